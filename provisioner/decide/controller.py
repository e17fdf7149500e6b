"""The decision state that spans cycles, in one pure object shared by the service and the
simulator.

`Controller` holds everything a cycle remembers from earlier cycles: pilot flags and their
idle observations, the cadence mark of the last full cycle, the queue history that sizes the
reserve's departures, the releases sent and not yet finished. It does no I/O and reads no
clock: every method takes `now`. The service (`provisioner.service.loop.Provisioner`) observes,
asks the controller, and acts; the simulator (`bench.sim.policies.PlanPolicy`) does the same
against its virtual world, so both run the very same cycle (both through the one tick driver,
`provisioner.service.ticker`).

What `plan()` reads of all this is one record, `CycleMemory`, handed to it beside the
observation: ``plan(snapshot, memory, config, now)``. The snapshot holds only what this cycle
observed; `prepare` builds the memory from the last cycle's decisions (`Controller.memory`:
flags, idle observations, unneeded and drained counts, hedges, retirements) and what the
controller's learners know at `now` (lead times, circuit breakers, SLURM limits, the queue's
history for the reserve).

Contract of one cycle, in order (steps 0-4 are `provisioner.service.ticker`'s `tick` and
`decide`, which the service and the simulator both call):

0. At every timer tick (`check_period()`), ``controller.look(now)`` says what to read:
   pilot ads (and, for "probe", the idle job count); ``controller.reschedule_due(...)``
   says whether to ask the schedd for a negotiation (a pilot joined while jobs wait).
   Only a "probe" goes on:
1. ``reason = controller.due(now, probe)``: whether a full cycle runs now ("" = not).
2. ``since = controller.arrivals_since(now)``: the start of the arrival window to query
   (None: the reserve is off, do not query arrivals).
3. Observe into a `Snapshot`: what this cycle saw, nothing remembered.
4. ``plan = controller.cycle(snapshot, now, QueueSize(total, older))``: decides (calls the
   pure ``plan(snapshot, memory, config, now)`` with the memory `prepare` builds) and
   carries the state over to the next cycle. Apply `plan.actions`.
5. After pilots were submitted: ``controller.submitted(keys)`` (the circuit breaker
   follows them from then on, even if one starts and dies before the next cycle looks).
   Each `Submit` sent, with the job ids it got and the error that stopped it:
   ``controller.sent(action, ids, error, now)`` (SLURM's limits, `provisioner.decide.limits`);
   after a failure, ``controller.replan(now)`` places what the failed site was to take
   at the other sites in the same cycle (`provisioner.service.submitter` drives both).
   After a release was sent: ``controller.released(key, now)``; once per cycle, with the
   pool's view, ``controller.follow_releases(now, view)`` names the SLURM jobs of released
   pilots to cancel (startd gone, job lingering). A `Retire` or `Unretire` counts as sent
   when the cycle decides it; if sending failed: ``controller.not_sent(action)``.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from provisioner.config import Config
from provisioner.decide.answers import SubmitAnswers, _held
from provisioner.decide.arrivals import ArrivalTimes, QueueHistory, departures
from provisioner.decide.breaker import SiteBreakers
from provisioner.decide.cadence import SLACK, CycleMark, Probe, cycle_due
from provisioner.decide.estimates import Estimates
from provisioner.decide.limits import SiteLimits
from provisioner.decide.plan import carry_over, plan
from provisioner.decide.reserve import NoClaimWatch, ShapeRates
from provisioner.decide.scaledown import drained_empty
from provisioner.decide.stuck import StuckGroups
from provisioner.model import (
    Action,
    Cancel,
    CycleMemory,
    Pilot,
    PilotState,
    Plan,
    Retire,
    Snapshot,
    Submit,
    Unretire,
)

log = logging.getLogger(__name__)

_UP = (PilotState.IDLE, PilotState.BUSY, PilotState.DRAINING)

#: A released pilot whose startd ad has been gone this long, on which the schedd runs no
#: job, and whose SLURM job lingers, is cancelled. A released pilot that still advertises
#: itself, not draining, this long after the release refused it (it took a job) and is
#: forgotten.
LINGER_S = 60.0

#: Pilots still idle beside waiting jobs this long after a negotiation was asked for are
#: asked for again (`Controller.reschedule_due`), at most MAX_REASKS times in a row.
REASK_S = 30.0
MAX_REASKS = 3


@dataclass
class ReleaseMark:
    """A release sent at `sent_at`; `ad_gone_since` is when its startd ad was first missed."""

    sent_at: float
    ad_gone_since: float | None = None


@dataclass(frozen=True)
class QueueSize:
    """The schedd's queue at this cycle: all jobs, and those submitted before the window."""

    total: int
    older: int


