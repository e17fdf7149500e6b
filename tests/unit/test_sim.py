"""Simulator: deterministic for a seed; jobs and core-hours are conserved."""

from __future__ import annotations

import pytest

from bench.sim import TRACES, run_scenario
from bench.sim.results import RunResult
from bench.sim.traces import HOUR
from provisioner.config import PolicyConfig
from provisioner.decide.cadence import CycleMark, Probe, cycle_due

SHORT = 6 * HOUR


def short_run(policy: str, trace: str, seed: int = 3) -> RunResult:
    return run_scenario(policy, trace, seed=seed, duration=SHORT)


@pytest.mark.parametrize("trace", sorted(TRACES))
def test_traces_are_seeded(trace: str) -> None:
    assert TRACES[trace](5) == TRACES[trace](5)
    assert TRACES[trace](5) != TRACES[trace](6)


@pytest.mark.parametrize("policy", ["prototype", "cobald", "ours"])
def test_deterministic_for_a_seed(policy: str) -> None:
    a, b = short_run(policy, "mixed"), short_run(policy, "mixed")
    assert a == b and a.timeline == b.timeline
    assert short_run(policy, "mixed", seed=4) != a


@pytest.mark.parametrize("policy", ["prototype", "cobald", "ours"])
@pytest.mark.parametrize("trace", ["steady", "mixed"])
def test_conservation(policy: str, trace: str) -> None:
    r = short_run(policy, trace)
    submitted = len([j for j in TRACES[trace](3) if j.submit < SHORT])
    assert r.jobs == submitted
    assert r.finished + r.running + r.queued + r.unmatchable_jobs == r.jobs
    assert 0 < r.claimed_core_h <= r.allocated_core_h
    assert r.pilots_never_claimed <= r.pilots_started <= r.pilots_submitted
    if trace == "mixed":
        assert r.unmatchable_jobs > 0


def test_ours_finishes_everything_without_kills() -> None:
    r = short_run("ours", "bursty")
    assert r.queued == 0 and r.running == 0 and r.killed == 0
    assert r.finished == r.jobs - r.unmatchable_jobs
    # core-hours add up: every finished job's cores x runtime is claimed
    assert r.efficiency > 0.5


def test_cadence_rules() -> None:
    pol = PolicyConfig(interval_s=300, quick_check_s=20, min_cycle_gap_s=10)
    last = CycleMark(at=1000, idle_jobs=5, idle_pilots=frozenset({"a/1"}))
    assert cycle_due(0, Probe(0), None, pol) == "first cycle"
    assert cycle_due(1005, Probe(50), last, pol) == ""  # within the minimum gap
    assert cycle_due(1015, Probe(6), last, pol) == "idle jobs rose"
    assert cycle_due(1015, Probe(4), last, pol) == ""
    assert cycle_due(1015, Probe(4, frozenset({"a/2"})), last, pol) == "pilot became idle"
    flagged = CycleMark(at=1000, idle_jobs=5, flagged=1)
    assert cycle_due(1015, Probe(5), flagged, pol) == ""
    assert cycle_due(1020, Probe(5), flagged, pol) == "confirm flagged pilots"
    assert cycle_due(1300, Probe(0), last, pol) == "interval"


def test_a_pilot_idle_again_after_jobs_is_seen_at_the_next_check() -> None:
    """The last cycle kept idle pilot a/1 for idle jobs; they ran on it. The check that
    sees it busy makes no cycle; the next one, seeing it idle again, does; and when the
    queue empties while the last cycle left it idle (jobs shorter than a check), too."""
    pol = PolicyConfig(interval_s=300, quick_check_s=10, min_cycle_gap_s=5)
    last = CycleMark(at=1000, idle_jobs=4, idle_pilots=frozenset({"a/1"}))
    busy = Probe(0, frozenset())
    assert cycle_due(1010, Probe(1, frozenset()), last, pol) == ""
    assert cycle_due(1020, Probe(1, frozenset({"a/1"})), last, pol, busy) == "pilot became idle"
    assert cycle_due(1020, Probe(1, frozenset({"a/1"})), last, pol,
                     Probe(1, frozenset({"a/1"}))) == ""
    assert cycle_due(1020, Probe(0, frozenset({"a/1"})), last, pol,
                     Probe(1, frozenset({"a/1"}))) == "queue emptied"
    nothing_kept = CycleMark(at=1000, idle_jobs=4)
    assert cycle_due(1020, Probe(0), nothing_kept, pol, Probe(1)) == ""
    # pilots submitted for the jobs joined and took them all between two checks
    joined = CycleMark(at=1000, idle_jobs=4, joining=1)
    assert cycle_due(1020, Probe(0), joined, pol, Probe(4)) == "queue emptied"


