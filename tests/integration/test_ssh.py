"""The SSH executor against the login nodes' real sshd: strict host keys, one
multiplexed connection reused, every word literal on the remote side, and each
failure a clear, site-named Unreachable (never a crash)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from provisioner.errors import Unreachable
from provisioner.sites.executor import SshExecutor

# The testbed's second key, without the forced-command gate the provisioner's own key
# has (deploy/testbed/inside/configure.sh): these tests send arbitrary commands.
KEY = "/root/.ssh/testbed-shell_ed25519"
KNOWN = "/etc/provisioner/ssh/known_hosts"


def executor(tmp_path: Path, **kw: object) -> SshExecutor:
    args: dict[str, object] = {"site": "gsi", "host": "gsi-login", "user": "pilot",
                               "key_file": KEY, "known_hosts": KNOWN,
                               "control_dir": str(tmp_path / "ctl"), "connect_timeout_s": 5,
                               "command_timeout_s": 20}
    args.update(kw)
    return SshExecutor(**args)  # type: ignore[arg-type]


def test_remote_command_gets_every_word_literally_over_one_connection(tmp_path: Path) -> None:
    ex = executor(tmp_path)
    hostile = ["; touch /tmp/pwned", "$(id)", "`id`", "a  b", "'q'", '"dq"', "*", "$HOME"]
    try:
        t0 = time.monotonic()
        first = ex.run(["python3", "-c", "import json,sys,os; print(json.dumps("
                        "[os.uname().nodename, sys.argv[1:], os.environ.get('V')]))",
                        *hostile], {"V": "$(id)"})
        t_first = time.monotonic() - t0
        assert first.returncode == 0, first.stderr
        assert json.loads(first.stdout) == ["gsi-login", hostile, "$(id)"]
        assert not Path("/tmp/pwned").exists()
        assert Path(ex.control_path).is_socket()  # the master connection stays
        t0 = time.monotonic()
        again = ex.run(["true"], {})
        t_again = time.monotonic() - t0
        assert again.returncode == 0
        print(f"first command {t_first * 1000:.0f} ms, over the open connection "
              f"{t_again * 1000:.0f} ms")
        # stdin reaches the remote command (sbatch reads the batch script so)
        assert ex.run(["cat"], {}, stdin="#!/bin/bash\necho hi\n").stdout.endswith("echo hi\n")
        # the remote exit code is a normal result, not an executor error
        assert ex.run(["sh", "-c", "exit 3"], {}).returncode == 3
    finally:
        ex.close()
    assert not Path(ex.control_path).exists()


def test_wrong_host_key_is_unreachable_naming_site_and_cause(tmp_path: Path) -> None:
    # fra-login's key listed under gsi-login's name: strict checking must refuse.
    lines = Path(KNOWN).read_text().splitlines()
    fra = next(line for line in lines if line.startswith("fra-login "))
    wrong = tmp_path / "known_hosts"
    wrong.write_text("gsi-login " + fra.split(" ", 1)[1] + "\n")
    with pytest.raises(Unreachable, match=r"site gsi: wrong or unknown host key of gsi-login"):
        executor(tmp_path, known_hosts=str(wrong)).run(["true"], {})


def test_unknown_host_refused_key_and_closed_port_are_unreachable(tmp_path: Path) -> None:
    with pytest.raises(Unreachable, match="site gsi: unknown host no-such-login"):
        executor(tmp_path, host="no-such-login").run(["true"], {})
    with pytest.raises(Unreachable, match="site gsi: login as root@gsi-login refused"):
        executor(tmp_path, user="root").run(["true"], {})
    with pytest.raises(Unreachable, match="site gsi: cannot connect to gsi-login:2222"):
        executor(tmp_path, port=2222).run(["true"], {})
    missing = executor(tmp_path, key_file=str(tmp_path / "absent"))
    with pytest.raises(Unreachable, match=r"SSH key .* is missing"):
        missing.run(["true"], {})
    assert os.path.exists(KEY)
