"""Plain data exchanged between the observe, plan and act phases.

Everything here is immutable and free of I/O. The service builds a `Snapshot` from the
schedd, the collector and `squeue` (what this cycle observed); the controller adds its
`CycleMemory` (what earlier cycles left); `provisioner.decide.plan.plan()` turns the two
into a `Plan` whose `actions` the service applies.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any

#: The startd rounds every job's RequestMemory up to a multiple of this (MB).
MEMORY_ROUNDING_MB = 128


def round_memory(memory_mb: int) -> int:
    """RequestMemory as the startd will carve it: rounded up to a multiple of 128 MB."""
    if memory_mb <= 0:
        return 0
    return -(-memory_mb // MEMORY_ROUNDING_MB) * MEMORY_ROUNDING_MB


@dataclass(frozen=True, order=True)
class JobShape:
    """What one idle job asks for; jobs with equal shapes are counted together."""

    cpus: int  # RequestCpus
    memory_mb: int  # RequestMemory (MB)
    disk_kb: int = 0  # RequestDisk (KB)
    gpus: int = 0  # RequestGPUs
    runtime_s: int | None = None  # expected runtime if the job states one, else None
    desired_sites: tuple[str, ...] = ()  # empty = any site
    #: The job's Requirements expression as text ("" = not read: matched on resources
    #: alone) and the job attributes it reads besides the requests, as (name, ClassAd
    #: literal) pairs: with the requests, all a pilot's match depends on.
    requirements: str = ""
    match_attrs: tuple[tuple[str, str], ...] = ()
    #: The job's accounting group (AcctGroup), read only where some site has
    #: allocations (`Config.groups_in_use`); "" = no group, or groups not in use.
    group: str = ""

    @property
    def rounded_memory_mb(self) -> int:
        """Memory the startd will actually reserve for this job."""
        return round_memory(self.memory_mb)


@dataclass(frozen=True)
class Demand:
    shape: JobShape
    idle: int  # number of idle jobs with this shape
    #: The sites whose pilot would match the shape's Requirements (computed while
    #: observing, `provisioner.pool.prototype`); None: not evaluated, any site with the
    #: resources matches.
    sites: frozenset[str] | None = None
    #: Why no site matches (when `sites` is empty).
    mismatch: str = ""


class PilotState(str, Enum):
    PENDING = "pending"  # queued in SLURM
    STARTING = "starting"  # running in SLURM, no startd ad yet
    IDLE = "idle"  # ad present, no claimed resources
    BUSY = "busy"  # ad present, at least one claimed slot
    DRAINING = "draining"  # ad says draining / we asked it to drain
    ENDING = "ending"  # SLURM completing / ad gone after running


@dataclass(frozen=True)
class Pilot:
    site: str
    job_id: str  # SLURM job id (string)
    state: PilotState
    cpus: int  # allocation cores
    memory_mb: int
    submitted_at: float  # epoch seconds
    started_at: float | None = None
    walltime_end: float | None = None  # epoch seconds when SLURM will kill it
    free_cpus: int = 0  # unclaimed cpus in the partitionable slot; for PENDING/STARTING = cpus
    free_memory_mb: int = 0
    claimed_since: float | None = None
    name: str | None = None  # startd Name / Machine in the collector (for drain)
    gpus: int = 0  # allocation GPUs
    free_gpus: int = 0  # unclaimed GPUs in the partitionable slot; for PENDING/STARTING = gpus
    joined_at: float | None = None  # its startd's start (DaemonStartTime), once in the pool
    #: PENDING at a job-count limit of the account (SLURM's reason, e.g.
    #: QOSMaxJobsPerUserLimit): no capacity on its way; "" otherwise.
    limit_reason: str = ""
    #: The SLURM account the pilot is charged to (squeue's account): at a site with
    #: allocations, it names the allocation whose groups the pilot serves; "" = unknown.
    account: str = ""
    #: "site/job_id", unique over all sites (derived, computed once).
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", f"{self.site}/{self.job_id}")


def by_state(pilots: Iterable[Pilot]) -> dict[PilotState, list[Pilot]]:
    """The pilots of each state (every state a key), each list in the order given: one
    pass for the stages of a cycle that read only some states (most pilots are busy)."""
    out: dict[PilotState, list[Pilot]] = {state: [] for state in PilotState}
    for p in pilots:
        out[p.state].append(p)
    return out


@dataclass(frozen=True)
class SiteView:
    name: str
    known: bool  # False if squeue failed this cycle -> no actions at this site
    error: str = ""


@dataclass(frozen=True)
class SiteEstimate:
    """What the controller has learnt about a site's lead time (seconds)."""

    wait_s: float  # SLURM queue wait: submit -> start (moving average)
    boot_s: float  # start -> startd in the pool
    samples: int = 0  # queue waits observed (0: a configured default)