def test_the_controller_remembers_the_last_probe() -> None:
    from provisioner.decide.controller import Controller

    from .helpers import config
    c = Controller(config())
    c.mark = CycleMark(at=1000, idle_jobs=4, idle_pilots=frozenset({"a/1"}))
    assert c.due(1200, Probe(1, frozenset())) == ""  # busy: nothing to decide
    assert c.due(1210, Probe(1, frozenset({"a/1"}))) == "pilot became idle"


def test_queue_size_is_what_the_schedd_query_counts() -> None:
    """The simulator's (total, older) are the jobs still queued, all and those submitted
    before `since`: what the service counts in its schedd query."""
    from bench.sim.scenarios import default_config, default_sites, make_policy
    from bench.sim.world import World

    sites = default_sites()
    config = default_config(sites)
    world = World(sites, config, seed=7)
    jobs = [j for j in TRACES["steady"](7) if j.submit < 3 * HOUR]
    world.run(make_policy("ours", config), jobs, duration=3 * HOUR, drain_s=0)
    since = world.now - 900.0
    queued = [j for j in world.jobs if j.end is None]
    total, older = world.queue_size(since)
    assert total == len(queued) > 0
    assert older == sum(1 for j in queued if j.spec.submit < since)


def test_black_hole_site_is_cut_off_and_probed_with_backoff() -> None:
    """Pilots at a site whose pilots never join: the circuit breaker opens after a few,
    demand moves to the other site, and the site is probed with a growing back-off."""
    import dataclasses

    from bench.sim.scenarios import default_config, default_sites, make_policy
    from bench.sim.world import World

    sites = default_sites()
    sites[0] = dataclasses.replace(sites[0], black_hole=True)  # gsi, the higher weight
    config = default_config(sites)
    world = World(sites, config, seed=7)
    policy = make_policy("ours", config)
    jobs = [j for j in TRACES["steady"](3) if j.submit < SHORT]
    r = world.run(policy, jobs, duration=SHORT)
    assert r.finished == r.jobs
    late = sorted(p.submitted_at for p in world.all_pilots
                  if p.site.name == "gsi" and p.submitted_at > HOUR)
    assert 1 <= len(late) <= 5  # probes only
    breaker = policy.controller.breakers.state("gsi")
    assert breaker.open_until is not None or breaker.probing
    assert breaker.delay_s >= 4 * config.policy.breaker.base_s  # it kept doubling


def test_a_handful_of_jobs_gets_no_reserve_pilots() -> None:
    """The testbed's small workload on production defaults (reserve on): 8 one-minute
    jobs, 4 more six minutes later, from zero pilots, at a quick site (SLURM wait ~1 s,
    boot 7 s, 4-core pilots). Two batches are not a rate: no reserve, no pilot started
    that no job uses."""
    from bench.sim.entities import SiteModel
    from bench.sim.scenarios import _site, make_policy
    from bench.sim.traces import JobSpec
    from bench.sim.world import World
    from provisioner.config import Config, PolicyConfig
    from provisioner.model import JobShape

    site = SiteModel(_site("gsi", 4, 8000, 3600, 120, (10, 4, 5), min_cpus=4),
                     nodes=2, cores_per_node=4, mem_per_node_mb=8000, wait_median_s=1,
                     wait_sigma=0.1, boot_s=7)
    config = Config(policy=PolicyConfig(), sites=(site.config,))
    jobs = [JobSpec(i, 5.0 * (i >= 8) * 72 + i * 0.1, JobShape(1, 500), 60.0)
            for i in range(12)]
    world = World([site], config, seed=1, negotiate_s=10)
    policy = make_policy("ours", config)
    r = world.run(policy, jobs, duration=400)
    assert r.finished == 12
    assert r.pilots_never_claimed == 0
    assert r.pilots_submitted <= 4  # two per batch of 8 and of 4 four-core-wide jobs
