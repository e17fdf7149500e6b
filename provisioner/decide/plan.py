"""The decision core: `plan(snapshot, memory, config, now) -> Plan`. Pure: no I/O, no clock.

`snapshot` is what this cycle observed, `memory` what earlier cycles left (`CycleMemory`:
flags, learnt lead times, limits, the queue's history; the controller keeps it).

One cycle, as named stages over small records (a `Row` per demand shape, a `SiteRow` per
site):

1. `match_demand`: every demand shape to the sites whose largest pilot can run it
   (`provisioner.decide.matching`); shapes no site can run are `Unmatchable` and cause nothing.
   The predictive reserve (`provisioner.decide.reserve`) adds rows after all real demand.
2. `fill_existing`: rows into capacity that exists: free resources of BUSY then IDLE pilots
   that can still take work, then the whole shape of STARTING and PENDING pilots.
3. `fill_new`: what is left into new pilots, each site limited by its caps and the global
   per-cycle cap; real demand at every site first, then the reserve. New pilots are sized
   down to what they hold (between min_cpus and cpus).
4. `submissions`: one `Submit` per site and pilot size, and the per-site summary.
5. `pilot_actions` (`provisioner.decide.scaledown`): flag, unflag, release, cancel, retire.

Existing and new capacity share one packing index (`provisioner.decide.packing.CapacityIndex`).
If the pool is unknown nothing happens; at an unknown site nothing happens, but its
pilots' capacity still counts.
"""

from __future__ import annotations

import gc
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from operator import attrgetter

from provisioner.config import Config, SiteBase
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
    INF,
    NO_SHARE,
    BinGroup,
    CapacityIndex,
    GpuShare,
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
from provisioner.model import (
    Action,
    Cap,
    CycleMemory,
    Pilot,
    PilotState,
    Plan,
    SiteSummary,
    Snapshot,
    Submit,
    by_state,
)

__all__ = ["SiteRow", "carry_over", "demand_of", "item_of", "plan", "reserve_size",
           "site_rejects", "unmatchable_reason"]

# Existing capacity is used in this order: fill pilots already working first, so idle ones
# can be released and pending ones cancelled.
_TIERS: tuple[PilotState, ...] = (
    PilotState.BUSY,
    PilotState.IDLE,
    PilotState.STARTING,
    PilotState.PENDING,
)
_WHOLE = _TIERS.index(PilotState.STARTING)  # from this tier on a pilot counts whole
_PENDING_TIER = _TIERS.index(PilotState.PENDING)
#: the states of pilots not yet in the pool
_NOT_UP = (PilotState.PENDING, PilotState.STARTING)


@dataclass
class SiteRow:
    """Everything one cycle knows and decides about one site."""

    config: SiteBase
    known: bool  # squeue answered this cycle
    held: int = 0  # pilots SLURM holds, ENDING ones too (what max_pilots counts)
    pending: int = 0
    existing: dict[int, CapacityIndex] = field(default_factory=dict)  # tier -> index
    room: dict[Cap, int] = field(default_factory=dict)  # cap -> new pilots it allows
    new: NewPilots | None = None
    absorbed: int = 0  # real jobs given to existing capacity
    absorbed_reserve: int = 0
    offered_jobs: int = 0  # real jobs offered to new pilots here
    offered_cpus: int = 0
    new_jobs: int = 0  # real jobs placed on new pilots
    new_reserve: int = 0

    @property
    def name(self) -> str:
        return self.config.name

    def load(self) -> float:
        """Share of the site's pilot cap in use, new pilots of this cycle included."""
        opened = self.new.opened if self.new is not None else 0
        return (self.held + opened) / max(1, self.config.caps.max_pilots)


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


