"""A large synthetic cycle for timing `plan()`: many shapes, many pilots, many sites."""

from __future__ import annotations

import random

from provisioner.config import (
    CapsConfig,
    Config,
    PilotShapeConfig,
    PolicyConfig,
    SiteConfig,
)
from provisioner.model import CycleMemory, Demand, JobShape, Pilot, PilotState, SiteView, Snapshot


def synthetic_config(n_sites: int = 10) -> Config:
    sites = []
    for i in range(n_sites):
        cpus = (16, 32, 40, 64, 128)[i % 5]
        sites.append(SiteConfig(
            name=f"site{i}", max_walltime_s=172800, template="gsi.sh.j2",
            image="/opt/images/pilot.sif", weight=1.0 + (i % 3),
            pilot=PilotShapeConfig(
                cpus=cpus, min_cpus=1 if i % 2 else cpus, memory_mb=cpus * 4000,
                memory_per_cpu_mb=4000, walltime_s=86400, shutdown_margin_s=600,
            ),
            caps=CapsConfig(max_pilots=1000, max_pending=200, max_submit_per_cycle=50),
        ))
    return Config(policy=PolicyConfig(max_submit_per_cycle=200), sites=tuple(sites))


def synthetic_snapshot(
    seed: int = 0,
    n_jobs: int = 100_000,
    n_shapes: int = 500,
    n_pilots: int = 5_000,
    n_sites: int = 10,
    now: float = 1_000_000.0,
) -> tuple[Snapshot, CycleMemory, Config]:
    """`n_jobs` idle jobs spread over `n_shapes` distinct shapes, `n_pilots` pilots in all
    states over `n_sites` sites (including some unmatchable shapes), recent arrivals in
    every shape (so the reserve is part of the timed work), and a memory with some
    pilots flagged and a 15-minute arrival window."""
    rng = random.Random(seed)
    config = synthetic_config(n_sites)
    shapes: dict[JobShape, None] = {}
    while len(shapes) < n_shapes:
        cpus = rng.choice((1, 1, 1, 2, 4, 8, 16))
        mem = rng.choice((500, 1000, 2000, 3000, 4000, 8000)) * cpus
        if rng.random() < 0.02:
            mem = 2_000_000
        runtime = rng.choice((None, None, 3600, 7200, 14400))
        desired: tuple[str, ...] = ()
        if rng.random() < 0.1:
            desired = (f"site{rng.randrange(n_sites)}",)
        shapes.setdefault(JobShape(cpus, mem + rng.randrange(50), runtime_s=runtime,
                                   desired_sites=desired))
    ordered = list(shapes)
    weights = [rng.random() for _ in ordered]
    total = sum(weights)
    counts = [max(1, int(n_jobs * w / total)) for w in weights]
    demand = tuple(Demand(s, n) for s, n in zip(ordered, counts, strict=True))
    states = [PilotState.BUSY] * 6 + [PilotState.IDLE, PilotState.PENDING,
                                       PilotState.STARTING, PilotState.DRAINING]
    pilots = []
    flagged: dict[str, float] = {}
    for j in range(n_pilots):
        site = config.sites[j % n_sites]
        state = rng.choice(states)
        cpus = site.pilot.cpus
        mem = site.pilot.memory_mb
        started = now - rng.uniform(0, 80000)
        if state is PilotState.PENDING:
            free_c, free_m, started_at, end = cpus, mem, None, None
        elif state is PilotState.STARTING:
            free_c, free_m, started_at, end = cpus, mem, now - 30, now - 30 + 86400
        elif state is PilotState.IDLE:
            free_c, free_m, started_at, end = cpus, mem, started, started + 86400
        else:
            free_c = rng.randrange(0, cpus // 2 + 1)
            free_m = free_c * rng.choice((1000, 2000, 4000))
            started_at, end = started, started + 86400
        p = Pilot(site=site.name, job_id=str(100000 + j), state=state, cpus=cpus,
                  memory_mb=mem, submitted_at=now - 90000, started_at=started_at,
                  walltime_end=end, free_cpus=free_c, free_memory_mb=free_m)
        pilots.append(p)
        if state is PilotState.IDLE and rng.random() < 0.5:
            flagged[p.key] = now - 300
    views = tuple(SiteView(s.name, known=(i != n_sites - 1))
                  for i, s in enumerate(config.sites))
    # jobs submitted in the last 15 minutes, in every shape: the predictive reserve runs too
    arrivals = tuple(Demand(s, rng.randint(1, 20)) for s in ordered)
    snap = Snapshot(demand=demand, pilots=tuple(pilots), sites=views, recent_arrivals=arrivals)
    return snap, CycleMemory(flagged=flagged, arrival_window_s=900.0), config
