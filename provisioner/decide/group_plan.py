"""`plan()` where some site has allocations (pure): the same stages, over lanes.

`provisioner.decide.plan.plan` hands the cycle here when `Config.groups_in_use`; the
stages are those of the plain cycle (`provisioner.decide.plan`), with a site that has
allocations split into one lane per allocation (`provisioner.decide.groups`):

1. the sites' rows (`site_rows`) become lanes, each allocation's budget from the books
   and its pilots in flight (`provisioner.decide.budget.budgets`, with the allocations
   SLURM's refusals stopped: `CycleMemory.stopped_allocations`);
2. existing capacity goes to the lane of the pilot's account; a pilot whose account
   matches no allocation of its site is no capacity;
3. demand and reserve rows are offered only to the rows that serve their group;
4. new pilots are admitted by their lane's budget one after another (`LaneBudget`);
5. each lane's pilots are one `Submit` per size, with `Submit.allocation` set; the
   summary stays one per site;
6. scale-down is the plain one, per site;
7. the plan (`GroupPlan`) also carries the budgets and why groups wait
   (`provisioner.decide.budget_why`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from provisioner.config import Config, SiteBase
from provisioner.decide.budget import Budget, budgets
from provisioner.decide.budget_why import GroupWait, group_waits
from provisioner.decide.capacity import SiteRow, add_capacity, fill_existing, ordered_sites
from provisioner.decide.groups import (
    Lanes,
    build_lanes,
    into_lanes,
    lane_costs,
    lane_key,
    mark_bound_lanes,
    site_caps,
)
from provisioner.decide.matching import Row, ShapeMatches, match_demand
from provisioner.decide.newpilots import fill_new, submissions
from provisioner.decide.packing import BinGroup, Item
from provisioner.decide.placement import slow_pending
from provisioner.decide.reasons import Reason
from provisioner.decide.reserve import reserve_lead, reserve_rows
from provisioner.decide.scaledown import pilot_actions
from provisioner.decide.sizing import new_pilot_size, pack_reserve
from provisioner.model import (
    Action,
    CycleMemory,
    Pilot,
    PilotState,
    Plan,
    SiteSummary,
    Snapshot,
    Submit,
    Unmatchable,
    by_state,
)

_NOT_UP = (PilotState.PENDING, PilotState.STARTING)


@dataclass(frozen=True)
class GroupPlan(Plan):
    """A `Plan` where some site has allocations, with what they decided."""

    #: every allocation's budget at the start of the cycle (config order)
    budgets: tuple[Budget, ...] = ()
    #: groups whose jobs wait for their allocations, and why
    group_waits: tuple[GroupWait, ...] = ()
    #: (site, allocation, the worst case of this plan's new pilots charged to it)
    committing: tuple[tuple[str, str, float], ...] = ()


@dataclass
class _Placed:
    """The cycle's rows after stages 1-4."""

    lanes: Lanes
    budgets: dict[tuple[str, str], Budget]
    rows: list[Row]
    ghosts: list[Row]
    unserved: list[Row]
    unmatchable: list[Unmatchable]
    late: dict[str, str]  # pending pilots that are no capacity -> their row's key
    registry: list[BinGroup]
    offered: dict[str, tuple[int, int]]  # site -> real jobs (and cores) new pilots were offered
    global_left: int
    sized: int


def plan_groups(snapshot: Snapshot, memory: CycleMemory, config: Config, now: float
                ) -> GroupPlan:
    """`plan()` with allocations as lanes (see the module's docstring). The pool not
    read: no action, the budgets only."""
    if not snapshot.pool_known:
        books = budgets(config, snapshot, now, memory.stopped_allocations)
        return GroupPlan(actions=(), budgets=tuple(books.values()))
    states = by_state(snapshot.pilots)
    placed, order = _place(snapshot, memory, config, now, states)
    lanes, rows, ghosts = placed.lanes, placed.rows, placed.ghosts
    actions, summaries = lane_submissions(order, lanes, rows, placed.global_left,
                                          placed.offered)
    _settle(lanes, actions)
    used = {p.key for g in placed.registry if g.jobs > 0 for p in g.members}
    if placed.late:  # kept while demand they could run is queued
        wanted = set().union(*(r.sites for r in rows))
        used |= {key for key, name in placed.late.items() if name in wanted}
    site_ok = {name: s.known and snapshot.scale_down_ok for name, s in lanes.sites.items()}
    reserve = sum(r.jobs for r in ghosts)
    spare = (not actions and not reserve and not any(r.left for r in rows)
             and not any(p.key in used for state in _NOT_UP for p in states[state]))
    down, unneeded = pilot_actions(snapshot, memory, config, now, used, site_ok,
                                   bool(actions), spare)
    late = placed.late
    waits = group_waits(rows, placed.unserved, lanes, config)
    return GroupPlan(
        actions=tuple(actions + down),
        unmatchable=tuple(placed.unmatchable),
        summary=tuple(summaries),
        unplaced_jobs=max(0, sum(r.left for r in rows) - budget_held(waits)),
        reserve_jobs=reserve,
        reserve_held=reserve - sum(r.left for r in ghosts),
        reserve_sized=placed.sized,
        reserve_lead_s=reserve_lead(memory, config) if ghosts or placed.sized else 0.0,
        unneeded=tuple(unneeded),
        hedges=tuple(sorted(set(late) - memory.hedged)) if actions else (),
        unplaced=tuple((r.shape, r.left) for r in rows if r.left),
        budgets=tuple(placed.budgets.values()),
        group_waits=waits,
        committing=tuple((lane.site.name, lane.alloc.name, lane.budget.already)
                         for lane in lanes.lanes.values() if lane.budget.opened),
    )