def site_rows(snapshot: Snapshot, memory: CycleMemory, config: Config,
              pending: Sequence[Pilot] | None = None) -> dict[str, SiteRow]:
    """One `SiteRow` per configured site with its pilot counts, its room for new pilots
    (the tightest of its caps, its circuit breaker and its SLURM limits; none at a site
    not read this cycle) and an empty `NewPilots`. `pending`: the snapshot's PENDING
    pilots, if already sorted out (`by_state`)."""
    known = {v.name: v.known for v in snapshot.sites}
    rows = {s.name: SiteRow(s, known.get(s.name, False)) for s in config.sites}
    # An ENDING pilot is no capacity, but its batch job still holds the allocation until
    # it leaves SLURM: the cap counts it. (Counted in C; the pending ones apart: a
    # (site, state) key per pilot cost more than a second pass.)
    for site, n in Counter(map(_SITE, snapshot.pilots)).items():
        row = rows.get(site)
        if row is not None:
            row.held += n
    if pending is None:
        pending = by_state(snapshot.pilots)[PilotState.PENDING]
    for site, n in Counter(map(_SITE, pending)).items():
        row = rows.get(site)
        if row is not None:
            row.pending += n
    for s in rows.values():
        caps = s.config.caps
        s.room = {
            Cap.MAX_PILOTS: caps.max_pilots - s.held,
            Cap.MAX_PENDING: caps.max_pending - s.pending,
            Cap.SITE_MAX_SUBMIT: caps.max_submit_per_cycle,
        }
        limit = memory.submit_limit.get(s.name)
        if limit is not None:
            s.room[Cap.BREAKER] = limit
        limit = memory.limit_room.get(s.name)
        if limit is not None:
            s.room[Cap.SLURM_LIMITS] = limit
        allowed = max(0, min(s.room.values())) if s.known else 0
        shape = s.config.pilot
        s.new = NewPilots(shape.cpus, shape.memory_mb, shape.gpus, allowed, shape.pack_cpus)
    return rows


