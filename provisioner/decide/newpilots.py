"""Stages 3 and 4 of `plan()` (pure): the demand left after existing capacity into new
pilots, site by site within each site's room and the cycle's (`fill_new`), then one
`Submit` per site and pilot size, and the per-site summary (`submissions`).

The sites are the keys of a mapping of `SiteRow`s; a site with allocations is one row per
allocation there (`provisioner.decide.groups`), which these stages treat like any site.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from provisioner.decide.capacity import SiteRow, _tier_bound
from provisioner.decide.matching import Row
from provisioner.decide.packing import Item, NewPilots
from provisioner.decide.placement import ranked, shares, whole_pilots
from provisioner.decide.sizing import new_pilot_size
from provisioner.model import Action, Cap, SiteSummary, Submit


@dataclass
class CycleRoom:
    """The new pilots this cycle may still open over all sites
    (`policy.max_submit_per_cycle`), spent as the sites open them."""

    left: int

    def take(self, n: int) -> None:
        """`n` new pilots were opened."""
        self.left -= n

    def fill(self, new: NewPilots, item: Item, n: int) -> int:
        """Up to `n` jobs of `item` into the new pilots of one site, opening no more
        pilots than the site's own allowance and this budget both permit; the pilots
        opened are taken. Returns how many jobs were placed."""
        own, before = new.allowed, new.opened
        new.allowed = min(own, before + max(0, self.left))  # `fill` reads the allowance
        try:
            got = new.fill(item, n)
        finally:
            new.allowed = own
        self.take(new.opened - before)
        return got




def fill_new(rows: Iterable[Row], sites: dict[str, SiteRow], global_left: int,
             costs: Mapping[str, float], tie_share: float) -> int:
    """Stage 3: each row's remaining jobs into new pilots, best sites first (`ranked`):
    sites of one tier share the row in proportion to the pilots they can still take (moved
    so that no new pilot is left part-empty where a move fills it: `whole_pilots`), what
    one cannot take goes to the others, then to the next tier. Within each site's room
    and `global_left` new pilots over all sites; returns what is left of `global_left`."""
    budget = CycleRoom(global_left)
    min_cpus = {name: s.config.pilot.min_cpus for name, s in sites.items()}
    # real jobs offered per list of sites (many rows share one): added to the sites at the end
    offered: dict[tuple[str, ...], list[int]] = {}
    # once no site can open a pilot, only the pilots opened so far take jobs, and their room
    # only shrinks: `room` bounds it (None: pilots may still be opened)
    room = _open_room(sites) if _all_closed(sites, budget.left) else None
    for row in rows:
        if row.left == 0:
            continue
        if not row.reserve:
            jobs_cpus = offered.setdefault(tuple(row.sites), [0, 0])
            jobs_cpus[0] += row.left
            jobs_cpus[1] += row.left * row.item.cpus
        if room is not None and room.excludes(row.item):
            continue  # no pilot opened anywhere has the room for one job (cheap pre-check)
        if not _any_may_take(sites, row, budget.left):
            continue  # no site can open a pilot or has an open one that fits: no change
        for tier in ranked(row, costs, min_cpus, tie_share):
            if row.left == 0:
                break
            if not any(_pilots_left(sites[name], budget.left) for name in tier):
                for name in tier:  # the split would be all zeros: only open pilots take
                    _place(sites[name], row, row.left, budget)
                continue
            per = [_per_pilot(sites[name], row) for name in tier]
            capacity = [_pilots_left(sites[name], budget.left) * k
                        for name, k in zip(tier, per, strict=True)]
            load = [sites[name].load() for name in tier]
            split = shares(row.left, capacity, load)
            fill = [-(-min_cpus[name] // row.item.cpus) for name in tier]
            if len(tier) > 1 and max(fill) > 1:  # else no new pilot is ever part-empty
                split = whole_pilots(split, capacity, per, fill,
                                     [(costs[name], load[k]) for k, name in enumerate(tier)])
            for name, n in zip(tier, split, strict=True):
                _place(sites[name], row, n, budget)
            for name in tier:
                _place(sites[name], row, row.left, budget)
        if _all_closed(sites, budget.left):
            room = _open_room(sites)
    for names, (jobs, cpus) in offered.items():
        for name in names:
            sites[name].offered_jobs += jobs
            sites[name].offered_cpus += cpus
    return budget.left


@dataclass(frozen=True, slots=True)
class _OpenRoom:
    """The most free cores and the most free memory of any pilot opened this cycle, at
    any site, for CPU-only jobs and for GPU jobs (upper bounds while no pilot is opened)."""

    cpus: int
    memory_mb: int
    gpu_cpus: int
    gpu_memory_mb: int

    def excludes(self, item: Item) -> bool:
        """Whether no pilot opened this cycle can hold one job of `item`."""
        if item.gpus > 0:
            return item.cpus > self.gpu_cpus or item.memory_mb > self.gpu_memory_mb
        return item.cpus > self.cpus or item.memory_mb > self.memory_mb


def _open_room(sites: dict[str, SiteRow]) -> _OpenRoom:
    """The room of the pilots opened so far, over all sites (`_OpenRoom`)."""
    cpu_only = [s.new.open for s in sites.values() if s.new is not None]
    gpu = [s.new.open_gpu for s in sites.values() if s.new is not None]
    cpus, memory = _tier_bound(cpu_only)
    gpu_cpus, gpu_memory = _tier_bound(gpu)
    return _OpenRoom(cpus, memory, gpu_cpus, gpu_memory)


def _all_closed(sites: dict[str, SiteRow], global_left: int) -> bool:
    """Whether no site can open another pilot this cycle (for good: pilots opened and the
    budget spent only grow)."""
    return global_left <= 0 or not any(_pilots_left(s, global_left) for s in sites.values())


def _per_pilot(s: SiteRow, row: Row) -> int:
    """How many of the row's jobs one new pilot at `s` takes."""
    p = s.config.pilot
    gpus = p.gpus if row.item.gpus else 0  # CPU-only jobs get pilots without GPUs
    assert s.new is not None
    pack = s.new.pack_cpus or p.cpus
    return row.item.per_bin(min(p.cpus, max(pack, row.item.cpus)), p.memory_mb, gpus)


