"""The live pilot tokens: which pilot tokens the collector accepts, kept by the service.

A pilot's token is listed from just before its sbatch until the service sees the pilot
end (SLURM no longer lists its job), cancels it, or the token expires; the collector
refuses a pilot token that is not listed (`SEC_TOKEN_REVOCATION_EXPR` over the token's
``jti``, condor_config/central-manager.conf). The file holds one token a line:
``jti identity site job_id issued_at expires_at`` (job_id ``-`` until sbatch answered).
The collector's configuration reads it through provisioner/security/collector_list.py,
which takes only the jti column, so this file cannot set anything else there. After
each change the service asks the collector to re-read its configuration.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from provisioner.security.tokens import JTI, PilotToken

log = logging.getLogger(__name__)

#: A token whose sbatch never answered (the service stopped in between) is kept this
#: long: its pilot may run; the service cannot tell which job it is.
UNBOUND_KEEP_S = 600
#: A token minted less than this before SLURM's list was read is not judged by it
#: (`iat` counts whole seconds).
IAT_SLACK_S = 2


@dataclass(frozen=True)
class Entry:
    jti: str
    identity: str
    site: str
    job_id: str  # "" until sbatch answered
    issued_at: int
    expires_at: int

    def line(self) -> str:
        return (f"{self.jti} {self.identity} {self.site} {self.job_id or '-'} "
                f"{self.issued_at} {self.expires_at}\n")

    @classmethod
    def parse(cls, line: str) -> Entry | None:
        words = line.split()
        if len(words) != 6 or not JTI.match(words[0]):
            return None
        try:
            iat, exp = int(words[4]), int(words[5])
        except ValueError:
            return None
        return cls(words[0], words[1], words[2], "" if words[3] == "-" else words[3], iat, exp)


class LiveTokens:
    """The list, in memory and in its file; `commit` writes it and tells the collector."""

    def __init__(self, path: str, reconfig: Callable[[], None]) -> None:
        self.path = Path(path)
        self.reconfig = reconfig
        self.entries: dict[str, Entry] = {}
        self.changed = False
        self.revoked_total = 0
        self._revoked_new = 0
        #: Tokens revoked lately, by jti: a refusal of one still names its pilot.
        self.gone: dict[str, Entry] = {}

    def load(self) -> None:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return
        for line in text.splitlines():
            entry = Entry.parse(line)
            if entry:
                self.entries[entry.jti] = entry

    def add(self, tokens: Iterable[PilotToken]) -> None:
        for t in tokens:
            self.entries[t.jti] = Entry(t.jti, t.identity, t.site, "", t.issued_at,
                                        t.expires_at)
            self.changed = True

    def bind(self, jti: str, job_id: str) -> None:
        if jti in self.entries:
            self.entries[jti] = replace(self.entries[jti], job_id=job_id)
            self.changed = True

    def drop(self, jtis: Iterable[str], why: str) -> None:
        for jti in jtis:
            entry = self.entries.pop(jti, None)
            if entry is not None:
                log.info("pilot token %s of %s (%s/%s) revoked: %s", jti, entry.identity,
                         entry.site, entry.job_id or "-", why)
                self.revoked_total += 1
                self._revoked_new += 1
                self.changed = True
                self.gone[jti] = entry
                if len(self.gone) > 1000:
                    self.gone.pop(next(iter(self.gone)))

    def known(self, jti: str) -> Entry | None:
        """The token `jti`, live or revoked lately."""
        return self.entries.get(jti) or self.gone.get(jti)

    def take_revoked(self) -> int:
        """How many tokens were revoked since the last call."""
        n, self._revoked_new = self._revoked_new, 0
        return n

    def of_job(self, site: str, job_id: str) -> Entry | None:
        for entry in self.entries.values():
            if entry.site == site and entry.job_id == job_id:
                return entry
        return None

    def ended(self, listed: Mapping[str, Iterable[str]], listed_at: float) -> None:
        """Revoke the tokens of pilots SLURM no longer lists (`listed`: the job ids of
        each site read this cycle, from `listed_at` on; a site not read is unknown:
        nothing of it is revoked, nor a token minted after the list was read), of
        unbound tokens kept long enough, and of expired ones."""
        now = listed_at
        jobs = {site: set(ids) for site, ids in listed.items()}
        gone, stale, expired = [], [], []
        for entry in self.entries.values():
            if entry.expires_at <= now:
                expired.append(entry.jti)
            elif not entry.job_id:
                if now - entry.issued_at > UNBOUND_KEEP_S:
                    stale.append(entry.jti)
            elif (entry.site in jobs and entry.job_id not in jobs[entry.site]
                  and entry.issued_at < listed_at - IAT_SLACK_S):
                gone.append(entry.jti)
        self.drop(gone, "its pilot has left SLURM")
        self.drop(stale, "sbatch never answered for it")
        self.drop(expired, "expired")

    def commit(self) -> None:
        """Write the list (atomically, mode 0644: jtis are no secret) and have the
        collector re-read it; raises OSError or the reconfig's error."""
        if not self.changed:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".live.")
        try:
            with os.fdopen(fd, "w") as f:
                f.writelines(e.line() for e in sorted(self.entries.values(),
                                                      key=lambda e: e.issued_at))
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.changed = False
        self.reconfig()
