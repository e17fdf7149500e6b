"""Properties of plan() over random snapshots (hypothesis)."""

from __future__ import annotations

import dataclasses
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisioner.config import Config, ReserveConfig
from provisioner.decide.plan import plan, site_rejects
from provisioner.model import (
    Cancel,
    CycleMemory,
    Demand,
    Flag,
    JobShape,
    Pilot,
    PilotState,
    Plan,
    Release,
    Retire,
    SiteView,
    Snapshot,
    Submit,
    Unflag,
    Unretire,
)

from .helpers import NOW, config, site

SITES = ("a", "b", "c")
#: what a cycle observed, what earlier cycles left, the configuration
Scenario = tuple[Snapshot, CycleMemory, Config]
SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def configs(draw: st.DrawFn) -> Config:
    sites = []
    for i, name in enumerate(SITES):
        cpus = draw(st.integers(1, 16))
        walltime = draw(st.sampled_from((3600, 7200, 86400)))
        sites.append(site(
            name, cpus=cpus, min_cpus=draw(st.integers(1, cpus)),
            memory_mb=cpus * draw(st.sampled_from((1000, 2000, 4000))),
            per_cpu=draw(st.sampled_from((500, 2000, 4000))), walltime_s=walltime,
            margin=draw(st.sampled_from((0, 120, 600))),
            weight=draw(st.sampled_from((0.5, 1.0, 2.0))) + i * 0.01,
            max_pilots=draw(st.integers(0, 12)), max_pending=draw(st.integers(0, 6)),
            max_submit=draw(st.integers(0, 6)), keep_warm=draw(st.integers(0, 2)),
            target_cpus=draw(st.one_of(st.none(), st.integers(1, cpus))),
        ))
    reserve = ReserveConfig(
        enabled=draw(st.sampled_from((True, True, False))),
        window_s=draw(st.sampled_from((60, 900))),
        lead_s=draw(st.sampled_from((0, 240, 3600))),
        factor=draw(st.sampled_from((0, 1.0, 2.5))),
        max_jobs=draw(st.sampled_from((0, 3, 64))),
    )
    return config(*sites, max_submit=draw(st.integers(0, 12)),
                  release_cycles=draw(st.integers(1, 3)),
                  min_lifetime=draw(st.sampled_from((0, 600))), reserve=reserve,
                  retire=draw(st.booleans()))


shapes = st.builds(
    JobShape,
    cpus=st.integers(1, 20),
    memory_mb=st.integers(1, 80000),
    gpus=st.sampled_from((0, 0, 0, 1)),
    runtime_s=st.one_of(st.none(), st.integers(60, 100000)),
    desired_sites=st.sampled_from(((), (), ("a",), ("b", "c"), ("z",))),
)
demands = st.lists(st.builds(Demand, shape=shapes, idle=st.integers(1, 60)), max_size=8)
arrivals = st.lists(st.builds(Demand, shape=shapes, idle=st.integers(0, 300)), max_size=4)


@st.composite
def pilots(draw: st.DrawFn, cfg: Config) -> list[Pilot]:
    out = []
    for i in range(draw(st.integers(0, 12))):
        s = cfg.site(draw(st.sampled_from(SITES)))
        state = draw(st.sampled_from(list(PilotState)))
        cpus = draw(st.integers(1, s.pilot.cpus))
        mem = draw(st.integers(1000, s.pilot.memory_mb))
        started = None if state is PilotState.PENDING else NOW - draw(st.integers(0, 80000))
        full = state in (PilotState.PENDING, PilotState.STARTING)
        free_c = cpus if full else draw(st.integers(0, cpus))
        if state is PilotState.IDLE:
            free_c = cpus
        if state is PilotState.BUSY:
            free_c = min(free_c, cpus - 1)
        out.append(Pilot(
            site=s.name, job_id=str(i), state=state, cpus=cpus, memory_mb=mem,
            submitted_at=NOW - 90000, started_at=started,
            walltime_end=None if started is None else started + s.pilot.walltime_s,
            free_cpus=free_c, free_memory_mb=mem if full else draw(st.integers(0, mem)),
        ))
    return out


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    cfg = draw(configs())
    ps = draw(pilots(cfg))
    flagged = {p.key: NOW - draw(st.sampled_from((0, 20, 300)))
               for p in ps if draw(st.booleans())}
    views = tuple(SiteView(n, draw(st.booleans()) or n == "a") for n in SITES)
    retiring = frozenset(p.key for p in ps if p.state in (PilotState.BUSY, PilotState.IDLE)
                         and draw(st.booleans()))
    snap = Snapshot(demand=tuple(draw(demands)), pilots=tuple(ps), sites=views,
                    recent_arrivals=tuple(draw(arrivals)))
    memory = CycleMemory(flagged=flagged, retiring=retiring,
                         idle_cycles={k: draw(st.integers(0, 3)) for k in flagged},
                         arrival_window_s=draw(st.sampled_from((0.0, 900.0, 900.0))))
    return snap, memory, cfg


def by_type(p: Plan, kind: type) -> list:  # type: ignore[type-arg]
    return [a for a in p.actions if isinstance(a, kind)]