def _pilots_left(s: SiteRow, global_left: int) -> int:
    """How many new pilots `s` could still open (open pilots aside)."""
    new = s.new
    assert new is not None
    return max(0, min(new.allowed, new.opened + global_left) - new.opened)


def _may_take(s: SiteRow, row: Row, global_left: int) -> bool:
    """False only if `_place` would put none of the row's jobs at `s`: it can open no
    pilot and none of its open pilots has the room for one job (cheap pre-check)."""
    new = s.new
    assert new is not None
    # `_pilots_left(s, global_left) > 0`, inlined: this runs per row and site
    return (global_left > 0 and new.allowed > new.opened) or new.may_fit(row.item)


def _any_may_take(sites: dict[str, SiteRow], row: Row, global_left: int) -> bool:
    """Whether `_may_take` holds at any of the row's sites (once the sites' room is spent
    it is all that happens to most rows)."""
    return any(_may_take(sites[name], row, global_left) for name in row.sites)


def _place(s: SiteRow, row: Row, n: int, budget: CycleRoom) -> None:
    """Up to `n` of the row's jobs into new pilots at `s`, within the global `budget`."""
    new = s.new
    assert new is not None
    if n <= 0 or not _may_take(s, row, budget.left):
        return
    got = budget.fill(new, row.item, min(n, row.left))
    if s.shared is not None:  # the rows of one site's allocations share its room
        s.shared.refresh()
    row.left -= got
    if row.reserve:
        s.new_reserve += got
    else:
        s.new_jobs += got


def submissions(sites: Iterable[SiteRow], demand: Sequence[Row], global_room: int
                ) -> tuple[list[Action], list[SiteSummary]]:
    """Stage 4: one `Submit` per site and pilot size, and the per-site summary; a site
    that could not take all the demand it fits names the cap that stopped it."""
    actions: list[Action] = []
    summaries: list[SiteSummary] = []
    for s in sites:
        new = s.new
        assert new is not None
        shapes: dict[tuple[int, int, int], int] = defaultdict(int)
        for g in new.registry:
            if g.count > 0 and g.jobs > 0:
                shapes[new_pilot_size(s.config, g.used_cpus, g.used_mem, g.used_gpus,
                                      s.bound)] += g.count
        n_new = sum(shapes.values())
        why = f"{s.new_jobs} idle jobs"
        if s.new_reserve:
            why += f" and {s.new_reserve} reserve slots"
        for (cpus, mem, gpus), n in sorted(shapes.items(), reverse=True):
            actions.append(Submit(
                site=s.name, count=n, cpus=cpus, memory_mb=mem,
                walltime_s=s.config.pilot.walltime_s,
                reason=f"{why} need {n_new} new pilots at {s.name}", gpus=gpus))
        capped = None
        if any(r.left and s.name in r.sites for r in demand):
            room = {**s.room, Cap.POLICY_MAX_SUBMIT: global_room}
            capped = min(room, key=lambda k: room[k]) if s.known else Cap.SITE_UNKNOWN
        summaries.append(SiteSummary(
            site=s.name, demand_jobs=s.offered_jobs + s.absorbed,
            demand_cpus=s.offered_cpus, existing_jobs=s.absorbed,
            new_pilot_jobs=s.new_jobs, new_pilots=n_new,
            new_cpus=sum(cp * n for (cp, _m, _g), n in shapes.items()), capped=capped,
            reserve_jobs=s.absorbed_reserve + s.new_reserve))
    return actions, summaries
