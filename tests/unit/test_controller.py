"""The controller is the one cycle both the service and the simulator run: replaying what
the simulator observed through the service (with fakes of the pool and the sites) gives
the same cycles at the same times with the same actions."""

from __future__ import annotations

from bench.sim.policies import PlanPolicy
from bench.sim.scenarios import default_config, default_sites
from bench.sim.traces import HOUR, TRACES
from bench.sim.world import World
from provisioner.config import PolicyConfig
from provisioner.decide.cadence import CycleMark, Probe
from provisioner.decide.controller import Controller
from provisioner.model import Action, CycleMemory, PilotState, Snapshot
from provisioner.pool.classads import PilotAd
from provisioner.service.journal import Journal
from provisioner.service.loop import Provisioner, describe
from provisioner.sites.base import SiteJob, SiteJobState
from tests.unit.fakes import Clock, FakeBackend, FakePool


class Recording(PlanPolicy):
    """The simulator's policy, remembering what it saw and decided at every tick."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.steps: list[tuple[float, Snapshot, tuple[int, int] | None, list[Action],
                               list[str]]] = []

    def tick(self, world: World, now: float) -> list[Action]:
        since = self.controller.arrivals_since(now)
        seen = world.snapshot(arrivals_since=since)
        queue = world.queue_size(since) if since is not None else None
        first = len(world.all_pilots) + 1
        actions = super().tick(world, now)  # sends this tick's submissions itself
        # the job ids the world gave them (one sequence over sites)
        self.steps.append((now, seen, queue, list(self.planned),
                           [str(i) for i in range(first, len(world.all_pilots) + 1)]))
        return actions


def show(pool: FakePool, backends: dict[str, FakeBackend], snap: Snapshot) -> None:
    """Make the fakes show what the simulator showed its policy."""
    pool.demand, pool.arrivals = snap.demand, snap.recent_arrivals
    pool.newest = snap.last_arrival_at
    pool.ads = {}
    for b in backends.values():
        b.jobs = []
    for p in snap.pilots:
        state = SiteJobState.PENDING if p.state is PilotState.PENDING else SiteJobState.RUNNING
        backends[p.site].jobs.append(SiteJob(p.job_id, state, p.cpus, p.memory_mb,
                                             p.submitted_at, p.started_at, p.walltime_end))
        if p.state in (PilotState.IDLE, PilotState.BUSY, PilotState.DRAINING):
            pool.ads[p.key] = PilotAd(
                p.site, p.job_id, f"pilot-{p.site}-{p.job_id}@node", p.walltime_end, p.cpus,
                p.memory_mb, p.free_cpus, p.free_memory_mb,
                claimed_slots=int(p.state is PilotState.BUSY),
                draining=p.state is PilotState.DRAINING)


def test_service_and_simulator_run_the_same_cycles() -> None:
    sites = default_sites()
    config = default_config(sites)
    policy = Recording(config)
    trace = [j for j in TRACES["bursty"](2) if j.submit < 2 * HOUR]
    World(sites, config, seed=5).run(policy, trace, duration=2 * HOUR, drain_s=HOUR)
    assert sum(1 for *_x, acts, _ids in policy.steps if acts) > 10  # the run decided things

    pool, clock = FakePool(), Clock()
    backends = {s.name: FakeBackend(s.name) for s in sites}
    prov = Provisioner(config, pool=pool, backends=backends,  # type: ignore[arg-type]
                       journal=Journal(""), clock=clock)
    for now, snap, queue, actions, ids in policy.steps:
        show(pool, backends, snap)
        for b in backends.values():
            b.next_ids = ids  # the sites give the ids the simulator gave
        pool.total, pool.older = queue or (0, 0)
        clock.t = now
        cycle = prov.tick()
        got = [describe(a) for a in cycle.plan.actions] if cycle else []
        assert got == [describe(a) for a in actions], f"at t={now}"


def test_flag_is_confirmed_by_the_next_quick_check_even_if_it_comes_early() -> None:
    """The cycle's time is when it began; a timer firing a few ms short of the period
    still confirms the flags (the release takes one quick check, not two)."""
    policy = PolicyConfig(interval_s=300, quick_check_s=20, min_cycle_gap_s=10)
    ctl = Controller(default_config(default_sites()).model_copy(update={"policy": policy}))
    ctl.mark = CycleMark(at=1000.0, idle_jobs=0, flagged=1)
    assert ctl.due(1019.99, Probe(0)) == "confirm flagged pilots"
    assert ctl.due(1015.0, Probe(0)) == ""


def test_flag_is_confirmed_early_also_when_the_cycle_gap_equals_the_quick_check() -> None:
    """The testbed's cadence (min_cycle_gap_s == quick_check_s): the minimum gap between
    cycles counts within the same slack as the quick check, or the check that comes a few
    ms early is refused and the release waits a second quick check."""
    policy = PolicyConfig(interval_s=10, quick_check_s=3, min_cycle_gap_s=3)
    ctl = Controller(default_config(default_sites()).model_copy(update={"policy": policy}))
    ctl.mark = CycleMark(at=1000.0, idle_jobs=0, flagged=1)
    assert ctl.due(1002.995, Probe(0)) == "confirm flagged pilots"
    assert ctl.due(1002.5, Probe(0)) == ""


def test_reserve_is_held_one_lead_time_and_sparse_arrivals_widen_the_window() -> None:
    from dataclasses import replace

    from provisioner.model import Plan

    ctl = Controller(default_config(default_sites()))
    r = ctl.config.policy.reserve
    assert ctl.window(1000.0) == r.evidence_s  # nothing seen yet: the widest window
    for i in range(40):  # one arrival every 30 s
        ctl.arrivals.count(1000.0 + 30 * i, 1000.0 + 30 * i)
    ctl.arrivals.count(2175.0, 2175.0)  # within a quick check of the last: the same batch
    assert len(ctl.arrivals) == 40
    assert ctl.window(2200.0) == r.window_s
    for i in range(6):  # then one every 10 minutes
        ctl.arrivals.count(10000.0 + 600 * i, 10000.0 + 600 * i)
    # the evidence now holds 6 arrivals over 3000 s: the window spans 8 of their gaps
    assert ctl.window(13000.0) == r.window_gaps * 3000 / 6 > r.window_s
    snap, memory = Snapshot(demand=(), pilots=(), sites=()), CycleMemory()
    ctl.remember(snap, memory, Plan((), reserve_jobs=9, reserve_sized=9, reserve_lead_s=200),
                 5000.0)
    ctl.remember(snap, memory, Plan((), reserve_jobs=9, reserve_sized=2, reserve_lead_s=200),
                 5100.0)
    assert ctl.prepare(snap, 5150.0, commit=False)[1].reserve_hold == 9
    ctl.remember(snap, memory, Plan((), reserve_jobs=9, reserve_sized=2, reserve_lead_s=200),
                 5250.0)
    assert ctl.prepare(replace(snap), 5260.0, commit=False)[1].reserve_hold == 2
