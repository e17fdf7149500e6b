"""The decision core: `plan(snapshot, memory, config, now) -> Plan`. Pure: no I/O, no clock.

`snapshot` is what this cycle observed, `memory` what earlier cycles left (`CycleMemory`:
flags, learnt lead times, limits, the queue's history; the controller keeps it).

One cycle, as named stages over small records (a `Row` per demand shape, a `SiteRow` per
site):

1. `match_demand`: every demand shape to the sites whose largest pilot can run it
   (`provisioner.decide.matching`); shapes no site can run are `Unmatchable` and cause nothing.
   The predictive reserve (`provisioner.decide.reserve`) adds rows after all real demand.
2. `fill_existing` (`provisioner.decide.capacity`): rows into capacity that exists: free
   resources of BUSY then IDLE pilots that can still take work, then the whole shape of
   STARTING and PENDING pilots.
3. `fill_new`: what is left into new pilots, each site limited by its caps and the global
   per-cycle cap; real demand at every site first, then the reserve. New pilots are sized
   down to what they hold (between min_cpus and cpus), or take the site's whole shape
   where its pilots, not its cores, are scarce (`provisioner.decide.sizing`).
4. `submissions`: one `Submit` per site and pilot size, and the per-site summary.
5. `pilot_actions` (`provisioner.decide.scaledown`): flag, unflag, release, cancel, retire.

Existing and new capacity share one packing index (`provisioner.decide.packing.CapacityIndex`).
If the pool is unknown nothing happens; at an unknown site nothing happens, but its
pilots' capacity still counts.
"""

from __future__ import annotations

import gc
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from provisioner.config import Config
from provisioner.decide.capacity import (
    _TIERS,
    SiteRow,
    _tier_bound,
    add_capacity,
    fill_existing,
    mark_bound,
    site_rows,
)
from provisioner.decide.matching import (
    Row,
    ShapeMatches,
    demand_of,
    item_of,
    match_demand,
    site_rejects,
    unmatchable_reason,
)
from provisioner.decide.packing import (
    BinGroup,
    Item,
    NewPilots,
)
from provisioner.decide.placement import (
    costs_of,
    ranked,
    shares,
    site_leads,
    slow_pending,
    whole_pilots,
)
from provisioner.decide.reserve import reserve_lead, reserve_rows, reserve_size
from provisioner.decide.scaledown import carry_over, pilot_actions
from provisioner.decide.sizing import new_pilot_size, pack_reserve
from provisioner.model import (
    Action,
    Cap,
    CycleMemory,
    PilotState,
    Plan,
    SiteSummary,
    Snapshot,
    Submit,
    by_state,
)

__all__ = ["_TIERS", "SiteRow", "carry_over", "demand_of", "item_of", "plan", "reserve_size",
           "site_rejects", "site_rows", "unmatchable_reason"]

#: the states of pilots not yet in the pool
_NOT_UP = (PilotState.PENDING, PilotState.STARTING)


@dataclass
class Budget:
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
    budget = Budget(global_left)
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


def _place(s: SiteRow, row: Row, n: int, budget: Budget) -> None:
    """Up to `n` of the row's jobs into new pilots at `s`, within the global `budget`."""
    new = s.new
    assert new is not None
    if n <= 0 or not _may_take(s, row, budget.left):
        return
    got = budget.fill(new, row.item, min(n, row.left))
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


@contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the block, back on after it (if it was on).

    A cycle allocates tens of thousands of short-lived objects (groups, rows, keys); each
    700 allocations start a collection, and every few of them a full one walks every
    object of the process (the snapshot's pilots among them): about a fifth of a large
    cycle went there. What a cycle allocates is freed by reference counting when it ends
    (it builds no reference cycles), so nothing is lost by not collecting meanwhile.
    """
    was_on = gc.isenabled()
    if was_on:
        gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def plan(snapshot: Snapshot, memory: CycleMemory, config: Config, now: float) -> Plan:
    """Decide this cycle's actions from what it observed (`snapshot`) and what earlier
    cycles left (`memory`). Pure; `now` is the cycle's time (epoch seconds)."""
    with _collector_paused():
        return _plan(snapshot, memory, config, now)


def _plan(snapshot: Snapshot, memory: CycleMemory, config: Config, now: float) -> Plan:
    """`plan`, with the collector paused."""
    if not snapshot.pool_known:
        return Plan(actions=())
    states = by_state(snapshot.pilots)  # several stages read only some states
    pending = states[PilotState.PENDING]
    leads = site_leads(snapshot, memory, config, now, pending)
    costs = costs_of(leads, config)
    # stable: config order; a tuple, so that matching reads the sites' limits once
    order = tuple(sorted(config.sites, key=lambda s: costs[s.name]))
    sites = site_rows(snapshot, memory, config, pending)
    sites = {s.name: sites[s.name] for s in order}
    # pending pilots a new one elsewhere would beat: no capacity (their jobs are placed
    # anew, once: the new pilots are capacity themselves), kept while demand they could
    # run is queued
    can_submit = [name for name, s in sites.items() if s.new is not None and s.new.allowed]
    late = (slow_pending(snapshot, memory, config, now, leads, can_submit, pending)
            if config.policy.max_submit_per_cycle > 0 else {})
    registry: list[BinGroup] = []
    add_capacity(sites, snapshot, now, registry, skip=late, states=states)

    matches = ShapeMatches(order)  # the queue's shapes and the recent arrivals' alike
    rows, unmatchable = match_demand(snapshot.demand, order, matches)
    ghosts, sized = reserve_rows(snapshot, memory, config, order, now, matches)
    everything = rows + ghosts
    floor = Item(cpus=min((r.item.cpus for r in everything), default=1),
                 memory_mb=min((r.item.memory_mb for r in everything), default=0))
    fill_existing(everything, sites, now, floor)
    mark_bound(sites, rows, snapshot, memory)
    tie = config.policy.placement.tie_share
    global_left = fill_new(rows, sites, config.policy.max_submit_per_cycle, costs, tie)
    rates = memory.shape_rates
    pack_reserve(sites.values(), sum(r.jobs for r in ghosts),
                 sum(rates.values()) if rates else None)
    global_left = fill_new(ghosts, sites, global_left, costs, tie)
    actions, summaries = submissions(sites.values(), rows, global_left)

    used = {p.key for g in registry if g.jobs > 0 for p in g.members}
    if late:  # kept while demand they could run is queued
        wanted = set().union(*(r.sites for r in rows))
        used |= {key for key, name in late.items() if name in wanted}
    # a schedd not read: its demand is unknown, so no pilot anywhere goes for want of it
    site_ok = {name: s.known and snapshot.scale_down_ok for name, s in sites.items()}
    # every idle job sits in the free room of pilots already in the pool, and no arrival
    # is expected (the reserve would want the room the busy pilots' jobs leave behind)
    reserve = sum(r.jobs for r in ghosts)
    spare = (not actions and not reserve and not any(r.left for r in rows)
             and not any(p.key in used for state in _NOT_UP for p in states[state]))
    down, unneeded = pilot_actions(snapshot, memory, config, now, used, site_ok, bool(actions),
                                    spare)
    return Plan(
        actions=tuple(actions + down),
        unmatchable=tuple(unmatchable),
        summary=tuple(summaries),
        unplaced_jobs=sum(r.left for r in rows),
        reserve_jobs=reserve,
        reserve_held=reserve - sum(r.left for r in ghosts),
        reserve_sized=sized,
        reserve_lead_s=reserve_lead(memory, config) if ghosts or sized else 0.0,
        unneeded=tuple(unneeded),
        hedges=tuple(sorted(set(late) - memory.hedged)) if actions else (),
        unplaced=tuple((r.shape, r.left) for r in rows if r.left),
    )
