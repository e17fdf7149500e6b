"""What the allocations' pilots and the groups' jobs spent, in each allocation's own unit
(pure: plain records in, unit-hours out).

A pilot costs its rate (`provisioner.decide.budget.pilot_rate`: its cores, 1 node, or
its GPUs) for every hour SLURM holds it: from its SLURM start to its end, or to `now`
while it runs; a pilot that never started costs nothing. A stretch [t0, t1) counts the
part of each pilot's held time inside it, so a pilot that crosses a period boundary is
split between the two periods.

A group's spend is what its finished jobs claimed of the allocations' pilots: a job's
cores (core-hours), its GPUs (GPU-hours) or its share of the pilot's cores (node-hours)
for its wall time, inside the period. The rest of what a pilot held is its idle time,
charged to the allocation and to no group.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from provisioner.config import AllocationConfig, SiteBase
from provisioner.decide.budget import pilot_rate
from provisioner.service.accounting import HOUR_S, JobRun, PilotRecord

DAY_S = 86400.0
#: The spend rate is the ledger's charge over this window before now.
BURN_WINDOW_S = DAY_S
#: A run of no accounting group, as the group tables and the metrics name it (no
#: accounting group can be called so: provisioner.config.GROUP_PATTERN).
NO_GROUP = "-"


def held(pilot: PilotRecord, now: float) -> tuple[float, float] | None:
    """[SLURM start, end or `now`) of a pilot that started; None if it never did."""
    if pilot.start_at is None:
        return None
    end = pilot.end_at if pilot.end_at is not None else max(now, pilot.start_at)
    return pilot.start_at, end


def charged(pilots: Iterable[PilotRecord], unit: str, t0: float, t1: float,
            now: float) -> float:
    """Unit-hours the pilots held within [t0, t1)."""
    total = 0.0
    for p in pilots:
        life = held(p, now)
        if life is None:
            continue
        seconds = min(life[1], t1) - max(life[0], t0)
        if seconds > 0:
            total += pilot_rate(unit, p.cores, p.gpus) * seconds / HOUR_S
    return total


def of_allocation(pilots: Iterable[PilotRecord], site: str,
                  alloc: AllocationConfig) -> list[PilotRecord]:
    """The site's pilots charged to the allocation's account (a record that names no
    account: those recorded under the allocation's name)."""
    return [p for p in pilots if p.site == site and (
        p.account == alloc.account if p.account else p.allocation == alloc.name)]


def runout(amount: float, spent: float, rate_per_h: float, now: float) -> float | None:
    """When what is left of `amount` is gone at `rate_per_h` (epoch s): `now` if it is
    gone already, None if nothing is spent (it never runs out at that rate)."""
    left = amount - spent
    if left <= 0:
        return now
    if rate_per_h <= 0:
        return None
    return now + left / rate_per_h * HOUR_S


def committed(pilots: Iterable[PilotRecord], unit: str, walltime_s: float,
              now: float) -> float:
    """The worst case still to come of the pilots in flight by their records: a pending
    one its whole walltime, a running one the rest of it (as
    `provisioner.decide.budget.pilot_commitment`, the walltime from its start)."""
    total = 0.0
    for p in pilots:
        if p.end_at is not None:
            continue
        rest = walltime_s if p.start_at is None else max(0.0, p.start_at + walltime_s - now)
        total += pilot_rate(unit, p.cores, p.gpus) * rest / HOUR_S
    return total


def spent_series(pilots: Sequence[PilotRecord], unit: str, start: float, end: float,
                 now: float, points: int = 200) -> list[tuple[float, float]]:
    """(t, unit-hours held since `start`) at `points` + 1 times from `start` to the
    earlier of `end` and `now` (the burn-down's spent line)."""
    last = min(end, now)
    if last <= start:
        return [(start, 0.0)]
    step = (last - start) / points
    return [(t, charged(pilots, unit, start, t, now))
            for t in (start + i * step for i in range(points + 1))]


def run_units(unit: str, run: JobRun, pilot: PilotRecord, t0: float, t1: float) -> float:
    """Unit-hours a finished run claimed of its pilot within [t0, t1)."""
    seconds = min(run.end_at, t1) - max(run.start_at, t0)
    if seconds <= 0:
        return 0.0
    if unit == "core-hours":
        share = float(min(run.cores, pilot.cores))
    elif unit == "gpu-hours":
        share = float(min(run.gpus, pilot.gpus))
    else:  # node-hours: the job's share of the node's cores
        share = min(1.0, run.cores / pilot.cores) if pilot.cores > 0 else 0.0
    return share * seconds / HOUR_S


@dataclass(frozen=True)
class GroupSpend:
    """What one accounting group's jobs claimed of one allocation this period."""

    group: str  # NO_GROUP for runs of no group
    site: str
    allocation: str
    unit: str
    spent: float


def group_spend(sites: Sequence[SiteBase], pilots: Iterable[PilotRecord],
                runs: Iterable[JobRun], now: float,
                window: tuple[float, float] | None = None) -> list[GroupSpend]:
    """Per (group, allocation), the unit-hours the group's finished runs claimed of the
    allocation's pilots within the allocation's period at `now` (or within `window`);
    sorted."""
    by_key = {p.key: p for p in pilots}
    allocs: dict[tuple[str, str], tuple[str, AllocationConfig]] = {}
    names: dict[tuple[str, str], tuple[str, AllocationConfig]] = {}
    for site in sites:
        for alloc in site.allocations:
            allocs[(site.name, alloc.account)] = (site.name, alloc)
            names[(site.name, alloc.name)] = (site.name, alloc)
    out: dict[tuple[str, str, str], float] = {}
    for run in runs:
        pilot = by_key.get(run.pilot_key)
        if pilot is None:
            continue
        found = allocs.get((pilot.site, pilot.account)) if pilot.account \
            else names.get((pilot.site, pilot.allocation))  # as of_allocation
        if found is None:
            continue
        site_name, alloc = found
        t0, t1 = window or alloc.period_bounds(now)
        units = run_units(alloc.unit, run, pilot, t0, min(t1, now))
        if units > 0:
            key = (run.group or NO_GROUP, site_name, alloc.name)
            out[key] = out.get(key, 0.0) + units
    units_of = {(s, a.name): a.unit for s, a in allocs.values()}
    return [GroupSpend(g, s, a, units_of[(s, a)], v) for (g, s, a), v in sorted(out.items())]


def group_totals(spends: Iterable[GroupSpend]) -> dict[tuple[str, str], float]:
    """(group, unit) -> unit-hours, over all allocations."""
    out: dict[tuple[str, str], float] = {}
    for g in spends:
        out[(g.group, g.unit)] = out.get((g.group, g.unit), 0.0) + g.spent
    return out


def groups_of(sites: Sequence[SiteBase]) -> Mapping[str, list[tuple[str, str]]]:
    """Each configured accounting group -> the (site, allocation) pairs it may spend."""
    out: dict[str, list[tuple[str, str]]] = {}
    for site in sites:
        for alloc in site.allocations:
            for group in alloc.groups:
                out.setdefault(group, []).append((site.name, alloc.name))
    return dict(sorted(out.items()))
