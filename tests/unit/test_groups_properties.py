"""Properties of plan() with allocations over random budgeted snapshots (hypothesis):
never past a budget, a group's jobs only on its allocations, each lane its own pilots,
and with budgets that do not bind the same decisions as without allocations."""

from __future__ import annotations

import dataclasses
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.config import AllocationConfig, Config
from provisioner.decide.budget import BudgetStatus, budgets
from provisioner.decide.capacity import add_capacity, site_rows
from provisioner.decide.groups import build_lanes
from provisioner.decide.plan import plan
from provisioner.model import (
    AllocationBooks,
    CycleMemory,
    Demand,
    JobShape,
    Pilot,
    PilotState,
    Plan,
    SiteView,
    Snapshot,
    Submit,
    by_state,
)

from .allocs import DEC10, alloc, budgeted, groups_config
from .helpers import site
from .test_plan_properties import SETTINGS, scenarios

NOW = DEC10 + 3 * 3600.0
GROUPS = ("g1", "g2", "g3")
SITES = ("a", "b", "c")
Budgeted = tuple[Snapshot, CycleMemory, Config]


# (hypothesis draws the first of sampled values and the least integers most: the common
# case comes first)
@st.composite
def allocations(draw: st.DrawFn, site_name: str, gpus: int) -> tuple[AllocationConfig, ...]:
    out = []
    for i in range(draw(st.integers(1, 3))):
        units = ["core-hours", "node-hours"] + (["gpu-hours"] if gpus else [])
        period = draw(st.sampled_from(("monthly", "monthly", "monthly", "quarterly", "quarterly",
                                       {"start": "2026-12-01", "end": "2026-12-11"},
                                       {"start": "2026-11-01", "end": "2026-12-01"},
                                       {"start": "2027-01-01", "end": "2027-02-01"})))
        out.append(alloc(
            f"{site_name}-{i}", draw(st.lists(st.sampled_from(GROUPS), min_size=1,
                                              max_size=2, unique=True)),
            unit=draw(st.sampled_from(units)),
            amount=draw(st.sampled_from((2000.0, 300.0, 40.0, 5.0, 20_000.0, 1e6))),
            pace=draw(st.sampled_from(("asap", "asap", "even"))), period=period,
            max_pilots=draw(st.sampled_from((None, None, None, 0, 1, 3)))))
    return tuple(out)


