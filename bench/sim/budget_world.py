"""The allocations world: two accounting groups at a GSI-like and a Frankfurt-like site,
each group with a grant at both sites, over one period (30 simulated days by default).

- "analysis": steady 4-core work (Poisson arrivals, about 60 busy cores).
- "campaign": bursts of about 300 8-core jobs (0.6-1.4 times that), one every two days
  or so.

Jobs run two hours on average (`RUNTIMES`): half the events of the one-hour jobs of the
other traces for the same core-hours, so that a month of six variants runs in minutes.

Each site has one `even` and one `asap` allocation, so each group has both kinds: at gsi
analysis is paced (even) and campaign spends as it comes (asap); at frankfurt the other way
round. The grants run from simulated time 0 (1970-01-01 UTC, where the simulator's clock
starts) for `days` days.

Variants (`VARIANTS`): none (no allocations: groups are not read), loose (grants that
never bind), tight (about two thirds of the demand), faults (tight, with pilots killed and
sbatch refused at random), spent (campaign's grants spent before the run, analysis's
loose) and alone (analysis's jobs only, its grants as in spent).
"""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from bench.sim.accounts import Accounts, Checks, Grant, Key, Point
from bench.sim.entities import SiteModel
from bench.sim.policies import PlanPolicy
from bench.sim.results import RunResult, percentile
from bench.sim.scenarios import default_config, default_sites
from bench.sim.traces import DAY, HOUR, JobSpec, RuntimeModel, _jobs
from bench.sim.world import World
from provisioner import config as cf

GROUPS = ("analysis", "campaign")
#: The period of every grant starts where the simulator's clock does.
EPOCH = dt.date(1970, 1, 1)
#: The tight grants of a 30-day period (core-hours): (site, group) -> (amount, pace).
TIGHT: dict[tuple[str, str], tuple[float, str]] = {
    ("gsi", "analysis"): (15_000.0, "even"), ("gsi", "campaign"): (12_000.0, "asap"),
    ("frankfurt", "analysis"): (12_000.0, "asap"),
    ("frankfurt", "campaign"): (36_000.0, "even"),
}
#: A grant that never binds: even at the period's start, a walltime's share of it is more
#: than every pilot both sites could hold and queue at once could cost.
LOOSE = 10_000_000.0
#: Faults: a running pilot dies once in 48 h on average; 3 % of sbatch calls refused.
KILL_PER_H = 1 / 48
REFUSE_SHARE = 0.03

#: What the configuration names as its journal (the simulator opens none).
JOURNAL = "/var/lib/htcondor-slurm-sim/journal.sqlite"

#: Job runtimes: 2 h on average (sd 30 min, 20 min to 4 h).
RUNTIMES = RuntimeModel(mean_s=2 * HOUR, sd_s=30 * 60, min_s=20 * 60, max_s=4 * HOUR)

VARIANTS = ("none", "loose", "tight", "faults", "spent", "alone")


def analysis_jobs(seed: int, duration: float, rate_per_h: float = 7.5) -> list[JobSpec]:
    """Steady 4-core work of group analysis."""
    rng = random.Random(seed)
    times, t = [], rng.expovariate(rate_per_h / HOUR)
    while t < duration:
        times.append(t)
        t += rng.expovariate(rate_per_h / HOUR)
    return _jobs(times, rng, lambda r: (4, 4 * r.choice((1500, 2000, 2500))), RUNTIMES,
                 group="analysis")


def campaign_jobs(seed: int, duration: float, burst_jobs: int = 300,
                  every: float = 2 * DAY) -> list[JobSpec]:
    """Bursts of 8-core jobs of group campaign: `burst_jobs` (0.6-1.4 times) within 10
    minutes, every `every` (0.8-1.2 times)."""
    rng = random.Random(seed + 500)
    times: list[float] = []
    start = 2 * HOUR
    while start < duration:
        n = int(burst_jobs * rng.uniform(0.6, 1.4))
        times.extend(start + rng.uniform(0, 600.0) for _ in range(n))
        start += every * rng.uniform(0.8, 1.2)
    return _jobs([t for t in times if t < duration], rng,
                 lambda r: (8, 8 * r.choice((1500, 2000, 2500))), RUNTIMES, group="campaign")


def workload(seed: int, days: float, groups: tuple[str, ...] = GROUPS) -> list[JobSpec]:
    """Both groups' jobs (or those of `groups`) in submission order, numbered afresh."""
    duration = days * DAY
    jobs = []
    if "analysis" in groups:
        jobs += analysis_jobs(seed, duration)
    if "campaign" in groups:
        jobs += campaign_jobs(seed, duration)
    jobs.sort(key=lambda j: (j.submit, j.shape.group))
    return [replace(j, id=i) for i, j in enumerate(jobs)]


