"""Pilots joining: while pilots are on their way into the pool and jobs wait, the service
reads the pilots' ads every `join_check_s` and asks the schedd for a negotiation when one
joins idle, instead of leaving the jobs to the negotiator's next cycle. The controller
decides; the service and the simulator follow it."""

from __future__ import annotations

import itertools

import pytest

from bench.sim.scenarios import default_config, default_sites
from bench.sim.world import World
from provisioner.config import ConfigError, PolicyConfig, parse_config
from provisioner.decide.cadence import Probe
from provisioner.decide.controller import MAX_REASKS, REASK_S, Controller
from provisioner.model import Demand, JobShape, PilotState
from provisioner.service.ticker import tick
from tests.unit.test_service_act import idle_ad, make_world, running_job

from .helpers import NOW, config, pilot, snap

ONE = JobShape(1, 2000)


def joined_controller(join_check_s: float = 2) -> Controller:
    cfg = config()
    cfg = cfg.model_copy(update={"policy": cfg.policy.model_copy(
        update={"join_check_s": join_check_s})})
    return Controller(cfg)


def c_probe(idle_jobs: int, idle_pilots: frozenset[str] = frozenset()) -> Probe:
    return Probe(idle_jobs, idle_pilots)


def test_the_quick_check_comes_first_then_join_checks_only_while_pilots_join() -> None:
    c = joined_controller()
    assert c.look(NOW) == "probe"
    c.due(NOW, c_probe(3))
    assert c.look(NOW + 2) == ""  # no cycle yet: nothing is known to be joining
    c.cycle(snap([(ONE, 3)]), NOW)  # submits a pilot for the waiting jobs
    assert c.mark is not None and c.mark.joining == 1
    assert c.watching() and c.check_period() == 2
    assert c.look(NOW + 2) == "join"
    assert c.look(NOW + 9.5) == "probe"  # within the timer's slack of a quick check
    # the pilot is in the pool and busy, no job waits: back to the quick check alone
    busy = pilot("1", PilotState.BUSY)
    c.due(NOW + 10, c_probe(0))
    c.cycle(snap([], [busy]), NOW + 10)
    assert not c.watching() and c.check_period() == 10 and c.look(NOW + 12) == ""


def test_a_negotiation_is_asked_for_once_per_pilot_that_joins_while_jobs_wait() -> None:
    c = joined_controller()
    c.due(NOW, c_probe(3))
    assert not c.reschedule_due(frozenset(), None, NOW)
    assert c.reschedule_due(frozenset({"gsi/1"}), None, NOW)  # the last count: 3 idle jobs
    assert not c.reschedule_due(frozenset({"gsi/1"}), 3, NOW)  # the same pilot: once
    assert c.reschedule_due(frozenset({"gsi/1", "gsi/2"}), 3, NOW)
    assert not c.reschedule_due(frozenset({"gsi/3"}), 0, NOW)  # nothing waits
    assert not joined_controller(0).reschedule_due(frozenset({"gsi/1"}), 3, NOW)  # off


def test_pilots_still_idle_beside_waiting_jobs_are_asked_for_again_a_few_times() -> None:
    """A match lost on its way to the pilot (a claim sent over a session a restarted
    collector no longer knows) leaves the pilot idle and the jobs waiting: asked for
    again every REASK_S, at most MAX_REASKS times, until a new pilot joins."""
    c = joined_controller()
    c.due(NOW, c_probe(3))
    idle = frozenset({"gsi/1"})
    assert c.reschedule_due(idle, 3, NOW)
    assert not c.reschedule_due(idle, 3, NOW + REASK_S - 1)  # too soon
    asked = [t for t in range(1, 400) if c.reschedule_due(idle, 3, NOW + t)]
    assert len(asked) == MAX_REASKS and asked[0] == REASK_S, asked
    assert all(b - a >= REASK_S for a, b in itertools.pairwise(asked)), asked
    assert not c.reschedule_due(idle, 0, NOW + 500)  # nothing waits
    # a new pilot: asked at once, and the re-asks start again
    both = idle | {"gsi/2"}
    assert c.reschedule_due(both, 3, NOW + 600)
    assert c.reschedule_due(both, 3, NOW + 600 + REASK_S)


class _Senses:
    """What the tick sequence reads: the probes given, in order; negotiations counted."""

    def __init__(self, *probes: Probe) -> None:
        self.probes, self.asked = list(probes), 0

    def probe(self) -> Probe:
        return self.probes.pop(0)

    def idle_pilots(self) -> frozenset[str]:
        return self.probes[0].idle_pilots

    def reschedule(self) -> None:
        self.asked += 1

    def observe(self, now: float, since: float | None) -> object:
        raise AssertionError("no full cycle is read here")


