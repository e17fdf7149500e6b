"""The black-hole circuit breaker: opens after pilots in a row never join, tests the
site with one pilot after the pause, doubles the pause on a failed test; fed by the
controller, which also cancels pilots drained by someone else; the learnt state that
survives a restart."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.decide.breaker import SiteBreakers
from provisioner.decide.controller import Controller
from provisioner.model import Cancel, JobShape, Pilot, PilotState, Submit

from .helpers import NOW, config, pilot, snap


def fail_one(b: SiteBreakers, key: str, t: float) -> list[str]:
    """A pilot is submitted at `a` and ends without ever joining."""
    b.track([key])
    return b.observe("a", [], [], t + 10)


def test_opens_after_threshold_half_opens_and_doubles_on_failed_test() -> None:
    b = SiteBreakers(threshold=2, base_s=60, max_s=200)
    assert fail_one(b, "a/1", 0) == [] and b.max_new("a", 10, 0) is None
    events = fail_one(b, "a/2", 20)
    assert "circuit breaker OPEN for 60 s" in events[0] and "a/2" in events[0]
    assert b.max_new("a", 40, 0) == 0
    assert "half-open" in b.observe("a", [], [], 91)[0]
    assert b.max_new("a", 91, 0) == 1 and b.max_new("a", 91, 1) == 0
    assert "OPEN for 120 s" in fail_one(b, "a/3", 100)[0]
    b.observe("a", [], [], 231)
    assert "OPEN for 200 s" in fail_one(b, "a/4", 240)[0]  # capped at max_s
    assert b.max_new("b", 240, 0) is None  # other sites unaffected


def test_a_joining_test_pilot_closes_it() -> None:
    b = SiteBreakers(threshold=1, base_s=60)
    fail_one(b, "a/1", 0)
    b.observe("a", [], [], 70)
    b.observe("a", ["a/2"], [], 80)
    b.observe("a", ["a/2"], ["a/2"], 90)  # it joined
    assert "closed" in b.observe("a", [], [], 100)[0]  # and was released later
    assert b.max_new("a", 100, 0) is None and b.snapshot(100) == {"a": "closed"}


def test_pilots_that_joined_or_were_withdrawn_are_no_failures() -> None:
    b = SiteBreakers(threshold=1)
    b.observe("a", ["a/1"], [], 0)  # pending, then cancelled by the provisioner
    b.withdraw("a/1")
    assert b.observe("a", [], [], 10) == []
    b.observe("a", ["a/2"], ["a/2"], 20)
    assert b.observe("a", [], [], 30) == [] and b.max_new("a", 30, 0) is None


def test_a_pilot_that_lived_only_between_two_cycles_still_counts() -> None:
    b = SiteBreakers(threshold=1)
    b.track(["a/5"])  # submitted; started and died before the next cycle looked
    assert "OPEN" in b.observe("a", [], [], 10)[0]


@given(st.lists(st.booleans(), min_size=1, max_size=40))
def test_never_more_than_one_new_pilot_unless_closed(outcomes: list[bool]) -> None:
    b = SiteBreakers(threshold=2, base_s=30, max_s=300)
    t = 0.0
    for i, joined in enumerate(outcomes):
        key = f"a/{i}"
        b.observe("a", [key], [key] if joined else [], t)
        b.observe("a", [], [], t + 5)
        limit = b.max_new("a", t + 5, 0)
        st_ = b.state("a")
        assert limit is None or limit <= 1
        assert st_.delay_s <= 300
        if limit is None:
            assert st_.open_until is None and not st_.probing
        t += 20


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=30))
def test_opens_only_after_threshold_failures_in_a_row(outcomes: list[bool]) -> None:
    """Never open before `threshold` failed pilots in a row (a joined pilot resets)."""
    b = SiteBreakers(threshold=3, base_s=600, max_s=2400)
    run = 0
    for i, ok in enumerate(outcomes):
        t = 100.0 * i
        key = f"a/{i}"
        b.observe("a", [key], [key] if ok else [], t)
        b.observe("a", [], [], t + 50)
        run = 0 if ok else run + 1
        opened = b.state("a").open_until is not None
        assert not (opened and run < 3), f"open after {run} failures in a row"
        if ok:
            assert not opened


def starting(job_id: str, t: float) -> Pilot:
    return pilot(job_id, PilotState.STARTING, started=t - 10)


def test_the_controller_follows_submissions_withdraws_cancels_and_skips_unknown_sites(
        ) -> None:
    ctl = Controller(config())
    threshold = ctl.config.policy.breaker.threshold
    for i in range(threshold - 1):
        ctl.submitted([f"gsi/{i}"])  # started and died before any cycle looked
        ctl.cycle(snap(), NOW + 10 * i)
    assert ctl.breakers.state("gsi").failures == threshold - 1
    # A pending pilot the controller cancels is withdrawn, not a failure.
    pending = pilot("50", PilotState.PENDING, submitted=NOW)
    cancels = []
    for k in range(5):
        result = ctl.cycle(snap([], [pending]), NOW + 100 + 10 * k)
        cancels += [a.pilot.key for a in result.actions if isinstance(a, Cancel)]
        if cancels:
            break
    assert cancels == ["gsi/50"]
    ctl.cycle(snap(), NOW + 200)
    assert ctl.breakers.state("gsi").failures == threshold - 1 and not ctl.transitions
    # A pilot at a site not read this cycle is not gone.
    ctl.cycle(snap([], [starting("60", NOW + 300)]), NOW + 300)
    ctl.cycle(snap(unknown=("gsi",)), NOW + 310)
    assert ctl.breakers.state("gsi").failures == threshold - 1
    ctl.cycle(snap(), NOW + 320)  # read again: gone without ever joining
    assert any("circuit breaker OPEN" in line for line in ctl.transitions)
    assert not [a for a in ctl.cycle(snap([(JobShape(1, 2000), 4)]), NOW + 330).actions
                if isinstance(a, Submit)]


def test_pilot_drained_by_someone_else_is_cancelled_once_empty_for_n_cycles() -> None:
    drained = dataclasses.replace(pilot("1", PilotState.DRAINING), free_cpus=16,
                                  free_memory_mb=64000)
    busy = dataclasses.replace(pilot("2", PilotState.DRAINING), free_cpus=8,
                               free_memory_mb=32000)
    ctl = Controller(config())
    kinds = []
    for i in range(3):
        result = ctl.cycle(snap([], [drained, busy]), NOW + 20 * i)
        kinds.append(sorted(a.pilot.job_id for a in result.actions if isinstance(a, Cancel)))
    assert kinds == [[], ["1"], ["1"]]  # idle_release_cycles = 2; the busy one never
    ctl.released(busy.key, NOW)
    emptied = dataclasses.replace(busy, free_cpus=16, free_memory_mb=64000)
    for i in range(3):  # our own release: the release follow-up handles it, not this
        result = ctl.cycle(snap([], [emptied]), NOW + 100 + 20 * i)
        assert not [a for a in result.actions if isinstance(a, Cancel)]


def test_learnt_state_survives_a_restart() -> None:
    ctl = Controller(config())
    sub = NOW - 500
    pend = dataclasses.replace(pilot("1", PilotState.PENDING), submitted_at=sub)
    ctl.cycle(snap([], [pend]), NOW - 400)
    up = dataclasses.replace(pilot("1", PilotState.IDLE, started=NOW - 300), submitted_at=sub)
    ctl.cycle(snap([], [up]), NOW - 250)
    est = ctl.estimates.sites["gsi"]
    assert est.samples == 1 and est.wait_s == 200 and 0 < est.boot_s < 90
    for i in range(ctl.config.policy.breaker.threshold):
        fail = starting(str(10 + i), NOW + 100 * i)
        ctl.cycle(snap([], [fail]), NOW + 100 * i)
        ctl.cycle(snap([], []), NOW + 100 * i + 50)
    restarted = Controller(config())
    restarted.load(ctl.state())
    assert restarted.state() == ctl.state()
    assert restarted.estimates.sites == ctl.estimates.sites
    assert restarted.breakers.state("gsi").open_until is not None
    restarted.load({"estimates": {"gsi": {"wait_s": "x"}}, "breakers": None})  # ignored


def test_opening_is_one_line_however_many_failed_pilots_are_seen() -> None:
    """Item 6 of issue 23: ten pilots that never joined, seen in one cycle and then one
    by one while the breaker is open, give one OPEN line, and the pause is not
    stretched by the stragglers."""
    b = SiteBreakers(threshold=3, base_s=600, max_s=3600)
    b.track([f"a/{i}" for i in range(10)])
    burst = b.observe("a", [f"a/{i}" for i in range(6, 10)], [], 100)  # six gone at once
    later = [line for t, i in ((200, 6), (300, 7), (400, 8))
             for line in b.observe("a", [f"a/{j}" for j in range(i + 1, 10)], [], t)]
    opened = [line for line in burst + later if "OPEN" in line]
    assert len(opened) == 1 and "OPEN for 600 s" in opened[0]
    assert b.state("a").open_until == 700 and b.state("a").failures == 9
    assert "half-open" in b.observe("a", [], [], 700)[0]  # the tenth: one more failure
    assert "OPEN for 1200 s" in fail_one(b, "a/11", 710)[0]  # the failed test: a transition
