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
3. `fill_new` (`provisioner.decide.newpilots`): what is left into new pilots, each site
   limited by its caps and the global per-cycle cap; real demand at every site first,
   then the reserve. New pilots are sized
   down to what they hold (between min_cpus and cpus), or take the site's whole shape
   where its pilots, not its cores, are scarce (`provisioner.decide.sizing`).
4. `submissions`: one `Submit` per site and pilot size, and the per-site summary.
5. `pilot_actions` (`provisioner.decide.scaledown`): flag, unflag, release, cancel, retire.

Where some site has allocations, the cycle goes to `provisioner.decide.group_plan`: the
same stages, a site with allocations split into one lane per allocation.

Existing and new capacity share one packing index (`provisioner.decide.packing.CapacityIndex`).
If the pool is unknown nothing happens; at an unknown site nothing happens, but its
pilots' capacity still counts.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from provisioner.config import Config
from provisioner.decide.capacity import (
    _TIERS,
    SiteRow,
    add_capacity,
    fill_existing,
    mark_bound,
    ordered_sites,
    site_rows,
)
from provisioner.decide.group_plan import plan_groups
from provisioner.decide.matching import (
    ShapeMatches,
    demand_of,
    item_of,
    match_demand,
    site_rejects,
    unmatchable_reason,
)
from provisioner.decide.newpilots import (
    _per_pilot,
    _pilots_left,
    fill_new,
    submissions,
)
from provisioner.decide.packing import (
    BinGroup,
    Item,
)
from provisioner.decide.placement import (
    slow_pending,
)
from provisioner.decide.reserve import reserve_lead, reserve_rows, reserve_size
from provisioner.decide.scaledown import carry_over, pilot_actions
from provisioner.decide.sizing import pack_reserve
from provisioner.model import (
    CycleMemory,
    PilotState,
    Plan,
    Snapshot,
    by_state,
)

__all__ = ["_TIERS", "SiteRow", "_per_pilot", "_pilots_left", "carry_over", "demand_of",
           "fill_new", "item_of", "plan", "reserve_size", "site_rejects", "site_rows",
           "submissions", "unmatchable_reason"]

#: the states of pilots not yet in the pool
_NOT_UP = (PilotState.PENDING, PilotState.STARTING)


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
    if config.groups_in_use:  # sites with allocations: lanes (none of it runs otherwise)
        return plan_groups(snapshot, memory, config, now)
    if not snapshot.pool_known:
        return Plan(actions=())
    states = by_state(snapshot.pilots)  # several stages read only some states
    pending = states[PilotState.PENDING]
    ordered = ordered_sites(snapshot, memory, config, now, pending)
    leads, costs, order, sites = ordered.leads, ordered.costs, ordered.order, ordered.rows
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