def budget_held(waits: Sequence[GroupWait]) -> int:
    """The jobs that wait for their allocations (paced, spent, closed, at max_pilots):
    not "demand left over by caps", which asks for a cycle at every quick check. A
    budget frees room only as time passes or pilots end, and those bring their own
    cycles (the interval, a pilot that became idle or left)."""
    return sum(w.jobs for w in waits if w.why.reason is not Reason.GROUP_UNSERVED)


def _place(snapshot: Snapshot, memory: CycleMemory, config: Config, now: float,
           states: dict[PilotState, list[Pilot]]) -> tuple[_Placed, tuple[SiteBase, ...]]:
    """Stages 1-4: the lanes, existing capacity, demand and reserve into it and into new
    pilots; and the sites in placement order."""
    pending = states[PilotState.PENDING]
    ordered = ordered_sites(snapshot, memory, config, now, pending)
    leads, costs, order, per_site = ordered.leads, ordered.costs, ordered.order, ordered.rows
    books = budgets(config, snapshot, now, memory.stopped_allocations)
    lanes = build_lanes(per_site, books, snapshot.pilots)
    can_submit = [name for name in per_site
                  if any(s.new is not None and s.new.allowed for s in _rows_of(lanes, name))]
    late_sites = (slow_pending(snapshot, memory, config, now, leads, can_submit, pending)
                  if config.policy.max_submit_per_cycle > 0 else {})
    late = {p.key: key for p in pending if p.key in late_sites
            and (key := lanes.lane_of(p)) is not None}
    registry: list[BinGroup] = []
    add_capacity(lanes.rows, snapshot, now, registry, skip=late_sites, states=states,
                 lane_of=lanes.lane_of)
    matches = ShapeMatches(order)
    rows, unmatchable = match_demand(snapshot.demand, order, matches)
    rows, unserved = into_lanes(rows, lanes)
    ghosts, sized = reserve_rows(snapshot, memory, config, order, now, matches)
    ghosts, _none = into_lanes(ghosts, lanes)
    global_left, offered = _fill(snapshot, memory, config, lanes, rows, ghosts,
                                 lane_costs(costs, lanes), now)
    placed = _Placed(lanes, books, rows, ghosts, unserved, unmatchable, late, registry,
                     offered, global_left, sized)
    return placed, order


def _rows_of(lanes: Lanes, site: str) -> list[SiteRow]:
    """The rows of `site`: its lanes', or its own."""
    return [lane.row for lane in lanes.of_site(site)] or [lanes.rows[site]]


def _fill(snapshot: Snapshot, memory: CycleMemory, config: Config, lanes: Lanes,
          rows: list[Row], ghosts: list[Row], costs: dict[str, float], now: float
          ) -> tuple[int, dict[str, tuple[int, int]]]:
    """Stages 2-3 over the lanes: existing capacity, then new pilots (demand first, then
    the reserve). Returns what is left of the cycle's new pilots, and per site the real
    jobs (and cores) offered to new pilots."""
    everything = rows + ghosts
    floor = Item(cpus=min((r.item.cpus for r in everything), default=1),
                 memory_mb=min((r.item.memory_mb for r in everything), default=0))
    fill_existing(everything, lanes.rows, now, floor)
    running: dict[str, int] = {}
    for p in snapshot.pilots:
        if p.state in (PilotState.BUSY, PilotState.IDLE):
            running[p.site] = running.get(p.site, 0) + max(0, p.cpus - p.free_cpus)
    mark_bound_lanes(lanes, rows, running, memory.pilot_limits)
    offered: dict[str, tuple[int, int]] = {}
    for r in rows:
        if r.left:
            for name in dict.fromkeys(lanes.site_of(k) for k in r.sites):
                jobs, cpus = offered.get(name, (0, 0))
                offered[name] = (jobs + r.left, cpus + r.left * r.item.cpus)
    tie = config.policy.placement.tie_share
    left = fill_new(rows, lanes.rows, config.policy.max_submit_per_cycle, costs, tie)
    rates = memory.shape_rates
    pack_reserve(lanes.rows.values(), sum(r.jobs for r in ghosts),
                 sum(rates.values()) if rates else None)
    return fill_new(ghosts, lanes.rows, left, costs, tie), offered


