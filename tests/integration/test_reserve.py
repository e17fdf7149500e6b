"""The reserve's inputs from the real schedd: arrivals by QDate and departures from the
queue size one window back (provisioner.decide.arrivals), through `Provisioner.observe()` and
the controller that carries the queue history (`Controller.prepare`).

The service's clock is injected so that one window passes at once; QDate and the
queue are real. Nothing is acted on: no pilot is submitted.
"""

from __future__ import annotations

import time

import pytest
from conftest import run, service_config
from test_loop import clean, jobs_left, submit  # noqa: F401 (clean: fixture)

from provisioner.decide.plan import plan, reserve_size
from provisioner.decide.reserve import reserve_lead
from provisioner.service.loop import Provisioner

WINDOW = 600.0


@pytest.mark.usefixtures("clean")
def test_departures_follow_the_real_queue() -> None:
    base = service_config()
    # One fixed window (window_gaps small: a sparse stream does not widen it); one batch
    # is a rate here (min_arrival_times 1); the jump of the injected clock is no quiet
    # spell (quiet_gaps large: no decay). No journal, but the controller learns a site's
    # lead from the pilots its first observation sees (queue wait, boot): with pilots up
    # in the testbed the reserve is sized for that lead, not lead_s (4 slots, not 7;
    # tests/unit/test_reserve.py reproduces it with plain data). The
    # gates on the chance that a reserve slot is used (min_use_chance 0: always) and on
    # its idle time per use (max_idle_leads 0: none) are not what is tested here: their
    # long-run rate weighs the injected jump of the clock as a quiet hour
    # (tests/unit/test_reserve*.py cover the gates).
    reserve = base.policy.reserve.model_copy(
        update={"enabled": True, "window_s": WINDOW, "factor": 2.0, "window_gaps": 0.5,
                "min_arrival_times": 1, "quiet_gaps": 1e6, "min_use_chance": 0.0,
                "max_idle_leads": 0})
    config = base.model_copy(
        update={"policy": base.policy.model_copy(update={"reserve": reserve}), "journal": ""})
    first_cluster = submit("early", 3, 600)
    time.sleep(1.1)  # QDate has one-second resolution: keep it clear of t0
    now = [time.time()]  # t0
    prov = Provisioner(config, clock=lambda: now[0])
    obs = prov.observe(since=prov.controller.arrivals_since(now[0]))
    first, memory = prov.controller.prepare(obs.snapshot, now[0], obs.queue)
    assert memory.recent_departures is None  # not yet watched for one window
    assert sum(d.idle for d in first.recent_arrivals) == 3

    run(["condor_rm", f"{first_cluster}.0"])
    assert jobs_left(first_cluster) == 2
    time.sleep(1.1)
    late_cluster = submit("late", 10, 600)
    now[0] += WINDOW + 1  # one window later, as the service sees it
    obs = prov.observe(since=prov.controller.arrivals_since(now[0]))
    snap, memory = prov.controller.prepare(obs.snapshot, now[0], obs.queue)
    # since = t0: the ten late jobs arrived, one of the three early ones left
    assert sum(d.idle for d in snap.recent_arrivals) == 10
    assert memory.recent_departures == 1
    assert abs(memory.arrival_window_s - (WINDOW + 1)) < 1e-6
    lead = reserve_lead(memory, config)  # learnt from the pilots up, else lead_s
    expected = reserve_size(10, memory.arrival_window_s, config, 1, lead_s=lead)
    # the departure grows it (at lead_s; at a short learnt lead the growth may round away)
    assert reserve_size(10, memory.arrival_window_s, config, 1) > reserve_size(
        10, memory.arrival_window_s, config, None)
    result = plan(snap, memory, config, now[0])
    assert result.reserve_jobs == expected
    run(["condor_rm", first_cluster, late_cluster])
