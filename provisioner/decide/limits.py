"""What a site's own SLURM limits allow (pure: the caller passes what happened and `now`).

SLURM's refusals are signals, each of its own kind (`provisioner.sites.base`):

- `AtLimit` (a QOS or association submit limit refused sbatch): the site is *at its
  submission limit*. The limit is learnt as the number of pilots the site held when it
  refused; no sbatch goes there beyond it, so the next one goes only once one of its
  pilots has left. A pending pilot whose SLURM reason is a job-count limit
  (`QOSMaxJobsPerUserLimit`, ...) says the same without a refusal: the *job limit* is
  learnt as the pilots held that are not waiting on it. A limit is forgotten after
  `forget_s` (an admin may raise it): then one sbatch tests it again.
- `Misconfigured` (account, partition, QOS, time limit refused): the site is *stopped*,
  the error named; no sbatch there until the service restarts (after the configuration is
  fixed). Nothing else stops: its pilots are still followed and released.
- `Transient` or `Unreachable` (busy controller, timeout, rate limit) and any other
  refusal: the site's sbatch is *backed off*, ``base_s * 2**(n-1)`` up to `max_s`.

`rooms()` gives, per site, the most new pilots these allow this cycle; the controller puts
them in `CycleMemory.limit_room`, and `plan()` counts them with the site's caps. Each change
of a site's state is one line for the log (returned, never logged here).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from provisioner.decide.backoff import SiteBackoff
from provisioner.errors import AtLimit, BackendError, Misconfigured

SUBMISSION = "submission limit"
JOBS = "job limit"


@dataclass
class SiteLimit:
    jobs: int  # pilots the site may hold
    kind: str  # SUBMISSION or JOBS
    reason: str  # SLURM's name of the limit
    learnt_at: float


@dataclass
class SiteLimits:
    forget_s: float = 3600.0
    busy: SiteBackoff = field(default_factory=lambda: SiteBackoff(base_s=60.0, max_s=900.0))
    caps: dict[str, SiteLimit] = field(default_factory=dict)
    stopped: dict[str, str] = field(default_factory=dict)  # site -> the error, named
    busy_why: dict[str, str] = field(default_factory=dict)  # site -> the last failure

    def refused(self, site: str, error: BackendError, held: int, now: float) -> str:
        """An sbatch at `site` failed with `error` while the site held `held` pilots (this
        cycle's submissions included). Returns the line for the log."""
        if isinstance(error, AtLimit):
            self.caps[site] = SiteLimit(held, SUBMISSION, error.reason, now)
            return f"{site}: at its submission limit ({held} jobs): {error}"
        if isinstance(error, Misconfigured):
            self.stopped[site] = (f"stopped: SLURM refused its configuration, field "
                                  f"{error.field}: {error.slurm_message}")
            return (f"{site}: {self.stopped[site]}; no further pilots there until the site's "
                    f"configuration is fixed and the service restarted")
        delay = self.busy.failed(site, now)
        self.busy_why[site] = str(error)
        return f"{site}: sbatch backed off for {delay:.0f} s: {error}"

    def submitted(self, site: str) -> bool:
        """An sbatch at `site` succeeded; True if its sbatch had been backed off."""
        self.busy_why.pop(site, None)
        return self.busy.succeeded(site)

    def observe(self, site: str, held: int, limited: Mapping[str, int],
                now: float) -> list[str]:
        """One cycle's view of a site read this cycle: `held` its pilots in SLURM,
        `limited` SLURM's reason -> pending pilots waiting on a job-count limit. Learns
        a job limit, forgets limits older than `forget_s`; returns the changes."""
        events = []
        cap = self.caps.get(site)
        if cap is not None and now - cap.learnt_at >= self.forget_s:
            del self.caps[site]
            events.append(f"{site}: its {cap.kind} ({cap.jobs} jobs) forgotten after "
                          f"{self.forget_s:.0f} s; the next pilot tests it")
            cap = None
        waiting = sum(limited.values())
        if waiting:
            jobs = held - waiting
            if cap is None or cap.kind != JOBS or cap.jobs != jobs:
                reason = ", ".join(sorted(limited))
                self.caps[site] = SiteLimit(jobs, JOBS, reason, now)
                events.append(f"{site}: at its job limit ({jobs} jobs): {waiting} pilot(s) "
                              f"pending with reason {reason}")
        return events

    def room(self, site: str, held: int, now: float) -> int | None:
        """The most new pilots the site's limits allow now (None: no limit known)."""
        if site in self.stopped or not self.busy.due(site, now):
            return 0
        cap = self.caps.get(site)
        return None if cap is None else max(0, cap.jobs - held)

    def rooms(self, held: Mapping[str, int], sites: Iterable[str], now: float) -> dict[str, int]:
        """`room` of every site in `sites` that has a limit (the others absent)."""
        out = {}
        for site in sites:
            room = self.room(site, held.get(site, 0), now)
            if room is not None:
                out[site] = room
        return out

    def describe(self, site: str, held: int, now: float) -> str:
        """The site's limits in words ("" if none): e.g. "at its submission limit (20
        jobs)"."""
        if site in self.stopped:
            return self.stopped[site]
        parts = []
        cap = self.caps.get(site)
        if cap is not None:
            at = "at" if held >= cap.jobs else f"{held} pilots, below"
            parts.append(f"{at} its {cap.kind} ({cap.jobs} jobs, {cap.reason})")
        if not self.busy.due(site, now):
            parts.append(f"sbatch backed off for {self.busy.retry_at[site] - now:.0f} s "
                         f"({self.busy_why.get(site, '')})")
        return "; ".join(parts)

    def snapshot(self, held: Mapping[str, int], now: float) -> dict[str, str]:
        """Every site with a limit in words (for the journal and `provisioner status`)."""
        sites = sorted(set(self.caps) | set(self.stopped) | set(self.busy.retry_at))
        out = {site: self.describe(site, held.get(site, 0), now) for site in sites}
        return {site: text for site, text in out.items() if text}

    def to_dict(self) -> dict[str, Any]:
        """The learnt limits, JSON-able (a stop and a back-off do not outlive the
        service: after a restart the first sbatch asks again)."""
        return {site: {"jobs": c.jobs, "kind": c.kind, "reason": c.reason,
                       "learnt_at": c.learnt_at} for site, c in sorted(self.caps.items())}

    def load(self, data: Mapping[str, Any]) -> None:
        """Restore what `to_dict()` wrote; malformed entries are skipped."""
        for site, e in data.items():
            try:
                self.caps[str(site)] = SiteLimit(int(e["jobs"]), str(e["kind"]),
                                                 str(e["reason"]), float(e["learnt_at"]))
            except (KeyError, TypeError, ValueError):
                continue
