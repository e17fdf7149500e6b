"""plan() with allocations (provisioner.decide.groups, group_plan): lanes, groups and
the rule that no pilot is submitted past an allocation's budget."""

from __future__ import annotations

from dataclasses import replace

import pytest

from provisioner.config import AllocationConfig, ReserveConfig, SiteConfig
from provisioner.decide.budget import budgets
from provisioner.decide.group_plan import GroupPlan
from provisioner.decide.groups import LaneBudget
from provisioner.decide.plan import plan
from provisioner.decide.reasons import Reason
from provisioner.model import CycleMemory, Pilot, PilotState, Plan, Submit

from .allocs import DEC10, alloc, budgeted, groups_config, gsnap, job
from .helpers import memory, site

NOW = DEC10


def gsi(*allocations: AllocationConfig, cpus: int = 16, min_cpus: int = 1,
        walltime_s: int = 3600) -> SiteConfig:
    return budgeted(site("gsi", cpus=cpus, min_cpus=min_cpus, walltime_s=walltime_s,
                         max_pilots=50, max_pending=50, max_submit=50), *allocations)


def submits(p: Plan) -> list[Submit]:
    return list(p.submits)


def charged(p: Plan, allocation: str) -> list[Submit]:
    return [s for s in p.submits if s.allocation == allocation]


def pending(job_id: str, account: str, cpus: int = 16, site_name: str = "gsi") -> Pilot:
    return Pilot(site_name, job_id, PilotState.PENDING, cpus, 64000, NOW - 60,
                 free_cpus=cpus, free_memory_mb=64000, account=account)


def idle(job_id: str, account: str, cpus: int = 16, site_name: str = "gsi") -> Pilot:
    return Pilot(site_name, job_id, PilotState.IDLE, cpus, 64000, NOW - 600,
                 started_at=NOW - 300, walltime_end=NOW + 3000, free_cpus=cpus,
                 free_memory_mb=64000, account=account, joined_at=NOW - 200)


def test_a_pilot_that_would_cross_the_line_is_not_submitted() -> None:
    # whole-node pilots of 16 cores for 1 h cost 16 core-h; 1000 - 970 spent - one
    # pending pilot (16) leaves 14: the next pilot would cross the line
    cfg = groups_config(gsi(alloc(), min_cpus=16))
    snapshot = gsnap([(job(4), 40)], [pending("1", "alloc-a")],
                     spent={("gsi", "alloc-a"): 970.0})
    assert submits(plan(snapshot, CycleMemory(), cfg, NOW)) == []
    # two core-h more and one pilot fits, not two
    more = replace(snapshot, books=gsnap(spent={("gsi", "alloc-a"): 968.0}).books)
    assert [(s.count, s.cpus) for s in submits(plan(more, CycleMemory(), cfg, NOW))] == [(1, 16)]


def test_where_no_whole_pilot_fits_a_smaller_one_does() -> None:
    cfg = groups_config(gsi(alloc(), min_cpus=4))
    # 10 core-h left: a 10-core pilot of 1 h, holding two 4-core jobs, sized to 8
    snapshot = gsnap([(job(4), 40)], spent={("gsi", "alloc-a"): 990.0})
    [s] = submits(plan(snapshot, CycleMemory(), cfg, NOW))
    assert (s.count, s.cpus, s.allocation) == (1, 8, "alloc-a")
    # 3 core-h left: less than min_cpus
    less = replace(snapshot, books=gsnap(spent={("gsi", "alloc-a"): 997.0}).books)
    assert submits(plan(less, CycleMemory(), cfg, NOW)) == []


def test_node_hours_do_not_shrink() -> None:
    cfg = groups_config(gsi(alloc(unit="node-hours", amount=10), min_cpus=1))
    snapshot = gsnap([(job(1), 200)], spent={("gsi", "alloc-a"): 7.5})
    # 2.5 node-h left: two 1 h pilots, whatever their cores
    assert sum(s.count for s in submits(plan(snapshot, CycleMemory(), cfg, NOW))) == 2


@pytest.mark.parametrize("state", ["spent", "ended", "unknown", "stopped", "not started"])
def test_an_allocation_that_takes_nothing_gets_no_pilot(state: str) -> None:
    period: object = "monthly"
    if state == "ended":
        period = {"start": "2026-11-01", "end": "2026-12-01"}
    if state == "not started":
        period = {"start": "2027-01-01", "end": "2027-02-01"}
    cfg = groups_config(gsi(alloc(period=period), alloc("alloc-b", ["group_a"], max_pilots=2)))
    spent: dict[tuple[str, str], float | None] = {
        ("gsi", "alloc-a"): 1000.0 if state == "spent" else 0.0, ("gsi", "alloc-b"): 0.0}
    if state == "unknown":
        spent[("gsi", "alloc-a")] = None
    memory = CycleMemory(stopped_allocations={("gsi", "alloc-a"): "stopped: refused"}
                         if state == "stopped" else {})
    # 16 jobs of 4 cores: alloc-b's two pilots take 8, the rest waits
    result = plan(gsnap([(job(4), 16)], spent=spent), memory, cfg, NOW)
    assert charged(result, "alloc-a") == []
    assert sum(s.count for s in charged(result, "alloc-b")) == 2  # the other goes on


