"""plan() with plain data: one behaviour per test."""

from __future__ import annotations

import dataclasses

from provisioner.decide.plan import carry_over, plan
from provisioner.model import (
    Flag,
    JobShape,
    PilotState,
    Release,
    Retire,
    Submit,
    Unflag,
)

from .helpers import NOW, config, memory, pilot, site, snap

ONE = JobShape(1, 2000)


def submits(p):  # type: ignore[no-untyped-def]
    return [a for a in p.actions if isinstance(a, Submit)]


def test_empty_queue_no_pilots_plans_nothing() -> None:
    result = plan(snap(), memory(), config(), NOW)
    assert result.actions == () and result.unmatchable == ()


def test_pool_unknown_plans_nothing_even_with_demand_and_idle_pilots() -> None:
    s = snap([(ONE, 5)], [pilot("1", PilotState.IDLE), pilot("2", PilotState.PENDING)],
             pool_known=False)
    assert plan(s, memory(flagged={"gsi/1": NOW - 300}), config(), NOW).actions == ()


def test_single_small_job_gets_a_small_pilot() -> None:
    result = plan(snap([(ONE, 1)]), memory(), config(site(min_cpus=1)), NOW)
    assert submits(result) == [Submit("gsi", 1, 1, 4000, 86400, submits(result)[0].reason)]


def test_min_cpus_floor_and_memory_at_least_needed() -> None:
    big_mem = JobShape(1, 30000)
    result = plan(snap([(big_mem, 1)]), memory(), config(site(min_cpus=2)), NOW)
    (s,) = submits(result)
    assert s.cpus == 2 and s.memory_mb >= 30080  # 30000 rounded up to 128 MB


def test_memory_rounding_two_500mb_jobs_do_not_fit_1000mb() -> None:
    cfg = config(site(cpus=2, memory_mb=1000, per_cpu=500, min_cpus=2))
    result = plan(snap([(JobShape(1, 500), 2)]), memory(), cfg, NOW)
    assert sum(s.count for s in submits(result)) == 2


def test_identical_pilots_grouped_into_one_submit() -> None:
    result = plan(snap([(JobShape(4, 8000), 8)]), memory(), config(site(cpus=8, max_submit=10)),
                  NOW)
    assert [(s.count, s.cpus) for s in submits(result)] == [(4, 8)]


def test_existing_capacity_is_subtracted() -> None:
    pilots = [pilot("1", PilotState.BUSY, free_cpus=2, free_mem=8000),
              pilot("2", PilotState.PENDING, cpus=4, memory_mb=16000)]
    result = plan(snap([(ONE, 6)], pilots), memory(), config(), NOW)
    assert submits(result) == []
    result = plan(snap([(ONE, 7)], pilots), memory(), config(), NOW)
    assert [(s.count, s.cpus) for s in submits(result)] == [(1, 1)]


def test_pilot_in_shutdown_margin_is_not_capacity() -> None:
    p = pilot("1", PilotState.IDLE, end=NOW + 300)  # margin is 600 s
    result = plan(snap([(ONE, 1)], [p]), memory(), config(), NOW)
    assert len(submits(result)) == 1


def test_stated_runtime_needs_a_pilot_that_can_finish_it() -> None:
    p = pilot("1", PilotState.IDLE, end=NOW + 3000)
    short, long_ = JobShape(1, 2000, runtime_s=1800), JobShape(1, 2000, runtime_s=7200)
    assert submits(plan(snap([(short, 1)], [p]), memory(), config(), NOW)) == []
    assert len(submits(plan(snap([(long_, 1)], [p]), memory(), config(), NOW))) == 1


def test_equal_pilots_with_different_ends_take_long_jobs_on_the_later_one() -> None:
    """Pilots with the same free resources are packed as one group; a job stating a
    runtime goes only to the members that can finish it, the other stays unused."""
    soon = pilot("1", PilotState.IDLE, cpus=1, memory_mb=4000, end=NOW + 3000)
    late = pilot("2", PilotState.IDLE, cpus=1, memory_mb=4000, end=NOW + 9000)
    long_ = JobShape(1, 2000, runtime_s=7200)
    for pilots in ([soon, late], [late, soon]):
        result = plan(snap([(long_, 1)], pilots), memory(), config(), NOW)
        assert submits(result) == []
        assert [a.pilot.key for a in result.actions if isinstance(a, Flag)] == [soon.key]
    # two such jobs: one fits the later pilot, the other needs a new pilot
    result = plan(snap([(long_, 2)], [soon, late]), memory(), config(), NOW)
    assert sum(s.count for s in submits(result)) == 1