@SETTINGS
@given(scenarios())
def test_never_exceeds_any_cap(sc: Scenario) -> None:
    snap, mem, cfg = sc
    result = plan(snap, mem, cfg, NOW)
    subs = by_type(result, Submit)
    assert sum(s.count for s in subs) <= cfg.policy.max_submit_per_cycle
    known = {v.name for v in snap.sites if v.known}
    for s in cfg.sites:
        n = sum(a.count for a in subs if a.site == s.name)
        held = sum(1 for p in snap.pilots if p.site == s.name)  # ENDING ones too
        pending = sum(1 for p in snap.pilots if p.site == s.name and p.state is PilotState.PENDING)
        assert n <= max(0, s.caps.max_pilots - held)
        assert n <= max(0, s.caps.max_pending - pending)
        assert n <= s.caps.max_submit_per_cycle
        if s.name not in known:
            assert n == 0
    for a in subs:
        p = cfg.site(a.site).pilot
        assert a.count > 0 and p.min_cpus <= a.cpus <= p.cpus and a.memory_mb <= p.memory_mb
        assert a.walltime_s == p.walltime_s


@SETTINGS
@given(scenarios())
def test_never_plans_for_unmatchable_jobs(sc: Scenario) -> None:
    snap, mem, cfg = sc
    result = plan(snap, mem, cfg, NOW)
    for u in result.unmatchable:
        assert all(site_rejects(u.shape, s) for s in cfg.sites)
        assert u.reason
    unmatchable = {u.shape for u in result.unmatchable}
    matchable_only = dataclasses.replace(
        snap, demand=tuple(d for d in snap.demand if d.shape not in unmatchable))
    assert plan(matchable_only, mem, cfg, NOW).actions == result.actions


@SETTINGS
@given(scenarios())
def test_pilot_actions_respect_state(sc: Scenario) -> None:
    snap, mem, cfg = sc
    result = plan(snap, mem, cfg, NOW)
    known = {v.name for v in snap.sites if v.known}
    seen: Counter[str] = Counter()
    for a in result.actions:
        if isinstance(a, Submit):
            continue
        p = a.pilot
        seen[p.key] += 1
        assert p.site in known, "no pilot action at an unknown site"
        drained_empty = p.state is PilotState.DRAINING and p.free_cpus >= p.cpus
        if isinstance(a, Release):
            assert p.state is PilotState.IDLE, "only idle pilots are released"
        if isinstance(a, Flag):
            assert p.state is PilotState.IDLE, "only idle pilots are flagged"
        if isinstance(a, Cancel):
            # pending; running at the site for longer than the start timeout without
            # ever joining the pool; or drained with nothing running (never busy)
            assert p.state is PilotState.PENDING or drained_empty or (
                p.state is PilotState.STARTING and p.started_at is not None
                and NOW - p.started_at > cfg.policy.start_timeout_s)
        if isinstance(a, Unflag):
            assert p.key in mem.flagged
            # bookkeeping: may come with a retire order or its withdrawal
            seen[p.key] -= any(isinstance(b, Retire | Unretire) and b.pilot.key == p.key
                               for b in result.actions)
        if isinstance(a, Flag):
            assert p.key not in mem.flagged
        if isinstance(a, Retire):
            assert p.state is PilotState.BUSY, "only busy pilots are retired"
            assert p.key not in mem.retiring
        if isinstance(a, Unretire):
            assert p.key in mem.retiring
    assert all(n == 1 for n in seen.values()), "at most one action per pilot"


@SETTINGS
@given(scenarios())
def test_no_pilot_is_retired_while_demand_waits_for_capacity(sc: Scenario) -> None:
    """A retire order stands only in a cycle that placed every idle job on pilots
    already in the pool and expects no arrival: no submission, nothing left over, no
    reserve, no demand waiting for a pending or starting pilot. In any other cycle
    every order is withdrawn."""
    snap, mem, cfg = sc
    result = plan(snap, mem, cfg, NOW)
    retired = by_type(result, Retire)
    withdrawn = {a.pilot.key for a in by_type(result, Unretire)}
    standing = {k for k in mem.retiring if k not in withdrawn} | {a.pilot.key for a in retired}
    alive = {p.key: p for p in snap.pilots}
    known = {v.name for v in snap.sites if v.known}
    waiting = result.submits or result.unplaced_jobs or result.reserve_jobs
    if waiting or not cfg.policy.retire_when_done:
        assert not retired
        assert all(alive[k].site not in known for k in standing
                   if alive[k].state is PilotState.BUSY)


@SETTINGS
@given(scenarios())
def test_release_only_after_consecutive_idle_observations(sc: Scenario) -> None:
    snap, mem, cfg = sc
    n = cfg.policy.idle_release_cycles
    for a in by_type(plan(snap, mem, cfg, NOW), Release):
        key = a.pilot.key
        before = mem.idle_cycles.get(key, 0)
        if key in mem.flagged and mem.flagged[key] < NOW:
            before = max(before, 1)
        assert before + 1 >= n
        if n >= 2:
            assert key in mem.flagged and mem.flagged[key] < NOW