@dataclass(frozen=True)
class FailingStarts:
    """Idle jobs of one shape whose last start failed before they really ran (the
    starter's own error, `provisioner.decide.failed_starts`): `jobs` of them, the most failed
    starts among them (the schedd's cool-downs), one's error (VacateReason), and how
    many of them are in the schedd's cool-down (not started again before the pool's
    policy holds them)."""

    shape: JobShape
    jobs: int
    failed_starts: int
    reason: str
    cooling: int = 0


@dataclass(frozen=True)
class AllocationBooks:
    """What one allocation has spent this period, as the service's books hold it
    (`provisioner.service.books`): SLURM's charge where it can be read, the ledger's
    otherwise. `known` False (the journal unreadable): nothing may be committed."""

    site: str
    allocation: str  # sites[].allocations[].name
    spent: float  # units of the allocation's `unit`, this period, pilots still running included
    known: bool = True
    error: str = ""


@dataclass(frozen=True)
class Snapshot:
    """What one cycle observed: the idle demand, the pilots, which sites and schedds
    could be read, the recent arrivals. Nothing remembered from earlier cycles is in it
    (that is the `CycleMemory` beside it)."""

    demand: tuple[Demand, ...]
    pilots: tuple[Pilot, ...]
    sites: tuple[SiteView, ...]
    pool_known: bool = True  # False if no schedd or the collector unreadable -> no actions
    #: Schedds that could not be read while others could: their demand and busy startds
    #: are missing (unknown, not empty). Readable demand is provisioned for; nothing is
    #: scaled down (`scale_down_ok`).
    schedds_unknown: tuple[str, ...] = ()
    #: Jobs submitted within the arrival window (`CycleMemory.arrival_window_s`: QDate >=
    #: now - window) that are still in the queue, any state, grouped by shape
    #: (`Demand.idle` holds the count). Sizes the predictive reserve (`policy.reserve`).
    recent_arrivals: tuple[Demand, ...] = ()
    #: Submission time of the newest job in the queue (None: unknown or empty queue): the
    #: reserve decays once arrivals stop.
    last_arrival_at: float | None = None
    #: idle jobs whose last start failed, by shape (their real cause, for the reports;
    #: those not cooling down are in `demand` too: a pilot serves their next try).
    failing: tuple[FailingStarts, ...] = ()
    #: What each allocation has spent this period (one entry per configured allocation);
    #: an allocation absent from it is unknown: no new pilot is charged to it.
    books: tuple[AllocationBooks, ...] = ()

    @property
    def scale_down_ok(self) -> bool:
        """The whole queue was read: a pilot may be flagged, released, retired or
        cancelled for want of demand."""
        return self.pool_known and not self.schedds_unknown


