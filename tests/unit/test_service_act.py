"""The act phase with hand-written fakes (recording calls, injecting errors):
releases are re-checked, refused releases are forgotten, a lingering pilot is
cancelled only once its startd is gone and runs nothing, one failing action
does not stop the others, and an unknown site keeps its last-known pilots."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from provisioner.config import parse_config
from provisioner.decide.controller import LINGER_S
from provisioner.errors import Transient, Unreachable
from provisioner.model import Demand, JobShape, PilotState, Plan, Release, Submit
from provisioner.pool.classads import PilotAd
from provisioner.service.journal import Journal
from provisioner.service.loop import Provisioner, describe
from provisioner.sites.base import SiteJob, SiteJobState
from tests.unit.fakes import Clock, FakeBackend, FakePool

CONFIG = """
pool: {collector: "cm:9618", provisioner_id: t, uid_domain: example}
sites:
  - name: gsi
    max_walltime_s: 7200
    template: gsi.sh.j2
    image: /images/pilot.sif
    pilot: {cpus: 4, memory_mb: 8000, walltime_s: 3600}
  - name: fra
    max_walltime_s: 7200
    template: frankfurt.sh.j2
    image: /images/pilot.sif
    pilot: {cpus: 4, min_cpus: 4, memory_mb: 8000, walltime_s: 3600}