def allocation(site: str, group: str, amount: float, pace: str,
               days: float) -> cf.AllocationConfig:
    return cf.AllocationConfig(
        name=f"{group}-{site}", account=f"acct-{group}", amount=amount, pace=pace,
        period=cf.DatedPeriod(start=EPOCH, end=EPOCH + dt.timedelta(days=days)),
        groups=(group,))


def grants(variant: str, days: float) -> dict[tuple[str, str], tuple[float, str]]:
    """(site, group) -> (amount, pace) of `variant`; tight amounts scale with `days`."""
    if variant == "none":
        return {}
    scale = days / 30.0
    out = {}
    for key, (amount, pace) in TIGHT.items():
        tight = variant in ("tight", "faults") or (
            variant in ("spent", "alone") and key[1] == "campaign")
        out[key] = (amount * scale if tight else LOOSE, pace)
    return out


def sites_of(variant: str, days: float) -> list[SiteModel]:
    """The default sites with `variant`'s allocations (and faults)."""
    table = grants(variant, days)
    out = []
    for site in default_sites():
        allocs = tuple(allocation(site.name, group, amount, pace, days)
                       for (name, group), (amount, pace) in table.items() if name == site.name)
        site = replace(site, config=site.config.model_copy(update={"allocations": allocs}))
        if variant == "faults":
            site = replace(site, kill_per_h=KILL_PER_H, refuse_share=REFUSE_SHARE)
        out.append(site)
    return out


def precharge(variant: str, sites: list[SiteModel]) -> dict[Key, float]:
    """spent: campaign's grants were spent before the period's work began."""
    if variant != "spent":
        return {}
    return {(s.name, a.name): a.amount for s in sites for a in s.config.allocations
            if "campaign" in a.groups}


@dataclass(frozen=True)
class GroupSample:
    t: float
    idle: dict[str, int]  # group -> idle jobs
    running_cores: dict[str, int]  # group -> cores of its running jobs


class BudgetWorld(World):
    """The world, sampling each group's idle jobs and running cores too."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.group_samples: list[GroupSample] = []

    def _sample(self) -> None:
        super()._sample()
        idle = Counter(j.shape.group for j in self.queue)
        running: Counter[str] = Counter()
        for p in self.pilots.values():
            for j in p.jobs:
                running[j.shape.group] += j.shape.cpus
        self.group_samples.append(GroupSample(self.now, dict(idle), dict(running)))


@dataclass
class GroupWaits:
    jobs: int
    finished: int
    wait_p50_s: float
    wait_p95_s: float


@dataclass
class BudgetRun:
    """One run of the allocations world."""

    variant: str
    seed: int
    days: float
    result: RunResult
    groups: dict[str, GroupWaits]
    checks: Checks
    grants: dict[Key, Grant]
    series: dict[Key, list[Point]] = field(repr=False)
    group_samples: list[GroupSample] = field(repr=False)
    pilots_killed: int = 0
    wall_s: float = 0.0


def group_waits(world: World) -> dict[str, GroupWaits]:
    """Per group: jobs, finished, wait p50/p95 (a job still idle waits until the run's
    end)."""
    out = {}
    for group in sorted({j.shape.group for j in world.jobs}):
        jobs = [j for j in world.jobs if j.shape.group == group]
        waits = [(j.start if j.start is not None else world.now) - j.spec.submit for j in jobs]
        out[group] = GroupWaits(len(jobs), sum(1 for j in jobs if j.end is not None),
                                percentile(waits, 0.5), percentile(waits, 0.95))
    return out


def run_budget(variant: str, seed: int = 1, days: float = 30.0,
               patch: Callable[[], object] | None = None) -> BudgetRun:
    """One run of `variant` over `days` (the grants' period), then drained for at most
    12 hours; `patch` is called first in this process (a broken rule, for a check)."""
    import time

    if patch is not None:
        patch()
    t0 = time.perf_counter()
    sites = sites_of(variant, days)
    config = default_config(sites, journal=JOURNAL if variant != "none" else "")
    accounts = Accounts(config.sites, precharge(variant, sites))
    groups = ("analysis",) if variant == "alone" else GROUPS
    world = BudgetWorld(sites, config, seed=seed + 1000, accounts=accounts)
    trace = workload(seed, days, groups)
    result = world.run(PlanPolicy(config), trace, trace_name=f"budget-{variant}",
                       duration=days * DAY)
    result.seed = seed
    return BudgetRun(variant, seed, days, result, group_waits(world), accounts.checks,
                     accounts.grants, accounts.series, world.group_samples,
                     world.pilots_killed, time.perf_counter() - t0)