def test_unmatchable_reported_with_field_and_numbers() -> None:
    huge = JobShape(1, 2_000_000)
    result = plan(snap([(huge, 3)]), memory(), config(site(memory_mb=192000)), NOW)
    assert submits(result) == []
    (u,) = result.unmatchable
    assert u.idle == 3 and "RequestMemory" in u.reason
    assert "2000000" in u.reason and "192000" in u.reason


def test_desired_sites_respected() -> None:
    cfg = config(site("a", weight=2), site("b", weight=1))
    result = plan(snap([(JobShape(1, 1000, desired_sites=("b",)), 2)], sites=("a", "b")), memory(),
                  cfg, NOW)
    assert {s.site for s in submits(result)} == {"b"}
    result = plan(snap([(JobShape(1, 1000, desired_sites=("z",)), 2)], sites=("a", "b")), memory(),
                  cfg, NOW)
    assert submits(result) == [] and "DesiredSites" in result.unmatchable[0].reason


def test_weight_order_and_spill_when_capped() -> None:
    cfg = config(site("a", weight=1, cpus=1), site("b", weight=5, cpus=1, max_submit=3))
    result = plan(snap([(ONE, 5)], sites=("a", "b")), memory(), cfg, NOW)
    per_site = {s.site: s.count for s in submits(result)}
    assert per_site == {"b": 3, "a": 2}


def test_unknown_site_gets_nothing_and_spills() -> None:
    cfg = config(site("a", weight=5, cpus=1), site("b", weight=1, cpus=1))
    idle_a = pilot("1", PilotState.IDLE, site="a", cpus=1, memory_mb=4000)
    result = plan(snap([(ONE, 3)], [idle_a], sites=("a", "b"), unknown=("a",)),
                  memory(flagged={idle_a.key: NOW - 300}), cfg, NOW)
    assert all(getattr(a, "site", None) != "a" for a in result.actions)
    assert all(getattr(a, "pilot", None) is None or a.pilot.site != "a" for a in result.actions)
    # the unknown site's idle pilot still absorbs one job
    assert sum(s.count for s in submits(result)) == 2


def test_caps_max_pilots_and_max_pending() -> None:
    pilots = [pilot(str(i), PilotState.BUSY) for i in range(8)]
    pilots += [pilot("p", PilotState.PENDING, cpus=1, memory_mb=4000, free_cpus=1)]
    cfg = config(site(cpus=1, max_pilots=10, max_pending=5))
    result = plan(snap([(ONE, 10)], pilots), memory(), cfg, NOW)
    assert sum(s.count for s in submits(result)) == 1  # 9 alive, max 10
    cfg = config(site(cpus=1, max_pilots=100, max_pending=3))
    result = plan(snap([(ONE, 10)], pilots), memory(), cfg, NOW)
    assert sum(s.count for s in submits(result)) == 2  # 1 pending, max 3


def test_an_ending_pilot_is_no_capacity_but_counts_toward_max_pilots() -> None:
    # Its startd has stopped for good while SLURM still holds its batch job (a
    # pilot at its walltime): the job it ran is idle again and no longer placed
    # on it, yet a new pilot would put the site over its cap until it leaves.
    ending = pilot("1", PilotState.ENDING, cpus=1, free_cpus=0)
    at_cap = plan(snap([(ONE, 1)], [ending]), memory(), config(site(cpus=1, max_pilots=1)), NOW)
    assert submits(at_cap) == []
    room = plan(snap([(ONE, 1)], [ending]), memory(), config(site(cpus=1, max_pilots=2)), NOW)
    assert sum(s.count for s in submits(room)) == 1


def test_idle_pilot_flagged_then_released() -> None:
    p = pilot("1", PilotState.IDLE)
    first = plan(snap([], [p]), memory(), config(), NOW)
    assert [type(a) for a in first.actions] == [Flag]
    flagged, _cycles = carry_over(snap([], [p]), memory(), first, NOW)
    second = plan(snap([], [p]), memory(flagged=flagged), config(), NOW + 20)
    assert [type(a) for a in second.actions] == [Release]


def test_flag_same_instant_is_not_a_second_observation() -> None:
    p = pilot("1", PilotState.IDLE)
    result = plan(snap([], [p]), memory(flagged={p.key: NOW}), config(), NOW)
    assert result.actions == ()


def test_flagged_pilot_used_by_demand_is_unflagged() -> None:
    p = pilot("1", PilotState.IDLE)
    result = plan(snap([(ONE, 1)], [p]), memory(flagged={p.key: NOW - 300}), config(), NOW)
    assert [type(a) for a in result.actions] == [Unflag]


