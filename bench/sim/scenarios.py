"""The simulated sites and the provisioner configuration the bench runs with."""

from __future__ import annotations

from dataclasses import replace

from bench.sim.entities import SiteModel
from bench.sim.policies import CobaldPolicy, PlanPolicy, PrototypePolicy
from bench.sim.results import RunResult
from bench.sim.traces import TRACES
from bench.sim.world import Policy, World
from provisioner import config as cf

POLICIES = ("prototype", "cobald", "ours")
#: "ours" whose controller hears nothing of SLURM's refusals (as before issue 23)
BLIND = "ours-blind"


def _site(name: str, cpus: int, memory_mb: int, walltime_s: int, margin_s: int,
          caps: tuple[int, int, int], min_cpus: int = 1, target_cpus: int | None = None,
          per_cpu_mb: int = 4000, weight: float = 1.0) -> cf.SiteConfig:
    """The provisioner's configuration for one simulated site; caps are (max_pilots,
    max_pending, max_submit_per_cycle)."""
    return cf.SiteConfig(
        name=name, max_walltime_s=max(walltime_s, 3 * 86400), template="gsi.sh.j2",
        image="/opt/images/pilot.sif", weight=weight,
        pilot=cf.PilotShapeConfig(cpus=cpus, min_cpus=min_cpus, target_cpus=target_cpus,
                                  memory_mb=memory_mb, memory_per_cpu_mb=per_cpu_mb,
                                  walltime_s=walltime_s, shutdown_margin_s=margin_s),
        caps=cf.CapsConfig(max_pilots=caps[0], max_pending=caps[1],
                           max_submit_per_cycle=caps[2]),
    )


def default_sites(gsi_target: int | None = 1, frankfurt_target: int | None = 1,
                  frankfurt_min_cpus: int = 1) -> list[SiteModel]:
    """A GSI-like cluster (shared nodes, per-core allocation) and a Frankfurt-like one
    (bigger nodes, longer queue wait)."""
    gsi = _site("gsi", 16, 64000, 86400, 7200, (480, 60, 60), target_cpus=gsi_target,
                weight=2.0)
    frankfurt = _site("frankfurt", 40, 192000, 86400, 7200, (800, 60, 60),
                      min_cpus=frankfurt_min_cpus, target_cpus=frankfurt_target,
                      per_cpu_mb=4800)
    return [
        SiteModel(gsi, nodes=30, cores_per_node=16, mem_per_node_mb=64000,
                  wait_median_s=60, wait_sigma=1.0, boot_s=90),
        SiteModel(frankfurt, nodes=20, cores_per_node=40, mem_per_node_mb=192000,
                  wait_median_s=180, wait_sigma=1.0, boot_s=120),
    ]


def hetero_sites() -> list[SiteModel]:
    """Two sites that differ the way real ones do, with equal weights: `fast` (short SLURM
    queue, 24 h walltime, pilots sized to the jobs from 1 core) and `slow` (queue wait
    ~20 min, 4 h walltime with a 30 min margin so jobs that state no runtime can be killed
    at walltime, whole 48-core nodes only)."""
    fast = _site("fast", 16, 64000, 86400, 7200, (400, 60, 60), target_cpus=1)
    slow = _site("slow", 48, 192000, 4 * 3600, 1800, (40, 20, 20), min_cpus=48)
    return [
        SiteModel(fast, nodes=24, cores_per_node=16, mem_per_node_mb=64000,
                  wait_median_s=60, wait_sigma=1.0, boot_s=90),
        SiteModel(slow, nodes=20, cores_per_node=48, mem_per_node_mb=192000,
                  wait_median_s=1200, wait_sigma=1.0, boot_s=120),
    ]


def limited_sites() -> list[SiteModel]:
    """The default sites, but the cheaper one (gsi) lets the account hold at most 20 jobs
    and take 4 sbatch per minute: beyond, sbatch is refused with SLURM's words."""
    gsi, frankfurt = default_sites()
    return [replace(gsi, submit_limit=20, sbatch_per_min=4), frankfurt]