def _joining() -> Controller:
    """A controller whose last cycle (at NOW) submitted a pilot for 3 waiting jobs."""
    c = joined_controller()
    c.due(NOW, c_probe(3))
    c.cycle(snap([(ONE, 3)]), NOW)
    assert c.mark is not None and c.mark.joining == 1
    return c


def test_a_pilot_joining_beside_waiting_jobs_brings_a_negotiation_not_a_cycle() -> None:
    """A cycle while the schedd claims the new pilot would read its jobs still idle
    beside it already busy, and submit one more pilot for them: the quick check that
    asks for the negotiation runs none; the next one does if the pilot stayed idle."""
    quick = config().policy.quick_check_s
    joined = frozenset({"gsi/1"})
    c, senses = _joining(), _Senses(c_probe(3, joined), c_probe(3, joined))
    done = tick(c, senses, NOW + quick)
    assert (done.look, done.reason, senses.asked) == ("probe", "", 1)
    # still idle a quick check later (its jobs did not match it): now the cycle
    done = tick(c, senses, NOW + 2 * quick)
    assert (done.reason, senses.asked) == ("pilot became idle", 1)


def test_a_pilot_that_took_the_waiting_jobs_brings_no_cycle_after_the_negotiation(
        ) -> None:
    quick = config().policy.quick_check_s
    c = _joining()
    senses = _Senses(c_probe(3, frozenset({"gsi/1"})), c_probe(0))
    assert tick(c, senses, NOW + quick).reason == ""
    assert tick(c, senses, NOW + 2 * quick).reason in ("", "queue emptied")
    assert senses.asked == 1


def test_a_pilot_asked_for_at_a_join_check_is_left_to_its_negotiation_until_the_next(
        ) -> None:
    """The join check asks for the negotiation; a quick check right after reads the
    pilot still idle (the claim under way) and waits one more quick check."""
    quick = config().policy.quick_check_s
    joined = frozenset({"gsi/1"})
    c = _joining()
    assert c.reschedule_due(joined, None, NOW + quick - 1)  # the join check asks
    assert c.due(NOW + quick, c_probe(3, joined)) == ""
    assert c.due(NOW + 2 * quick, c_probe(3, joined)) == "pilot became idle"


def test_a_pilot_idle_with_nothing_waiting_brings_its_cycle_at_once() -> None:
    """Nothing waits: no negotiation is asked for, and the cycle that releases idle
    pilots is not held back."""
    quick = config().policy.quick_check_s
    c = _joining()
    c.reschedule_due(frozenset({"gsi/1"}), 3, NOW + 1)  # asked for, then the jobs left
    senses = _Senses(c_probe(0, frozenset({"gsi/1"})))
    assert tick(c, senses, NOW + quick).reason in ("pilot became idle", "queue emptied")


def test_join_check_cannot_be_slower_than_the_quick_check() -> None:
    with pytest.raises(ValueError, match="join_check_s 20"):
        PolicyConfig(join_check_s=20)
    with pytest.raises(ConfigError, match="join_check_s"):
        parse_config("pool: {collector: cm}\npolicy: {join_check_s: 20}\nsites: []\n", "t.yaml")


def test_the_service_reads_only_ads_between_quick_checks_and_asks_for_a_negotiation(
        ) -> None:
    prov, pool, backends, clock = make_world()
    pool.demand = (Demand(ONE, 3),)
    cycle = prov.tick()  # the first quick check: a cycle that submits pilots
    assert cycle is not None and cycle.plan.submits
    assert prov.controller.look(clock.t + 2) == "join"
    backends["gsi"].jobs = [running_job("101")]
    calls: list[str] = []
    pool_idle_count = pool.idle_count

    def counted() -> int:
        calls.append("idle_count")
        return pool_idle_count()

    pool.idle_count = counted  # type: ignore[method-assign]
    clock.t += 2
    assert prov.tick() is None and pool.reschedules == 0 and calls == []
    pool.ads = {"gsi/101": idle_ad("101")}  # the pilot joined
    clock.t += 2
    assert prov.tick() is None
    assert pool.reschedules == 1 and calls == []  # ads only, no schedd count
    clock.t += 2
    prov.tick()
    assert pool.reschedules == 1  # once per pilot


def test_the_simulated_negotiator_runs_when_asked_but_not_before_its_minimum_interval(
        ) -> None:
    sites = default_sites()
    world = World(sites, default_config(sites), seed=1, negotiate_s=30, negotiate_min_s=5)
    runs: list[float] = []
    world.negotiate = lambda: runs.append(world.now)  # type: ignore[method-assign]
    world._negotiated_at = 100.0
    world.now = 102.0
    world.reschedule()
    world.reschedule()  # one request pending at a time
    assert len(world._events) == 1
    t, _seq, kind, _ = world._events[0]
    assert (t, kind) == (105.0, "rescheduled")


