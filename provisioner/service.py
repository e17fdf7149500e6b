"""The reconcile loop: observe (I/O, batched) -> plan (pure) -> act (I/O, idempotent).

Observe reads one schedd query, one collector query and one `squeue` per site
and builds an immutable Snapshot. `provisioner.plan.plan()` decides. Act applies
the decisions: submits, releases (re-checked against a fresh collector read
right before), cancels of pending pilots. A site or pool that cannot be read is
unknown, never empty: plan() then takes no action there.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from provisioner import plan as planner
from provisioner.arrivals import QueueHistory, departures
from provisioner.backoff import SiteBackoff
from provisioner.breaker import SiteBreakers
from provisioner.cadence import CycleMark, Probe, cycle_due
from provisioner.condor import PilotAd, Pool, PoolUnreachable
from provisioner.config import Config
from provisioner.journal import Journal
from provisioner.model import (
    Cancel,
    Demand,
    Flag,
    Pilot,
    PilotState,
    Plan,
    Release,
    SiteView,
    Snapshot,
    Submit,
    Unflag,
)
from provisioner.pilot.script import render_pilot_script
from provisioner.sites import make_backend
from provisioner.sites.base import (
    BackendError,
    PilotRequest,
    SiteBackend,
    SiteJob,
    SiteJobState,
)

log = logging.getLogger(__name__)

#: A released pilot whose startd ad has been gone this long, on which the
#: schedd runs no job, and whose SLURM job lingers, is cancelled. A released
#: pilot that still advertises itself, not draining, this long after the
#: release refused it (it took a job) and is forgotten.
LINGER_S = 60.0
#: SLURM sends a job's warning signal (--signal) up to this much before the time asked.
SLURM_SIGNAL_SLOP_S = 60


@dataclass
class ReleaseMark:
    sent_at: float
    ad_gone_since: float | None = None


def runs_jobs(site: str, job_id: str, running_on: frozenset[str]) -> bool:
    """The schedd runs a job on this pilot's startd (named pilot-<site>-<job>@host)."""
    prefix = f"pilot-{site}-{job_id}@"
    return any(name.startswith(prefix) for name in running_on)


def ad_busy(ad: PilotAd, running_on: frozenset[str]) -> bool:
    """Claimed resources per the collector, or a running job per the schedd."""
    return (ad.claimed_slots > 0 or ad.free_cpus < ad.cpus
            or ad.free_memory_mb < ad.memory_mb or ad.name in running_on)


def idle_ad_keys(ads: Mapping[str, PilotAd]) -> frozenset[str]:
    """Pilots whose startd ad shows nothing claimed (what the quick check compares)."""
    return frozenset(k for k, a in ads.items() if a.claimed_slots == 0 and a.free_cpus == a.cpus)


def pilot_state(job: SiteJob, ad: PilotAd | None,
                running_on: frozenset[str] = frozenset(), site: str = "") -> PilotState:
    """The pilot's state from its SLURM job, its startd ad (None: no ad) and the
    startds the schedd runs jobs on (busy even if its ad is missing, e.g. after
    a collector restart)."""
    if job.state is SiteJobState.PENDING:
        return PilotState.PENDING
    if job.state is SiteJobState.ENDING:
        return PilotState.ENDING
    if ad is None:
        busy = runs_jobs(site, job.job_id, running_on)
        return PilotState.BUSY if busy else PilotState.STARTING
    if ad.draining:
        return PilotState.DRAINING
    if ad_busy(ad, running_on):
        return PilotState.BUSY
    return PilotState.IDLE


def merge_pilots(site: str, jobs: list[SiteJob], ads: Mapping[str, PilotAd],
                 running_on: frozenset[str] = frozenset()) -> list[Pilot]:
    """One Pilot per live SLURM job of the site, with what its startd advertises."""
    out = []
    for job in jobs:
        ad = ads.get(f"{site}/{job.job_id}")
        state = pilot_state(job, ad, running_on, site)
        up = state in (PilotState.IDLE, PilotState.BUSY, PilotState.DRAINING)
        out.append(Pilot(
            site=site,
            job_id=job.job_id,
            state=state,
            cpus=ad.cpus if ad else job.cpus,
            memory_mb=ad.memory_mb if ad else job.memory_mb,
            submitted_at=job.submitted_at,
            started_at=job.started_at,
            walltime_end=(ad.walltime_end if ad and ad.walltime_end else job.ends_at),
            # A draining pilot the schedd still runs a job on is reported full, so
            # that plan() never takes it for an empty drained one.
            free_cpus=(0 if state is PilotState.DRAINING and ad and ad_busy(ad, running_on)
                       else ad.free_cpus if up and ad else job.cpus),
            free_memory_mb=ad.free_memory_mb if up and ad else job.memory_mb,
            name=ad.name if ad else None,
        ))
    return out