def test_absent_books_are_unknown() -> None:
    cfg = groups_config(gsi(alloc()))
    assert submits(plan(gsnap([(job(4), 8)]), CycleMemory(), cfg, NOW)) == []


def test_a_groups_jobs_go_only_to_its_allocations() -> None:
    cfg = groups_config(gsi(alloc(), alloc("alloc-b", ["group_b"])))
    spent = {("gsi", "alloc-a"): 0.0, ("gsi", "alloc-b"): 0.0}
    result = plan(gsnap([(job(4, "group_b"), 4)], spent=spent), CycleMemory(), cfg, NOW)
    assert [s.allocation for s in result.submits] == ["alloc-b"]
    assert "gsi/alloc-b" in result.submits[0].reason


def test_a_site_without_allocations_takes_any_job() -> None:
    cfg = groups_config(gsi(alloc()), site("frankfurt", max_submit=5))
    snapshot = gsnap([(job(4, "group_x"), 4), (job(4, ""), 4)], sites=("gsi", "frankfurt"),
                     spent={("gsi", "alloc-a"): 0.0})
    result = plan(snapshot, CycleMemory(), cfg, NOW)
    assert {(s.site, s.allocation) for s in result.submits} == {("frankfurt", "")}
    assert result.group_waits == ()


def test_existing_pilots_serve_only_their_allocations_groups() -> None:
    cfg = groups_config(gsi(alloc(), alloc("alloc-b", ["group_b"])))
    spent = {("gsi", "alloc-a"): 0.0, ("gsi", "alloc-b"): 0.0}
    # an idle alloc-a pilot with 16 free cores beside 2 group_b jobs: a pilot for them
    result = plan(gsnap([(job(4, "group_b"), 2)], [idle("1", "alloc-a")], spent=spent),
                  CycleMemory(), cfg, NOW)
    assert [s.allocation for s in result.submits] == ["alloc-b"]
    # the same jobs of group_a fill the idle pilot
    again = plan(gsnap([(job(4, "group_a"), 2)], [idle("1", "alloc-a")], spent=spent),
                 CycleMemory(), cfg, NOW)
    assert again.submits == ()


def test_a_pilot_of_an_unknown_account_serves_nobody_and_is_not_killed_busy() -> None:
    cfg = groups_config(gsi(alloc()))
    spent = {("gsi", "alloc-a"): 0.0}
    stray = idle("1", "someone-else")
    result = plan(gsnap([(job(4), 2)], [stray], spent=spent), CycleMemory(), cfg, NOW)
    assert [s.allocation for s in result.submits] == ["alloc-a"]
    busy = replace(stray, state=PilotState.BUSY, free_cpus=12, claimed_since=NOW - 100)
    result = plan(gsnap([], [busy], spent=spent), CycleMemory(), cfg, NOW)
    assert not any(getattr(a, "pilot", None) == busy and type(a).__name__ in
                   ("Release", "Cancel") for a in result.actions)


def test_max_pilots_counts_the_allocations_pilots() -> None:
    cfg = groups_config(gsi(alloc(max_pilots=2), alloc("alloc-b", ["group_b"])))
    spent = {("gsi", "alloc-a"): 0.0, ("gsi", "alloc-b"): 0.0}
    held = [pending("1", "alloc-a", cpus=4), pending("2", "alloc-b", cpus=4)]
    result = plan(gsnap([(job(16), 5), (job(16, "group_b"), 3)], held, spent=spent),
                  CycleMemory(), cfg, NOW)
    assert sum(s.count for s in charged(result, "alloc-a")) == 1
    assert sum(s.count for s in charged(result, "alloc-b")) == 3
    [wait] = result.group_waits
    assert (wait.group, wait.jobs, wait.why.reason) == ("group_a", 4, Reason.GROUP_MAX_PILOTS)


def test_placement_prefers_the_lane_with_the_most_left_per_day() -> None:
    cfg = groups_config(gsi(alloc(amount=100_000), alloc("alloc-b", amount=10_000)))
    spent = {("gsi", "alloc-a"): 95_000.0, ("gsi", "alloc-b"): 0.0}
    result = plan(gsnap([(job(16), 2)], spent=spent), CycleMemory(), cfg, NOW)
    assert [s.allocation for s in result.submits] == ["alloc-b"]