def jobcap_sites() -> list[SiteModel]:
    """The default sites, but the cheaper one (gsi) runs at most 12 of the account's
    jobs at a time (MaxJobs: more pend with `AssocMaxJobsLimit`), and the other takes
    whole 40-core nodes only: the number of gsi's pilots is what is scarce."""
    gsi, frankfurt = default_sites(frankfurt_min_cpus=40)
    return [replace(gsi, job_limit=12), frankfurt]


def limit_change_sites() -> list[SiteModel]:
    """The submission-limited sites (`limited_sites`), but an admin removes gsi's submit
    limit after 16 hours and sets it to 8 jobs after 32 hours."""
    gsi, frankfurt = limited_sites()
    return [replace(gsi, submit_limit_changes=((16 * 3600.0, None), (32 * 3600.0, 8))),
            frankfurt]


def gpu_sites() -> list[SiteModel]:
    """The default sites with GPUs at gsi only: 4 per 16-core node (pilots ask for as
    many as their jobs use)."""
    gsi, frankfurt = default_sites()
    pilot = gsi.config.pilot.model_copy(update={"gpus": 4})
    gsi = replace(gsi, config=gsi.config.model_copy(update={"pilot": pilot}), gpus_per_node=4)
    return [gsi, frankfurt]


#: Site sets a scenario runs on.
SITE_SETS = {"default": default_sites, "hetero": hetero_sites, "limited": limited_sites,
             "gpu": gpu_sites, "jobcap": jobcap_sites, "limit-change": limit_change_sites}
#: (trace, site set) pairs `make bench` runs.
SCENARIOS: tuple[tuple[str, str], ...] = (
    ("steady", "default"), ("bursty", "default"), ("diurnal", "default"),
    ("mixed", "default"), ("steady-4x", "default"), ("trickle", "default"),
    ("steady", "hetero"), ("bursty", "hetero"), ("mixed", "hetero"), ("trickle", "hetero"),
    ("gpu-mix", "gpu"), ("mixed-rare", "default"), ("steady", "jobcap"),
    ("steady", "limit-change"),
)


def default_config(sites: list[SiteModel], reserve: cf.ReserveConfig | None = None,
                   journal: str = "") -> cf.Config:
    """The configuration `ours` runs with; the reserve is the default one unless given.
    Sites with allocations need a `journal` path (the simulator opens none)."""
    return cf.Config(
        journal=journal,
        policy=cf.PolicyConfig(interval_s=300, quick_check_s=10, min_cycle_gap_s=5,
                               idle_release_cycles=1, max_submit_per_cycle=120,
                               reserve=reserve or cf.ReserveConfig()),
        sites=tuple(s.config for s in sites),
    )


def make_policy(name: str, config: cf.Config) -> Policy:
    if name == "ours":
        return PlanPolicy(config)
    if name == BLIND:
        return PlanPolicy(config, name=BLIND, learn=False)
    if name == "prototype":
        return PrototypePolicy()
    if name == "cobald":
        return CobaldPolicy()
    raise KeyError(name)


def run_scenario(policy: str, trace: str, seed: int = 1, duration: float = 2 * 86400,
                 sites: list[SiteModel] | str | None = None,
                 reserve: cf.ReserveConfig | None = None) -> RunResult:
    """One simulated run: `policy` over `trace` generated with `seed`, on `sites` (a
    list, or the name of a site set; default: the default sites)."""
    name = trace
    if sites is None or isinstance(sites, str):
        if sites not in (None, "default"):
            name = f"{trace} @{sites}"
        sites = SITE_SETS[sites or "default"]()
    config = default_config(sites, reserve)
    jobs = TRACES[trace](seed)
    world = World(sites, config, seed=seed + 1000)
    result = world.run(make_policy(policy, config), [j for j in jobs if j.submit < duration],
                       trace_name=name, duration=duration)
    result.seed = seed
    return result
