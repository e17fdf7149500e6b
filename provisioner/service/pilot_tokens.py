"""The service's side of per-pilot tokens: mint before sbatch, revoke when a pilot ends.

`PilotTokens.issue` mints the tokens of one submission, lists them as live and has
the collector re-read the list before any sbatch runs (so a pilot's first ad is never
early); `bound` records the job id SLURM gave each, `unused` revokes those no pilot
got; every cycle `observed` revokes the tokens of pilots SLURM no longer lists, and
`cancelled` those the service cancels. `problem` says why tokens cannot be minted or
the list cannot be written (shown by `status`); a pilot is then not submitted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from provisioner.config import Config
from provisioner.security.livelist import LiveTokens
from provisioner.security.refusals import CollectorLog, Refusal
from provisioner.security.tokens import PilotToken, TokenError, check_key, mint

log = logging.getLogger(__name__)


def reconfig_collector(collector: str) -> None:
    """Ask the collector to re-read its configuration (it needs ADMINISTRATOR there
    for the service's identity; condor_config/central-manager.conf grants it)."""
    import htcondor2 as htcondor

    ads = htcondor.Collector(collector).query(htcondor.AdType.Collector)
    if not ads:
        raise RuntimeError(f"no collector ad at {collector}")
    htcondor.send_command(ads[0], htcondor.DaemonCommand.Reconfig)


#: The list of `site check`'s probe pilots, beside the service's (each process writes
#: its own file; the collector reads both).
CHECK_LIST = ".check"


def collector_log(setting: str) -> CollectorLog | None:
    """The collector's log to follow: `setting`'s path, this host's COLLECTOR_LOG
    ("auto"; None if HTCondor does not know one), or None ("off")."""
    if setting == "off":
        return None
    if setting == "auto":
        try:
            import htcondor2 as htcondor

            path = htcondor.param.get("COLLECTOR_LOG")
        except Exception:  # no bindings or no configuration: nothing to follow
            return None
        return CollectorLog(path) if path else None
    return CollectorLog(setting)


class PilotTokens:
    def __init__(self, config: Config,
                 reconfig: Callable[[], None] | None = None,
                 list_suffix: str = "",
                 minter: Callable[..., PilotToken] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.cfg = config.pilot_tokens
        self.minter = minter or mint
        self.clock = clock
        self.live = LiveTokens(self.cfg.live_list + list_suffix, reconfig or (
            lambda: reconfig_collector(config.pool.collector)))
        self.live.load()
        self.problem: str | None = None
        self.recent: list[str] = []
        self.collector_log = collector_log(self.cfg.collector_log)

    def lifetime_s(self, walltime_s: int) -> int:
        return walltime_s + self.cfg.queue_allowance_s + self.cfg.expiry_slack_s

    def deadline_s(self, walltime_s: int) -> int:
        """sbatch --deadline (from now): SLURM drops a pilot that could no longer end
        before its token expires."""
        return walltime_s + self.cfg.queue_allowance_s

    def issue(self, site: str, walltime_s: int, count: int) -> list[PilotToken]:
        """`count` fresh tokens for pilots at `site`, live at the collector on return.
        Raises TokenError (with `problem` set) when they cannot be minted or listed."""
        try:
            tokens = [self.minter(site, self.config.pool.uid_domain, self.cfg.signing_key,
                                  self.lifetime_s(walltime_s)) for _ in range(count)]
            self.live.add(tokens)
            self.live.commit()
        except TokenError as exc:
            self.problem = str(exc)
            raise
        except Exception as exc:  # the list's file or the collector's reconfig
            self.problem = (f"pilot_tokens.live_list {self.cfg.live_list}: not written or "
                            f"not read by the collector: {exc}")
            raise TokenError(self.problem) from exc
        self.problem = None
        return tokens

    def bound(self, token: PilotToken, job_id: str) -> None:
        self.live.bind(token.jti, job_id)

    def unused(self, tokens: Iterable[PilotToken]) -> None:
        self.live.drop((t.jti for t in tokens), "its sbatch failed")
        self._commit()

    def cancelled(self, site: str, job_id: str) -> None:
        entry = self.live.of_job(site, job_id)
        if entry:
            self.live.drop([entry.jti], "the service cancelled its pilot")
            self._commit()

    def observed(self, jobs: Mapping[str, Sequence[Any]], listed_at: float) -> None:
        """After a cycle's reads: `jobs` holds the SLURM jobs of each site read, read
        from `listed_at` on."""
        self.live.ended({site: [j.job_id for j in listed] for site, listed in jobs.items()},
                        listed_at)
        self._commit()

    def identity(self, site: str, job_id: str) -> str | None:
        entry = self.live.of_job(site, job_id)
        return entry.identity if entry else None

    def foreign(self, ads: Mapping[str, Any]) -> list[str]:
        """Pilot ads (`PilotAd`s by key) advertised by an identity other than the one
        minted for that pilot: "<key>: <identities>". A pilot the list does not hold
        (submitted before the service restarted and lost its list) is not judged."""
        out = []
        for key, ad in sorted(ads.items()):
            expected = self.identity(ad.site, ad.job_id)
            seen = [i for i in getattr(ad, "identities", ()) if i]
            if expected and any(i != expected for i in seen):
                out.append(f"{key}: advertised by {', '.join(seen)}; minted for {expected}")
        return out

    def refused(self) -> list[Refusal]:
        """The collector's refusals since the last call, each naming the pilot the
        service submitted when the refused token was one of its own."""
        if self.collector_log is None:
            return []
        out = []
        for r in self.collector_log.read():
            entry = self.live.known(r.jti) if r.jti else None
            if entry is not None:
                r = replace(r, detail=f"{r.detail} (pilot {entry.site}/{entry.job_id or '-'}"
                            " that this service submitted)")
            out.append(r)
        return out

    def report(self, ads: Mapping[str, Any], metrics: Any) -> dict[str, Any]:
        """What `status` shows (kept in the journal each cycle), and the metrics."""
        foreign = self.foreign(ads)
        refused = self.refused()
        self.recent = (self.recent + [f"{r.at} {r.kind}: {r.detail}" for r in refused])[-20:]
        metrics.tokens(live=len(self.live.entries), revoked=self.live.take_revoked(),
                       refused=[r.kind for r in refused], foreign=len(foreign))
        problem = self.problem or self.check()
        return {"live": len(self.live.entries), "revoked_total": self.live.revoked_total,
                "problem": problem or "", "foreign": foreign, "refused": self.recent,
                "collector_log": self.collector_log.problem if self.collector_log else "off"}

    def check(self) -> str | None:
        """Why no token could be minted now (None: the key is usable)."""
        return check_key(self.cfg.signing_key)

    def _commit(self) -> None:
        try:
            self.live.commit()
        except Exception as exc:  # retried at the next change or cycle
            self.live.changed = True
            self.problem = (f"pilot_tokens.live_list {self.cfg.live_list}: revocation not "
                            f"applied yet: {exc}")
            log.error("%s", self.problem)