def ad_only_pilots(site: str, ads: Mapping[str, PilotAd], now: float,
                   running_on: frozenset[str] = frozenset()) -> list[Pilot]:
    """Pilots of a site whose squeue failed: what the collector shows, counted as is."""
    out = []
    for ad in ads.values():
        if ad.site != site:
            continue
        busy = ad_busy(ad, running_on)
        out.append(Pilot(site=site, job_id=ad.job_id,
                         state=PilotState.BUSY if busy else PilotState.IDLE,
                         cpus=ad.cpus, memory_mb=ad.memory_mb, submitted_at=now,
                         walltime_end=ad.walltime_end, free_cpus=ad.free_cpus,
                         free_memory_mb=ad.free_memory_mb, name=ad.name))
    return out


@dataclass
class Observation:
    snapshot: Snapshot
    ads: dict[str, PilotAd]
    jobs: dict[str, list[SiteJob]]
    running_on: frozenset[str] = frozenset()


@dataclass
class CycleResult:
    reason: str
    observation: Observation
    plan: Plan
    outcomes: list[tuple[str, str]] = field(default_factory=list)  # (action text, outcome)
    timings: dict[str, float] = field(default_factory=dict)


def describe(action: Any) -> str:
    if isinstance(action, Submit):
        return (f"submit {action.count} at {action.site} "
                f"({action.cpus} cores, {action.memory_mb} MB, {action.walltime_s} s)")
    kind = type(action).__name__.lower()
    return f"{kind} {action.pilot.key}"