@dataclass(frozen=True)
class PoolView:
    """What following releases needs to see, per pilot key ("site/job_id").

    `jobs`: the live SLURM job ids of every site read this cycle (unknown sites absent);
    `ads`: pilot key -> whether its startd ad says draining (keys without an ad absent);
    `running`: pilot keys on whose startd the schedd runs a job."""

    jobs: Mapping[str, frozenset[str]]
    ads: Mapping[str, bool]
    running: frozenset[str] = frozenset()


@dataclass
class Controller(SubmitAnswers):
    """Pure cycle state; see the module docstring for the calling contract (what it
    learns from SLURM's answers to its submissions: `SubmitAnswers`)."""

    config: Config
    #: what the last cycle decided to carry over (flags, idle observations, unneeded and
    #: drained counts, hedges, retirements); `prepare` adds what is learnt at each cycle
    memory: CycleMemory = field(default_factory=CycleMemory)
    releases: dict[str, ReleaseMark] = field(default_factory=dict)
    mark: CycleMark | None = None
    probed: Probe | None = None  # the last quick check's probe
    probed_at: float | None = None  # when it was taken
    seen_idle: frozenset[str] = frozenset()  # idle pilots a negotiation was asked for
    asked_at: float | None = None  # when a negotiation was last asked for
    held_for: CycleMark | None = None  # the mark after which a cycle was held for one
    reasks: int = 0  # asked again since, for pilots still idle beside waiting jobs
    history: QueueHistory = field(init=False)
    estimates: Estimates = field(init=False)
    breakers: SiteBreakers = field(init=False)
    #: shapes idle beside fitting unclaimed pilots, and those found stuck
    stuck: StuckGroups = field(init=False)
    arrivals: ArrivalTimes = field(init=False)  # distinct arrival times
    reserves: deque[tuple[float, int]] = field(default_factory=deque)  # (time, wanted)
    #: reserve pilots that ended unclaimed, and their shapes' arrivals then
    noclaim: NoClaimWatch = field(default_factory=NoClaimWatch)
    rates: ShapeRates = field(default_factory=ShapeRates)  # arrivals per shape
    #: circuit-breaker state changes seen by the last cycle (the service logs them)
    transitions: list[str] = field(default_factory=list)
    cycles: int = 0
    limits: SiteLimits = field(default_factory=SiteLimits)  # what SLURM's refusals taught
    #: the last cycle's input to `plan()`: its snapshot (stuck shapes marked) and memory
    #: (`replan` places anew from it; the service's cycle line reads the memory)
    planned: tuple[Snapshot, CycleMemory] | None = None
    #: this cycle's pilots submitted so far (as pending pilots) and sites that failed
    just_sent: list[Pilot] = field(default_factory=list)
    failed_sites: set[str] = field(default_factory=set)
    #: this cycle's (site, allocation) whose sbatch SLURM refused for the allocation alone
    failed_allocations: set[tuple[str, str]] = field(default_factory=set)
    #: (site, allocation) -> why: allocations whose account SLURM refused, stopped until
    #: the service restarts (`stopped_allocations`)
    allocation_stops: dict[tuple[str, str], str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        r = self.config.policy.reserve
        self.history = QueueHistory(max(r.window_s, r.evidence_s))
        self.arrivals = ArrivalTimes(r.evidence_s, self.config.policy.quick_check_s)
        self.estimates = Estimates(self.config.policy.placement)
        b = self.config.policy.breaker
        self.breakers = SiteBreakers(b.threshold, b.base_s, b.max_s)
        self.stuck = StuckGroups(self.config.policy.stuck_after_s,
                                 self.config.policy.stuck_retry_s)
        self.limits.probe_s = self.config.policy.limit_probe_s

    # -- what survives a restart -------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """JSON-able learnt state: site lead-time estimates, circuit breakers, the pilots
        told to retire (a restarted service can still withdraw the order) and the job
        shapes found stuck. The service persists it (journal key "controller");
        `provisioner status` reads the breakers, estimates and stuck shapes from there."""
        return {"estimates": self.estimates.to_dict(), "breakers": self.breakers.to_dict(),
                "retiring": sorted(self.memory.retiring), "waits_counted": self.estimates.counted(),
                "boots_pending": self.estimates.booting(),
                "stuck": self.stuck.to_list(), "limits": self.limits.to_dict()}

    def load(self, data: dict[str, Any] | None) -> None:
        """Restore what `state()` returned (missing or malformed parts are ignored)."""
        data = data or {}
        self.estimates.load(data.get("estimates") or {})
        counted = data.get("waits_counted")
        if isinstance(counted, list):
            self.estimates.load_counted(counted)
        booting = data.get("boots_pending")
        if isinstance(booting, list):
            self.estimates.load_booting(booting)
        self.breakers.load(data.get("breakers") or {})
        self.limits.load(data.get("limits") or {})
        stuck = data.get("stuck")
        if isinstance(stuck, list):
            self.stuck.load(stuck)
        retiring = data.get("retiring")
        if isinstance(retiring, list):
            self.memory = replace(self.memory, retiring=frozenset(
                k for k in retiring if isinstance(k, str) and "/" in k))

    # -- cadence -----------------------------------------------------------------------
    def due(self, now: float, probe: Probe) -> str:
        """Why a full cycle is due at `now` given the cheap `probe`, or "". A pilot that
        became idle while jobs wait brings no cycle within a quick check of a
        negotiation asked for (`reschedule_due`, `negotiating`); the first quick check
        after that runs it if the pilot is still idle. Held back once per cycle."""
        previous, self.probed, self.probed_at = self.probed, probe, now
        reason = cycle_due(now, probe, self.mark, self.config.policy, previous)
        if (reason == "pilot became idle" and self.held_for is not self.mark
                and self.negotiating(now, probe)):
            self.held_for = self.mark  # once per cycle: pilots that keep joining
            return ""                  # must not hold the cycle back for good
        return reason

    def negotiating(self, now: float, probe: Probe) -> bool:
        """Whether the negotiation asked for last (`reschedule_due`) may still be placing
        `probe`'s waiting jobs: asked for less than a quick check ago (less `SLACK`).
        A cycle then would read the queue while the schedd claims the new pilot: its
        jobs still idle (they turn running only once their shadows start), the pilot
        already busy, so the waiting jobs would look unplaced and bring one more
        pilot (seen in the testbed once the claim came within 0.2 s of the ad)."""
        quick = self.config.policy.quick_check_s
        return (probe.idle_jobs > 0 and self.asked_at is not None
                and now - self.asked_at < quick * (1 - SLACK))

    # -- pilots joining --------------------------------------------------------------------
    def look(self, now: float) -> str:
        """What to read at this timer tick: "probe" (the quick check: idle jobs and
        pilot ads, then `reschedule_due` and `due`), "join" (pilot ads only, then
        `reschedule_due`) or "" (nothing)."""
        period = self.config.policy.quick_check_s
        if self.probed_at is None or now - self.probed_at >= period * (1 - SLACK):
            return "probe"
        return "join" if self.watching() else ""

    def watching(self) -> bool:
        """Whether pilots are on their way into the pool while jobs wait: then their ads
        are read every `join_check_s`, between quick checks."""
        idle_jobs = self.probed.idle_jobs if self.probed is not None else 0
        return (self.config.policy.join_check_s > 0 and self.mark is not None
                and self.mark.joining > 0 and max(idle_jobs, self.mark.idle_jobs) > 0)

    def check_period(self) -> float:
        """Seconds to the next check: `join_check_s` while watching, else
        `quick_check_s`."""
        policy = self.config.policy
        return policy.join_check_s if self.watching() else policy.quick_check_s

    def reschedule_due(self, idle_pilots: frozenset[str], idle_jobs: int | None,
                       now: float) -> bool:
        """Whether to ask for a negotiation now: a pilot is idle that was not at the last
        look, while jobs wait (`idle_jobs` None: not counted at this look; the last
        count stands). Each pilot that becomes idle counts once; pilots still idle beside
        waiting jobs `REASK_S` after the last request are asked for again, at most
        `MAX_REASKS` times: a match the negotiator made can be lost on the way to the
        pilot (the schedd's claim refused, or sent over a security session that a
        restarted collector no longer knows), and the negotiator's own next cycle may be
        minutes away. Jobs that arrived since the last look (more idle than then) while
        room waits for them (an idle pilot, or the reserve the last cycle kept, which
        may lie in busy pilots) ask too: the negotiator's next cycle may be most of its
        interval away, and a reserve is kept so that arrivals do not wait."""
        before = self.probed.idle_jobs if self.probed is not None else 0
        arrived = idle_jobs is not None and idle_jobs > before and (
            bool(idle_pilots) or (self.mark is not None and self.mark.reserve > 0))
        idle_jobs = before if idle_jobs is None else idle_jobs
        new, self.seen_idle = idle_pilots - self.seen_idle, idle_pilots
        if self.config.policy.join_check_s <= 0 or idle_jobs <= 0:
            return False
        if new or arrived:
            self.asked_at, self.reasks = now, 0
            return True
        if (idle_pilots and self.asked_at is not None
                and now - self.asked_at >= REASK_S and self.reasks < MAX_REASKS):
            self.asked_at, self.reasks = now, self.reasks + 1
            return True
        return False

    # -- the reserve's window ----------------------------------------------------------
    def window(self, now: float) -> float:
        """The arrival window at `now` (`ArrivalTimes.window`: ``window_s``, longer for
        sparse arrivals)."""
        r = self.config.policy.reserve
        return self.arrivals.window(now, r.window_s, r.window_gaps)

    def arrivals_since(self, now: float) -> float | None:
        """Start of the arrival window to query at `now`; None when the reserve is off."""
        if not self.config.policy.reserve.enabled:
            return None
        return self.history.baseline(now, self.window(now))[0]

    # -- one cycle -----------------------------------------------------------------------
    def cycle(self, snapshot: Snapshot, now: float, queue: QueueSize | None = None,
              commit: bool = True, idle_ads: frozenset[str] | None = None) -> Plan:
        """Decide this cycle's actions for `snapshot` observed at `now` (the time the cycle
        began, before observing). `queue` (None: unknown) sizes the reserve's departures.
        `idle_ads`: the idle pilots as the quick check sees them (startd ads, a ghost's
        included; None: the snapshot's idle pilots), for the cadence mark. With
        `commit=False` (a dry run) nothing is remembered."""
        snap, memory = self.prepare(snapshot, now, queue, commit)
        result = plan(snap, memory, self.config, now)
        self.planned = (snap, memory)
        if commit:
            self.just_sent, self.failed_sites, self.failed_allocations = [], set(), set()
            self.remember(snap, memory, result, now, idle_ads)
        return result

    def prepare(self, snapshot: Snapshot, now: float, queue: QueueSize | None = None,
                commit: bool = True) -> tuple[Snapshot, CycleMemory]:
        """What `plan()` is given for `snapshot` observed at `now`: the snapshot, its
        stuck shapes marked as matching no site (`provisioner.decide.stuck`), and the
        `CycleMemory`: the last cycle's (flags, idle observations, pending pilots'
        unneeded cycles and hedges, retirements), drained pilots counted, and what was
        learnt brought up to `now` (the arrival window and the departures during it, the
        site estimates, circuit-breaker and SLURM limits, the reserve's history). With
        `commit`, this cycle's pilots, idle shapes and arrivals are learnt from first."""
        known = {v.name for v in snapshot.sites if v.known}
        seen = [p for p in snapshot.pilots if p.site in known]
        since, size_then = self.history.baseline(now, self.window(now))  # as arrivals_since
        if commit:
            self.arrivals.count(snapshot.last_arrival_at, now)
            self.transitions = []
        if commit and snapshot.pool_known:
            self.estimates.observe(seen, now, known)
            for site in sorted(known):
                # joined: up in the pool, or it has a startd ad (a name) while ending
                self.transitions += self.breakers.observe(
                    site, [p.key for p in seen if p.site == site],
                    [p.key for p in seen if p.site == site
                     and (p.name is not None or p.state in _UP)], now)
            self.transitions += self.stuck.observe(snapshot, self.config, now)
            for site in sorted(known):
                here = [p for p in seen if p.site == site]
                limited = Counter(p.limit_reason for p in here if p.limit_reason)
                started = sum(1 for p in here if p.state is not PilotState.PENDING)
                self.transitions += [line for line in self.limits.observe(
                    site, len(here), limited, now, started) if line]
            self.noclaim.observe(snapshot, self.config, now)
        in_flight = dict(Counter(p.site for p in seen
                                 if p.state in (PilotState.PENDING, PilotState.STARTING)))
        drained = {p.key: self.memory.drained_cycles.get(p.key, 0) for p in snapshot.pilots
                   if drained_empty(p) and p.key not in self.releases}
        window, left = 0.0, None
        if snapshot.pool_known and queue is not None:
            if commit:
                self.history.record(now, queue.total)
            if self.config.policy.reserve.enabled:
                window = now - since
                left = departures(size_then, queue.older)
        snap = replace(snapshot, demand=self.stuck.mark(snapshot.demand),
                       recent_arrivals=self.stuck.mark(snapshot.recent_arrivals))
        window = window if snapshot.recent_arrivals else 0.0
        times = self.arrivals.since(since) if window else 0
        if commit and snap.scale_down_ok:  # rates from the whole queue only
            self.rates.observe(snap, window, self.config, now, times)
        memory = replace(
            self.memory, drained_cycles=drained, estimates=dict(self.estimates.sites),
            submit_limit=self.breakers.limits(now, in_flight),
            limit_room=self.limits.rooms(_held(snapshot.pilots), self.config.site_names, now),
            pilot_limits={site: c.jobs for site, c in self.limits.caps.items()},
            probing=self.breakers.probing(), arrival_window_s=window, recent_departures=left,
            arrival_times=len(self.arrivals), arrivals_in_window=times,
            reserve_hold=max((n for _t, n in self.reserves), default=0),
            reserve_spent=self.noclaim.limits(), shape_rates=self.rates.rates(now),
            stopped_allocations=self.stopped_allocations)
        return snap, memory

    def remember(self, snapshot: Snapshot, memory: CycleMemory, result: Plan, now: float,
                 idle_ads: frozenset[str] | None = None) -> None:
        """Carry flags, idle observations, unneeded and drained counts, hedges and
        retirements over into `self.memory` (from the cycle that planned `result` on
        `snapshot` and `memory`), and set the cadence mark."""
        last = self.memory
        flagged, idle_cycles = carry_over(snapshot, memory, result, now)
        unneeded, hedged = last.unneeded_cycles, last.hedged
        drained, retiring = last.drained_cycles, set(last.retiring)
        self.reserves.append((now, result.reserve_sized))
        while self.reserves and self.reserves[0][0] <= now - result.reserve_lead_s:
            self.reserves.popleft()
        if snapshot.scale_down_ok:  # counts towards a scale-down from the whole queue only
            known = {v.name for v in snapshot.sites if v.known}
            present = {p.key for p in snapshot.pilots}
            unneeded = {k: n for k, n in memory.unneeded_cycles.items()
                        if k in present and k.split("/", 1)[0] not in known}
            unneeded.update({k: memory.unneeded_cycles.get(k, 0) + 1 for k in result.unneeded})
            hedged = (last.hedged | set(result.hedges)) & present
            drained = {k: n + 1 for k, n in memory.drained_cycles.items()}
            self.noclaim.after(snapshot, result.actions, result.reserve_jobs)
            retiring = {k for k in retiring if k in present or k.split("/", 1)[0] not in known}
            for a in result.actions:
                if isinstance(a, Cancel) and a.pilot.state is PilotState.PENDING:
                    # withdrawn, not failed (if it started meanwhile, it stays and the
                    # next cycle follows it again)
                    self.breakers.withdraw(a.pilot.key)
                elif isinstance(a, Retire):
                    retiring.add(a.pilot.key)
                elif isinstance(a, Unretire):
                    retiring.discard(a.pilot.key)
        self.memory = CycleMemory(flagged=flagged, idle_cycles=idle_cycles,
                                  unneeded_cycles=unneeded, hedged=frozenset(hedged),
                                  drained_cycles=drained, retiring=frozenset(retiring))
        self.mark = CycleMark(
            at=now, idle_jobs=sum(d.idle for d in snapshot.demand),
            # as the quick check will see them, or a ghost ad would look newly idle at
            # every check
            idle_pilots=idle_ads if idle_ads is not None else frozenset(
                p.key for p in snapshot.pilots if p.state is PilotState.IDLE),
            # drained pilots await their next observation as flagged ones do
            flagged=len(flagged) + len(drained), unplaced=result.unplaced_jobs,
            reserve=result.reserve_jobs, joining=_joining(snapshot, result))
        self.cycles += 1

    # -- submissions and releases --------------------------------------------------------
    def submitted(self, keys: Iterable[str]) -> None:
        """Pilots just submitted ("site/job_id"): the circuit breaker follows them."""
        self.breakers.track(keys)

    def released(self, key: str, now: float) -> None:
        """A release of pilot `key` was sent at `now`."""
        self.releases[key] = ReleaseMark(now)

    def follow_releases(self, now: float, view: PoolView) -> list[str]:
        """Pilot keys whose SLURM job to cancel now: released, startd ad gone for more than
        `LINGER_S`, no job running there, job still in SLURM. Releases that finished (job
        gone) or were refused (ad back, not draining, after `LINGER_S`) are forgotten; sites
        not read this cycle are left alone. A key returned stays followed until
        `cancelled(key)` says its cancel went through."""
        out = []
        for key, mark in list(self.releases.items()):
            site, job_id = key.split("/", 1)
            if site not in view.jobs:
                continue
            if job_id not in view.jobs[site]:
                del self.releases[key]  # the pilot left, as asked
                continue
            draining = view.ads.get(key)
            if draining is not None:
                mark.ad_gone_since = None
                if not draining and now - mark.sent_at > LINGER_S:
                    del self.releases[key]  # refused: it took a job; it stays a pilot
                continue
            if mark.ad_gone_since is None:
                mark.ad_gone_since = now
            if key in view.running or now - mark.ad_gone_since <= LINGER_S:
                continue
            out.append(key)
        return out

    def not_sent(self, action: Action) -> None:
        """A `Retire` or `Unretire` of this cycle could not be sent: the pilot keeps its
        former order, so the next cycle decides (and sends) again."""
        retiring = self.memory.retiring
        if isinstance(action, Retire):
            retiring = retiring - {action.pilot.key}
        elif isinstance(action, Unretire):
            retiring = retiring | {action.pilot.key}
        self.memory = replace(self.memory, retiring=retiring)

    def cancelled(self, key: str) -> None:
        """The SLURM job of released pilot `key` was cancelled: stop following it."""
        self.releases.pop(key, None)


def _joining(snapshot: Snapshot, result: Plan) -> int:
    """Pilots on their way into the pool after this cycle: pending or starting ones not
    cancelled, and those just submitted."""
    cancelled = {a.pilot.key for a in result.actions if isinstance(a, Cancel)}
    return (sum(1 for p in snapshot.pilots if p.key not in cancelled
                and p.state in (PilotState.PENDING, PilotState.STARTING))
            + sum(a.count for a in result.actions if isinstance(a, Submit)))
