"""Placement: learnt leads decide, equal sites share, weights scale, overdue pending
pilots are hedged once, pending pilots are not churned."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.decide.placement import _waste, shares, whole_pilots
from provisioner.decide.plan import plan
from provisioner.model import (
    Cancel,
    CycleMemory,
    JobShape,
    Pilot,
    PilotState,
    SiteEstimate,
    Snapshot,
    Submit,
)

from .helpers import NOW, config, memory, pilot, site, snap

ONE = JobShape(1, 2000)


def new_jobs(result, name: str) -> int:  # type: ignore[no-untyped-def]
    return next(s.new_pilot_jobs for s in result.summary if s.site == name)


def two_sites(weight_b: float = 1.0, **kw):  # type: ignore[no-untyped-def]
    return config(site("alpha", max_pilots=50, max_pending=50, max_submit=50, **kw),
                  site("beta", max_pilots=50, max_pending=50, max_submit=50,
                       weight=weight_b, **kw), max_submit=100)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 60), names=st.permutations(["alpha", "beta"]))
def test_equal_sites_share_demand_whatever_their_names(n: int, names: list[str]) -> None:
    cfg = config(*(site(name, max_pilots=50, max_pending=50, max_submit=50)
                   for name in names), max_submit=100)
    result = plan(snap([(ONE, n)], sites=tuple(names)), memory(), cfg, NOW)
    a, b = new_jobs(result, "alpha"), new_jobs(result, "beta")
    assert a + b == n and abs(a - b) <= 1


def test_shares_follow_capacity_and_never_exceed_it() -> None:
    assert shares(10, [10, 30], [0.0, 0.0]) == [3, 7]
    assert shares(10, [2, 30], [0.0, 0.0]) == [1, 9]
    assert shares(30, [2, 30], [0.0, 0.0]) == [2, 28]
    assert shares(1, [5, 5], [0.5, 0.1]) == [0, 1]  # the remainder to the less loaded
    assert shares(50, [3, 4], [0.0, 0.0]) == [3, 4]


def test_a_whole_node_site_gets_no_remainder_it_would_need_a_node_for() -> None:
    # 4 jobs per pilot at both; the second site gives whole nodes only
    assert whole_pilots([3, 5], [4, 8], [4, 4], [1, 4]) == [4, 4]
    assert sorted(whole_pilots([1, 3], [4, 8], [4, 4], [1, 4])) == [0, 4]
    # the remainder goes to the site ranked first (weighted lead, then load)
    assert whole_pilots([1, 3], [4, 8], [4, 4], [1, 4], [(1.0, 0.0), (1.25, 0.0)]) == [4, 0]
    assert whole_pilots([1, 3], [4, 8], [4, 4], [1, 4], [(1.25, 0.0), (1.0, 0.0)]) == [0, 4]
    assert whole_pilots([1, 4], [4, 8], [4, 4], [1, 4]) == [1, 4]  # nothing to save
    assert whole_pilots([7, 6], [40, 40], [4, 4], [4, 4]) == [7, 6]  # 13: 3 empty anyway
    assert whole_pilots([2, 2], [2, 8], [4, 4], [4, 4]) == [0, 4]  # the capacity holds


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 80), caps=st.lists(st.integers(0, 40), min_size=2, max_size=4),
       per=st.lists(st.integers(1, 8), min_size=4, max_size=4),
       fill=st.lists(st.integers(1, 8), min_size=4, max_size=4))
def test_whole_pilots_keeps_the_jobs_and_the_capacity_and_never_wastes_more(
        n: int, caps: list[int], per: list[int], fill: list[int]) -> None:
    k = len(caps)
    split = shares(n, caps, [0.0] * k)
    out = whole_pilots(split, caps, per[:k], fill[:k])
    assert sum(out) == sum(split)
    assert all(0 <= o <= c for o, c in zip(out, caps, strict=True))
    before = sum(_waste(s, p, f) for s, p, f in zip(split, per, fill, strict=False))
    after = sum(_waste(o, p, f) for o, p, f in zip(out, per, fill, strict=False))
    assert after <= before


def submitted_cpus(result) -> int:  # type: ignore[no-untyped-def]
    return sum(a.cpus * a.count for a in result.actions if isinstance(a, Submit))


def test_equal_sites_one_of_whole_nodes_get_no_part_empty_node() -> None:
    cfg = config(site("gsi", cpus=4, min_cpus=1, max_pilots=1, max_pending=1, max_submit=1),
                 site("frankfurt", cpus=4, min_cpus=4, max_pilots=2, max_pending=2,
                      max_submit=2), max_submit=10)
    for n in (8, 4, 5, 12):
        result = plan(snap([(ONE, n)], sites=("gsi", "frankfurt")), memory(), cfg, NOW)
        placed = new_jobs(result, "gsi") + new_jobs(result, "frankfurt")
        assert placed == n
        assert submitted_cpus(result) == n, (n, result.actions)  # no core left empty
    # equal but for the weight: 4 jobs go whole to the preferred site
    cfg = config(site("gsi", cpus=4, min_cpus=1, max_pilots=1, max_pending=1, max_submit=1),
                 site("frankfurt", cpus=4, min_cpus=4, max_pilots=2, max_pending=2,
                      max_submit=2, weight=0.9), max_submit=10)
    result = plan(snap([(ONE, 4)], sites=("gsi", "frankfurt")), memory(), cfg, NOW)
    assert (new_jobs(result, "gsi"), new_jobs(result, "frankfurt")) == (4, 0)


def test_the_learnt_quicker_site_takes_the_demand_and_weight_scales() -> None:
    est = {"alpha": SiteEstimate(1800, 90, 5), "beta": SiteEstimate(60, 90, 5)}
    s, m = snap([(ONE, 20)], sites=("alpha", "beta")), memory(estimates=est)
    result = plan(s, m, two_sites(), NOW)
    assert new_jobs(result, "beta") == 20 and new_jobs(result, "alpha") == 0
    # weight scales the lead: beta at weight 1/20 now looks as slow as 3000 s
    result = plan(s, m, two_sites(weight_b=0.05), NOW)
    assert new_jobs(result, "alpha") == 20


def test_a_site_without_history_is_explored() -> None:
    est = {"alpha": SiteEstimate(60, 90, 5)}  # beta never seen
    result = plan(snap([(ONE, 20)], sites=("alpha", "beta")), memory(estimates=est),
                  two_sites(), NOW)
    assert new_jobs(result, "beta") > 0 and new_jobs(result, "alpha") > 0


def test_a_slow_pending_pilot_makes_its_site_look_slow() -> None:
    stuck = pilot("1", PilotState.PENDING, site="alpha", cpus=1, memory_mb=4000,
                  submitted=NOW - 300)  # longer than expected, not yet given up
    est = {"alpha": SiteEstimate(60, 90, 5), "beta": SiteEstimate(60, 90, 5)}
    result = plan(snap([(ONE, 11)], [stuck], sites=("alpha", "beta")), memory(estimates=est),
                  two_sites(), NOW)
    assert new_jobs(result, "beta") == 10 and new_jobs(result, "alpha") == 0


def pending_at_alpha(age: float, jobs: int) -> tuple[Pilot, Snapshot, CycleMemory]:
    """A pilot pending `age` seconds at alpha, `jobs` one-core jobs, both sites known to
    wait 300 s."""
    pend = pilot("1", PilotState.PENDING, site="alpha", submitted=NOW - age)
    est = {"alpha": SiteEstimate(300, 90, 5), "beta": SiteEstimate(300, 90, 5)}
    return pend, snap([(ONE, jobs)], [pend], sites=("alpha", "beta")), memory(estimates=est)


@settings(max_examples=60, deadline=None)
@given(age=st.floats(0, 7200), jobs=st.integers(1, 8))
def test_pending_pilot_blocks_placement_only_until_its_expected_start(
        age: float, jobs: int) -> None:
    """While it is expected no later than a new pilot elsewhere plus the margin it holds
    its jobs; after, they are placed anew, and the late pilot is kept (pending costs
    nothing) while they wait."""
    cfg = two_sites()
    pend, s, m = pending_at_alpha(age, jobs)
    result = plan(s, m, cfg, NOW)
    # beta offers a slot in 300 + 90 s; the pilot is expected in max(300 - age, age) + 90
    late = max(300 - age, age) + 90 > 300 + 90 + cfg.policy.placement.hedge_margin_s
    placed = sum(a.count for a in result.actions if isinstance(a, Submit))
    assert (placed > 0) == late
    assert result.hedges == ((pend.key,) if late else ())
    assert not [a for a in result.actions if isinstance(a, Cancel)]


@settings(max_examples=60, deadline=None)
@given(age=st.floats(1000, 7200), jobs=st.integers(1, 16), cycles=st.integers(1, 5))
def test_at_most_one_hedge_per_pending_pilot(age: float, jobs: int, cycles: int) -> None:
    """Cycles after the hedge, with its pilot pending (not yet overdue), submit nothing
    more for the same jobs, and the hedge is not reported again."""
    cfg = two_sites()
    pend, s, m = pending_at_alpha(age, jobs)
    first = plan(s, m, cfg, NOW)
    assert first.hedges == (pend.key,)
    wanted = [a for a in first.actions if isinstance(a, Submit) for _ in range(a.count)]
    hedge = [pilot(f"h{i}", PilotState.PENDING, site=a.site, cpus=a.cpus,
                   memory_mb=a.memory_mb, submitted=NOW) for i, a in enumerate(wanted)]
    for i in range(cycles):
        t = NOW + 20 * (i + 1)
        later = dataclasses.replace(s, pilots=(pend, *hedge))
        result = plan(later, dataclasses.replace(m, hedged=frozenset({pend.key})), cfg, t)
        assert not [a for a in result.actions if isinstance(a, Submit | Cancel)]
        assert result.hedges == ()


@settings(max_examples=60, deadline=None)
@given(cycles=st.integers(0, 10), jobs=st.integers(0, 20))
def test_no_pending_pilot_is_cancelled_while_demand_for_it_persists(
        cycles: int, jobs: int) -> None:
    pend = pilot("1", PilotState.PENDING, cpus=4, memory_mb=16000)
    m = memory(unneeded_cycles={pend.key: cycles})
    cancelled = [a for a in plan(snap([(ONE, jobs)], [pend]), m, config(), NOW).actions
                 if isinstance(a, Cancel)]
    if jobs:
        assert not cancelled
    else:
        assert bool(cancelled) == (cycles + 1 >= config().policy.placement.pending_cancel_cycles)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 128), rooms=st.tuples(st.integers(1, 6), st.integers(1, 6)))
def test_equal_sites_share_in_proportion_to_what_they_can_take(
        n: int, rooms: tuple[int, int]) -> None:
    """Equally quick sites split a row by the pilots each may still submit (16 jobs a
    pilot here), within one job of the exact proportion."""
    cfg = config(site("alpha", max_pilots=50, max_pending=50, max_submit=rooms[0]),
                 site("beta", max_pilots=50, max_pending=50, max_submit=rooms[1]),
                 max_submit=100)
    result = plan(snap([(ONE, n)], sites=("alpha", "beta")), memory(), cfg, NOW)
    cap = [16 * r for r in rooms]
    got = [new_jobs(result, "alpha"), new_jobs(result, "beta")]
    assert sum(got) == min(n, sum(cap))
    for g, c in zip(got, cap, strict=True):
        assert g <= c
        assert abs(g - min(n, sum(cap)) * c / sum(cap)) <= 1


def test_no_pending_pilot_is_cancelled_in_a_cycle_that_submits() -> None:
    """A pending pilot at alpha that no demand needed for long is not cancelled while the
    same cycle submits a pilot (it would be replaced by an equivalent one)."""
    pend = pilot("1", PilotState.PENDING, site="alpha", cpus=1, memory_mb=4000)
    only_beta = JobShape(1, 2000, desired_sites=("beta",))
    s = snap([(only_beta, 1)], [pend], sites=("alpha", "beta"))
    m = memory(unneeded_cycles={pend.key: 10})
    result = plan(s, m, two_sites(), NOW)
    assert [a.site for a in result.actions if isinstance(a, Submit)] == ["beta"]
    assert not [a for a in result.actions if isinstance(a, Cancel)]
    quiet = dataclasses.replace(s, demand=())
    assert [a.pilot.key for a in plan(quiet, m, two_sites(), NOW).actions
            if isinstance(a, Cancel)] == [pend.key]