@st.composite
def budgeted_scenarios(draw: st.DrawFn) -> Budgeted:
    sites = []
    for i, name in enumerate(SITES):
        cpus = draw(st.integers(1, 16))
        gpus = draw(st.sampled_from((0, 0, 2)))
        s = site(name, cpus=cpus, min_cpus=draw(st.integers(1, cpus)),
                 memory_mb=cpus * 2000,
                 walltime_s=draw(st.sampled_from((3600, 3600, 7200, 86400))),
                 weight=1.0 + i * 0.01, max_pilots=draw(st.sampled_from((40, 12, 4, 0))),
                 max_pending=draw(st.sampled_from((40, 8, 3, 0))),
                 max_submit=draw(st.sampled_from((40, 8, 2, 0))))
        s = s.model_copy(update={"pilot": s.pilot.model_copy(update={"gpus": gpus})})
        if i < 2 or draw(st.integers(0, 3)) < 3:  # at least two sites with allocations
            s = budgeted(s, *draw(allocations(name, gpus)))
        sites.append(s)
    cfg = groups_config(*sites, max_submit=draw(st.sampled_from((60, 20, 5, 0))))
    accounts = {s.name: [a.account for a in s.allocations] + ["stray", ""] for s in sites}
    pilots = []
    for i in range(draw(st.integers(0, 10))):
        s = draw(st.sampled_from(sites))
        state = draw(st.sampled_from(list(PilotState)))
        cpus = draw(st.integers(1, s.pilot.cpus))
        started = None if state is PilotState.PENDING else NOW - draw(st.integers(0, 5000))
        full = state in (PilotState.PENDING, PilotState.STARTING, PilotState.IDLE)
        pilots.append(Pilot(
            s.name, str(i), state, cpus, cpus * 2000, NOW - 6000, started_at=started,
            walltime_end=None if started is None else started + s.pilot.walltime_s,
            free_cpus=cpus if full else draw(st.integers(0, cpus)),
            free_memory_mb=cpus * 2000, gpus=s.pilot.gpus, free_gpus=s.pilot.gpus,
            account=draw(st.sampled_from(accounts[s.name]))))
    books = []
    for s in sites:
        for a in s.allocations:
            spent = draw(st.sampled_from((0.0, 0.0, 0.0, 0.1, 0.3, 0.9, 0.999, 1.1, None)))
            if spent is not None or draw(st.booleans()):  # absent: unknown too
                books.append(AllocationBooks(s.name, a.name, (spent or 0) * a.amount,
                                             known=spent is not None))
    shapes = st.builds(JobShape, cpus=st.integers(1, 16), memory_mb=st.integers(1, 20000),
                       gpus=st.sampled_from((0, 0, 1)),
                       group=st.sampled_from((*GROUPS, "", "gx")))
    demand = draw(st.lists(st.builds(Demand, shape=shapes, idle=st.integers(1, 40)),
                           min_size=1, max_size=8))
    arrivals = draw(st.lists(st.builds(Demand, shape=shapes, idle=st.integers(0, 50)),
                             max_size=3))
    stopped = {(s.name, a.name): "stopped: SLURM refused its account" for s in sites
               for a in s.allocations if draw(st.integers(0, 9)) == 9}
    snap = Snapshot(demand=tuple(demand), pilots=tuple(pilots),
                    sites=tuple(SiteView(n, draw(st.integers(0, 4)) < 4 or n == "a")
                                for n in SITES),
                    recent_arrivals=tuple(arrivals), books=tuple(books))
    memory = CycleMemory(arrival_window_s=draw(st.sampled_from((0.0, 900.0))),
                         stopped_allocations=stopped)
    return snap, memory, cfg


CLOSED = (BudgetStatus.STOPPED, BudgetStatus.UNKNOWN, BudgetStatus.NOT_STARTED,
          BudgetStatus.ENDED)


@settings(parent=SETTINGS, max_examples=300)
@given(budgeted_scenarios())
def test_no_allocation_is_committed_past_its_allowance(sc: Budgeted) -> None:
    snap, memory, cfg = sc
    result = plan(snap, memory, cfg, NOW)
    books = budgets(cfg, snap, NOW, memory.stopped_allocations)
    cost: dict[tuple[str, str], float] = {}
    count: Counter[tuple[str, str]] = Counter()
    for s in result.submits:
        site_cfg = cfg.site(s.site)
        if not site_cfg.allocations:
            assert s.allocation == ""
            continue
        key = (s.site, s.allocation)
        assert key in books, s
        cost[key] = cost.get(key, 0.0) + s.count * books[key].cost(s.cpus, s.gpus)
        count[key] += s.count
        assert site_cfg.pilot.min_cpus <= s.cpus <= site_cfg.pilot.cpus
    for key, b in books.items():
        # never past it: the worst case of the new pilots within what even pace allows,
        # and with what is spent and committed within the amount
        assert cost.get(key, 0.0) <= b.allowance + 1e-6, (key, b)
        if count[key]:
            assert b.known and b.spent + b.committed + cost[key] <= b.amount + 1e-6
            assert b.status not in CLOSED and b.status is not BudgetStatus.SPENT
        a = cfg.site(key[0]).allocation(key[1])
        if a.max_pilots is not None:
            held = sum(1 for p in snap.pilots if p.site == key[0] and p.account == a.account)
            assert count[key] <= max(0, a.max_pilots - held)


