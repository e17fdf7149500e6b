"""The reserve pays for itself on every shape: a shape whose next job is unlikely to
arrive within the pilot's no-claim time, or whose slot would idle longer than
``max_idle_leads`` lead times per use, gets no reserve slot (its rate over the evidence
span, not one window's count), a shape keeps no more slots than each pay that price, and a
reserve pilot that ended by its no-claim shutdown is not replaced by an identical one until
its shape's jobs arrive again."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import given
from hypothesis import strategies as st

from provisioner.config import ReserveConfig
from provisioner.decide.controller import Controller, QueueSize
from provisioner.decide.reserve import ShapeRates, reserve_rows, slots_worth
from provisioner.model import JobShape, PilotState, Submit

from .helpers import NOW, config, memory, pilot, site, snap

ONE = JobShape(1, 2000)
EIGHT = JobShape(8, 16000)
RES = ReserveConfig(window_s=900, lead_s=240, factor=2.5, max_jobs=64)
PRICED = RES.model_copy(update={"max_idle_leads": 6.0})


def seen(arrivals, now, pilots=()):  # type: ignore[no-untyped-def]
    """A cycle's inputs: the arrivals, the newest a few seconds old, and the queue size."""
    return (dataclasses.replace(snap(arrivals=arrivals, pilots=list(pilots)),
                                last_arrival_at=now - 5), now, QueueSize(200, 100))


WATCHED = RES.model_copy(update={"min_use_chance": 0.0, "max_idle_leads": 0,
                                 "min_arrival_times": 1})  # the no-claim watch alone


def cpus_of_rows(s, cfg, rates=None) -> dict[int, int]:  # type: ignore[no-untyped-def]
    """The reserve's cores per row for snapshot `s`, the shapes' `rates` remembered."""
    rows, _size = reserve_rows(s, memory(shape_rates=rates or {}), cfg, cfg.sites, NOW)
    return {r.item.cpus: r.jobs for r in rows}


def test_a_shape_unlikely_to_claim_a_slot_within_the_noclaim_time_gets_none() -> None:
    cfg = config(reserve=RES)  # noclaim 1200 s; chance 0.5 needs 0.69 jobs per 1200 s
    often = snap(arrivals=[(ONE, 60), (EIGHT, 10)])  # 8-core: 40/h
    assert set(cpus_of_rows(often, cfg)) == {1, 8}
    rare = {(1, 0): 60 / 900, (8, 0): 1 / 7200}
    assert set(cpus_of_rows(often, cfg, rare)) == {1}  # one 8-core job per 2 h: no slot
    off = config(reserve=RES.model_copy(update={"min_use_chance": 0.0, "max_idle_leads": 0}))
    assert set(cpus_of_rows(often, off, rare)) == {1, 8}


def test_a_slot_that_would_idle_longer_than_the_waits_it_saves_is_not_kept() -> None:
    # 8-core jobs at 2.4/h pass the no-claim gate (chance 0.55 within 1200 s), but a slot
    # would idle 25 min per use to save one lead time (240 s): over 6 lead times (24 min)
    cfg = config(reserve=PRICED)
    rates = {(1, 0): 60 / 900, (8, 0): 2.4 / 3600}
    mix = snap(arrivals=[(ONE, 60), (EIGHT, 1)])
    assert set(cpus_of_rows(mix, cfg, rates)) == {1}
    unpriced = config(reserve=RES.model_copy(update={"max_idle_leads": 0}))
    assert set(cpus_of_rows(mix, unpriced, rates)) == {1, 8}
    # the same shape where a new pilot takes 15 minutes: a slot saves that much wait
    slow = config(reserve=PRICED.model_copy(update={"lead_s": 900}))
    assert set(cpus_of_rows(mix, slow, rates)) == {1, 8}


@given(rate_h=st.floats(0.1, 100), lead=st.floats(30, 3600), more=st.floats(1, 10))
def test_a_shape_kept_at_some_rate_and_lead_is_kept_at_higher_ones(
        rate_h: float, lead: float, more: float) -> None:
    """Monotone: more arrivals or a longer lead never take a shape's reserve away; and
    a shape is kept only when its slot idles at most max_idle_leads lead times per use."""
    def kept(r: float, lead_s: float) -> bool:
        cfg = config(reserve=PRICED.model_copy(update={"lead_s": lead_s}))
        s = snap(arrivals=[(ONE, 60), (EIGHT, 1)])
        return 8 in cpus_of_rows(s, cfg, {(1, 0): 60 / 900, (8, 0): r / 3600})
    here = kept(rate_h, lead)
    if here:
        assert kept(rate_h * more, lead) and kept(rate_h, lead * more)
        assert rate_h / 3600 * lead * PRICED.max_idle_leads >= 1 - 1e-9


