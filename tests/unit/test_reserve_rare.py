"""The reserve pays for itself on every shape: a shape whose next job is unlikely to
arrive within the pilot's no-claim time gets no reserve slot (its rate over the evidence
span, not one window's count), and a reserve pilot that ended by its no-claim shutdown is
not replaced by an identical one until its shape's jobs arrive again."""

from __future__ import annotations

import dataclasses

from provisioner.config import ReserveConfig
from provisioner.controller import Controller, QueueSize
from provisioner.model import JobShape, PilotState, Submit
from provisioner.reserve import ShapeRates, reserve_rows

from .helpers import NOW, config, pilot, site, snap

ONE = JobShape(1, 2000)
EIGHT = JobShape(8, 16000)
RES = ReserveConfig(window_s=900, lead_s=240, factor=2.5, max_jobs=64)


def seen(arrivals, now, pilots=()):  # type: ignore[no-untyped-def]
    """A cycle's inputs: the arrivals, the newest a few seconds old, and the queue size."""
    return (dataclasses.replace(snap(arrivals=arrivals, pilots=list(pilots)),
                                last_arrival_at=now - 5), now, QueueSize(200, 100))


WATCHED = RES.model_copy(update={"min_use_chance": 0.0, "min_arrival_times": 1})


def cpus_of_rows(s, cfg) -> dict[int, int]:  # type: ignore[no-untyped-def]
    rows, _size = reserve_rows(s, cfg, cfg.sites, NOW)
    return {r.item.cpus: r.jobs for r in rows}


def test_a_shape_unlikely_to_claim_a_slot_within_the_noclaim_time_gets_none() -> None:
    cfg = config(reserve=RES)  # noclaim 1200 s; chance 0.5 needs 0.69 jobs per 1200 s
    often = snap(arrivals=[(ONE, 60), (EIGHT, 10)])  # 8-core: 40/h
    assert set(cpus_of_rows(often, cfg)) == {1, 8}
    rare = dataclasses.replace(often, shape_rates={(1, 0): 60 / 900, (8, 0): 1 / 7200})
    assert set(cpus_of_rows(rare, cfg)) == {1}  # one 8-core job per 2 h: no slot
    off = config(reserve=RES.model_copy(update={"min_use_chance": 0.0}))
    assert set(cpus_of_rows(rare, off)) == {1, 8}


def test_the_rate_of_a_rare_shape_counts_the_windows_that_did_not_see_it() -> None:
    cfg = config(reserve=RES)
    rates = ShapeRates()
    for i in range(8):  # one window of 15 minutes in eight held an 8-core job
        arrivals = [(ONE, 60)] + ([(EIGHT, 1)] if i == 3 else [])
        rates.observe(snap(arrivals=arrivals), cfg, NOW + 900 * i)
    got = rates.rates(NOW + 7200)
    assert abs(got[(1, 0)] - 60 / 900) < 1e-9
    assert abs(got[(8, 0)] - 1 / 7200) < 1e-9  # one 8-core job in two hours
    assert ShapeRates().rates(NOW) == {}


def test_a_reserve_pilot_that_ended_unclaimed_is_not_replaced_for_the_same_forecast() -> None:
    cfg = config(site(target_cpus=1, max_pilots=50, max_pending=50, max_submit=50),
                 reserve=WATCHED)
    ctl = Controller(cfg)
    arrivals = [(ONE, 60), (EIGHT, 6)]
    idle8 = pilot("8", PilotState.IDLE, cpus=8, memory_mb=16000, submitted=NOW - 3660)
    first = ctl.cycle(*seen(arrivals, NOW, [idle8]))
    assert first.reserve_held and not any(a.pilot == idle8 for a in first.actions
                                          if not isinstance(a, Submit))  # it holds a slot
    # the pilot ended by itself (no release was sent): same arrivals, no new 8-core pilot
    second = ctl.cycle(*seen(arrivals, NOW + 1300))
    assert not any(isinstance(a, Submit) and a.cpus == 8 for a in second.actions)
    assert any(isinstance(a, Submit) and a.cpus == 1 for a in second.actions)
    # more 8-core jobs arrived: a new forecast, and a reserve pilot for it
    third = ctl.cycle(*seen([(ONE, 60), (EIGHT, 7)], NOW + 1400))
    assert any(isinstance(a, Submit) and a.cpus == 8 for a in third.actions)


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
