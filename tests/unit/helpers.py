"""Plain-data builders for the unit tests."""

from __future__ import annotations

from provisioner.config import (
    CapsConfig,
    Config,
    PilotShapeConfig,
    PolicyConfig,
    ReserveConfig,
    SiteConfig,
)
from provisioner.model import CycleMemory, Demand, JobShape, Pilot, PilotState, SiteView, Snapshot

NOW = 100_000.0


def site(name: str = "gsi", cpus: int = 16, min_cpus: int = 1, memory_mb: int = 64000,
         per_cpu: int = 4000, walltime_s: int = 86400, margin: int = 600, weight: float = 1.0,
         max_pilots: int = 10, max_pending: int = 5, max_submit: int = 5, keep_warm: int = 0,
         target_cpus: int | None = None) -> SiteConfig:
    return SiteConfig(
        name=name, max_walltime_s=max(walltime_s, 86400), template="t.sh.j2", image="/i.sif",
        weight=weight,
        pilot=PilotShapeConfig(cpus=cpus, min_cpus=min_cpus, memory_mb=memory_mb,
                               memory_per_cpu_mb=per_cpu, walltime_s=walltime_s,
                               shutdown_margin_s=margin, target_cpus=target_cpus),
        caps=CapsConfig(max_pilots=max_pilots, max_pending=max_pending,
                        max_submit_per_cycle=max_submit),
        keep_warm=keep_warm,
    )


def config(*sites: SiteConfig, max_submit: int = 20, release_cycles: int = 2,
           min_lifetime: float = 0, reserve: ReserveConfig | None = None,
           retire: bool = True) -> Config:
    return Config(
        policy=PolicyConfig(max_submit_per_cycle=max_submit, idle_release_cycles=release_cycles,
                            min_pilot_lifetime_s=min_lifetime, retire_when_done=retire,
                            reserve=reserve or ReserveConfig()),
        sites=sites or (site(),),
    )


def pilot(job_id: str, state: PilotState, site: str = "gsi", cpus: int = 16,
          memory_mb: int = 64000, free_cpus: int | None = None, free_mem: int | None = None,
          started: float | None = NOW - 3600, end: float | None = None,
          submitted: float | None = None) -> Pilot:
    """A pilot; a pending one was submitted a minute ago unless `submitted` says when."""
    if state is PilotState.PENDING:
        started = None
    if submitted is None:
        submitted = NOW - 60 if state is PilotState.PENDING else NOW - 7200
    full = state in (PilotState.PENDING, PilotState.STARTING, PilotState.IDLE)
    return Pilot(
        site=site, job_id=job_id, state=state, cpus=cpus, memory_mb=memory_mb,
        submitted_at=submitted, started_at=started,
        walltime_end=end if end is not None else (None if started is None else started + 86400),
        free_cpus=free_cpus if free_cpus is not None else (cpus if full else 0),
        free_memory_mb=free_mem if free_mem is not None else (memory_mb if full else 0),
    )


def snap(demand: list[tuple[JobShape, int]] = (), pilots: list[Pilot] = (),  # type: ignore[assignment]
         sites: tuple[str, ...] = ("gsi",), unknown: tuple[str, ...] = (),
         pool_known: bool = True,
         arrivals: list[tuple[JobShape, int]] = ()) -> Snapshot:  # type: ignore[assignment]
    """What a cycle observed; `arrivals`: the jobs of the arrival window (`memory`)."""
    return Snapshot(
        demand=tuple(Demand(s, n) for s, n in demand),
        pilots=tuple(pilots),
        sites=tuple(SiteView(n, n not in unknown) for n in sites),
        pool_known=pool_known,
        recent_arrivals=tuple(Demand(s, n) for s, n in arrivals),
    )


def memory(flagged: dict[str, float] | None = None, window: float = 900.0,
           **fields: object) -> CycleMemory:
    """What earlier cycles left: `flagged` pilots, the arrival window `snap`'s arrivals
    cover (`window` seconds), and any other `CycleMemory` field."""
    return CycleMemory(flagged=dict(flagged or {}), arrival_window_s=window,
                       **fields)  # type: ignore[arg-type]