class Provisioner:
    """Holds the backends, the pool reader and the hysteresis state between cycles."""

    def __init__(self, config: Config, pool: Pool | None = None,
                 backends: Mapping[str, SiteBackend] | None = None,
                 journal: Journal | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.pool = pool or Pool(config.pool)
        self.backends = dict(backends) if backends is not None else {
            s.name: make_backend(s, config.pool) for s in config.sites}
        self.journal = journal or Journal(config.journal)
        self.clock = clock
        self.flagged: dict[str, float] = {}
        self.idle_cycles: dict[str, int] = {}
        self.released: dict[str, ReleaseMark] = {}
        self.last_jobs: dict[str, list[SiteJob]] = {}
        self.last_submit: dict[str, float] = {}
        self.last_mark: CycleMark | None = None
        self.cycles = 0
        self.history = QueueHistory(config.policy.reserve.window_s)
        self.ghosts: set[str] = set()  # startd ads without a SLURM job, already logged
        self.busy_ends: dict[str, float | None] = {}  # busy pilots last cycle -> walltime end
        breaker = config.policy.breaker
        self.breakers = SiteBreakers(breaker.threshold, breaker.base_s, breaker.max_s)
        # A site that keeps failing is asked again after a growing delay.
        self.backoff = SiteBackoff(base_s=min(config.policy.interval_s, 60.0), max_s=600.0)

    # --- observe ---------------------------------------------------------
    def observe(self) -> Observation:
        now = self.clock()
        pool_known = True
        demand: tuple[Demand, ...] = ()
        ads: dict[str, PilotAd] = {}
        running_on: frozenset[str] = frozenset()
        arrivals: tuple[Demand, ...] = ()
        left: int | None = None
        window = 0.0
        since, size_then = self.history.baseline(now)
        try:
            queue = self.pool.queue(since if self.config.policy.reserve.enabled else None)
            demand, running_on, arrivals = queue.demand, queue.running_on, queue.recent_arrivals
            ads = self.pool.pilot_ads()
        except PoolUnreachable as exc:
            log.error("pool unknown this cycle (no scale-down, no submissions): %s", exc)
            pool_known = False
        else:
            self.history.record(now, queue.total)
            if self.config.policy.reserve.enabled:
                window = now - since
                left = departures(size_then, queue.older)
        views, pilots, jobs = [], [], {}
        for site in self.config.sites:
            error = ""
            if not self.backoff.due(site.name, now):
                error = (f"backed off after {self.backoff.failures[site.name]} failed reads; "
                         f"next try in {self.backoff.retry_at[site.name] - now:.0f} s")
            else:
                try:
                    site_jobs = list(self.backends[site.name].list_pilots())
                except BackendError as exc:
                    delay = self.backoff.failed(site.name, now)
                    error = str(exc)
                    log.error("site %s unknown this cycle (failed read %d, next try in %.0f s): "
                              "%s", site.name, self.backoff.failures[site.name], delay, exc)
            if error:
                views.append(SiteView(site.name, known=False, error=error))
                # Counted as last seen (pending and starting pilots included), so
                # their demand is not provisioned again elsewhere; no action is
                # taken at an unknown site.
                last = self.last_jobs.get(site.name)
                if last is not None:
                    pilots.extend(merge_pilots(site.name, last, ads, running_on))
                else:
                    pilots.extend(ad_only_pilots(site.name, ads, now, running_on))
                continue
            if self.backoff.succeeded(site.name):
                log.warning("site %s readable again", site.name)
            jobs[site.name] = site_jobs
            self.last_jobs[site.name] = site_jobs
            merged = merge_pilots(site.name, site_jobs, ads, running_on)
            pilots.extend(merged)
            views.append(SiteView(site.name, known=True,
                                  max_new=self._breaker(site.name, site_jobs, merged,
                                                        ads if pool_known else None, now)))
        snapshot = Snapshot(
            demand=demand, pilots=tuple(pilots), sites=tuple(views), pool_known=pool_known,
            flagged=dict(self.flagged), last_submit=dict(self.last_submit),
            idle_cycles=dict(self.idle_cycles), recent_arrivals=arrivals,
            arrival_window_s=window, recent_departures=left)
        if pool_known:
            self._report_disagreements(snapshot, ads, jobs, now)
        return Observation(snapshot, ads, jobs, running_on)

    def _breaker(self, site: str, site_jobs: list[SiteJob], merged: list[Pilot],
                 ads: Mapping[str, PilotAd] | None, now: float) -> int | None:
        """Feed the site's circuit breaker (only when the pool is known: a missing ad
        must mean "never joined"); its limit on new pilots this cycle."""
        if ads is not None:
            live = [f"{site}/{j.job_id}" for j in site_jobs]
            joined = [k for k, a in ads.items() if a.site == site]
            for event in self.breakers.observe(site, live, joined, now):
                log.warning("%s", event)
        untested = sum(1 for p in merged if p.state in (PilotState.PENDING,
                                                         PilotState.STARTING))
        return self.breakers.max_new(site, now, untested)

    def _report_disagreements(self, snapshot: Snapshot, ads: Mapping[str, PilotAd],
                              jobs: Mapping[str, list[SiteJob]], now: float) -> None:
        """Log, once each, where SLURM and the collector disagree: a startd ad whose
        SLURM job is gone (a ghost: never counted as capacity), and a pilot that
        was running jobs and is gone from SLURM (at its walltime or lost)."""
        live = {f"{site}/{j.job_id}" for site, site_jobs in jobs.items() for j in site_jobs}
        ghosts = {key for key, ad in ads.items() if ad.site in jobs and key not in live}
        for key in sorted(ghosts - self.ghosts):
            log.warning("pilot %s: startd ad in the collector but no SLURM job (killed or "
                        "node lost); not counted, the collector drops the ad", key)
        self.ghosts = ghosts
        for key, end in sorted(self.busy_ends.items()):
            site = key.split("/", 1)[0]
            if site not in jobs or key in live:
                continue
            # SLURM's warning signal comes shutdown_margin_s before the end, up to
            # 60 s early (its resolution); the pilot stops on it.
            margin = self.config.site(site).pilot.shutdown_margin_s + SLURM_SIGNAL_SLOP_S
            if end is not None and now >= end - margin:
                log.warning("pilot %s reached its walltime with jobs running (jobs that state "
                            "no +MaxRuntime can be cut off); HTCondor runs them again", key)
            else:
                log.warning("pilot %s left SLURM while running jobs (node lost or pilot "
                            "killed); HTCondor runs them again after their job lease", key)
        self.busy_ends = {p.key: p.walltime_end for p in snapshot.pilots
                          if p.state is PilotState.BUSY and p.site in jobs}

    # --- act -------------------------------------------------------------
    def _submit(self, action: Submit) -> str:
        site = self.config.site(action.site)
        backend = self.backends[action.site]
        script = render_pilot_script(self.config, site, action.walltime_s)
        request = PilotRequest(cpus=action.cpus, memory_mb=action.memory_mb,
                               walltime_s=action.walltime_s,
                               shutdown_margin_s=site.pilot.shutdown_margin_s, script=script)
        ids = []
        try:
            for _ in range(action.count):
                ids.append(backend.submit(request))
        except BackendError as exc:
            log.error("submission at %s stopped after %d of %d: %s", action.site, len(ids),
                      action.count, exc)
            return f"submitted {ids}; failed: {exc}"
        finally:
            if ids:
                self.last_submit[action.site] = self.clock()
                self.breakers.track(f"{action.site}/{i}" for i in ids)
        return f"submitted {ids}"

    def _release(self, action: Release,
                 fresh: tuple[Mapping[str, PilotAd], frozenset[str]] | None) -> str:
        key = action.pilot.key
        if fresh is None:
            return "skipped: pool unreadable right before release"
        ads, running_on = fresh
        ad = ads.get(key)
        if ad is None:
            return "skipped: ad gone right before release"
        if ad_busy(ad, running_on) or ad.draining:
            return "skipped: claimed since the snapshot"
        self.backends[action.pilot.site].release(action.pilot.job_id)
        self.released[key] = ReleaseMark(self.clock())
        return "release sent (the pilot drains itself if still idle)"

    def _cleanup(self, obs: Observation) -> list[tuple[str, str]]:
        """Follow released pilots: forget refused releases, cancel the SLURM job of a
        pilot whose startd is gone (and runs nothing per the schedd) but which lingers."""
        out = []
        now = self.clock()
        if not obs.snapshot.pool_known:
            return out
        for key, mark in list(self.released.items()):
            site, job_id = key.split("/", 1)
            if site not in obs.jobs:
                continue  # site unknown this cycle: decide nothing
            if not any(j.job_id == job_id for j in obs.jobs[site]):
                del self.released[key]  # the pilot left, as asked
                continue
            ad = obs.ads.get(key)
            if ad is not None:
                mark.ad_gone_since = None
                if not ad.draining and now - mark.sent_at > LINGER_S:
                    del self.released[key]  # refused: it took a job; it stays a pilot
                continue
            if mark.ad_gone_since is None:
                mark.ad_gone_since = now
            if runs_jobs(site, job_id, obs.running_on) or now - mark.ad_gone_since <= LINGER_S:
                continue
            try:
                self.backends[site].cancel(job_id)
                out.append((f"cancel {key}", "startd gone after release; job cancelled"))
                del self.released[key]
            except BackendError as exc:
                out.append((f"cancel {key}", f"failed: {exc}"))
        return out

    def act(self, obs: Observation, result: Plan) -> list[tuple[str, str]]:
        outcomes: list[tuple[str, str]] = []
        releases = [a for a in result.actions if isinstance(a, Release)]
        fresh: tuple[dict[str, PilotAd], frozenset[str]] | None = None
        if releases:
            try:  # one fresh schedd and collector read for all releases of this cycle
                fresh = (self.pool.pilot_ads(), self.pool.queue().running_on)
            except PoolUnreachable as exc:
                log.error("no release this cycle, collector unreadable: %s", exc)
        for action in result.actions:
            text = describe(action)
            try:
                if isinstance(action, Submit):
                    outcome = self._submit(action)
                elif isinstance(action, Release):
                    outcome = self._release(action, fresh)
                elif isinstance(action, Cancel):
                    pending = action.pilot.state is PilotState.PENDING
                    if pending:  # withdrawn, not failed (if it started meanwhile, it
                        self.breakers.withdraw(action.pilot.key)  # stays and is re-tracked)
                    self.backends[action.pilot.site].cancel(action.pilot.job_id,
                                                            only_pending=pending)
                    outcome = "cancelled if still pending" if pending else "cancelled"
                elif isinstance(action, Flag | Unflag):
                    outcome = "ok"
                else:
                    outcome = "unknown action"
            except BackendError as exc:
                outcome = f"failed: {exc}"
                log.error("%s: %s", text, outcome)
            except Exception as exc:  # one broken action must not stop the others
                outcome = f"failed: {type(exc).__name__}: {exc}"
                log.exception("%s: %s", text, outcome)
            outcomes.append((text, outcome))
        outcomes.extend(self._cleanup(obs))
        return outcomes

    # --- one cycle -------------------------------------------------------
    def run_cycle(self, reason: str = "manual", dry_run: bool = False,
                  started: float | None = None) -> CycleResult:
        """One full cycle. `started` is when the check that asked for it ran (the
        cadence counts from there: a cycle stamped after observing would make the
        next quick check come a few ms short of its interval, and wait one more)."""
        started = self.clock() if started is None else started
        t0 = time.monotonic()
        obs = self.observe()
        t1 = time.monotonic()
        now = self.clock()
        result = planner.plan(obs.snapshot, self.config, now)
        t2 = time.monotonic()
        cycle = CycleResult(reason, obs, result)
        if not dry_run:
            cycle.outcomes = self.act(obs, result)
            self.flagged, self.idle_cycles = planner.carry_over(obs.snapshot, result, now)
            self.last_mark = CycleMark(
                at=started, idle_jobs=sum(d.idle for d in obs.snapshot.demand),
                # As the quick check sees them (a ghost ad included), or a ghost
                # would look newly idle at every check.
                idle_pilots=idle_ad_keys(obs.ads),
                flagged=len(self.flagged), unplaced=result.unplaced_jobs,
                reserve=result.reserve_jobs)
        t3 = time.monotonic()
        cycle.timings = {"observe": t1 - t0, "plan": t2 - t1, "act": t3 - t2}
        self.cycles += 1
        line = summary_line(cycle)
        log.info("cycle %d (%s): %s", self.cycles, reason, line)
        if not dry_run:
            cid = self.journal.cycle(reason, line, cycle.timings)
            for text, outcome in cycle.outcomes:
                kind = text.split(" ", 1)[0]
                site, job_id = action_target(text)
                self.journal.action(cid, kind, site, job_id, text, outcome)
            self.journal.put("flagged", self.flagged)
            self.journal.put("breakers", self.breakers.snapshot(now))
            self.journal.put("last_cycle", {"at": now, "summary": line})
        return cycle

    def tick(self) -> CycleResult | None:
        """The cheap check; runs a full cycle when cadence says one is due."""
        now = self.clock()
        try:
            idle = self.pool.idle_count()
            idle_pilots = idle_ad_keys(self.pool.pilot_ads())
        except PoolUnreachable as exc:
            log.warning("quick check failed: %s", exc)
            idle, idle_pilots = 0, frozenset()
            if self.last_mark is not None and now - self.last_mark.at < \
                    self.config.policy.interval_s:
                return None
        reason = cycle_due(now, Probe(idle, idle_pilots), self.last_mark, self.config.policy)
        if not reason:
            return None
        return self.run_cycle(reason, started=now)


def action_target(text: str) -> tuple[str, str]:
    """(site, job id) of an action's text: "release gsi/12" or "submit 2 at gsi (...)"."""
    words = text.split()
    if len(words) >= 2 and "/" in words[1]:
        site, job_id = words[1].split("/", 1)
        return site, job_id
    if "at" in words:
        return words[words.index("at") + 1], ""
    return "", ""


def summary_line(cycle: CycleResult) -> str:
    snap = cycle.observation.snapshot
    demand = sum(d.idle for d in snap.demand)
    parts = [f"demand {demand} idle jobs in {len(snap.demand)} shapes"
             if snap.pool_known else "pool UNKNOWN"]
    for view in snap.sites:
        if not view.known:
            parts.append(f"{view.name}: UNKNOWN")
            continue
        states = Counter(p.state.value for p in snap.pilots if p.site == view.name)
        parts.append(f"{view.name}: " + (" ".join(f"{n} {s}" for s, n in sorted(states.items()))
                                         or "no pilots"))
    if cycle.plan.reserve_jobs:
        left = "?" if snap.recent_departures is None else snap.recent_departures
        parts.append(f"reserve {cycle.plan.reserve_held}/{cycle.plan.reserve_jobs} slots "
                     f"(arrived {sum(d.idle for d in snap.recent_arrivals)}, left {left} "
                     f"in {snap.arrival_window_s:.0f} s)")
    if cycle.plan.unmatchable:
        parts.append(f"unmatchable {sum(u.idle for u in cycle.plan.unmatchable)}")
    acts = [describe(a) for a in cycle.plan.actions]
    parts.append("actions: " + (", ".join(acts) if acts else "none"))
    t = cycle.timings
    parts.append(f"observe {t.get('observe', 0):.2f}s plan {t.get('plan', 0) * 1000:.1f}ms "
                 f"act {t.get('act', 0):.2f}s")
    return "; ".join(parts)


def run_forever(prov: Provisioner) -> None:
    """The service: an APScheduler interval job, one instance at a time, missed runs coalesced."""
    from apscheduler.schedulers.blocking import BlockingScheduler

    sched = BlockingScheduler()

    def job() -> None:
        try:
            prov.tick()
        except Exception:  # one bad cycle must never stop the service
            log.exception("cycle failed; the next one runs as scheduled")

    sched.add_job(job, "interval", seconds=prov.config.policy.quick_check_s,
                  max_instances=1, coalesce=True)
    log.info("provisioner %s: %d site(s), interval %.0f s, quick check %.0f s",
             prov.config.pool.provisioner_id, len(prov.config.sites),
             prov.config.policy.interval_s, prov.config.policy.quick_check_s)
    job()
    try:
        sched.start()
    except (KeyboardInterrupt, SystemExit):
        log.info("stopping")