def test_busy_flagged_pilot_is_unflagged_never_released() -> None:
    p = pilot("1", PilotState.BUSY, free_cpus=15, free_mem=60000)
    result = plan(snap([], [p]), memory(flagged={p.key: NOW - 300}), config(retire=False),
                  NOW)
    assert [type(a) for a in result.actions] == [Unflag]
    # with retirement on it is also told to leave when its job ends
    result = plan(snap([], [p]), memory(flagged={p.key: NOW - 300}), config(), NOW)
    assert [type(a) for a in result.actions] == [Unflag, Retire]


def test_min_lifetime_and_keep_warm_block_release() -> None:
    p = pilot("1", PilotState.IDLE, started=NOW - 100)
    s, m = snap([], [p]), memory(flagged={p.key: NOW - 50})
    assert not any(isinstance(a, Release)
                   for a in plan(s, m, config(min_lifetime=600), NOW).actions)
    assert not any(isinstance(a, Release)
                   for a in plan(s, m, config(site(keep_warm=1)), NOW).actions)
    assert any(isinstance(a, Release) for a in plan(s, m, config(), NOW).actions)


def test_pending_without_demand_cancelled_starting_only_after_the_start_timeout() -> None:
    pend = pilot("1", PilotState.PENDING)
    start = pilot("2", PilotState.STARTING, started=NOW - 60)
    stuck = pilot("3", PilotState.STARTING, started=NOW - 3600)
    s = snap([], [pend, start, stuck])
    result = plan(s, memory(), config(), NOW)
    assert sorted((type(a).__name__, a.pilot.job_id) for a in result.actions) == [
        ("Cancel", "3")]
    assert result.unneeded == ("gsi/1",)
    # the pending pilot goes after `pending_cancel_cycles` (3) cycles without demand
    later = memory(unneeded_cycles={"gsi/1": 2})
    assert sorted((type(a).__name__, a.pilot.job_id)
                  for a in plan(s, later, config(), NOW).actions
                  ) == [("Cancel", "1"), ("Cancel", "3")]


def test_a_half_open_sites_pending_probe_is_not_cancelled_for_lack_of_demand() -> None:
    pend = pilot("1", PilotState.PENDING)
    s, m = snap([], [pend]), memory(unneeded_cycles={"gsi/1": 10})
    assert [type(a).__name__ for a in plan(s, m, config(), NOW).actions] == ["Cancel"]
    probing = dataclasses.replace(m, probing=frozenset({"gsi"}))
    assert plan(s, probing, config(), NOW).actions == ()


def test_pending_kept_when_demand_needs_it() -> None:
    pend = pilot("1", PilotState.PENDING)
    result = plan(snap([(ONE, 3)], [pend]), memory(), config(), NOW)
    assert result.actions == ()


def test_release_cycles_three() -> None:
    p = pilot("1", PilotState.IDLE)
    cfg = config(release_cycles=3)
    flagged: dict[str, float] = {}
    cycles: dict[str, int] = {}
    kinds = []
    for i in range(3):
        s, m = snap([], [p]), memory(flagged=flagged, idle_cycles=cycles)
        r = plan(s, m, cfg, NOW + 20 * i)
        kinds.append([type(a).__name__ for a in r.actions])
        flagged, cycles = carry_over(s, m, r, NOW + 20 * i)
    assert kinds == [["Flag"], [], ["Release"]]


def test_target_cpus_packs_small_pilots() -> None:
    cfg = config(site(cpus=16, target_cpus=4, max_submit=10))
    result = plan(snap([(ONE, 8)]), memory(), cfg, NOW)
    assert [(s.count, s.cpus) for s in submits(result)] == [(2, 4)]


def test_open_circuit_breaker_sends_the_demand_elsewhere() -> None:
    cfg = config(site("a", weight=5, cpus=1), site("b", weight=1, cpus=1))
    s = snap([(ONE, 3)], sites=("a", "b"))
    blocked = memory(submit_limit={"a": 0})
    result = plan(s, blocked, cfg, NOW)
    assert {x.site: x.count for x in submits(result)} == {"b": 3}
    small_b = config(site("a", weight=5, cpus=1), site("b", weight=1, cpus=1, max_submit=1))
    left_over = plan(s, blocked, small_b, NOW)
    assert next(x for x in left_over.summary if x.site == "a").capped == "circuit breaker"
    probing = memory(submit_limit={"a": 1})
    assert {x.site: x.count for x in submits(plan(s, probing, cfg, NOW))} == {"a": 1, "b": 2}