def add_capacity(sites: dict[str, SiteRow], snapshot: Snapshot, now: float,
                 registry: list[BinGroup], skip: Iterable[str] = (),
                 states: Mapping[PilotState, Sequence[Pilot]] | None = None) -> None:
    """Existing capacity as identical-bin groups, one index per site and tier; pilots in
    `skip` are no capacity. `states`: the snapshot's pilots by state, if already sorted
    out (`by_state`)."""
    skip = frozenset(skip)
    if states is None:
        states = by_state(snapshot.pilots)
    # (site, tier, free cpus, memory and GPUs, GPU share's cpus and memory) -> pilots
    # (its pilots' ends, the pilots): two lists, not a tuple per pilot
    raw: dict[tuple[str, int, int, int, int, int, int], tuple[list[float], list[Pilot]]] = {}
    # per site: (walltime of a fresh pilot, shutdown margin), looked up once
    times = {name: (s.config.pilot.walltime_s, s.config.pilot.shutdown_margin_s)
             for name, s in sites.items()}
    # the groups with an end not read off a pilot's `walltime_end` (see below)
    derived: set[tuple[str, int, int, int, int, int, int]] = set()
    # tier by tier: the pilots of each (site, tier) keep the snapshot's order
    for tier, state in enumerate(_TIERS):
        whole, pending = tier >= _WHOLE, tier == _PENDING_TIER
        for p in states[state]:
            if whole:
                c, m, g = p.cpus, p.memory_mb, p.gpus
            else:
                c = p.free_cpus
                if c <= 0:
                    continue
                m, g = p.free_memory_mb, p.free_gpus
            site_times = times.get(p.site)
            if site_times is None or p.limit_reason or (skip and p.key in skip):
                continue  # a pilot pending at a job-count limit is no capacity on its way
            # when SLURM ends the pilot: a pending pilot gets a full walltime when it starts
            # (its runtime fit was checked per site), so it has no end yet; a pilot whose end
            # is not known ends a walltime after its start. Within the shutdown margin of its
            # end a pilot starts no jobs: no capacity. (Inline: this runs per pilot.)
            if pending:
                end, read = INF, False
            else:
                known_end = p.walltime_end
                read = known_end is not None
                if known_end is None:
                    start = p.started_at if p.started_at is not None else now
                    end = start + site_times[0]
                else:
                    end = known_end
                if end - site_times[1] <= now:
                    continue
            # the GPU share (`gpu_share`) as plain numbers; a `GpuShare` per group
            gpus = p.gpus
            if gpus > 0:
                key = (p.site, tier, c, m, g, p.cpus // gpus, p.memory_mb // gpus)
            else:
                key = (p.site, tier, c, m, g, 0, 0)
            if not read:
                derived.add(key)
            members = raw.get(key)
            if members is None:
                raw[key] = ([end], [p])
            else:
                members[0].append(end)
                members[1].append(p)
    by_index: dict[tuple[str, int], list[BinGroup]] = {}
    for key, (untils, pilots) in raw.items():
        site_name, tier, c, m, g, share_c, share_m = key
        if len(pilots) > 1:  # a pilot alone in its group (common): nothing to sort
            # latest end first; stable (also reversed): equal ends keep snapshot order
            if key in derived:
                order = sorted(range(len(untils)), key=untils.__getitem__, reverse=True)
                untils, pilots = [untils[i] for i in order], [pilots[i] for i in order]
            else:  # every end is its pilot's own: two sorts in C, not a permutation
                untils.sort(reverse=True)
                pilots.sort(key=_WALLTIME_END, reverse=True)
        by_index.setdefault((site_name, tier), []).append(
            BinGroup(c, m, g, untils[0], len(pilots), pilots, untils=untils,
                     share=GpuShare(share_c, share_m) if share_c or share_m else NO_SHARE))
    for site_name, tier in sorted(by_index):
        sites[site_name].existing[tier] = CapacityIndex(by_index[site_name, tier], registry)


def fill_existing(rows: Iterable[Row], sites: dict[str, SiteRow], now: float,
                  floor: Item) -> None:
    """Stage 2: each row's jobs into existing capacity, tier by tier (running pilots
    first, pending last), at its sites in the row's order."""
    tiers = range(len(_TIERS))
    # per tier: site name -> its index, looked up once, not per row
    indexes = [{name: s.existing[tier] for name, s in sites.items() if tier in s.existing}
               for tier in tiers]
    # per tier: the most cores and memory any site's index may still have free (upper
    # bounds: fills only lower them; `fresh` says whether they are exact again): a row
    # larger than that skips the tier
    bounds = [_tier_bound(at_tier.values()) for at_tier in indexes]
    fresh = [True for _tier in tiers]
    for row in rows:
        deadline = now + (row.item.runtime_s or 0)
        c, m = row.item.cpus, row.item.memory_mb
        for tier in tiers:
            if c <= bounds[tier][0] and m <= bounds[tier][1] and not fresh[tier]:
                bounds[tier], fresh[tier] = _tier_bound(indexes[tier].values()), True
            if c > bounds[tier][0] or m > bounds[tier][1]:
                continue  # no site's index can hold this job (cheap pre-check)
            at_tier = indexes[tier]
            for site_name in row.sites:
                bins = at_tier.get(site_name)
                # `bins.may_fit(row.item)`, inlined (this runs per row, tier and site):
                # nothing there can hold this job (cheap pre-check)
                if bins is None or not bins.keys or bins.max_cpus < c or bins.max_mem < m:
                    continue
                got = bins.fill(row.item, row.left, deadline, floor)
                fresh[tier] = False
                if row.reserve:
                    sites[site_name].absorbed_reserve += got
                else:
                    sites[site_name].absorbed += got
                row.left -= got
                if row.left == 0:
                    break
            if row.left == 0:
                break


def _tier_bound(indexes: Iterable[CapacityIndex]) -> tuple[int, int]:
    """The most free cores and the most free memory of any of the `indexes` (one tier's)."""
    indexes = list(indexes)
    return (max(map(_MAX_CPUS, indexes), default=0),
            max(map(_MAX_MEM, indexes), default=0))


_SITE = attrgetter("site")
_WALLTIME_END = attrgetter("walltime_end")
_MAX_CPUS = attrgetter("max_cpus")
_MAX_MEM = attrgetter("max_mem")


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
    return row.item.per_bin(min(p.cpus, max(p.pack_cpus, row.item.cpus)), p.memory_mb, gpus)


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


def _size_new_pilot(site: SiteBase, used_cpus: int, used_mem: int,
                    used_gpus: int = 0) -> tuple[int, int, int]:
    """(cpus, memory_mb, gpus) of a new pilot holding the given jobs: GPUs only as many
    as its jobs use (a GPU site's pilot for CPU-only jobs asks SLURM for none)."""
    p = site.pilot
    cpus = min(p.cpus, max(p.min_cpus, used_cpus))
    memory = min(p.memory_mb, max(p.memory_per_cpu_mb * cpus, used_mem))
    return cpus, memory, min(p.gpus, used_gpus)


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
                shapes[_size_new_pilot(s.config, g.used_cpus, g.used_mem, g.used_gpus)] += (
                    g.count)
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
    tie = config.policy.placement.tie_share
    global_left = fill_new(rows, sites, config.policy.max_submit_per_cycle, costs, tie)
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
