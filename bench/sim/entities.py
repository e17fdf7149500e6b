"""What the simulated world is made of: sites, jobs and pilots (plain records)."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.sim.traces import JobSpec
from provisioner.config import SiteConfig
from provisioner.decide.packing import fits_cpu_only, gpu_share
from provisioner.model import JobShape, Pilot, round_memory


@dataclass(frozen=True)
class SiteModel:
    """A simulated SLURM cluster plus the provisioner's configuration for it."""

    config: SiteConfig
    nodes: int
    cores_per_node: int
    mem_per_node_mb: int
    wait_median_s: float = 60.0  # SLURM queue wait, lognormal
    wait_sigma: float = 1.0
    boot_s: float = 90.0
    gpus_per_node: int = 0
    black_hole: bool = False  # pilots exit after boot_s without ever joining the pool
    #: An account limit: sbatch is refused (SLURM's words) while the site holds this many
    #: pilot jobs (None: no limit).
    submit_limit: int | None = None
    #: sbatch beyond this many per minute fails with "Rate limit exceeded" (None: no limit).
    sbatch_per_min: int | None = None
    #: Changes of `submit_limit` during the run: (time, the limit from then on; None: no
    #: limit), in time order (an admin raising, removing or lowering it).
    submit_limit_changes: tuple[tuple[float, int | None], ...] = ()
    #: A job-count limit (MaxJobs): the account runs at most this many pilot jobs; more
    #: are accepted and pend with SLURM's reason `AssocMaxJobsLimit` (None: no limit).
    job_limit: int | None = None
    #: Faults: a running pilot dies (node failure, preemption) at this rate per hour
    #: (exponential), its jobs back to the queue; this share of sbatch calls is refused
    #: with a busy controller's words (0: none; drawn from the world's fault generator).
    kill_per_h: float = 0.0
    refuse_share: float = 0.0

    def submit_limit_at(self, t: float) -> int | None:
        """The submit limit in force at time `t`."""
        limit = self.submit_limit
        for when, value in self.submit_limit_changes:
            if when <= t:
                limit = value
        return limit

    @property
    def name(self) -> str:
        return self.config.name


@dataclass(eq=False)
class SimJob:
    spec: JobSpec
    start: float | None = None
    end: float | None = None
    pilot: SimPilot | None = None
    kills: int = 0  # times killed at a pilot's walltime (then requeued)
    #: What a pilot's match depends on (jobs alike match alike): cores, rounded memory,
    #: stated runtime, GPUs, accounting group.
    sig: tuple[int, int, int | None, int, str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        s = self.spec.shape
        self.sig = (s.cpus, round_memory(s.memory_mb), s.runtime_s, s.gpus, s.group)

    @property
    def shape(self) -> JobShape:
        return self.spec.shape


@dataclass(eq=False)
class SimPilot:
    id: int
    site: SiteModel
    cpus: int
    memory_mb: int
    walltime_s: float
    submitted_at: float
    eligible: bool = False
    node: int | None = None
    started_at: float | None = None
    booted: bool = False
    draining: bool = False
    retiring: bool = False  # told to leave when its jobs end (it still takes jobs)
    ended_at: float | None = None
    cancelled: bool = False
    used_cpus: int = 0
    used_mem: int = 0
    jobs: set[SimJob] = field(default_factory=set)
    claimed: bool = False  # ever ran a job
    gpus: int = 0
    used_gpus: int = 0
    idle_since: float | None = None  # booted and running nothing since (no-claim timer)
    noclaim_ended: bool = False  # ended by its no-claim shutdown
    limit_reason: str = ""  # pending at its site's job-count limit (SLURM's reason)
    #: The SLURM account it is charged to and its allocation ("": the site has none);
    #: at a site with allocations it starts only jobs of `groups` (its START).
    account: str = ""
    allocation: str = ""
    groups: frozenset[str] | None = None  # None: any job
    killed: bool = False  # died by a fault before its walltime
    #: What `World.model_pilot` last made of it, and of what (its cache).
    view: tuple[tuple[object, ...], Pilot] | None = field(default=None, repr=False)

    @property
    def key(self) -> str:
        return f"{self.site.name}/{self.id}"

    @property
    def walltime_end(self) -> float | None:
        return None if self.started_at is None else self.started_at + self.walltime_s

    @property
    def margin_at(self) -> float:
        end = self.walltime_end
        assert end is not None
        return end - self.site.config.pilot.shutdown_margin_s

    def can_start(self, job: SimJob, now: float) -> bool:
        if not self.booted or self.draining or self.ended_at is not None:
            return False
        s = job.shape
        if self.groups is not None and s.group not in self.groups:
            return False
        if s.cpus > self.cpus - self.used_cpus:
            return False
        if round_memory(s.memory_mb) > self.memory_mb - self.used_mem:
            return False
        if s.gpus > self.gpus - self.used_gpus:
            return False
        if s.gpus == 0 and self.gpus > self.used_gpus and not fits_cpu_only(
                s.cpus, round_memory(s.memory_mb), self.cpus - self.used_cpus,
                self.memory_mb - self.used_mem, self.gpus - self.used_gpus,
                gpu_share(self.cpus, self.memory_mb, self.gpus)):
            return False  # the pilot's START keeps the free GPUs' cores for GPU jobs
        end = self.walltime_end
        assert end is not None
        if s.runtime_s is not None:
            return now + s.runtime_s <= end
        return now < self.margin_at
