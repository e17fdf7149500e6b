"""A slurmrestd site's JWT: read from a file only the service's account may read,
checked before use, and renewed before it expires where the site lets the account
renew it.

The token file is read again whenever it changes (its mtime or size), so a token
renewed by something else (a site portal's client, a cron job on a host that may
run `scontrol token`) is picked up at the next request. With `rest.renew_command`
the service renews it itself: when the token expires within `rest.renew_before_s`,
it runs that command (an argv list, no shell; at most once a minute) and writes
what it prints, the new token, into the file (a private temporary file, then
rename). A token is never logged, never put in argv, never written elsewhere.

Every problem is an `Unreachable` naming the site and the field (the site is
unknown that cycle; the others go on).
"""

from __future__ import annotations

import logging
import os
import re
import stat
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from provisioner.errors import Unreachable
from provisioner.security.jwt import payload

log = logging.getLogger(__name__)

#: Three base64url parts (header, claims, signature), as slurmctld signs them.
_JWT = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$")
#: A renewal is tried at most this often.
RENEW_EVERY_S = 60.0
#: A token file larger than this is not a token.
MAX_TOKEN_BYTES = 16384


def token_text(raw: str) -> str:
    """The token in a file's (or `scontrol token`'s) text: "SLURM_JWT=" dropped,
    surrounding space stripped."""
    text = raw.strip()
    return text.removeprefix("SLURM_JWT=").strip()


def expiry(token: str) -> float | None:
    """The token's `exp` claim (epoch s), read without checking the signature (the
    server does that); None if it has none. ValueError if it is not a JWT."""
    if not _JWT.match(token):
        raise ValueError("not a JWT (three base64url parts)")
    doc = payload(token)
    exp = doc.get("exp")
    if exp is None:
        return None
    if isinstance(exp, bool) or not isinstance(exp, int | float):
        raise ValueError(f"its exp claim is not a number: {exp!r}")
    return float(exp)


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


@dataclass
class TokenFile:
    """The JWT of site `site` in `path` (field `what`, e.g. sites[1].rest.token_file)."""

    site: str
    path: str
    what: str
    renew_command: Sequence[str] | None = None
    renew_before_s: float = 900.0
    uid: int = field(default_factory=os.geteuid)
    clock: Callable[[], float] = field(default=time.time, repr=False)
    _seen: tuple[float, int] | None = field(default=None, init=False, repr=False)
    _token: str = field(default="", init=False, repr=False)
    _exp: float | None = field(default=None, init=False, repr=False)
    _renew_tried: float | None = field(default=None, init=False, repr=False)

    def _fail(self, why: str) -> Unreachable:
        return Unreachable(f"site {self.site}: {self.what} {self.path}: {why}")

    def _load(self) -> None:
        """Read the file again if it changed; raise if it may not or cannot be used."""
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise self._fail(exc.strerror or str(exc)) from None
        if not stat.S_ISREG(st.st_mode):
            raise self._fail("not a regular file")
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise self._fail(f"has mode {mode:04o}: a token must be readable by the "
                             f"service's account only (chmod 600 {self.path})")
        if self.uid != 0 and st.st_uid != self.uid:
            raise self._fail(f"is owned by uid {st.st_uid}, not by the service's account "
                             f"(uid {self.uid})")
        if st.st_size > MAX_TOKEN_BYTES:
            raise self._fail(f"is {st.st_size} bytes: not a token")
        seen = (st.st_mtime, st.st_size)
        if seen == self._seen:
            return
        try:
            token = token_text(Path(self.path).read_text(encoding="ascii"))
            exp = expiry(token)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise self._fail(f"holds no usable token: {exc}") from None
        self._seen, self._token, self._exp = seen, token, exp

    def token(self) -> str:
        """The token to send now; renewed first when it expires soon and the site lets
        the account renew it; Unreachable if there is none that is still valid."""
        self._load()
        now = self.clock()
        if self._exp is not None and self.renew_command \
                and self._exp - now <= self.renew_before_s:
            self._renew(now)
        if self._exp is not None and self._exp <= now:
            how = "renew it (rest.renew_command)" if not self.renew_command \
                else "its renewal failed (see the log)"
            raise self._fail(f"the token expired at {_when(self._exp)}: {how}")
        return self._token

    def expires_at(self) -> float | None:
        self._load()
        return self._exp

    def _renew(self, now: float) -> None:
        """Run the renewal command (not more than once per RENEW_EVERY_S) and put its
        token in the file; a failure is logged, the old token used while valid."""
        if self._renew_tried is not None and now - self._renew_tried < RENEW_EVERY_S:
            return
        self._renew_tried = now
        assert self.renew_command
        try:
            result = subprocess.run(list(self.renew_command), capture_output=True, text=True,
                                    timeout=60, stdin=subprocess.DEVNULL, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.error("site %s: rest.renew_command failed: %s", self.site, exc)
            return
        token = token_text(result.stdout)
        try:
            exp = expiry(token) if result.returncode == 0 else None
        except ValueError as exc:
            log.error("site %s: rest.renew_command printed no token: %s", self.site, exc)
            return
        if result.returncode != 0:
            log.error("site %s: rest.renew_command exited %d: %s", self.site,
                      result.returncode, result.stderr.strip()[-300:])
            return
        self._write(token)
        log.info("site %s: token renewed%s", self.site,
                 f", valid until {_when(exp)}" if exp is not None else "")

    def _write(self, token: str) -> None:
        tmp = f"{self.path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(token + "\n")
            os.replace(tmp, self.path)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            log.error("site %s: renewed token not written to %s: %s", self.site, self.path,
                      exc)
            return
        self._seen = None  # read it back as any other change
        self._load()