def planned_capacity(snap: Snapshot, result: Plan) -> tuple[int, int]:
    """(pilots, cores) kept or newly planned."""
    gone = {a.pilot.key for a in result.actions if isinstance(a, (Release, Cancel))}
    kept = [p for p in snap.pilots
            if p.key not in gone and p.state not in (PilotState.ENDING, PilotState.DRAINING)]
    subs = by_type(result, Submit)
    return (len(kept) + sum(s.count for s in subs),
            sum(p.cpus for p in kept) + sum(s.cpus * s.count for s in subs))


@SETTINGS
@given(scenarios(), st.lists(st.builds(Demand, shape=shapes, idle=st.integers(1, 30)),
                             min_size=1, max_size=3))
def test_more_demand_never_reduces_planned_capacity(
        sc: Scenario, extra: list[Demand]) -> None:
    """More idle jobs never mean fewer pilots kept or planned; and when no cap binds, never
    fewer cores. (Under a cap on the pilot count the cores can drop: which jobs share the
    capped pilots is a greedy bin-packing choice, and a bigger job can crowd out a
    better-packing set.)"""
    snap, mem, cfg = sc
    more = dataclasses.replace(snap, demand=snap.demand + tuple(extra))
    plan_more = plan(more, mem, cfg, NOW)
    pilots_before, cores_before = planned_capacity(snap, plan(snap, mem, cfg, NOW))
    pilots_after, cores_after = planned_capacity(more, plan_more)
    assert pilots_after >= pilots_before
    if plan_more.unplaced_jobs == 0:
        assert cores_after >= cores_before


@SETTINGS
@given(configs())
def test_empty_queue_no_pilots_plans_nothing(cfg: Config) -> None:
    snap = Snapshot(demand=(), pilots=(), sites=tuple(SiteView(n, True) for n in SITES))
    assert plan(snap, CycleMemory(), cfg, NOW).actions == ()


@SETTINGS
@given(scenarios())
def test_pool_unknown_means_no_actions(sc: Scenario) -> None:
    snap, mem, cfg = sc
    blind = dataclasses.replace(snap, pool_known=False)
    assert plan(blind, mem, cfg, NOW).actions == ()


@SETTINGS
@given(scenarios())
def test_plan_is_deterministic(sc: Scenario) -> None:
    snap, mem, cfg = sc
    assert plan(snap, mem, cfg, NOW) == plan(snap, mem, cfg, NOW)


def without_arrivals(snap: Snapshot, mem: CycleMemory) -> tuple[Snapshot, CycleMemory]:
    return (dataclasses.replace(snap, recent_arrivals=()),
            dataclasses.replace(mem, arrival_window_s=0.0))


@SETTINGS
@given(scenarios())
def test_reserve_bounded_and_zero_without_arrivals(sc: Scenario) -> None:
    """The reserve never exceeds max_jobs; no arrivals (or no window) means no reserve and
    exactly the plan of a service that does not know arrivals at all."""
    snap, mem, cfg = sc
    result = plan(snap, mem, cfg, NOW)
    assert 0 <= result.reserve_held <= result.reserve_jobs <= cfg.policy.reserve.max_jobs
    assert sum(s.reserve_jobs for s in result.summary) <= result.reserve_held
    bare, bare_mem = without_arrivals(snap, mem)
    plain = plan(bare, bare_mem, cfg, NOW)
    assert plain.reserve_jobs == 0
    off = cfg.model_copy(update={"policy": cfg.policy.model_copy(
        update={"reserve": ReserveConfig(enabled=False)})})
    assert plan(bare, bare_mem, off, NOW) == plain
    if not snap.recent_arrivals or mem.arrival_window_s == 0:
        assert result == plain


@SETTINGS
@given(scenarios())
def test_reserve_never_takes_capacity_from_real_demand(sc: Scenario) -> None:
    """Real demand is placed exactly as without a reserve; the reserve only adds."""
    snap, mem, cfg = sc
    with_reserve = plan(snap, mem, cfg, NOW)
    plain = plan(*without_arrivals(snap, mem), cfg, NOW)
    assert with_reserve.unplaced_jobs == plain.unplaced_jobs
    assert with_reserve.unmatchable == plain.unmatchable
    for a, b in zip(with_reserve.summary, plain.summary, strict=True):
        assert (a.existing_jobs, a.new_pilot_jobs) == (b.existing_jobs, b.new_pilot_jobs)
    pilots_with, cores_with = planned_capacity(snap, with_reserve)
    pilots_plain, cores_plain = planned_capacity(snap, plain)
    assert pilots_with >= pilots_plain and cores_with >= cores_plain


@SETTINGS
@given(scenarios())
def test_reserve_only_for_matchable_arrivals(sc: Scenario) -> None:
    snap, mem, cfg = sc
    matchable = tuple(
        d for d in snap.recent_arrivals
        if any(not site_rejects(d.shape, s) for s in cfg.sites))
    only = dataclasses.replace(snap, recent_arrivals=matchable)
    assert plan(only, mem, cfg, NOW) == plan(snap, mem, cfg, NOW)
