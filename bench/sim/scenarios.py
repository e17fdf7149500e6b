"""The simulated sites and the provisioner configuration the bench runs with."""

from __future__ import annotations

from bench.sim.policies import CobaldPolicy, PlanPolicy, PrototypePolicy
from bench.sim.results import RunResult
from bench.sim.traces import TRACES
from bench.sim.world import Policy, SiteModel, World
from provisioner.config import (
    CapsConfig,
    Config,
    PilotShapeConfig,
    PolicyConfig,
    ReserveConfig,
    SiteConfig,
)

POLICIES = ("prototype", "cobald", "ours")


def default_sites(gsi_target: int | None = 1, frankfurt_target: int | None = 1,
                  frankfurt_min_cpus: int = 1) -> list[SiteModel]:
    """A GSI-like cluster (shared nodes, per-core allocation) and a Frankfurt-like one
    (bigger nodes, longer queue wait)."""
    gsi = SiteConfig(
        name="gsi", max_walltime_s=3 * 86400, template="gsi.sh.j2",
        image="/opt/images/pilot.sif", weight=2.0,
        pilot=PilotShapeConfig(cpus=16, min_cpus=1, target_cpus=gsi_target,
                               memory_mb=64000, memory_per_cpu_mb=4000,
                               walltime_s=86400, shutdown_margin_s=7200),
        caps=CapsConfig(max_pilots=480, max_pending=60, max_submit_per_cycle=60),
    )
    frankfurt = SiteConfig(
        name="frankfurt", max_walltime_s=3 * 86400, template="frankfurt.sh.j2",
        image="/opt/images/pilot.sif", weight=1.0,
        pilot=PilotShapeConfig(cpus=40, min_cpus=frankfurt_min_cpus,
                               target_cpus=frankfurt_target, memory_mb=192000,
                               memory_per_cpu_mb=4800, walltime_s=86400,
                               shutdown_margin_s=7200),
        caps=CapsConfig(max_pilots=800, max_pending=60, max_submit_per_cycle=60),
    )
    return [
        SiteModel(gsi, nodes=30, cores_per_node=16, mem_per_node_mb=64000,
                  wait_median_s=60, wait_sigma=1.0, boot_s=90),
        SiteModel(frankfurt, nodes=20, cores_per_node=40, mem_per_node_mb=192000,
                  wait_median_s=180, wait_sigma=1.0, boot_s=120),
    ]


def default_config(sites: list[SiteModel], reserve: ReserveConfig | None = None) -> Config:
    """The configuration `ours` runs with; the reserve is the default one unless given."""
    return Config(
        policy=PolicyConfig(interval_s=300, quick_check_s=20, min_cycle_gap_s=10,
                            idle_release_cycles=2, max_submit_per_cycle=120,
                            reserve=reserve or ReserveConfig()),
        sites=tuple(s.config for s in sites),
    )


def make_policy(name: str, config: Config) -> Policy:
    if name == "ours":
        return PlanPolicy(config)
    if name == "prototype":
        return PrototypePolicy()
    if name == "cobald":
        return CobaldPolicy()
    raise KeyError(name)


def run_scenario(policy: str, trace: str, seed: int = 1, duration: float = 2 * 86400,
                 sites: list[SiteModel] | None = None,
                 reserve: ReserveConfig | None = None) -> RunResult:
    """One simulated run: `policy` over `trace` generated with `seed`."""
    sites = sites if sites is not None else default_sites()
    config = default_config(sites, reserve)
    jobs = TRACES[trace](seed)
    world = World(sites, config, seed=seed + 1000)
    return world.run(make_policy(policy, config), [j for j in jobs if j.submit < duration],
                     trace_name=trace, duration=duration)