@dataclass(frozen=True)
class CycleMemory:
    """What earlier cycles left for this one, as `plan()` reads it beside the `Snapshot`.

    The controller (`provisioner.decide.controller.Controller`) keeps it between cycles
    and hands it over with each observation; every field is optional: the default is a
    first cycle, nothing remembered.
    """

    # -- the pilots' hysteresis: what earlier cycles decided about them
    #: pilot key -> time it was flagged
    flagged: dict[str, float] = field(default_factory=dict)
    #: pilot key -> number of consecutive cycles it has been observed idle *before* this
    #: one (absent: a flagged pilot counts as idle once).
    idle_cycles: dict[str, int] = field(default_factory=dict)
    #: pending pilot key -> consecutive earlier cycles in which no demand needed it.
    unneeded_cycles: dict[str, int] = field(default_factory=dict)
    #: pending pilots whose jobs were already placed elsewhere once (hedged).
    hedged: frozenset[str] = frozenset()
    #: DRAINING pilot (drained by someone else) with nothing running -> consecutive
    #: earlier cycles seen so.
    drained_cycles: dict[str, int] = field(default_factory=dict)
    #: busy pilots told to leave when their jobs end (`Retire`), not withdrawn since.
    retiring: frozenset[str] = frozenset()
    # -- what was learnt of the sites
    #: site -> learnt lead time; sites absent use `policy.placement` defaults.
    estimates: dict[str, SiteEstimate] = field(default_factory=dict)
    #: site -> most new pilots allowed this cycle (circuit breaker); absent = no limit.
    submit_limit: dict[str, int] = field(default_factory=dict)
    #: site -> most new pilots its SLURM limits allow this cycle (a learnt submission or
    #: job limit, a back-off after a busy sbatch, a refused configuration: 0); absent =
    #: no limit known (`provisioner.decide.limits`).
    limit_room: dict[str, int] = field(default_factory=dict)
    #: site -> the pilots a learnt SLURM limit (submission or job count) lets it hold:
    #: its pilots are scarce, and new ones take the work's share of them
    #: (`provisioner.decide.sizing`); absent = no such limit known.
    pilot_limits: dict[str, int] = field(default_factory=dict)
    #: sites whose circuit breaker is half-open: their pending pilot is the probe.
    probing: frozenset[str] = frozenset()
    # -- the queue's history, for the predictive reserve (`provisioner.decide.reserve`)
    #: The arrival window `Snapshot.recent_arrivals` covers (seconds; 0: no reserve).
    arrival_window_s: float = 0.0
    #: Jobs submitted before the window that left the queue during it (finished, removed,
    #: held): with the arrivals this gives the queue's net growth, so the reserve can grow
    #: ahead of a rising queue. None = unknown (e.g. the service just started); the
    #: reserve then assumes departures equal arrivals (a queue that is not growing).
    recent_departures: int | None = None
    #: Distinct times at which jobs arrived within `policy.reserve.evidence_s` (None: not
    #: counted, taken as enough).
    arrival_times: int | None = None
    #: Distinct arrival times seen within the arrival window (`arrival_window_s`): each
    #: is at least one job, counted when seen, so jobs that already left the queue (a
    #: window longer than they run) are not lost, as they are from `recent_arrivals`.
    arrivals_in_window: int = 0
    #: The largest reserve wanted over the last lead time: the reserve follows the queue
    #: down one lead time late, so noise in its estimate does not release pilots that the
    #: next arrivals need.
    reserve_hold: int = 0
    #: Reserve shapes (cpus, gpus) whose reserve pilot ended by its no-claim shutdown ->
    #: the jobs of the shape the idle pilots left then have room for (`NoClaimWatch`):
    #: the shape's reserve holds no more slots than that until one of its jobs arrives.
    reserve_spent: dict[tuple[int, int], int] = field(default_factory=dict)
    #: Arrival rate (jobs/s) per shape (cpus, gpus) over ``reserve.evidence_s``; a shape
    #: absent: rated from the window's arrivals alone.
    shape_rates: dict[tuple[int, int], float] = field(default_factory=dict)
    # -- what SLURM's refusals stopped
    #: (site, allocation name) -> why: allocations whose account SLURM refused, stopped
    #: until the service restarts (`Controller.stopped_allocations`); no new pilot is
    #: charged to them.
    stopped_allocations: dict[tuple[str, str], str] = field(default_factory=dict)


# Actions: returned as data, applied by the service.


@dataclass(frozen=True)
class Submit:
    site: str
    count: int
    cpus: int
    memory_mb: int
    walltime_s: int
    reason: str = ""
    gpus: int = 0
    #: The allocation (sites[].allocations[].name) the pilots are charged to and whose
    #: groups alone they serve; "" = the site has no allocations.
    allocation: str = ""


@dataclass(frozen=True)
class Flag:
    pilot: Pilot
    reason: str = ""


@dataclass(frozen=True)
class Unflag:
    pilot: Pilot
    reason: str = ""