def test_the_site_room_is_shared_by_its_lanes() -> None:
    cfg = groups_config(budgeted(site("gsi", walltime_s=3600, max_submit=3),
                                 alloc(), alloc("alloc-b", ["group_b"])))
    spent = {("gsi", "alloc-a"): 0.0, ("gsi", "alloc-b"): 0.0}
    result = plan(gsnap([(job(16, "group_a"), 5), (job(16, "group_b"), 5)], spent=spent),
                  CycleMemory(), cfg, NOW)
    assert sum(s.count for s in result.submits) == 3
    assert result.summary[0].capped is not None


def test_the_plan_carries_budgets_and_group_reasons() -> None:
    cfg = groups_config(gsi(alloc(amount=100), alloc("alloc-b", ["group_b"], amount=744,
                                                     pace="even")))
    spent = {("gsi", "alloc-a"): 100.0, ("gsi", "alloc-b"): 9 * 24 - 1}
    result = plan(gsnap([(job(4), 3), (job(4, "group_b"), 9), (job(1, "group_x"), 1)],
                        spent=spent), CycleMemory(), cfg, NOW)
    assert isinstance(result, GroupPlan)
    assert [b.name for b in result.budgets] == ["alloc-a", "alloc-b"]
    waits = {w.group: w for w in result.group_waits}
    assert waits["group_a"].why.reason is Reason.GROUP_SPENT
    assert waits["group_a"].jobs == 3
    assert waits["group_b"].why.reason is Reason.GROUP_PACED
    assert waits["group_b"].why.get("until") > NOW
    assert waits["group_x"].why.reason is Reason.GROUP_UNSERVED
    assert all(u.shape.group != "group_x" for u in result.unmatchable)


def test_lane_budget_admits_one_after_another() -> None:
    cfg = groups_config(gsi(alloc(amount=100), min_cpus=2))
    b = budgets(cfg, gsnap(spent={("gsi", "alloc-a"): 60.0}), NOW)[("gsi", "alloc-a")]
    lane = LaneBudget(b, min_cpus=2)
    assert lane.count(16, 0, 10) == 2  # 40 core-h: two 16-core pilots of 1 h
    lane.take(16, 0, 2)
    assert lane.size(16, 0, 1) == 8 and lane.count(8, 0, 5) == 1
    lane.take(8, 0, 1)
    assert lane.size(16, 0, 1) == 0 and lane.count(1, 0, 5) == 0


def test_no_allocations_runs_no_group_code(monkeypatch: pytest.MonkeyPatch) -> None:
    import provisioner.decide.group_plan as group_plan
    import provisioner.decide.plan as plan_module

    def boom(*_a: object, **_k: object) -> GroupPlan:
        raise AssertionError("group code ran without allocations")

    monkeypatch.setattr(plan_module, "plan_groups", boom)
    monkeypatch.setattr(group_plan, "build_lanes", boom)
    cfg = groups_config(site("gsi")).model_copy(update={"journal": ""})
    result = plan(gsnap([(job(4, ""), 3)]), CycleMemory(), cfg, NOW)
    assert type(result) is Plan and result.submits[0].allocation == ""


def test_the_reserve_is_held_per_group_on_its_lanes() -> None:
    reserve = ReserveConfig(window_s=900, lead_s=240, factor=2.5, max_jobs=64)
    cfg = groups_config(gsi(alloc(), alloc("alloc-b", ["group_b"])), reserve=reserve)
    spent = {("gsi", "alloc-a"): 0.0, ("gsi", "alloc-b"): 0.0}
    result = plan(gsnap(arrivals=[(job(1, "group_b"), 60)], spent=spent), memory(), cfg, NOW)
    assert result.reserve_jobs > 0 and result.submits
    assert {s.allocation for s in result.submits} == {"alloc-b"}
    assert all("reserve" in s.reason for s in result.submits)
    # arrivals of a group no allocation serves hold no reserve
    none = plan(gsnap(arrivals=[(job(1, "group_x"), 60)], spent=spent), memory(), cfg, NOW)
    assert none.submits == ()


def test_an_unread_pool_decides_nothing_but_gives_the_budgets() -> None:
    cfg = groups_config(gsi(alloc()))
    snapshot = replace(gsnap([(job(4), 8)], spent={("gsi", "alloc-a"): 10.0}),
                       pool_known=False)
    result = plan(snapshot, CycleMemory(), cfg, NOW)
    assert result.actions == () and [b.spent for b in result.budgets] == [10.0]
