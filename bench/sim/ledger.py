"""The simulated run as the journal would hold it: pilot records and job runs.

Simulated time 0 is `base` (epoch seconds), so the report's UTC days are real days.
The payload's CPU efficiency is drawn here (a clipped normal per job, from its own
seeded generator, so the simulation itself is unchanged): the report's E2 is this
input, not a result.
"""

from __future__ import annotations

import random

from bench.sim.world import World
from provisioner.service.accounting import JobRun, PilotRecord

#: Monday 2026-01-05 00:00 UTC.
BASE = 1_767_571_200.0


def pilot_records(world: World, base: float = BASE) -> list[PilotRecord]:
    out = []
    for p in world.all_pilots:
        start = None if p.started_at is None else base + p.started_at
        joined = None
        if p.started_at is not None and not p.site.black_hole:
            up = p.started_at + p.site.boot_s
            if p.ended_at is None or up <= p.ended_at:
                joined = base + up
        out.append(PilotRecord(
            site=p.site.name, job_id=str(p.id), cores=p.cpus, submit_at=base + p.submitted_at,
            start_at=start, end_at=None if p.ended_at is None else base + p.ended_at,
            memory_mb=p.memory_mb, join_at=joined, gpus=p.gpus))
    return out


def job_runs(world: World, seed: int, base: float = BASE, cpu_mean: float = 0.85,
             cpu_sd: float = 0.08) -> list[JobRun]:
    """Finished runs (a run killed at walltime is not in the history as finished)."""
    rng = random.Random(seed)
    out = []
    for job in world.jobs:
        p = job.pilot
        if job.end is None or job.start is None or p is None:
            continue
        eff = min(1.0, max(0.05, rng.gauss(cpu_mean, cpu_sd)))
        wall = job.end - job.start
        out.append(JobRun(
            job_id=f"{job.spec.id}.0", owner="alice", site=p.site.name, pilot_job_id=str(p.id),
            cores=job.shape.cpus, start_at=base + job.start, end_at=base + job.end,
            cpu_s=eff * wall * job.shape.cpus, gpus=job.shape.gpus))
    return out
