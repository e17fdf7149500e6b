"""The predictive reserve (policy.reserve): sizing, placement after real demand, keeping
idle and pending pilots that hold it, and the cadence trigger when it is drawn on."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import given
from hypothesis import strategies as st

from provisioner.config import PolicyConfig, ReserveConfig
from provisioner.decide.cadence import CycleMark, Probe, cycle_due
from provisioner.decide.controller import Controller, QueueSize
from provisioner.decide.plan import plan, reserve_size
from provisioner.decide.reserve import reserve_lead
from provisioner.model import Cancel, Flag, JobShape, PilotState, Release, Submit

from .helpers import NOW, config, memory, pilot, site, snap

ONE = JobShape(1, 2000)
RES = ReserveConfig(window_s=900, lead_s=240, factor=2.5, max_jobs=64)


def submits(p):  # type: ignore[no-untyped-def]
    return [a for a in p.actions if isinstance(a, Submit)]


def test_reserve_size_formula_and_zero_cases() -> None:
    cfg = config(reserve=RES)
    # 60 arrivals in 900 s -> 16 expected per 240 s lead -> 2.5 * sqrt(32) = 14.1 -> 15
    assert reserve_size(60, 900, cfg) == math.ceil(2.5 * math.sqrt(32)) == 15
    assert reserve_size(0, 900, cfg) == 0
    assert reserve_size(60, 0, cfg) == 0  # unknown window: no reserve
    assert reserve_size(60, 900, config(reserve=RES.model_copy(update={"factor": 0}))) == 0
    assert reserve_size(60, 900, config(reserve=RES.model_copy(update={"enabled": False}))) == 0
    assert reserve_size(10**6, 900, cfg) == 64  # max_jobs


def test_no_arrivals_no_reserve() -> None:
    result = plan(snap([(ONE, 3)]), memory(), config(reserve=RES), NOW)
    assert result.reserve_jobs == 0
    assert sum(s.cpus * s.count for s in submits(result)) == 3


def test_reserve_submits_pilots_without_idle_jobs() -> None:
    cfg = config(site(max_pilots=100, max_pending=50, max_submit=50), reserve=RES)
    result = plan(snap(arrivals=[(ONE, 60)]), memory(), cfg, NOW)
    assert result.reserve_jobs == result.reserve_held == 15
    assert sum(s.cpus * s.count for s in submits(result)) == 15  # target_cpus None: packed
    assert all("reserve" in s.reason for s in submits(result))


def test_reserve_comes_after_real_demand_under_caps() -> None:
    cfg = config(site(cpus=1, max_pilots=100, max_pending=50, max_submit=4), reserve=RES)
    result = plan(snap([(ONE, 3)], arrivals=[(ONE, 60)]), memory(), cfg, NOW)
    assert sum(s.count for s in submits(result)) == 4
    assert result.unplaced_jobs == 0 and result.reserve_held == 1


def test_idle_pilot_holding_the_reserve_is_kept() -> None:
    idle = pilot("1", PilotState.IDLE, cpus=1, memory_mb=4000)
    flagged = {idle.key: NOW - 300}
    cfg = config(reserve=RES)
    kept = plan(snap([], [idle], arrivals=[(ONE, 4)]), memory(flagged=flagged), cfg, NOW)
    assert not [a for a in kept.actions if isinstance(a, (Release, Flag))]
    released = plan(snap([], [idle]), memory(flagged=flagged), cfg, NOW)
    assert [a for a in released.actions if isinstance(a, Release)]


def test_pending_pilot_holding_the_reserve_is_not_cancelled() -> None:
    pending = pilot("1", PilotState.PENDING, cpus=1, memory_mb=4000)
    cfg = config(reserve=RES)
    kept = plan(snap([], [pending], arrivals=[(ONE, 4)]), memory(), cfg, NOW)
    assert not [a for a in kept.actions if isinstance(a, Cancel)]
    assert plan(snap([], [pending]), memory(), cfg, NOW).unneeded == (pending.key,)


def test_unmatchable_arrivals_cause_no_reserve() -> None:
    huge = JobShape(1, 2_000_000)
    result = plan(snap(arrivals=[(huge, 500)]), memory(), config(reserve=RES), NOW)
    assert result.reserve_jobs == 0 and result.actions == ()


def test_reserve_slot_fits_the_largest_memory_of_its_core_count() -> None:
    cfg = config(site(target_cpus=1, max_pilots=100, max_pending=50, max_submit=50),
                 reserve=RES.model_copy(update={"max_jobs": 1}))
    result = plan(snap(arrivals=[(JobShape(1, 1000), 50), (JobShape(1, 9000), 1)]), memory(),
                  cfg, NOW)
    (s,) = submits(result)
    assert s.count == 1 and s.cpus == 1 and s.memory_mb >= 9088


def test_reserve_split_by_core_count() -> None:
    cfg = config(site(target_cpus=1, max_pilots=100, max_pending=50, max_submit=50),
                 reserve=RES.model_copy(update={"max_jobs": 4}))
    result = plan(snap(arrivals=[(JobShape(1, 1000), 60), (JobShape(8, 8000), 20)]), memory(),
                  cfg, NOW)
    cores = sorted(c for s in submits(result) for c in [s.cpus] * s.count)
    assert cores == [1, 1, 1, 8]


def test_cadence_reserve_drawn_on() -> None:
    pol = PolicyConfig(interval_s=300, quick_check_s=20, min_cycle_gap_s=10)
    mark = CycleMark(at=1000, idle_jobs=0, idle_pilots=frozenset({"a/1", "a/2"}), reserve=2)
    assert cycle_due(1015, Probe(0, frozenset({"a/2"})), mark, pol) == "reserve drawn on"
    assert cycle_due(1005, Probe(0, frozenset({"a/2"})), mark, pol) == ""  # minimum gap
    no_reserve = CycleMark(at=1000, idle_jobs=0, idle_pilots=frozenset({"a/1", "a/2"}))
    assert cycle_due(1015, Probe(0, frozenset({"a/2"})), no_reserve, pol) == ""


def test_reserve_grows_ahead_of_a_growing_queue() -> None:
    cfg = config(reserve=RES)
    # 60 arrivals and as many departures in 900 s: a = d = 16 per lead time, no growth
    assert reserve_size(60, 900, cfg, departures=60) == reserve_size(60, 900, cfg) == 15
    # nothing left the queue: it grows by a = 16 per lead time, less one standard deviation
    # of that estimate (sqrt(60 + 0) arrivals over the window, scaled to the lead time), on
    # top of 2.5 * sqrt(16)
    scale = 240 / 900
    assert reserve_size(60, 900, cfg, departures=0) == math.ceil(
        16 - math.sqrt(60) * scale + 10) == 24
    # half left: growth 8 less sqrt(90) * scale, spread sqrt(24)
    assert reserve_size(60, 900, cfg, departures=30) == math.ceil(
        8 - math.sqrt(90) * scale + 2.5 * math.sqrt(24)) == 18
    # a growth within its own noise adds nothing
    assert reserve_size(60, 900, cfg, departures=55) == math.ceil(
        2.5 * math.sqrt((60 + 55) * scale)) == 14
    # a shrinking queue keeps the steady reserve (departures count up to the arrivals)
    assert reserve_size(60, 900, cfg, departures=500) == 15
    assert reserve_size(0, 900, cfg, departures=0) == 0  # no arrivals, no reserve


def test_plan_uses_the_departures_of_the_snapshot() -> None:
    cfg = config(site(max_pilots=100, max_pending=50, max_submit=50), reserve=RES)
    steady = snap(arrivals=[(ONE, 60)])
    assert plan(steady, memory(), cfg, NOW).reserve_jobs == 15
    assert plan(steady, memory(recent_departures=0), cfg, NOW).reserve_jobs == 24


@given(arrivals=st.integers(0, 5000), departures=st.one_of(st.none(), st.integers(0, 5000)),
       factor=st.floats(0, 5), window=st.sampled_from((0.0, 60.0, 900.0, 3600.0)))
def test_reserve_size_bounded_and_growing_with_arrivals(
        arrivals: int, departures: int | None, factor: float, window: float) -> None:
    cfg = config(reserve=RES.model_copy(update={"factor": factor}))
    size = reserve_size(arrivals, window, cfg, departures)
    assert 0 <= size <= RES.max_jobs
    if arrivals == 0 or window == 0:
        assert size == 0
    assert reserve_size(arrivals + 1, window, cfg, departures) >= size


def test_cycle_line_says_why_the_reserve_has_its_size() -> None:
    from provisioner.service.loop import CycleResult, Observation, summary_line

    cfg = config(site(max_pilots=100, max_pending=50, max_submit=50), reserve=RES)
    s, m = snap(arrivals=[(ONE, 60)]), memory(recent_departures=0)
    line = summary_line(CycleResult("test", Observation(s, {}, {}), plan(s, m, cfg, NOW),
                                    memory=m))
    assert "reserve 24/24 slots (arrived 60, left 0 in 900 s)" in line
    line = summary_line(CycleResult("test", Observation(s, {}, {}), plan(s, memory(), cfg, NOW),
                                    memory=memory()))
    assert "(arrived 60, left ? in 900 s)" in line


def test_reserve_split_gives_rare_shapes_more_than_their_count() -> None:
    """Square-root split: 90 one-core and 10 eight-core arrivals share 19 slots 14 : 5
    (in proportion to the counts it would be 17 : 2, and the rare 8-core jobs would
    mostly find no slot)."""
    from provisioner.decide.reserve import reserve_rows

    cfg = config(reserve=RES)
    eight = JobShape(8, 16000)
    rows, _size = reserve_rows(snap(arrivals=[(ONE, 90), (eight, 10)]), memory(), cfg,
                               cfg.sites, NOW)
    assert {(r.item.cpus, r.jobs) for r in rows} == {(1, 14), (8, 5)}


@given(arrivals=st.integers(10, 2000), quiet=st.floats(0, 20000), more=st.floats(0, 5000))
def test_reserve_decays_once_arrivals_stop(arrivals: int, quiet: float, more: float) -> None:
    """While jobs keep arriving (quiet within a few mean gaps) the reserve is its base;
    once they stop it only shrinks, and within a few lead times it is gone."""
    cfg = config(reserve=RES)
    base = reserve_size(arrivals, 900, cfg, None)
    gap = 900 / arrivals
    assert reserve_size(arrivals, 900, cfg, None, quiet_s=2 * gap) == base
    now = reserve_size(arrivals, 900, cfg, None, quiet_s=quiet)
    assert reserve_size(arrivals, 900, cfg, None, quiet_s=quiet + more) <= now <= base
    assert reserve_size(arrivals, 900, cfg, None, quiet_s=3 * gap + 6 * RES.lead_s) <= max(
        1, math.ceil(base * math.exp(-6)))


def test_a_handful_of_arrivals_is_not_a_rate() -> None:
    """Jobs submitted at once (the controller saw them arrive at 2 distinct times) make
    no reserve; the same count arriving at 4 distinct times does."""
    cfg = config(reserve=RES)
    s = snap(arrivals=[(ONE, 12)])
    assert plan(s, memory(arrival_times=2), cfg, NOW).reserve_jobs == 0
    assert plan(s, memory(arrival_times=4), cfg, NOW).reserve_jobs > 0


def brute_loss(a: float, d: float, stock: int) -> float:
    """E[(A - D - stock)+] by direct summation."""
    pa = [math.exp(-a) * a ** k / math.factorial(k) for k in range(60)]
    pd = [math.exp(-d) * d ** k / math.factorial(k) for k in range(60)]
    return sum(x * y * max(0, i - j - stock) for i, x in enumerate(pa) for j, y in enumerate(pd))


@given(a=st.floats(0.05, 8), share=st.floats(0, 1), eps=st.sampled_from([0.005, 0.023, 0.1]))
def test_fill_rate_stock_is_the_smallest_that_serves(a: float, share: float, eps: float) -> None:
    """The stock leaves at most eps of the arrivals without a slot, one slot less would
    not (checked against direct summation)."""
    from provisioner.decide.reserve import fill_rate_stock

    d = a * share
    stock = fill_rate_stock(a, d, eps, 1000)
    assert brute_loss(a, d, stock) <= eps * a + 1e-9
    if stock > 0:
        assert brute_loss(a, d, stock - 1) > eps * a - 1e-9


def test_a_sparse_stream_gets_more_than_the_normal_approximation() -> None:
    """0.1 arrivals per lead time (a job every ten minutes, a one-minute lead): the normal
    approximation keeps ceil(2 * sqrt(0.2)) = 1 slot, which leaves 4.4 % of the jobs
    waiting where 2.3 % are allowed: the fill rate keeps 2. With many arrivals the normal
    approximation is the larger and decides."""
    cfg = config(reserve=ReserveConfig(factor=2.0))
    assert reserve_size(6, 3600, cfg, lead_s=60) == 2 > math.ceil(2 * math.sqrt(0.2))
    assert reserve_size(240, 3600, cfg, lead_s=240) == math.ceil(2 * math.sqrt(32))


def test_the_departures_scenario_sizes_the_reserve_with_the_lead_learnt_from_pilots_up(
        ) -> None:
    """tests/integration/test_reserve.py with plain data: three jobs, then one window
    (600 s) later ten more and one of the three gone. Its service keeps no journal, but
    a controller learns a site's lead from the pilots it sees at its first cycle (queue
    wait and boot, `provisioner.estimates`): with a pilot up in the pool the lead is that
    site's (quick check 3 s + 5 s wait + boot), not ``lead_s`` (240 s), and the reserve
    is 4 slots, not 7."""
    small = JobShape(1, 500)
    reserve = ReserveConfig(window_s=600, lead_s=240, factor=2.0, window_gaps=0.5,
                            min_arrival_times=1, quiet_gaps=1e6, min_use_chance=0.0,
                            max_idle_leads=0)
    base = config(site(max_pilots=20, max_pending=20, max_submit=20), reserve=reserve)
    cfg = base.model_copy(update={"policy": base.policy.model_copy(
        update={"quick_check_s": 3})})
    up = dataclasses.replace(
        pilot("7", PilotState.BUSY, cpus=4, memory_mb=7800, started=NOW - 95,
              submitted=NOW - 100), joined_at=NOW - 60)

    def sized(pilots: list) -> tuple[int, int, float]:  # type: ignore[type-arg]
        ctl = Controller(cfg)
        first = dataclasses.replace(snap(arrivals=[(small, 3)], pilots=pilots),
                                    last_arrival_at=NOW - 1)
        ctl.prepare(first, NOW, QueueSize(3, 0))
        now = NOW + 601
        late = dataclasses.replace(snap(arrivals=[(small, 10)], pilots=pilots),
                                   last_arrival_at=now - 1)
        s, m = ctl.prepare(late, now, QueueSize(12, 2))
        assert m.recent_departures == 1 and abs(m.arrival_window_s - 601) < 1e-6
        return (plan(s, m, cfg, now).reserve_jobs, reserve_size(10, 601, cfg, 1),
                reserve_lead(m, cfg))

    assert sized([]) == (7, 7, 240)  # nothing learnt: lead_s
    got, unlearnt, lead = sized([up])
    assert lead < 100 and got == reserve_size(10, 601, cfg, 1, lead_s=lead) == 4
    assert unlearnt == 7