"""


def idle_ad(job_id: str, site: str = "gsi", draining: bool = False) -> PilotAd:
    return PilotAd(site=site, job_id=job_id, name=f"pilot-{site}-{job_id}@node",
                   walltime_end=20_000.0, cpus=4, memory_mb=8000, free_cpus=4,
                   free_memory_mb=8000, claimed_slots=0, draining=draining)


def running_job(job_id: str) -> SiteJob:
    return SiteJob(job_id, SiteJobState.RUNNING, 4, 8000, 9_000.0, 9_010.0, 20_000.0)


@pytest.fixture
def world() -> tuple[Provisioner, FakePool, dict[str, FakeBackend], Clock]:
    return make_world()


def make_world() -> tuple[Provisioner, FakePool, dict[str, FakeBackend], Clock]:
    """A Provisioner over fake sites gsi and fra, a fake pool and a settable clock."""
    pool = FakePool()
    backends = {"gsi": FakeBackend("gsi"), "fra": FakeBackend("fra")}
    clock = Clock()
    prov = Provisioner(parse_config(CONFIG, "t.yaml"), pool=pool,  # type: ignore[arg-type]
                       backends=backends, journal=Journal(""), clock=clock)  # type: ignore[arg-type]
    return prov, pool, backends, clock


def release_of(prov: Provisioner, job_id: str) -> Plan:
    pilot = next(p for p in prov.observe().snapshot.pilots if p.job_id == job_id)
    return Plan(actions=(Release(pilot),))


def test_release_is_rechecked_against_fresh_reads(world) -> None:  # type: ignore[no-untyped-def]
    prov, pool, backends, _ = world
    backends["gsi"].jobs = [running_job("7")]
    pool.ads = {"gsi/7": idle_ad("7")}
    plan = release_of(prov, "7")
    # A job started on it after the snapshot: the schedd says so; no release.
    pool.running_on = frozenset({"pilot-gsi-7@node"})
    outcomes = prov.act(prov.observe(), plan)
    assert backends["gsi"].calls == [] and "skipped" in outcomes[0][1]
    pool.running_on = frozenset()
    prov.act(prov.observe(), plan)
    assert backends["gsi"].calls == [("release", "7")]


def test_refused_release_is_forgotten_and_never_becomes_a_cancel(world) -> None:  # type: ignore[no-untyped-def]
    prov, pool, backends, clock = world
    backends["gsi"].jobs = [running_job("7")]
    pool.ads = {"gsi/7": idle_ad("7")}
    prov.act(prov.observe(), release_of(prov, "7"))
    # The pilot refused (it took a job); much later its ad is briefly missing.
    clock.t += 2 * LINGER_S
    pool.running_on = frozenset({"pilot-gsi-7@node"})
    prov.act(prov.observe(), Plan(actions=()))
    assert "gsi/7" not in prov.released
    pool.ads = {}
    for _ in range(3):
        clock.t += LINGER_S
        prov.act(prov.observe(), Plan(actions=()))
    assert [c for c in backends["gsi"].calls if c[0] == "cancel"] == []


def test_lingering_released_pilot_is_cancelled_once_its_startd_is_gone(world) -> None:  # type: ignore[no-untyped-def]
    prov, pool, backends, clock = world
    backends["gsi"].jobs = [running_job("7")]
    pool.ads = {"gsi/7": idle_ad("7")}
    prov.act(prov.observe(), release_of(prov, "7"))
    pool.ads = {"gsi/7": idle_ad("7", draining=True)}
    clock.t += 5
    prov.act(prov.observe(), Plan(actions=()))
    pool.ads = {}  # the startd exited; the SLURM job lingers
    clock.t += 5
    prov.act(prov.observe(), Plan(actions=()))
    assert ("cancel", "7") not in backends["gsi"].calls  # not before LINGER_S
    clock.t += LINGER_S + 1
    prov.act(prov.observe(), Plan(actions=()))
    assert ("cancel", "7") in backends["gsi"].calls
    assert "gsi/7" not in prov.released


def test_one_failing_action_does_not_stop_the_others(world) -> None:  # type: ignore[no-untyped-def]
    prov, _, backends, _ = world
    backends["gsi"].next_error = Transient("slurmctld busy")
    plan = Plan(actions=(Submit("gsi", 1, 4, 8000, 3600), Submit("fra", 1, 4, 8000, 3600)))
    outcomes = prov.act(prov.observe(), plan)
    assert "failed" in outcomes[0][1] and "slurmctld busy" in outcomes[0][1]
    assert backends["fra"].calls == [("submit", "")]


def test_unknown_pool_means_no_actions_and_no_cleanup(world) -> None:  # type: ignore[no-untyped-def]
    prov, pool, backends, _ = world
    pool.demand = (Demand(JobShape(1, 500), 8),)
    pool.fail = True
    cycle = prov.run_cycle("test")
    assert not cycle.observation.snapshot.pool_known
    assert cycle.plan.actions == () and backends["gsi"].calls == []


def test_unknown_site_keeps_its_last_known_pending_pilots(world) -> None:  # type: ignore[no-untyped-def]
    prov, pool, backends, _ = world
    pool.demand = (Demand(JobShape(1, 500), 4),)
    backends["fra"].jobs = [SiteJob("5", SiteJobState.PENDING, 4, 8000, 9_000.0, None, None)]
    backends["gsi"].list_error = None
    first = prov.observe()
    assert [p.state for p in first.snapshot.pilots] == [PilotState.PENDING]
    backends["fra"].list_error = Unreachable("slurmctld down")
    obs = prov.observe()
    assert [(p.site, p.state) for p in obs.snapshot.pilots] == [("fra", PilotState.PENDING)]
    cycle = prov.run_cycle("test")
    # The pending pilot at the unknown site still covers the 4 jobs: nothing new anywhere.
    assert [a for a in cycle.plan.actions if isinstance(a, Submit)] == []



def test_pilot_that_never_joins_is_cancelled_but_one_running_jobs_never(world) -> None:  # type: ignore[no-untyped-def]
    prov, pool, backends, clock = world
    started = clock.t - 2000  # beyond the default start_timeout_s (900 s)
    backends["gsi"].jobs = [SiteJob("7", SiteJobState.RUNNING, 4, 8000, started - 5, started,
                                    started + 3600),
                            SiteJob("8", SiteJobState.RUNNING, 4, 8000, started - 5, started,
                                    started + 3600)]
    # Job 8's ad is missing (collector restart) but the schedd runs a job on it.
    pool.running_on = frozenset({"pilot-gsi-8@node"})
    states = {p.job_id: p.state for p in prov.observe().snapshot.pilots}
    assert states == {"7": PilotState.STARTING, "8": PilotState.BUSY}
    prov.run_cycle("test")
    assert ("cancel", "7") in backends["gsi"].calls
    # job 8 is only told to leave when its job ends (nothing else needs it)
    assert [c for c in backends["gsi"].calls if c[1] == "8"] == [("retire", "8")]


def test_young_starting_pilot_is_left_alone(world) -> None:  # type: ignore[no-untyped-def]
    prov, _, backends, clock = world
    backends["gsi"].jobs = [SiteJob("7", SiteJobState.RUNNING, 4, 8000, clock.t - 60,
                                    clock.t - 30, clock.t + 3600)]
    prov.run_cycle("test")
    assert backends["gsi"].calls == []


def test_failing_site_is_backed_off_and_its_pilots_still_count(world, caplog) -> None:  # type: ignore[no-untyped-def]
    prov, _, backends, clock = world
    backends["gsi"].jobs = [running_job("7")]
    prov.observe()
    backends["gsi"].list_error = Unreachable("ssh: connect to host gsi-login: timed out")
    views = {v.name: v for v in prov.observe().snapshot.sites}
    assert not views["gsi"].known and "failed read 1, next try in 60 s" in caplog.text
    clock.t += 30  # within the back-off: not asked, still unknown, pilot still counted
    snap = prov.observe().snapshot
    assert "backed off" in {v.name: v for v in snap.sites}["gsi"].error
    assert [p.key for p in snap.pilots if p.site == "gsi"] == ["gsi/7"]
    backends["gsi"].list_error = None
    clock.t += 30
    assert all(v.known for v in prov.observe().snapshot.sites)
    assert "site gsi readable again" in caplog.text


def test_ghost_ads_and_pilots_lost_while_busy_are_reported_once(world, caplog) -> None:  # type: ignore[no-untyped-def]
    prov, pool, backends, clock = world
    busy = PilotAd(site="gsi", job_id="7", name="pilot-gsi-7@node", walltime_end=20_000.0,
                   cpus=4, memory_mb=8000, free_cpus=3, free_memory_mb=7000, claimed_slots=1,
                   draining=False)
    backends["gsi"].jobs = [running_job("7")]
    pool.ads = {"gsi/7": busy}
    assert [p.state for p in prov.observe().snapshot.pilots] == [PilotState.BUSY]
    backends["gsi"].jobs = []  # killed: SLURM forgot it, the collector still has its ad
    pool.running_on = frozenset({"pilot-gsi-7@node"})  # the schedd waits out its lease
    snap = prov.observe().snapshot
    assert snap.pilots == ()  # a ghost is never capacity
    assert caplog.text.count("gsi/7: startd ad in the collector but no SLURM job") == 1
    assert "pilot gsi/7 left SLURM while running jobs" in caplog.text
    prov.observe()
    assert caplog.text.count("gsi/7: startd ad in the collector but no SLURM job") == 1
    # A busy pilot gone at its walltime end is reported as such.
    backends["gsi"].jobs = [running_job("8")]
    pool.ads = {"gsi/8": busy.__class__(**{**busy.__dict__, "job_id": "8",
                                           "name": "pilot-gsi-8@node"})}
    prov.observe()
    backends["gsi"].jobs, pool.ads = [], {}
    clock.t = 19_950.0
    prov.observe()
    assert "pilot gsi/8 reached its walltime with jobs running" in caplog.text


def test_a_busy_pilot_that_left_after_its_jobs_ended_is_not_reported_lost(
        world, caplog) -> None:  # type: ignore[no-untyped-def]
    """A retired pilot leaves within a second of its last job, often between two
    observations: seen busy, then gone. The schedd runs nothing there any more, so it
    is no lost node."""
    prov, pool, backends, clock = world
    busy = PilotAd(site="gsi", job_id="7", name="pilot-gsi-7@node", walltime_end=20_000.0,
                   cpus=4, memory_mb=8000, free_cpus=3, free_memory_mb=7000, claimed_slots=1,
                   draining=False)
    backends["gsi"].jobs = [running_job("7")]
    pool.ads, pool.running_on = {"gsi/7": busy}, frozenset({"pilot-gsi-7@node"})
    assert [p.state for p in prov.observe().snapshot.pilots] == [PilotState.BUSY]
    backends["gsi"].jobs, pool.ads, pool.running_on = [], {}, frozenset()
    clock.t += 12
    prov.observe()
    clock.t += 12
    prov.observe()
    assert "gsi/7" not in caplog.text


def test_a_busy_pilot_whose_startd_ends_before_its_batch_job_is_ending_then_reported(
        world, caplog) -> None:  # type: ignore[no-untyped-def]
    """At its walltime a pilot's startd stops first; its batch job may linger until
    SLURM's limit. Meanwhile it is ENDING (no capacity to come, not in the caps), and
    its end is still the walltime end of a busy pilot."""
    prov, pool, backends, clock = world
    margin = prov._margin("gsi")
    busy = PilotAd(site="gsi", job_id="7", name="pilot-gsi-7@node", walltime_end=20_000.0,
                   cpus=4, memory_mb=8000, free_cpus=3, free_memory_mb=7000, claimed_slots=1,
                   draining=False)
    backends["gsi"].jobs = [running_job("7")]
    pool.ads = {"gsi/7": busy}
    clock.t = 20_000.0 - margin - 30
    assert [p.state for p in prov.observe().snapshot.pilots] == [PilotState.BUSY]
    pool.ads = {}  # the startd has stopped; SLURM still runs the batch job
    clock.t = 20_000.0 - margin + 1
    assert [p.state for p in prov.observe().snapshot.pilots] == [PilotState.ENDING]
    clock.t = 20_000.0 - 10
    assert [p.state for p in prov.observe().snapshot.pilots] == [PilotState.ENDING]
    assert "gsi/7" not in caplog.text
    backends["gsi"].jobs = []
    clock.t = 20_001.0
    prov.observe()
    assert caplog.text.count("pilot gsi/7 reached its walltime with jobs running") == 1
    # Before its stop time the same pilot without an ad is still starting.
    backends["gsi"].jobs = [running_job("8")]
    clock.t = 20_000.0 - margin - 1
    assert [p.state for p in prov.observe().snapshot.pilots] == [PilotState.STARTING]


def test_a_ghost_ad_does_not_make_every_quick_check_a_cycle(world) -> None:  # type: ignore[no-untyped-def]
    prov, pool, _, clock = world
    pool.ads = {"gsi/7": idle_ad("7")}  # in the collector, gone from SLURM
    assert prov.tick() is not None  # the first cycle
    for _ in range(5):
        clock.t += 30
        assert prov.tick() is None


def _two_cycle_release(prov) -> None:  # type: ignore[no-untyped-def]
    """Flagged first, released at the next quick check (`idle_release_cycles: 2`)."""
    policy = prov.config.policy.model_copy(update={"idle_release_cycles": 2})
    prov.config = prov.config.model_copy(update={"policy": policy})
    prov.controller.config = prov.config


def test_flag_then_release_takes_one_quick_check_not_two(world) -> None:  # type: ignore[no-untyped-def]
    prov, pool, backends, clock = world
    _two_cycle_release(prov)
    q = prov.config.policy.quick_check_s
    backends["gsi"].jobs = [running_job("7")]
    pool.ads = {"gsi/7": idle_ad("7")}
    real = clock.__class__.__call__

    def slow_clock(self):  # type: ignore[no-untyped-def]
        self.t += 0.004  # every read of the clock during a cycle takes a little time
        return real(self)

    clock.__class__.__call__ = slow_clock  # type: ignore[method-assign]
    try:
        clock.t = 10_000.0  # the scheduler's tick
        first = prov.tick()
        assert first is not None and "flag gsi/7" in [describe(a) for a in first.plan.actions]
        clock.t = 10_000.0 + q  # its next tick, one quick check later
        second = prov.tick()
        assert second is not None and second.reason == "confirm flagged pilots"
        assert "release gsi/7" in [describe(a) for a in second.plan.actions]
    finally:
        clock.__class__.__call__ = real  # type: ignore[method-assign]


def test_flag_then_release_takes_one_quick_check_when_the_gap_equals_it(world) -> None:  # type: ignore[no-untyped-def]
    """The testbed's cadence: quick_check_s == min_cycle_gap_s. The scheduler fires every
    3 s; the first check reads the clock 5 ms late, the next one on time: that check comes
    5 ms short of 3 s after the flag and still releases."""
    prov, pool, backends, clock = world
    policy = prov.config.policy.model_copy(
        update={"interval_s": 10.0, "quick_check_s": 3.0, "min_cycle_gap_s": 3.0,
                "idle_release_cycles": 2})
    prov.config = prov.config.model_copy(update={"policy": policy})
    prov.controller.config = prov.config
    backends["gsi"].jobs = [running_job("7")]
    pool.ads = {"gsi/7": idle_ad("7")}
    clock.t = 10_000.005  # fired at 10 000 s, the clock read 5 ms later
    first = prov.tick()
    assert first is not None and "flag gsi/7" in [describe(a) for a in first.plan.actions]
    clock.t = 10_003.0  # the next firing, read at once
    second = prov.tick()
    assert second is not None and second.reason == "confirm flagged pilots"
    assert "release gsi/7" in [describe(a) for a in second.plan.actions]


def test_learnt_state_and_breakers_are_journalled_and_reloaded(world) -> None:  # type: ignore[no-untyped-def]
    from provisioner.service.loop import breakers_of

    prov, _pool, backends, clock = world
    journal = prov.journal
    for i in range(3):  # three pilots at gsi start and vanish without joining
        backends["gsi"].jobs = [SiteJob(str(i), SiteJobState.RUNNING, 4, 8000,
                                        clock.t - 100, clock.t - 40, clock.t + 3000)]
        prov.run_cycle("test")
        clock.t += 30
        backends["gsi"].jobs = []
        prov.run_cycle("test")
        clock.t += 30
    assert breakers_of(journal)["gsi"].startswith("open (3 pilots in a row never joined")
    assert journal.get("controller")["estimates"]["gsi"]["samples"] == 3
    again = Provisioner(prov.config, pool=prov.pool, backends=backends, journal=journal,
                        clock=clock)
    assert again.controller.state() == prov.controller.state()


def test_sites_are_read_while_the_pool_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each site's squeue runs beside the pool's reads: every site's read waits here
    until the pool has been read and the other site has started, which read one after
    the other would never happen (the wait would run out and the test fail)."""
    prov, pool, backends, _ = make_world()
    started = {name: threading.Event() for name in backends}
    pool_read = threading.Event()
    seen: list[str] = []

    def concurrent(name: str, original: Any) -> Any:
        def list_pilots() -> list[SiteJob]:
            started[name].set()
            others = [e for n, e in started.items() if n != name]
            assert all(e.wait(10) for e in others) and pool_read.wait(10), name
            seen.append(name)
            return list(original())
        return list_pilots

    for name, backend in backends.items():
        monkeypatch.setattr(backend, "list_pilots", concurrent(name, backend.list_pilots))
    original_queue = pool.queue

    def queue(since: float | None = None) -> Any:
        assert all(e.wait(10) for e in started.values())  # both sites already asked
        pool_read.set()
        return original_queue(since)

    monkeypatch.setattr(pool, "queue", queue)
    obs = prov.observe()
    assert sorted(seen) == ["fra", "gsi"] and all(v.known for v in obs.snapshot.sites)


