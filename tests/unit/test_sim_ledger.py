"""The simulator's pilot records and job runs give, through the accounting, the very
core-hours the simulator counted itself."""

from __future__ import annotations

import math

from bench.sim import TRACES, default_config, hetero_sites
from bench.sim.ledger import job_runs, pilot_records
from bench.sim.policies import PlanPolicy
from bench.sim.traces import HOUR
from bench.sim.world import World
from provisioner.service.accounting import site_days, totals


def test_report_of_a_simulated_run_matches_the_simulator() -> None:
    sites = hetero_sites()
    config = default_config(sites)
    world = World(sites, config, seed=7)
    jobs = [j for j in TRACES["mixed"](7) if j.submit < 6 * HOUR]
    world.run(PlanPolicy(config), jobs, duration=6 * HOUR)
    pilots, runs = pilot_records(world), job_runs(world, seed=7)
    rows = site_days(pilots, runs, now=world.now + 1e9)
    tot = totals(rows).values()
    assert math.isclose(sum(t.allocated for t in tot), world.allocated_core_s / 3600,
                        rel_tol=1e-9)
    assert math.isclose(sum(t.claimed for t in tot), world.claimed_core_s / 3600, rel_tol=1e-9)
    assert all(0 < (t.e2 or 0) <= 1 for t in tot)