def lane_submissions(order: Sequence[SiteBase], lanes: Lanes, rows: Sequence[Row],
                     global_room: int, offered: dict[str, tuple[int, int]]
                     ) -> tuple[list[Action], list[SiteSummary]]:
    """Stage 5: per site in `order`, a site without allocations as `submissions` has it;
    a site with allocations one `Submit` per lane and pilot size (`Submit.allocation`
    its name), and one summary over its lanes."""
    actions: list[Action] = []
    summaries: list[SiteSummary] = []
    for site in order:
        if site.name not in lanes.budgeted:
            more, summary = submissions([lanes.rows[site.name]], rows, global_room)
            actions += more
            summaries += summary
            continue
        here = lanes.of_site(site.name)
        counts = [_lane_shapes(lane.row) for lane in here]
        for lane, shapes in zip(here, counts, strict=True):
            actions += _lane_submits(lane.key, lane.alloc.name, lane.row, shapes)
        keys = {lane.key for lane in here}
        opened = sum(sum(shapes.values()) for shapes in counts)
        capped = (site_caps(lanes, site.name, opened, global_room)
                  if any(r.left and keys.intersection(r.sites) for r in rows) else None)
        jobs, cpus = offered.get(site.name, (0, 0))
        absorbed = sum(lane.row.absorbed for lane in here)
        summaries.append(SiteSummary(
            site=site.name, demand_jobs=jobs + absorbed, demand_cpus=cpus,
            existing_jobs=absorbed, new_pilot_jobs=sum(lane.row.new_jobs for lane in here),
            new_pilots=opened,
            new_cpus=sum(c * n for shapes in counts for (c, _m, _g), n in shapes.items()),
            capped=capped, reserve_jobs=sum(lane.row.absorbed_reserve + lane.row.new_reserve
                                            for lane in here)))
    return actions, summaries


def _settle(lanes: Lanes, actions: Sequence[Action]) -> None:
    """Each lane's `already` as its `Submit`s commit it: pilots sized down below the
    size they were admitted at give the difference back (for the reasons' figures)."""
    cost: dict[tuple[str, str], float] = defaultdict(float)
    for a in actions:
        if isinstance(a, Submit) and a.allocation:
            b = lanes.lanes[lane_key(a.site, a.allocation)].budget.budget
            cost[(a.site, a.allocation)] += a.count * b.cost(a.cpus, a.gpus)
    for lane in lanes.lanes.values():
        lane.budget.already = cost.get((lane.site.name, lane.alloc.name), 0.0)


def _lane_shapes(s: SiteRow) -> dict[tuple[int, int, int], int]:
    """A lane's new pilots by size: each sized down to its jobs (`new_pilot_size`), never
    above the size its budget admitted it at (a bin's cores)."""
    new = s.new
    assert new is not None
    shapes: dict[tuple[int, int, int], int] = defaultdict(int)
    for g in new.registry:
        if g.count > 0 and g.jobs > 0:
            admitted = g.free_cpus + g.used_cpus
            shapes[new_pilot_size(s.config, g.used_cpus, g.used_mem, g.used_gpus,
                                  min(s.bound, admitted))] += g.count
    return shapes


def _lane_submits(key: str, allocation: str, s: SiteRow,
                  shapes: dict[tuple[int, int, int], int]) -> list[Action]:
    n_new = sum(shapes.values())
    why = f"{s.new_jobs} idle jobs"
    if s.new_reserve:
        why += f" and {s.new_reserve} reserve slots"
    return [Submit(site=s.name, count=n, cpus=cpus, memory_mb=mem,
                   walltime_s=s.config.pilot.walltime_s,
                   reason=f"{why} need {n_new} new pilots at {key}", gpus=gpus,
                   allocation=allocation)
            for (cpus, mem, gpus), n in sorted(shapes.items(), reverse=True)]
