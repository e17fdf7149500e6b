"""The reserve's gate (issue 40, part 2): what made sparse streams wait.

- A window longer than jobs run lost the finished ones from the arrival count; the
  distinct arrival times seen bound it from below (`seen_arrivals`, `ShapeRates`).
- A reserve pilot that idled out dropped its shape's reserve until the next job, which
  then waited; now only an idle-out the forecast makes unlikely does (`spent_slots`).
- Slots that would wait longer than a pilot waits unclaimed go into shared pilots
  (`pack_reserve`), and arrivals beside waiting room ask for a negotiation.
"""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.config import ReserveConfig
from provisioner.decide.cadence import Probe
from provisioner.decide.controller import Controller, QueueSize
from provisioner.decide.plan import plan
from provisioner.decide.reserve import (
    ShapeRates,
    likely_slots,
    seen_arrivals,
    spent_slots,
)
from provisioner.model import JobShape, PilotState, Submit

from .helpers import NOW, config, memory, pilot, site, snap

ONE = JobShape(cpus=1, memory_mb=1000)


def _p_below(mean: float, k: int) -> float:
    """P(N < k), N ~ Poisson(mean)."""
    return sum(math.exp(-mean) * mean ** i / math.factorial(i) for i in range(k))


@given(counted=st.integers(0, 500), times=st.integers(0, 500))
def test_the_arrivals_of_a_window_are_never_fewer_than_either_count(
        counted: int, times: int) -> None:
    got = seen_arrivals(counted, times)
    if counted == 0:
        assert got == 0  # nothing matchable in the window: no reserve from the times
    else:
        assert got == max(counted, times)


def test_a_window_longer_than_the_jobs_run_counts_the_finished_ones_by_their_times() -> None:
    cfg = config(reserve=ReserveConfig())
    rates = ShapeRates()
    # two hours of a one-job-in-ten-minutes trickle; hour-long jobs: only the last six
    # are still in the queue, twelve arrival times were seen
    rates.observe(snap(arrivals=[(ONE, 6)]), 7200.0, cfg, NOW, times=12)
    assert abs(rates.rates(NOW + 1)[(1, 0)] * 3600 - 6.0) < 1e-9
    # safeguard off (no times given): the rate reads half of it
    blind = ShapeRates()
    blind.observe(snap(arrivals=[(ONE, 6)]), 7200.0, cfg, NOW)
    assert abs(blind.rates(NOW + 1)[(1, 0)] * 3600 - 3.0) < 1e-9


@settings(max_examples=300, deadline=None)
@given(mean=st.floats(0.0, 50.0), chance=st.floats(0.0, 0.99), most=st.integers(0, 64))
def test_likely_slots_are_those_whose_job_comes_with_the_chance(
        mean: float, chance: float, most: int) -> None:
    k = likely_slots(mean, chance, most)
    assert 0 <= k <= most
    if k > 0:
        assert 1 - _p_below(mean, k) >= chance - 1e-9
    if k < most:
        assert 1 - _p_below(mean, k + 1) < chance + 1e-9


@settings(max_examples=300, deadline=None)
@given(held=st.integers(0, 20), left=st.integers(0, 20), mean=st.floats(0.0, 40.0),
       chance=st.floats(0.0, 0.99))
def test_a_spent_shape_keeps_no_more_than_its_size_and_drops_on_a_surprise(
        held: int, left: int, mean: float, chance: float) -> None:
    eps = 0.006
    got = spent_slots(held, left, mean, chance, eps)
    assert 0 <= got <= held
    if _p_below(mean, held) < eps:  # the forecast said its last slot was surely used
        assert got == min(held, left)
    else:
        assert got >= min(held, left, likely_slots(mean, chance, held))


def test_a_trickles_slots_go_into_one_pilot_and_a_quick_streams_stay_apart() -> None:
    s = site("gsi", cpus=16, target_cpus=1, max_pilots=100, max_pending=50, max_submit=50)
    cfg = config(s, max_submit=50, reserve=ReserveConfig(min_arrival_times=1))
    arrivals = [(ONE, 6)]
    # six jobs an hour, a no-claim time of 20 minutes: two expected, three slots kept
    slow = plan(snap(arrivals=arrivals), memory(window=3600.0, shape_rates={
        (1, 0): 6 / 3600}), cfg, NOW)
    cores = [a.cpus for a in slow.actions if isinstance(a, Submit) for _ in range(a.count)]
    assert len(cores) == 1 and cores[0] == slow.reserve_held > 1
    # the same slots for a quick stream (hundreds an hour): a pilot each, as configured
    quick = plan(snap(arrivals=arrivals), memory(window=3600.0, shape_rates={
        (1, 0): 600 / 3600}), cfg, NOW)
    cores = [a.cpus for a in quick.actions if isinstance(a, Submit) for _ in range(a.count)]
    assert cores and set(cores) == {1}


def test_a_job_arriving_beside_the_reserve_asks_for_a_negotiation() -> None:
    c = Controller(config(site(), reserve=ReserveConfig(min_arrival_times=1)))
    c.due(NOW, Probe(0))
    idle = pilot("1", PilotState.IDLE)
    seen = replace(snap([], [idle], arrivals=[(ONE, 20)]), last_arrival_at=NOW - 5)
    c.cycle(seen, NOW, QueueSize(200, 100))  # keeps the idle pilot for the reserve
    assert c.mark is not None and c.mark.reserve > 0
    assert not c.reschedule_due(frozenset({"gsi/1"}), 0, NOW + 1)  # nothing waits
    c.due(NOW + 1, Probe(0, frozenset({"gsi/1"})))
    assert c.reschedule_due(frozenset({"gsi/1"}), 1, NOW + 10)  # a job arrived
    c.due(NOW + 10, Probe(1, frozenset({"gsi/1"})))
    assert not c.reschedule_due(frozenset({"gsi/1"}), 1, NOW + 20)  # none since