def test_a_site_whose_read_fails_is_unknown_and_the_others_are_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    prov, _pool, backends, _ = make_world()
    backends["gsi"].jobs = [running_job("7")]

    def fails() -> list[SiteJob]:
        raise Unreachable("site fra: ssh to fra-login failed: timeout")

    monkeypatch.setattr(backends["fra"], "list_pilots", fails)
    views = {v.name: v for v in prov.observe().snapshot.sites}
    assert views["gsi"].known and not views["fra"].known
    assert "ssh to fra-login failed" in views["fra"].error


def test_a_cycle_is_logged_once_the_journal_holds_it(world) -> None:  # type: ignore[no-untyped-def]
    """`provisioner status` reads the journal: a cycle's lines (its transitions, its
    summary) are written only after its commit, so the status agrees with the log from
    the moment a line is there."""
    import logging

    prov, pool, _, _ = world
    pool.demand = (Demand(JobShape(cpus=1, memory_mb=500), 3),)
    seen: list[tuple[str, object]] = []

    class Check(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("cycle "):
                seen.append((record.getMessage(), prov.journal.get("last_cycle")))

    handler = Check()
    logger = logging.getLogger("provisioner.service.loop")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        prov.run_cycle("test")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    [(line, last)] = seen
    assert isinstance(last, dict) and last["summary"] and last["summary"] in line, (line, last)
