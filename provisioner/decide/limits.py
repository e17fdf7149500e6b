"""What a site's own SLURM limits allow (pure: the caller passes what happened and `now`).

SLURM's refusals are signals, each of its own kind (`provisioner.sites.base`):

- `AtLimit` (a QOS or association submit limit refused sbatch): the site is *at its
  submission limit*. The limit is learnt as the number of pilots the site held when it
  refused; no sbatch goes there beyond it, so the next one goes only once one of its
  pilots has left. An admin may raise or remove the limit: ``probe_s`` after the refusal
  one sbatch past it is allowed (only if work waits for the site: `plan()` submits
  nothing else); accepted, the limit is dropped; refused, it is learnt again and the next
  probe waits twice as long (up to ``probe_max_s``).
- A pending pilot whose SLURM reason is a job-count limit (`JOB_LIMIT_REASONS`) says
  the site holds as many running pilots as it allows: the *job limit* is learnt as the
  pilots held that are not waiting on it, and kept while SLURM gives that reason. Once no
  pilot pends with it, one pilot past it is allowed; that one pending with the reason
  again keeps the limit, a site running more pilots than the limit drops it (raised or
  removed).
- Any other pending reason `plan()` is told of (`Pilot.limit_reason`: one that is not
  SLURM's ordinary wait, e.g. another version's name for a limit) is no capacity on its
  way, and is never learnt as a limit: it is named once per site and text
  (`unknown_reason`).
- `Misconfigured` (account, partition, QOS, time limit refused): the site is *stopped*,
  the error named; no sbatch there until the service restarts (after the configuration is
  fixed). Nothing else stops: its pilots are still followed and released. A refused
  account of an allocation's pilot stops only that allocation, not the site
  (`provisioner.decide.answers`).
- `Transient` or `Unreachable` (busy controller, timeout, rate limit) and any other
  refusal: the site's sbatch is *backed off*, ``base_s * 2**(n-1)`` up to `max_s`.

`rooms()` gives, per site, the most new pilots these allow this cycle; the controller puts
them in `CycleMemory.limit_room`, and `plan()` counts them with the site's caps (and
sizes a site's pilots up to its whole shape while it is at a limit: `at_limit()`). Each
change of a site's state is one line for the log (returned, never logged here).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from provisioner.decide.backoff import SiteBackoff
from provisioner.errors import AtLimit, BackendError, Misconfigured

SUBMISSION = "submission limit"
JOBS = "job limit"

#: SLURM's pending reasons of a job-count limit (MaxJobs, GrpJobs; the older names
#: included): sbatch accepts, the job pends until one of the account's jobs ends.
JOB_LIMIT_REASONS = frozenset({
    "QOSMaxJobsPerUserLimit", "QOSMaxJobsPerAccountLimit", "QOSGrpJobsLimit",
    "AssocMaxJobsLimit", "AssocGrpJobsLimit", "AssociationJobLimit", "QOSJobLimit"})


@dataclass
class SiteLimit:
    jobs: int  # pilots the site may hold
    kind: str  # SUBMISSION or JOBS
    reason: str  # SLURM's name of the limit
    learnt_at: float
    #: SUBMISSION: when one sbatch past the limit may test it (None: not yet planned)
    probe_at: float | None = None
    #: SUBMISSION: probes refused in a row (each doubles the wait before the next)
    probes: int = 0
    #: JOBS: no pilot pends with the reason any more; one pilot past the limit tests it
    probing: bool = False


@dataclass
class SiteLimits:
    #: a submission limit is tested again this long after its refusal (then doubling)
    probe_s: float = 300.0
    probe_max_s: float = 3600.0
    busy: SiteBackoff = field(default_factory=lambda: SiteBackoff(base_s=60.0, max_s=900.0))
    caps: dict[str, SiteLimit] = field(default_factory=dict)
    stopped: dict[str, str] = field(default_factory=dict)  # site -> the error, named
    busy_why: dict[str, str] = field(default_factory=dict)  # site -> the last failure
    #: (site, reason) of pending reasons that are neither a wait nor a known limit, named once
    unknown: set[tuple[str, str]] = field(default_factory=set)

    def refused(self, site: str, error: BackendError, held: int, now: float) -> str:
        """An sbatch at `site` failed with `error` while the site held `held` pilots (this
        cycle's submissions included). Returns the line for the log."""
        if isinstance(error, AtLimit):
            old = self.caps.get(site)
            probes = old.probes + 1 if old is not None and old.kind == SUBMISSION else 0
            wait = min(self.probe_max_s, self.probe_s * 2 ** probes)
            self.caps[site] = SiteLimit(held, SUBMISSION, error.reason, now,
                                        probe_at=now + wait, probes=probes)
            return (f"{site}: at its submission limit ({held} jobs): {error}; one sbatch "
                    f"past it tests it again in {wait:.0f} s if work waits")
        if isinstance(error, Misconfigured):
            self.stopped[site] = (f"stopped: SLURM refused its configuration, field "
                                  f"{error.field}: {error.slurm_message}")
            return (f"{site}: {self.stopped[site]}; no further pilots there until the site's "
                    f"configuration is fixed and the service restarted")
        delay = self.busy.failed(site, now)
        self.busy_why[site] = str(error)
        return f"{site}: sbatch backed off for {delay:.0f} s: {error}"

    def submitted(self, site: str, held: int | None = None) -> str:
        """An sbatch at `site` succeeded, the site now holding `held` pilots (None: not
        counted). Returns the line for the log ("" when nothing changed): sbatch accepted
        after a back-off, or past a learnt submission limit (which is then dropped)."""
        self.busy_why.pop(site, None)
        line = f"{site}: sbatch accepted again" if self.busy.succeeded(site) else ""
        cap = self.caps.get(site)
        if (cap is not None and cap.kind == SUBMISSION and held is not None
                and held > cap.jobs):
            del self.caps[site]
            line = (f"{site}: sbatch accepted past its submission limit ({cap.jobs} jobs, "
                    f"{cap.reason}): the limit was raised or removed")
        return line

    def observe(self, site: str, held: int, limited: Mapping[str, int], now: float,
                started: int | None = None) -> list[str]:
        """One cycle's view of a site read this cycle: `held` its pilots in SLURM,
        `started` those no longer pending (None: `held` less the `limited` ones),
        `limited` the pending reasons `plan()` is told of -> pilots pending with it. A
        job-count reason (`JOB_LIMIT_REASONS`) learns or keeps a job limit; with none, a
        job limit is tested (one pilot past it) and dropped once more pilots than it
        allows have started. Another reason is named once (`unknown_reason`). Returns
        the changes."""
        events = [self.unknown_reason(site, reason) for reason in sorted(limited)
                  if reason not in JOB_LIMIT_REASONS and (site, reason) not in self.unknown]
        waiting = {r: n for r, n in limited.items() if r in JOB_LIMIT_REASONS}
        if started is None:
            started = held - sum(limited.values())
        cap = self.caps.get(site)
        if waiting:
            jobs = held - sum(waiting.values())
            if cap is None or cap.kind != JOBS or cap.jobs != jobs or cap.probing:
                reason = ", ".join(sorted(waiting))
                self.caps[site] = SiteLimit(jobs, JOBS, reason, now)
                events.append(f"{site}: at its job limit ({jobs} jobs): "
                              f"{sum(waiting.values())} pilot(s) pending with reason {reason}")
        elif cap is not None and cap.kind == JOBS:
            if started > cap.jobs:
                del self.caps[site]
                events.append(f"{site}: {started} pilots run, more than its job limit "
                              f"({cap.jobs} jobs, {cap.reason}): the limit was raised or "
                              "removed")
            elif not cap.probing:
                cap.probing = True
                events.append(f"{site}: no pilot pending at its job limit ({cap.jobs} jobs) "
                              "any more: one pilot past it tests it")
        return events

    def unknown_reason(self, site: str, reason: str) -> str:
        """The line naming a pending reason that is neither SLURM's ordinary wait nor a
        known limit, the first time it is seen at `site` ("" after)."""
        if (site, reason) in self.unknown:
            return ""
        self.unknown.add((site, reason))
        return (f"{site}: pilot(s) pending with SLURM reason {reason!r}, which this "
                "provisioner does not know: not counted as capacity on its way, not "
                "learnt as a limit")

    def room(self, site: str, held: int, now: float) -> int | None:
        """The most new pilots the site's limits allow now (None: no limit known): up
        to the limit, one more while the limit is tested."""
        if site in self.stopped or not self.busy.due(site, now):
            return 0
        cap = self.caps.get(site)
        if cap is None:
            return None
        return max(0, cap.jobs + (1 if self.testing(cap, now) else 0) - held)

    def testing(self, cap: SiteLimit, now: float) -> bool:
        """Whether one pilot past `cap` may test it now."""
        if cap.kind == JOBS:
            return cap.probing
        due = cap.probe_at if cap.probe_at is not None else cap.learnt_at + self.probe_s
        return now >= due

    def at_limit(self, site: str, held: int) -> bool:
        """Whether `site` holds as many pilots as a learnt limit allows (its pilots are
        the scarce resource, not its cores)."""
        cap = self.caps.get(site)
        return cap is not None and held >= cap.jobs

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
            parts.append(f"{at} its {cap.kind} ({cap.jobs} jobs, {cap.reason})"
                         + ("; one pilot past it tests it" if self.testing(cap, now) else ""))
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
                       "learnt_at": c.learnt_at, "probe_at": c.probe_at, "probes": c.probes,
                       "probing": c.probing} for site, c in sorted(self.caps.items())}

    def load(self, data: Mapping[str, Any]) -> None:
        """Restore what `to_dict()` wrote; malformed entries are skipped."""
        for site, e in data.items():
            try:
                probe_at = e.get("probe_at")
                self.caps[str(site)] = SiteLimit(
                    int(e["jobs"]), str(e["kind"]), str(e["reason"]), float(e["learnt_at"]),
                    None if probe_at is None else float(probe_at), int(e.get("probes", 0)),
                    bool(e.get("probing", False)))
            except (AttributeError, KeyError, TypeError, ValueError):
                continue
