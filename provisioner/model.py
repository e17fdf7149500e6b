"""Plain data exchanged between the observe, plan and act phases.

Everything here is immutable and free of I/O. The service builds a `Snapshot` from the
schedd, the collector and `squeue`; `provisioner.plan.plan()` turns it into a `Plan` whose
`actions` the service applies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

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
    requirements: str = ""  # the job's Requirements text (informational)
    desired_sites: tuple[str, ...] = ()  # empty = any site

    @property
    def rounded_memory_mb(self) -> int:
        """Memory the startd will actually reserve for this job."""
        return round_memory(self.memory_mb)


@dataclass(frozen=True)
class Demand:
    shape: JobShape
    idle: int  # number of idle jobs with this shape


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
    #: "site/job_id", unique over all sites (derived, computed once).
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", f"{self.site}/{self.job_id}")


@dataclass(frozen=True)
class SiteView:
    name: str
    known: bool  # False if squeue failed this cycle -> no actions at this site
    error: str = ""
    #: At most this many new pilots this cycle (None: only the caps limit them);
    #: 0 while the site's circuit breaker is open, 1 while a pilot may test it.
    max_new: int | None = None


@dataclass(frozen=True)
class Snapshot:
    demand: tuple[Demand, ...]
    pilots: tuple[Pilot, ...]
    sites: tuple[SiteView, ...]
    pool_known: bool = True  # False if schedd or collector unreadable -> no actions at all
    flagged: dict[str, float] = field(default_factory=dict)  # pilot key -> time it was flagged
    last_submit: dict[str, float] = field(default_factory=dict)  # site -> last submission time
    # pilot key -> number of consecutive cycles it has been observed idle *before* this one
    # (kept by the service; optional: when absent, a flagged pilot counts as idle once).
    idle_cycles: dict[str, int] = field(default_factory=dict)
    # Jobs submitted within the last `arrival_window_s` seconds (QDate >= now - window) that
    # are still in the queue, any state, grouped by shape (`Demand.idle` holds the count).
    # Sizes the predictive reserve (`policy.reserve`); empty or window 0 = no reserve.
    recent_arrivals: tuple[Demand, ...] = ()
    arrival_window_s: float = 0.0
    # Jobs submitted before the window that left the queue during it (finished, removed,
    # held): with the arrivals this gives the queue's net growth, so the reserve can grow
    # ahead of a rising queue. None = unknown (e.g. the service just started); the reserve
    # then assumes departures equal arrivals (a queue that is not growing).
    recent_departures: int | None = None


# Actions: returned as data, applied by the service.


@dataclass(frozen=True)
class Submit:
    site: str
    count: int
    cpus: int
    memory_mb: int
    walltime_s: int
    reason: str = ""


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
class Cancel:
    """A pending pilot with no demand: scancel directly."""

    pilot: Pilot
    reason: str = ""


Action = Submit | Flag | Unflag | Release | Cancel


@dataclass(frozen=True)
class Unmatchable:
    shape: JobShape
    idle: int
    reason: str


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
    capped: str = ""  # which cap limited the site, if any
    reserve_jobs: int = 0  # reserve job slots held at this site (existing + new pilots)


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    unmatchable: tuple[Unmatchable, ...] = ()
    summary: tuple[SiteSummary, ...] = ()
    unplaced_jobs: int = 0  # matchable idle jobs left without capacity because of caps
    reserve_jobs: int = 0  # reserve job slots wanted this cycle (policy.reserve)
    reserve_held: int = 0  # of which placed in existing or new pilots

    @property
    def submits(self) -> tuple[Submit, ...]:
        return tuple(a for a in self.actions if isinstance(a, Submit))