def test_the_rate_of_a_rare_shape_counts_the_windows_that_did_not_see_it() -> None:
    cfg = config(reserve=RES)
    rates = ShapeRates()
    for i in range(8):  # one window of 15 minutes in eight held an 8-core job
        arrivals = [(ONE, 60)] + ([(EIGHT, 1)] if i == 3 else [])
        rates.observe(snap(arrivals=arrivals), 900.0, cfg, NOW + 900 * i)
    got = rates.rates(NOW + 7200)
    assert abs(got[(1, 0)] - 60 / 900) < 1e-9
    assert abs(got[(8, 0)] - 1 / 7200) < 1e-9  # one 8-core job in two hours
    assert ShapeRates().rates(NOW) == {}


def test_a_reserve_pilot_that_ended_unclaimed_is_not_replaced_for_the_same_forecast() -> None:
    """The forecast (60 8-core jobs in the window: about ten within a no-claim time)
    said the slot would surely be used; it idled out: the forecast is wrong for the
    shape, and no slot of it is held until one of its jobs arrives."""
    cfg = config(site(target_cpus=1, max_pilots=50, max_pending=50, max_submit=50),
                 reserve=WATCHED)
    ctl = Controller(cfg)
    arrivals = [(ONE, 60), (EIGHT, 60)]
    idle8 = pilot("8", PilotState.IDLE, cpus=8, memory_mb=16000, submitted=NOW - 3660)
    first = ctl.cycle(*seen(arrivals, NOW, [idle8]))
    assert first.reserve_held and not any(a.pilot == idle8 for a in first.actions
                                          if not isinstance(a, Submit))  # it holds a slot
    # the pilot ended by itself (no release was sent): same arrivals, no new 8-core pilot
    second = ctl.cycle(*seen(arrivals, NOW + 1300))
    assert not any(isinstance(a, Submit) and a.cpus == 8 for a in second.actions)
    assert any(isinstance(a, Submit) and a.cpus == 1 for a in second.actions)
    # more 8-core jobs arrived: a new forecast, and a reserve pilot for it
    third = ctl.cycle(*seen([(ONE, 60), (EIGHT, 61)], NOW + 1400))
    assert any(isinstance(a, Submit) and a.cpus == 8 for a in third.actions)


def test_a_sparse_streams_reserve_that_idled_out_as_expected_keeps_its_likely_slots(
        ) -> None:
    """Six 8-core jobs in two hours: about one within a no-claim time, so a slot idles
    out about one time in three. One that did is no evidence against the forecast: the
    slot likely to be used is held again (before, every such idle-out dropped the
    shape's reserve until its next job, which then waited for a new pilot)."""
    cfg = config(site(target_cpus=1, max_pilots=50, max_pending=50, max_submit=50),
                 reserve=WATCHED.model_copy(update={"min_use_chance": 0.5}))
    ctl = Controller(cfg)
    arrivals = [(EIGHT, 6)]
    idle8 = pilot("8", PilotState.IDLE, cpus=8, memory_mb=16000, submitted=NOW - 3660)
    first = ctl.cycle(*seen(arrivals, NOW, [idle8]))
    assert first.reserve_held
    second = ctl.cycle(*seen(arrivals, NOW + 1300))
    assert (8, 0) in ctl.noclaim.spent
    assert [a.cpus for a in second.actions if isinstance(a, Submit)] == [8]


def test_a_pilot_released_or_at_its_walltime_is_no_noclaim_shutdown() -> None:
    cfg = config(site(target_cpus=1, max_pilots=50, max_pending=50, max_submit=50),
                 reserve=WATCHED)
    ctl = Controller(cfg)
    arrivals = [(ONE, 60), (EIGHT, 6)]
    late = pilot("9", PilotState.IDLE, cpus=8, memory_mb=16000, started=NOW - 86000,
                 submitted=NOW - 86060)
    ctl.cycle(*seen(arrivals, NOW, [late]))
    second = ctl.cycle(*seen(arrivals, NOW + 400))  # gone at its walltime margin
    assert any(isinstance(a, Submit) and a.cpus == 8 for a in second.actions)


def test_a_rare_shape_shares_the_room_of_quicker_ones_but_a_shape_alone_keeps_its_own(
        ) -> None:
    # one-core jobs at 3/h (a slot idles 20 min per use, over 3 lead times of 240 s):
    # alone, as in a trickle, they keep their reserve; next to a quick one-core stream an
    # 8-core shape that slow shares that stream's room instead
    cfg = config(reserve=RES.model_copy(update={"max_idle_leads": 3.0}))
    trickle = snap(arrivals=[(ONE, 4)])
    assert set(cpus_of_rows(trickle, cfg, {(1, 0): 3 / 3600})) == {1}
    eight = snap(arrivals=[(EIGHT, 4)])
    assert set(cpus_of_rows(eight, cfg, {(8, 0): 3 / 3600})) == {8}
    mix = snap(arrivals=[(ONE, 60), (EIGHT, 1)])
    assert set(cpus_of_rows(mix, cfg, {(1, 0): 60 / 900, (8, 0): 3 / 3600})) == {1}


