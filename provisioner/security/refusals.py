"""What the collector refused: pilot ads and tokens, read from its own log.

The collector says so only in its log: an ad that fails COLLECTOR_REQUIREMENTS with
D_MACHINE ("COLLECTOR_REQUIREMENTS VIOLATION: requirements do not match ad from
<peer>"), a token refused by SEC_TOKEN_REVOCATION_EXPR or expired with D_SECURITY
("User token with payload {...} has been revoked.", "User token has been expired for
N seconds."). `CollectorLog` follows the file from where it was when the service
started (a rotation starts it again at the new file's beginning) and turns those
lines into `Refusal`s; other lines are skipped.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass

log = logging.getLogger(__name__)

_AD = re.compile(r"COLLECTOR_REQUIREMENTS VIOLATION: requirements do not match ad from (\S+)")
_REVOKED = re.compile(r"User token with payload (\{.*\}) has been revoked")
_EXPIRED = re.compile(r"User token has been expired for (\d+) seconds")
#: At most this much of the log is read per call (a burst is reported in part).
MAX_READ = 4 << 20


@dataclass(frozen=True)
class Refusal:
    kind: str  # "ad" (COLLECTOR_REQUIREMENTS), "revoked" or "expired" (a token)
    detail: str  # the peer of a refused ad; the identity of a refused token
    jti: str = ""
    at: str = ""  # the log line's time stamp


def parse_line(line: str) -> Refusal | None:
    at = line[:17].strip()
    if found := _AD.search(line):
        return Refusal("ad", found.group(1), at=at)
    if found := _REVOKED.search(line):
        try:
            claims = json.loads(found.group(1))
        except ValueError:
            claims = {}
        return Refusal("revoked", str(claims.get("sub", "?")), str(claims.get("jti", "")), at)
    if found := _EXPIRED.search(line):
        return Refusal("expired", f"expired {found.group(1)} s ago", at=at)
    return None


class CollectorLog:
    """Follows the collector's log from its end at the first read."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.inode: int | None = None
        self.offset = 0
        self.problem: str | None = None

    def read(self) -> list[Refusal]:
        try:
            st = os.stat(self.path)
            if self.inode is None:
                self.inode, self.offset = st.st_ino, st.st_size
            elif st.st_ino != self.inode or st.st_size < self.offset:
                self.inode, self.offset = st.st_ino, 0  # rotated
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(MAX_READ)
        except OSError as exc:
            if self.problem is None:
                log.warning("collector log %s not readable: refused ads are not "
                            "reported: %s", self.path, exc.strerror or exc)
            self.problem = f"{self.path}: {exc.strerror or exc}"
            return []
        self.problem = None
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self.offset += end
        lines = data[:end].decode("utf-8", "replace").splitlines()
        return [r for r in map(parse_line, lines) if r is not None]
