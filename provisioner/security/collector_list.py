"""Print the live pilot tokens' jtis as one HTCondor configuration line.

The collector's configuration runs this (``include command :``, see
condor_config/central-manager.conf) on every read of its configuration:

    python3 -I collector_list.py /var/lib/provisioner/pilot-tokens.live \
        /var/lib/provisioner/pilot-tokens.live.check

It prints exactly one line, ``PROVISIONER_LIVE_PILOT_TOKENS = <jti> <jti> ...``, taking
from each line of the files only its first word, and only if it is 16-64 lowercase hex
digits: whatever else a file (written by the provisioner's account) holds never
reaches the collector's configuration. A missing or unreadable file lists no token.
Standard library only; it imports nothing of the provisioner.
"""

import re
import sys

JTI = re.compile(r"^[0-9a-f]{16,64}$")


def main(argv: list[str]) -> int:
    jtis = []
    for path in argv[1:]:
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                for line in f:
                    words = line.split()
                    if words and JTI.match(words[0]):
                        jtis.append(words[0])
        except OSError:
            pass
    print("PROVISIONER_LIVE_PILOT_TOKENS = " + " ".join(jtis))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
