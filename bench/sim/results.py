"""What one simulated run measured (`RunResult`), and how it is read off a World (through
`Books`, what `summarize` reads of it)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from bench.sim.entities import SimJob, SimPilot
from bench.sim.traces import HOUR


@dataclass
class Sample:
    t: float
    idle_jobs: int
    running_jobs: int
    pilots: int
    pending_pilots: int
    allocated_cores: int
    claimed_cores: int


@dataclass
class RunResult:
    policy: str
    trace: str
    jobs: int
    unmatchable_jobs: int
    finished: int
    running: int
    queued: int
    killed: int  # runs killed at a pilot's walltime (the jobs ran again)
    wait_p50_s: float
    wait_p95_s: float
    wait_max_s: float
    allocated_core_h: float
    claimed_core_h: float
    pilots_submitted: int
    pilots_started: int
    pilots_never_claimed: int
    submissions_per_h: float
    sim_hours: float
    killed_core_h: float = 0.0  # core time of killed runs: waste, not claimed
    pending_cancelled: int = 0  # pilots cancelled before they started
    #: site -> (pilots started, allocated core-h)
    placement: dict[str, tuple[int, float]] = field(default_factory=dict)
    allocated_gpu_h: float = 0.0  # pilot GPUs from SLURM start to end
    claimed_gpu_h: float = 0.0  # GPUs of GPU jobs' runs (killed runs excluded)
    noclaim_ended: int = 0  # pilots ended by their no-claim shutdown
    seed: int = 0
    sbatch_calls: int = 0  # sbatch attempts, refused ones included
    sbatch_refused: int = 0
    timeline: list[Sample] = field(repr=False, default_factory=list)

    @property
    def efficiency(self) -> float:
        return self.claimed_core_h / self.allocated_core_h if self.allocated_core_h else 0.0

    @property
    def gpu_efficiency(self) -> float | None:
        """GPU-hours claimed by GPU jobs / GPU-hours allocated; None without GPUs."""
        return self.claimed_gpu_h / self.allocated_gpu_h if self.allocated_gpu_h else None


class Books(Protocol):
    """What `summarize` reads of a run (a `bench.sim.world.World`)."""

    now: float
    jobs: list[SimJob]
    unmatchable: list[SimJob]
    queue: list[SimJob]
    pilots: dict[int, SimPilot]
    all_pilots: list[SimPilot]
    allocated_core_s: float
    claimed_core_s: float
    allocated_gpu_s: float
    claimed_gpu_s: float
    killed_core_s: float
    timeline: list[Sample]
    sbatch_calls: int
    sbatch_refused: int


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[idx]


def summarize(world: Books, policy: str, trace: str) -> RunResult:
    """The run's outputs, books closed at `world.now`: what still runs is charged up to
    then."""
    now = world.now
    allocated = world.allocated_core_s + sum(
        p.cpus * (now - p.started_at) for p in world.pilots.values()
        if p.started_at is not None)
    claimed = world.claimed_core_s + sum(
        j.shape.cpus * (now - j.start) for p in world.pilots.values()
        for j in p.jobs if j.start is not None)
    alive = [p for p in world.pilots.values() if p.started_at is not None]
    gpu_alloc = world.allocated_gpu_s + sum(
        p.gpus * (now - p.started_at) for p in alive if p.started_at is not None)
    gpu_claimed = world.claimed_gpu_s + sum(
        j.shape.gpus * (now - j.start) for p in alive for j in p.jobs if j.start is not None)
    never = {id(j) for j in world.unmatchable}
    matchable = [j for j in world.jobs if id(j) not in never]
    waits = [(j.start if j.start is not None else now) - j.spec.submit for j in matchable]
    started = [p for p in world.all_pilots if p.started_at is not None]
    placement: dict[str, tuple[int, float]] = {}
    for p in started:
        assert p.started_at is not None
        n, core_h = placement.get(p.site.name, (0, 0.0))
        end = p.ended_at if p.ended_at is not None else now
        placement[p.site.name] = (n + 1, core_h + p.cpus * (end - p.started_at) / HOUR)
    hours = max(now, 1.0) / HOUR
    return RunResult(
        policy=policy, trace=trace, jobs=len(world.jobs),
        unmatchable_jobs=len(world.unmatchable),
        finished=sum(1 for j in matchable if j.end is not None),
        running=sum(1 for j in matchable if j.start is not None and j.end is None),
        queued=len(world.queue),
        killed=sum(j.kills for j in matchable),
        wait_p50_s=percentile(waits, 0.50), wait_p95_s=percentile(waits, 0.95),
        wait_max_s=max(waits, default=0.0),
        allocated_core_h=allocated / HOUR, claimed_core_h=claimed / HOUR,
        pilots_submitted=len(world.all_pilots), pilots_started=len(started),
        pilots_never_claimed=sum(1 for p in started if not p.claimed),
        submissions_per_h=len(world.all_pilots) / hours, sim_hours=hours,
        timeline=world.timeline, killed_core_h=world.killed_core_s / HOUR,
        pending_cancelled=sum(1 for p in world.all_pilots if p.cancelled),
        placement=dict(sorted(placement.items())),
        sbatch_calls=world.sbatch_calls, sbatch_refused=world.sbatch_refused,
        allocated_gpu_h=gpu_alloc / HOUR, claimed_gpu_h=gpu_claimed / HOUR,
        noclaim_ended=sum(1 for p in started if p.noclaim_ended),
    )
