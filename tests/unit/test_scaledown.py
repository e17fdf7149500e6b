"""Retiring busy pilots (`provisioner.decide.scaledown`, through `plan()`): a busy pilot nothing
needs leaves when its jobs end; the order is withdrawn as soon as demand could use it."""

from __future__ import annotations

from provisioner.config import ReserveConfig
from provisioner.decide.plan import plan
from provisioner.model import CycleMemory, JobShape, PilotState, Submit, Unretire

from .helpers import NOW, config, memory, pilot, site, snap

ONE = JobShape(1, 2000)
BIG = JobShape(16, 60000)  # needs a whole pilot


def kinds(result, key: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [type(a).__name__ for a in result.actions
            if not isinstance(a, Submit) and a.pilot.key == key]


def retiring(*keys: str) -> CycleMemory:
    """A memory of pilots told to retire."""
    return memory(retiring=frozenset(keys))


def test_busy_pilot_without_demand_is_retired_once() -> None:
    busy = pilot("1", PilotState.BUSY)
    assert kinds(plan(snap([], [busy]), memory(), config(), NOW), "gsi/1") == ["Retire"]
    # already retiring: no second order
    assert kinds(plan(snap([], [busy]), retiring("gsi/1"), config(), NOW), "gsi/1") == []


def test_retirement_off_leaves_busy_pilots_alone() -> None:
    busy = pilot("1", PilotState.BUSY)
    assert plan(snap([], [busy]), memory(), config(retire=False), NOW).actions == ()


def test_demand_for_new_pilots_retires_nobody_and_withdraws_orders() -> None:
    busy = pilot("1", PilotState.BUSY)
    result = plan(snap([(BIG, 1)], [busy]), retiring("gsi/1"), config(), NOW)
    assert any(isinstance(a, Submit) for a in result.actions)
    assert kinds(result, "gsi/1") == ["Unretire"]
    result = plan(snap([(BIG, 1)], [busy]), memory(), config(), NOW)
    assert kinds(result, "gsi/1") == []


def test_demand_left_over_by_caps_retires_nobody() -> None:
    busy = pilot("1", PilotState.BUSY)
    result = plan(snap([(BIG, 1)], [busy]), memory(), config(max_submit=0), NOW)
    assert result.unplaced_jobs == 1 and not result.submits
    assert kinds(result, "gsi/1") == []


def test_demand_waiting_for_a_pending_pilot_retires_nobody() -> None:
    busy = pilot("1", PilotState.BUSY)
    pending = pilot("2", PilotState.PENDING)
    result = plan(snap([(ONE, 1)], [busy, pending]), retiring("gsi/1"), config(), NOW)
    assert not result.submits
    assert kinds(result, "gsi/1") == ["Unretire"]
    assert kinds(result, "gsi/2") == []


def test_demand_an_idle_pilot_takes_still_retires_the_busy_one() -> None:
    busy = pilot("1", PilotState.BUSY)
    idle = pilot("2", PilotState.IDLE)
    result = plan(snap([(ONE, 3)], [busy, idle]), memory(), config(), NOW)
    assert kinds(result, "gsi/1") == ["Retire"]
    assert kinds(result, "gsi/2") == []


def test_a_busy_pilot_whose_free_room_demand_uses_is_not_retired() -> None:
    half = pilot("1", PilotState.BUSY, free_cpus=8, free_mem=32000)
    assert kinds(plan(snap([(ONE, 2)], [half]), memory(), config(), NOW), "gsi/1") == []
    result = plan(snap([(ONE, 2)], [half]), retiring("gsi/1"), config(), NOW)
    assert kinds(result, "gsi/1") == ["Unretire"]
    assert "room" in next(a for a in result.actions if isinstance(a, Unretire)).reason


def test_an_idle_retiring_pilot_that_demand_will_use_is_withdrawn() -> None:
    idle = pilot("1", PilotState.IDLE)
    result = plan(snap([(ONE, 1)], [idle]), retiring("gsi/1"), config(), NOW)
    assert kinds(result, "gsi/1") == ["Unretire"]


def test_keep_warm_keeps_the_busy_pilots_that_end_last() -> None:
    soon = pilot("1", PilotState.BUSY, end=NOW + 3600)
    late = pilot("2", PilotState.BUSY, end=NOW + 7200)
    cfg = config(site(keep_warm=1))
    result = plan(snap([], [soon, late]), memory(), cfg, NOW)
    assert kinds(result, "gsi/1") == ["Retire"]
    assert kinds(result, "gsi/2") == []
    # an idle pilot already kept warm: both busy ones may go
    idle = pilot("3", PilotState.IDLE)
    result = plan(snap([], [soon, late, idle]), memory(), cfg, NOW)
    assert kinds(result, "gsi/1") == kinds(result, "gsi/2") == ["Retire"]
    # a retiring pilot that keep_warm now needs is withdrawn
    result = plan(snap([], [late]), retiring("gsi/2"), cfg, NOW)
    assert kinds(result, "gsi/2") == ["Unretire"]


def test_minimum_lifetime_delays_retirement() -> None:
    young = pilot("1", PilotState.BUSY, started=NOW - 100)
    s = snap([], [young])
    assert kinds(plan(s, memory(), config(min_lifetime=600), NOW), "gsi/1") == []
    assert kinds(plan(s, memory(), config(min_lifetime=60), NOW), "gsi/1") == ["Retire"]


def test_no_order_at_an_unknown_site() -> None:
    busy = pilot("1", PilotState.BUSY)
    s = snap([(BIG, 1)], [busy], unknown=("gsi",))
    assert kinds(plan(s, retiring("gsi/1"), config(), NOW), "gsi/1") == []


def test_expected_arrivals_keep_busy_pilots() -> None:
    """The reserve wants the room the busy pilot's jobs will leave: no retirement."""
    busy = pilot("1", PilotState.BUSY)
    cfg = config(reserve=ReserveConfig(enabled=True, window_s=900, lead_s=240, factor=1.0,
                                       max_jobs=64))
    result = plan(snap([], [busy], arrivals=[(ONE, 30)]), memory(), cfg, NOW)
    assert result.reserve_jobs > 0
    assert kinds(result, "gsi/1") == []
    # no arrivals: retired
    assert kinds(plan(snap([], [busy]), memory(), cfg, NOW), "gsi/1") == ["Retire"]