@given(one_h=st.floats(0.5, 400), eight_h=st.floats(0.5, 400))
def test_a_slow_shape_keeps_room_exactly_when_no_quick_shape_keeps_some(
        one_h: float, eight_h: float) -> None:
    """Two shapes, no no-claim gate: a shape under the price (``rate * lead *
    max_idle_leads < 1``) keeps its own slots only when the other is under it too."""
    cfg = config(reserve=PRICED.model_copy(update={"min_use_chance": 0.0}))
    s = snap(arrivals=[(ONE, 60), (EIGHT, 60)])
    got = set(cpus_of_rows(s, cfg, {(1, 0): one_h / 3600, (8, 0): eight_h / 3600}))
    quick = {c for c, r in ((1, one_h), (8, eight_h))
             if r / 3600 * PRICED.lead_s * PRICED.max_idle_leads >= 1}
    assert got == (quick or {1, 8})


def _min_idle(k: int, rate: float, hold: float) -> tuple[float, float]:
    """(E[min(T_k, hold)], P(T_k < hold)) for T_k ~ Gamma(k, rate), from the closed form
    E[T_k; T_k < hold] = k / rate * P(N >= k + 1) and N ~ Poisson(rate * hold)."""
    mean = rate * hold
    pmf = [math.exp(-mean)]
    for j in range(1, k + 1):
        pmf.append(pmf[-1] * mean / j)
    below_k = sum(pmf[:k])  # P(N <= k - 1)
    at_least_k1 = 1 - below_k - pmf[k]
    return k / rate * at_least_k1 + hold * below_k, 1 - below_k


@given(rate_h=st.floats(0.2, 600), hold=st.floats(60, 7200), value=st.floats(30, 7200))
def test_slots_worth_keeps_exactly_the_slots_whose_idle_is_paid_by_their_use(
        rate_h: float, hold: float, value: float) -> None:
    rate = rate_h / 3600
    n = slots_worth(rate, hold, value, 64)
    for k in range(1, min(n, 64) + 2):
        idle, used = _min_idle(k, rate, hold)
        pays = idle <= value * used * (1 + 1e-6) + 1e-9
        if k <= n:
            assert pays
        elif k == n + 1 and n < 64:
            assert not pays or abs(idle - value * used) < 1e-6 * max(1.0, idle)
    # the first slot pays exactly when the shape's mean gap is at most the value of a use
    assert (n >= 1) == (rate * value >= 1 - 1e-9) or abs(rate * value - 1) < 1e-6
    assert slots_worth(rate * 2, hold, value, 64) >= n  # more jobs, never fewer slots
    assert slots_worth(rate, hold, value * 2, 64) >= n  # a dearer wait, never fewer


def test_a_shape_kept_for_its_price_holds_only_the_slots_that_pay() -> None:
    # 1-core jobs at 60/h, 8-core ones at 8/h: the 8-core shape's first slot idles 7.5
    # minutes per use, under the price (3 lead times of 240 s: 12 minutes), but its second
    # would idle about 15 minutes per use; the square-root split would give it 4 of 16
    # slots: it holds one (and the one-core shape no more than its 11 that pay: a 12th
    # would idle 12 minutes per use at the earliest)
    cfg = config(reserve=RES.model_copy(update={"max_idle_leads": 3.0}))
    rates = {(1, 0): 60 / 3600, (8, 0): 8 / 3600}
    mix = snap(arrivals=[(ONE, 60), (EIGHT, 8)])
    rows, size = reserve_rows(mix, memory(shape_rates=rates), cfg, cfg.sites, NOW)
    got = {r.item.cpus: r.jobs for r in rows}
    assert slots_worth(8 / 3600, 1200, 3 * 240, 64) == 1
    assert got[8] == 1 and size == 16
    assert got[1] == slots_worth(60 / 3600, 1200, 3 * 240, 64) == 11
    unpriced = config(reserve=RES.model_copy(update={"max_idle_leads": 0}))
    assert cpus_of_rows(mix, unpriced, rates)[8] >= 2


def test_a_shape_alone_holds_what_the_size_gives_it() -> None:
    # 8-core jobs alone at 8/h: one slot pays the price, but no other shape's room
    # is there to share, so the shape keeps the base stock the size asks for (as a
    # trickle keeps its reserve); beside a quicker stream the same shape holds one slot
    cfg = config(reserve=RES.model_copy(update={"max_idle_leads": 3.0}))
    alone = snap(arrivals=[(EIGHT, 8)])
    rows, size = reserve_rows(alone, memory(shape_rates={(8, 0): 8 / 3600}), cfg, cfg.sites,
                              NOW)
    assert slots_worth(8 / 3600, 1200, 3 * 240, 64) == 1 < size == sum(r.jobs for r in rows)