@SETTINGS
@given(budgeted_scenarios())
def test_a_groups_jobs_are_offered_only_to_lanes_serving_it(sc: Budgeted) -> None:
    snap, memory, cfg = sc
    result = plan(snap, memory, cfg, NOW)
    asked = {d.shape.group for d in snap.demand + snap.recent_arrivals if d.idle}
    for s in result.submits:
        if s.allocation:
            groups = set(cfg.site(s.site).allocation(s.allocation).groups)
            assert groups & asked, (s, asked)
    # the site's caps hold over its lanes together
    for site_cfg in cfg.sites:
        n = sum(a.count for a in result.submits if a.site == site_cfg.name)
        held = sum(1 for p in snap.pilots if p.site == site_cfg.name)
        assert n <= max(0, site_cfg.caps.max_pilots - held)
        assert n <= site_cfg.caps.max_submit_per_cycle
    assert sum(s.count for s in result.submits) <= cfg.policy.max_submit_per_cycle


@SETTINGS
@given(budgeted_scenarios())
def test_each_lane_holds_only_its_own_allocations_pilots(sc: Budgeted) -> None:
    snap, memory, cfg = sc
    per_site = site_rows(snap, memory, cfg)
    lanes = build_lanes(per_site, budgets(cfg, snap, NOW), snap.pilots)
    registry: list[object] = []
    add_capacity(lanes.rows, snap, NOW, registry, states=by_state(snap.pilots),  # type: ignore[arg-type]
                 lane_of=lanes.lane_of)
    for key, row in lanes.rows.items():
        for index in row.existing.values():
            for bucket in index.buckets.values():
                for group in bucket:
                    for p in group.members:
                        lane = lanes.lanes.get(key)
                        if lane is None:  # a site without allocations: its own pilots
                            assert p.site == key
                        else:
                            assert (p.site, p.account) == (lane.site.name,
                                                           lane.alloc.account)


def _served_by_one_allocation(sc: tuple[Snapshot, CycleMemory, Config]
                              ) -> tuple[Snapshot, CycleMemory, Config]:
    """A scenario with every site given one allocation that does not bind, serving the
    one group of every job, every pilot charged to it."""
    snap, memory, cfg = sc
    sites = [budgeted(s, alloc(f"{s.name}-all", ["g"], amount=1e12)) for s in cfg.sites]
    grouped = groups_config(*sites)
    grouped = grouped.model_copy(update={"policy": cfg.policy})

    def g(rows: tuple[Demand, ...]) -> tuple[Demand, ...]:
        return tuple(dataclasses.replace(d, shape=dataclasses.replace(d.shape, group="g"))
                     for d in rows)

    pilots = tuple(dataclasses.replace(p, account=f"{p.site}-all") for p in snap.pilots)
    books = tuple(AllocationBooks(s.name, f"{s.name}-all", 0.0) for s in sites)
    snap = dataclasses.replace(snap, demand=g(snap.demand), recent_arrivals=g(snap.recent_arrivals),
                               pilots=pilots, books=books)
    return snap, memory, grouped


def _decisions(p: Plan) -> tuple[object, ...]:
    """What a plan decides, without the texts and allocation names lanes change."""
    actions = tuple((a.site, a.count, a.cpus, a.memory_mb, a.walltime_s, a.gpus)
                    if isinstance(a, Submit) else (type(a).__name__, a.pilot.key, a.reason)
                    for a in p.actions)
    return (actions, p.unplaced_jobs, p.reserve_jobs, p.reserve_held, p.reserve_sized,
            p.unneeded, p.hedges, tuple(n for _s, n in p.unplaced),
            tuple((s.site, s.new_pilots, s.new_cpus, s.new_pilot_jobs, s.existing_jobs,
                   s.reserve_jobs) for s in p.summary))


@SETTINGS
@given(scenarios(), st.sampled_from((0.0, 300.0)))
def test_budgets_that_do_not_bind_decide_as_without_allocations(
        sc: tuple[Snapshot, CycleMemory, Config], later: float) -> None:
    now = 100_000.0 + later
    plain = plan(*sc, now)
    snap, memory, cfg = _served_by_one_allocation(sc)
    grouped = plan(snap, memory, cfg, now)
    assert _decisions(grouped) == _decisions(plain)
    assert all(s.allocation == f"{s.site}-all" for s in grouped.submits)