@dataclass(frozen=True)
class Release:
    """Drain gracefully, then scancel once the startd ad is gone."""

    pilot: Pilot
    reason: str = ""


@dataclass(frozen=True)
class Retire:
    """A busy pilot nothing queued needs: leave as soon as the running jobs end (it
    still takes jobs until then). Sent through the site (scancel --signal)."""

    pilot: Pilot
    reason: str = ""


@dataclass(frozen=True)
class Unretire:
    """Withdraw a `Retire`: demand returned; stay when the running jobs end."""

    pilot: Pilot
    reason: str = ""


@dataclass(frozen=True)
class Cancel:
    """A pending pilot with no demand: scancel directly."""

    pilot: Pilot
    reason: str = ""


Action = Submit | Flag | Unflag | Release | Cancel | Retire | Unretire


@dataclass(frozen=True)
class Unmatchable:
    shape: JobShape
    idle: int
    reason: str


class Cap(StrEnum):
    """What stopped a site from taking all the demand it fits this cycle; the value is
    the text a summary shows."""

    MAX_PILOTS = "max_pilots"  # the site's caps.max_pilots (pilots SLURM holds)
    MAX_PENDING = "max_pending"  # the site's caps.max_pending
    SITE_MAX_SUBMIT = "site max_submit_per_cycle"  # the site's caps.max_submit_per_cycle
    BREAKER = "circuit breaker"  # its open (or half-open) circuit breaker
    SLURM_LIMITS = "SLURM limits"  # what its SLURM limits allow, learnt from refusals
    POLICY_MAX_SUBMIT = "policy max_submit_per_cycle"  # the global per-cycle cap
    SITE_UNKNOWN = "site unknown"  # no cap: squeue did not answer this cycle
    #: its allocations: what their budgets (spent, paced, ended, unknown, stopped) or
    #: their max_pilots let it charge (`provisioner.decide.groups`)
    ALLOCATIONS = "allocations"


@dataclass(frozen=True)
class SiteSummary:
    """Per-site numbers for the cycle log line."""

    site: str
    demand_jobs: int = 0  # idle jobs assigned to this site this cycle
    demand_cpus: int = 0
    existing_jobs: int = 0  # of which absorbed by existing/pending pilots
    new_pilot_jobs: int = 0  # of which placed on new pilots
    new_pilots: int = 0
    new_cpus: int = 0
    capped: Cap | None = None  # which cap limited the site, if any
    reserve_jobs: int = 0  # reserve job slots held at this site (existing + new pilots)


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    unmatchable: tuple[Unmatchable, ...] = ()
    summary: tuple[SiteSummary, ...] = ()
    unplaced_jobs: int = 0  # matchable idle jobs left without capacity because of caps
    reserve_jobs: int = 0  # reserve job slots wanted this cycle (policy.reserve)
    reserve_held: int = 0  # of which placed in existing or new pilots
    reserve_sized: int = 0  # what the arrivals asked for (reserve_jobs also holds)
    reserve_lead_s: float = 0.0  # the lead time the reserve was sized for
    #: pending pilots no demand needed this cycle (kept or cancelled, see hysteresis)
    unneeded: tuple[str, ...] = ()
    #: pending pilots past their expected start whose jobs were placed anew this cycle
    hedges: tuple[str, ...] = ()
    #: demand shapes with jobs left without capacity (caps, limits, the per-cycle
    #: budget), and how many: why those jobs wait (`provisioner.decide.explain`)
    unplaced: tuple[tuple[JobShape, int], ...] = ()

    @property
    def submits(self) -> tuple[Submit, ...]:
        return tuple(a for a in self.actions if isinstance(a, Submit))

    @property
    def budgets(self) -> tuple[Any, ...]:
        """Every allocation's budget at the start of the cycle
        (`provisioner.decide.budget.Budget`); none where no site has allocations (the
        plan of `provisioner.decide.groups`, `GroupPlan`, holds them)."""
        return ()

    @property
    def group_waits(self) -> tuple[Any, ...]:
        """Why the jobs of an accounting group wait for its allocations
        (`provisioner.decide.budget_why.GroupWait`); none where no site has
        allocations."""
        return ()
