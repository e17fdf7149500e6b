"""The black-hole circuit breaker: opens after pilots in a row never join, tests the
site with one pilot after the pause, doubles the pause on a failed test."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from provisioner.breaker import SiteBreakers


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
