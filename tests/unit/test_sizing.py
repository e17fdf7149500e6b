"""Pilot shape follows the scarce resource (issue 40, part 1): where a site's pilots are
limited in number (a learnt SLURM limit, `caps.max_pilots` short of the work), new
pilots take the work's share per allowed pilot, up to the whole shape; where cores are
the limit they are sized to their jobs as before. Plain data and property tests."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.config import ReserveConfig
from provisioner.decide.matching import Row, item_of
from provisioner.decide.plan import plan
from provisioner.decide.sizing import bound_sizes, new_pilot_size
from provisioner.model import JobShape, PilotState, Submit

from .helpers import NOW, config, memory, pilot, site, snap

ONE = JobShape(cpus=1, memory_mb=1000)
NO_RESERVE = ReserveConfig(enabled=False)


def submitted(result: object) -> list[int]:
    """The cores of each new pilot of a plan, one entry per pilot."""
    return sorted((a.cpus for a in result.actions  # type: ignore[attr-defined]
                   if isinstance(a, Submit) for _ in range(a.count)), reverse=True)


def test_a_site_at_a_learnt_job_limit_gets_pilots_of_the_works_share() -> None:
    gsi = site("gsi", cpus=16, target_cpus=1, max_pilots=500, max_pending=50, max_submit=50)
    cfg = config(gsi, max_submit=50, reserve=NO_RESERVE)
    # 120 one-core jobs wait; SLURM lets the account run 10 pilots there, 4 are held
    running = [pilot(str(i), PilotState.BUSY, cpus=8, free_cpus=0) for i in range(4)]
    limited = plan(snap([(ONE, 120)], running), memory(pilot_limits={"gsi": 10},
                                                       limit_room={"gsi": 6}), cfg, NOW)
    # work: 32 running + 120 waiting cores over 10 pilots: 16 cores each (the whole shape)
    assert submitted(limited) == [16] * 6
    # cores the limit: the same jobs, no limit known: one-core pilots, as configured
    free = plan(snap([(ONE, 120)], running), memory(), cfg, NOW)
    assert set(submitted(free)) == {1} and len(submitted(free)) == 50


def test_max_pilots_alone_keeps_pilots_sized_to_the_work_and_a_generous_limit_too(
        ) -> None:
    # 40 jobs, 5 pilots allowed by configuration: a burst; the rest waits or goes
    # elsewhere, pilots stay sized to their jobs
    tight = site("gsi", cpus=16, target_cpus=1, max_pilots=5, max_pending=50, max_submit=50)
    result = plan(snap([(ONE, 40)]), memory(), config(tight, reserve=NO_RESERVE), NOW)
    assert submitted(result) == [1] * 5
    # a learnt limit of 100 pilots for 40 jobs: pilots of one core (no idle room bought)
    roomy = site("gsi", cpus=16, target_cpus=1, max_pilots=200, max_pending=200,
                 max_submit=200)
    result = plan(snap([(ONE, 40)]), memory(pilot_limits={"gsi": 100},
                                            limit_room={"gsi": 100}),
                  config(roomy, max_submit=200, reserve=NO_RESERVE), NOW)
    assert submitted(result) == [1] * 40
    # the same learnt limit at 10 pilots: 4 cores each
    result = plan(snap([(ONE, 40)]), memory(pilot_limits={"gsi": 10}, limit_room={"gsi": 10}),
                  config(roomy, max_submit=200, reserve=NO_RESERVE), NOW)
    assert submitted(result) == [4] * 10


@settings(max_examples=200, deadline=None)
@given(cpus=st.integers(1, 64), pack=st.integers(1, 64), allowed=st.integers(1, 500),
       cap=st.integers(1, 500), waiting=st.integers(0, 5000), running=st.integers(0, 5000),
       learnt=st.booleans())
def test_bound_sizes_stay_within_the_shape_and_never_below_the_packing_size(
        cpus: int, pack: int, allowed: int, cap: int, waiting: int, running: int,
        learnt: bool) -> None:
    """A bound site's pilots are between its packing size and its whole shape, and carry
    at least the work's share per allowed pilot (the learnt limit or max_pilots, the
    lower) where the shape allows; a site without a learnt limit keeps its packing
    size."""
    pack = min(pack, cpus)
    s = site("gsi", cpus=cpus, target_cpus=pack, max_pilots=cap, max_pending=cap,
             max_submit=cap)
    row = Row(item_of(ONE), ONE, waiting, ["gsi"])
    limits = {"gsi": allowed} if learnt else {}
    got = bound_sizes([row], {"gsi": s}, limits, {"gsi": running})
    if not learnt:
        assert got == {}
        return
    size = got.get("gsi", pack)
    assert pack <= size <= cpus
    share = -(-(waiting + running) // min(allowed, cap))
    assert size >= min(cpus, share)
    if "gsi" in got:
        assert size > pack


@settings(max_examples=200, deadline=None)
@given(cpus=st.integers(1, 64), min_cpus=st.integers(1, 64), used=st.integers(0, 64),
       at_least=st.integers(0, 64))
def test_a_new_pilot_holds_its_jobs_and_asks_no_more_than_the_shape(
        cpus: int, min_cpus: int, used: int, at_least: int) -> None:
    min_cpus = min(min_cpus, cpus)
    used = min(used, cpus)
    s = site("gsi", cpus=cpus, min_cpus=min_cpus, memory_mb=cpus * 4000)
    c, m, g = new_pilot_size(s, used, used * 1000, 0, at_least)
    assert max(min_cpus, used, min(at_least, cpus)) <= c <= cpus
    assert m <= s.pilot.memory_mb and m >= min(s.pilot.memory_mb, used * 1000) and g == 0


def test_a_job_limited_site_packs_the_work_into_the_pilots_it_may_hold() -> None:
    """The controller end to end: pilots pending with AssocMaxJobsLimit teach the limit;
    the next cycle's new pilots there carry the work's share."""
    from dataclasses import replace

    from provisioner.decide.controller import Controller
    gsi = site("gsi", cpus=16, target_cpus=1, max_pilots=100, max_pending=50, max_submit=50)
    ctl = Controller(config(gsi, max_submit=50, reserve=NO_RESERVE))
    busy = [pilot(str(i), PilotState.BUSY, cpus=1, free_cpus=0) for i in range(3)]
    pend = [replace(pilot(f"p{i}", PilotState.PENDING, cpus=1),
                    limit_reason="AssocMaxJobsLimit") for i in range(2)]
    first = ctl.cycle(snap([(ONE, 60)], busy + pend), NOW)
    assert ctl.limits.caps["gsi"].jobs == 3
    assert submitted(first) == []  # at its limit: no room, nothing more there
    # the pending ones gone, no reason any more: one pilot past the limit tests it, and
    # carries the work's share (3 running + 60 waiting cores over 3 pilots: whole)
    second = ctl.cycle(snap([(ONE, 60)], busy), NOW + 60)
    assert submitted(second) == [16]
