"""Back-off of unreadable sites."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from provisioner.decide.backoff import SiteBackoff


def test_delays_double_up_to_the_cap_and_reset_on_success() -> None:
    b = SiteBackoff(base_s=10, max_s=60)
    assert b.due("gsi", 0)
    assert [b.failed("gsi", 0) for _ in range(5)] == [10, 20, 40, 60, 60]
    assert not b.due("gsi", 59) and b.due("gsi", 60)
    assert b.due("frankfurt", 0)  # one site's failures never hold back another
    assert b.succeeded("gsi") is True
    assert b.due("gsi", 0) and b.succeeded("gsi") is False
    assert b.failed("gsi", 100) == 10


@given(st.lists(st.floats(min_value=0, max_value=1e6), min_size=1, max_size=30))
def test_never_backed_off_longer_than_the_cap(times: list[float]) -> None:
    b = SiteBackoff(base_s=5, max_s=120)
    for now in sorted(times):
        delay = b.failed("s", now)
        assert 5 <= delay <= 120
        assert b.due("s", now + delay) and not b.due("s", now + delay - 1e-3)
