"""Demand from every schedd (`provisioner.pool.schedds`, `Pool`): the roster (the collector's
schedds, remembered once seen, or the configured ones), one query each merged into one
view, and a schedd that cannot be read is unknown, not empty: readable demand is
provisioned for, nothing is scaled down. Plain data and a hand-written fake of the
bindings (collector and schedds that record calls and fail on demand)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

from provisioner.config import PoolConfig, parse_config
from provisioner.decide.plan import plan
from provisioner.model import (
    Cancel,
    Demand,
    FailingStarts,
    Flag,
    JobShape,
    PilotState,
    Release,
    Retire,
    Submit,
)
from provisioner.pool.condor import Pool, PoolUnreachable
from provisioner.pool.schedds import QueueView, merge_views, negotiation_targets, roster
from provisioner.service.accounting import JobRun
from provisioner.service.cycle_text import summary_line
from provisioner.service.journal import Journal
from provisioner.service.loop import Provisioner

from .fakes import Clock, FakeBackend, FakePool, matches
from .helpers import NOW, config, memory, pilot, snap
from .test_boundaries import Ad
from .test_service_act import idle_ad, make_world, release_of, running_job

ONE = JobShape(1, 500)
FOUR = JobShape(4, 2000)


# -- the roster ---------------------------------------------------------------------
def test_every_listed_schedd_is_read_and_remembered() -> None:
    r = roster(["b", "a"], (), {}, 100.0, 600.0)
    assert r.read == ("a", "b") and r.unknown == () and r.seen == {"a": 100.0, "b": 100.0}


def test_a_schedd_that_left_the_collector_is_unknown_until_the_hold_ends() -> None:
    seen = roster(["a", "b"], (), {}, 100.0, 600.0).seen
    gone = roster(["a"], (), seen, 200.0, 600.0)
    assert gone.read == ("a",) and [n for n, _ in gone.unknown] == ["b"]
    assert "100 s" in gone.unknown[0][1]
    later = roster(["a"], (), gone.seen, 699.0, 600.0)
    assert [n for n, _ in later.unknown] == ["b"]
    forgotten = roster(["a"], (), later.seen, 700.0, 600.0)
    assert forgotten.unknown == () and "b" not in forgotten.seen
    back = roster(["a", "b"], (), later.seen, 650.0, 600.0)
    assert back.unknown == () and back.read == ("a", "b")


def test_configured_schedds_only_and_a_missing_one_is_unknown_for_ever() -> None:
    r = roster(["a", "b", "c"], ("c", "x"), {}, 100.0, 600.0)
    assert r.read == ("c",) and r.unknown == (("x", "not in the collector"),)
    assert roster(["a"], ("x",), {"x": 0.0}, 1e9, 600.0).unknown == (
        ("x", "not in the collector"),)


def test_pool_schedd_is_a_deprecated_one_item_list() -> None:
    assert PoolConfig(schedd="cm").schedds == ("cm",)
    assert PoolConfig().schedds == ()
    with pytest.raises(ValueError, match=r"pool\.schedds only"):
        PoolConfig(schedd="cm", schedds=("cm", "submit2"))


# -- merging ------------------------------------------------------------------------
def test_views_merge_by_shape_and_unknown_schedds_are_carried() -> None:
    a = QueueView((Demand(ONE, 3), Demand(FOUR, 1)), frozenset({"p1@n"}),
                  (Demand(ONE, 2),), total=5, older=1, newest=50.0,
                  failing=(FailingStarts(ONE, 1, 2, "bad image", 0),))
    b = QueueView((Demand(ONE, 2),), frozenset({"p2@n"}), (Demand(FOUR, 1),), total=3,
                  older=2, newest=70.0, failing=(FailingStarts(ONE, 2, 3, "no file", 1),))
    m = merge_views({"b": b, "a": a}, [("c", "down")])
    assert {d.shape: d.idle for d in m.demand} == {ONE: 5, FOUR: 1}
    assert m.running_on == {"p1@n", "p2@n"}
    assert {d.shape: d.idle for d in m.recent_arrivals} == {ONE: 2, FOUR: 1}
    assert (m.total, m.older, m.newest) == (8, 3, 70.0)
    assert m.failing == (FailingStarts(ONE, 3, 3, "no file", 1),)
    assert m.unknown == (("c", "down"),) and not m.whole
    assert m.idle_by_schedd == {"a": 4, "b": 2}
    assert merge_views({"a": a}).whole


def test_negotiation_requests_go_where_jobs_wait() -> None:
    assert negotiation_targets({"a": 0, "b": 3}, ["a", "b", "c"]) == ("b", "c")
    assert negotiation_targets(None, ["a", "b"]) == ("a", "b")


# -- the pool over fake bindings ----------------------------------------------------
JOB = {"RequestCpus": 1, "RequestMemory": 500, "RequestDisk": 0, "RequestGPUs": 0,
       "MaxRuntime": 0, "DesiredSites": "", "RemoteHost": "", "QDate": 10}


class FakeSchedd:
    def __init__(self, name: str, jobs: list[Ad], runs: list[Ad] | None = None) -> None:
        self.name, self.jobs, self.runs = name, jobs, runs or []
        self.fail = False
        self.reschedules = 0

    def _check(self) -> None:
        if self.fail:
            raise RuntimeError(f"{self.name} does not answer")

    def query(self, constraint: str = "", projection: Any = None, opts: Any = None) -> list[Ad]:
        self._check()
        if opts == "summary":
            return [Ad(AllusersIdle=sum(1 for j in self.jobs if j["JobStatus"] == 1))]
        return [j for j in self.jobs if matches(constraint, j)]

    def history(self, constraint: str, projection: Any, match: int) -> list[Ad]:
        self._check()
        return list(self.runs)

    def reschedule(self) -> None:
        self._check()
        self.reschedules += 1


class FakeBindings:
    """What `Pool` uses of htcondor2: a collector listing `listed` schedds."""

    class DaemonType:
        Schedd = "schedd"

    class QueryOpt:
        SummaryOnly = "summary"
        GroupBy = "groupby"  # the fake schedd ignores it, as an old one would

    def __init__(self, *schedds: FakeSchedd) -> None:
        self.schedds = {s.name: s for s in schedds}
        self.listed = list(self.schedds)
        self.collector_fail = False
        self.param: dict[str, str] = {}
        bindings = self

        class Collector:
            def __init__(self, address: str) -> None:
                pass

            def locateAll(self, daemon_type: str) -> list[Ad]:
                if bindings.collector_fail:
                    raise RuntimeError("collector down")
                return [Ad(Name=n, MyAddress=f"<{n}>") for n in bindings.listed]

        self.Collector = Collector

    def Schedd(self, ad: Ad) -> FakeSchedd:
        return self.schedds[ad["Name"]]


def two_schedds() -> tuple[Pool, FakeBindings, Clock]:
    cm = FakeSchedd("cm", [Ad(JOB, JobStatus=1), Ad(JOB, JobStatus=2,
                                                    RemoteHost="slot1_1@p1@n")])
    s2 = FakeSchedd("submit2", [Ad(JOB, JobStatus=1), Ad(JOB, JobStatus=1),
                                Ad(JOB, JobStatus=2, RemoteHost="slot1_1@p2@n")])
    fake = FakeBindings(cm, s2)
    clock = Clock()
    return Pool(PoolConfig(token_file=""), fake, clock), fake, clock


def test_demand_and_busy_startds_come_from_every_schedd() -> None:
    pool, _, _ = two_schedds()
    view = pool.queue()
    assert view.whole and {d.shape.cpus: d.idle for d in view.demand} == {1: 3}
    assert view.running_on == {"p1@n", "p2@n"}
    assert pool.idle_count() == 3


def test_an_unreadable_schedd_is_named_and_the_others_still_count() -> None:
    pool, fake, _ = two_schedds()
    fake.schedds["submit2"].fail = True
    view = pool.queue()
    assert [n for n, _ in view.unknown] == ["submit2"]
    assert "does not answer" in view.unknown[0][1]
    assert sum(d.idle for d in view.demand) == 1 and view.running_on == {"p1@n"}
    assert pool.idle_count() == 1
    fake.schedds["cm"].fail = True
    with pytest.raises(PoolUnreachable, match="no schedd readable"):
        pool.queue()


def test_the_probe_counts_an_unreadable_schedd_as_last_read_not_empty() -> None:
    """A schedd restarting is not an emptied queue: the cheap probe keeps its last count
    (read as none, the probe would wake a cycle for "queue emptied")."""
    pool, fake, _ = two_schedds()
    assert pool.idle_count() == 3
    fake.schedds["submit2"].fail = True
    assert pool.idle_count() == 3  # submit2's 2 from its last read
    fake.schedds["submit2"].fail = False
    fake.schedds["submit2"].jobs = [Ad(JOB, JobStatus=2, RemoteHost="slot1_1@p2@n")]
    assert pool.idle_count() == 1  # read again: its own count


def test_the_probe_leaves_out_jobs_in_their_cool_down_as_the_full_read_does() -> None:
    """A job whose start failed waits out its cool-down (and then its hold): no pilot can
    start it, so it is not demand. Counted by the probe, it would look like new demand
    at every quick check, each bringing a full cycle for nothing."""
    now = int(time.time())  # the full read's clock
    cooling = Ad(JOB, JobStatus=1, VacateReasonCode=1007,
                 VacateReason="Error from slot1@p1@n: Singularity test failed",
                 JobCurrentStartDate=now - 30, JobCurrentStartExecutingDate=now - 30,
                 LastVacateTime=now - 29, NumJobCoolDowns=1, JobCoolDownExpiration=now + 60)
    fake = FakeBindings(FakeSchedd("cm", [Ad(JOB, JobStatus=1), cooling]))
    clock = Clock()
    clock.t = float(now)
    pool = Pool(PoolConfig(token_file=""), fake, clock)
    assert pool.idle_count() == 1 and pool.idle_by_schedd == {"cm": 1}
    # its end is passed on to the schedd, though no full read saw it
    assert pool.nudger.ends.ends == {"cm": {now + 60.0}}
    view = pool.queue()
    assert sum(d.idle for d in view.demand) == 1 and view.failing[0].cooling == 1
    clock.t = now + 61.0  # the cool-down over: demand again, and the probe sees it rise
    assert pool.idle_count() == 2
    assert pool.nudger.ends.due(clock.t) == ("cm",)


def test_a_schedd_gone_from_the_collector_is_unknown_not_empty() -> None:
    pool, fake, clock = two_schedds()
    pool.queue()
    fake.listed = ["cm"]  # submit2 shut down: its ad invalidated
    clock.t += 60
    assert [n for n, _ in pool.queue().unknown] == ["submit2"]
    clock.t += pool.cfg.schedd_gone_s
    assert pool.queue().whole  # decommissioned: forgotten
    fake.listed = []  # every schedd gone: the pool is unknown, remembered or not
    with pytest.raises(PoolUnreachable, match="no schedd readable: cm: not in the collector"):
        pool.queue()
    clock.t += pool.cfg.schedd_gone_s
    with pytest.raises(PoolUnreachable, match="lists no schedd"):
        pool.queue()
    fake.collector_fail = True
    with pytest.raises(PoolUnreachable, match="collector"):
        pool.queue()


def test_a_configured_schedd_missing_from_the_collector_is_unknown() -> None:
    pool, _, _ = two_schedds()
    pool.cfg = PoolConfig(token_file="", schedds=("submit2", "other"))
    view = pool.queue()
    assert view.unknown == (("other", "not in the collector"),)
    assert sum(d.idle for d in view.demand) == 2  # cm is not read


def test_negotiation_is_asked_of_every_schedd_whose_jobs_wait() -> None:
    pool, fake, _ = two_schedds()
    fake.schedds["cm"].jobs = [Ad(JOB, JobStatus=2, RemoteHost="slot1_1@p1@n")]
    pool.reschedule()  # nothing counted yet: every schedd
    assert [s.reschedules for s in fake.schedds.values()] == [1, 1]
    pool.idle_count()
    pool.reschedule()
    assert [s.reschedules for s in fake.schedds.values()] == [1, 2]
    fake.schedds["submit2"].fail = True
    with pytest.raises(PoolUnreachable, match="submit2"):
        pool.reschedule()


def test_history_is_read_from_every_schedd_or_not_at_all() -> None:
    run = {"ClusterId": 1, "ProcId": 0, "Owner": "alice", "JobStatus": 4, "RequestCpus": 1,
           "JobCurrentStartDate": 100, "CompletionDate": 200}
    pool, fake, _ = two_schedds()
    fake.schedds["cm"].runs = [Ad(run)]
    fake.schedds["submit2"].runs = [Ad(run, ClusterId=7)]
    runs = pool.history(0.0)
    assert sorted(r.job_id for r in runs) == ["1.0", "7.0"]
    assert all(isinstance(r, JobRun) for r in runs)
    fake.schedds["submit2"].fail = True
    with pytest.raises(PoolUnreachable, match="submit2"):
        pool.history(0.0)


# -- decisions on a queue read in part ----------------------------------------------
def scale_down(actions: Any) -> list[Any]:
    return [a for a in actions if isinstance(a, Flag | Release | Retire | Cancel)]


def test_no_scale_down_while_a_schedd_is_unknown() -> None:
    cfg = config()
    pilots = [pilot("1", PilotState.IDLE), pilot("2", PilotState.BUSY),
              pilot("3", PilotState.IDLE)]
    s = snap(pilots=pilots)
    m = memory(flagged={"gsi/3": NOW - 120}, idle_cycles={"gsi/3": 5})
    whole = plan(s, m, cfg, NOW).actions
    assert {type(a) for a in scale_down(whole)} >= {Flag, Release, Retire}
    assert plan(replace(s, schedds_unknown=("submit2",)), m, cfg, NOW).actions == ()


def test_readable_demand_is_provisioned_for_while_a_schedd_is_unknown() -> None:
    s = replace(snap(demand=[(ONE, 4)]), schedds_unknown=("submit2",))
    assert [a for a in plan(s, memory(), config(), NOW).actions if isinstance(a, Submit)]


CONFIG = """
pool: {collector: "cm:9618", provisioner_id: t, uid_domain: example}
sites:
  - name: gsi
    max_walltime_s: 7200
    template: gsi.sh.j2
    image: /images/pilot.sif
    pilot: {cpus: 4, memory_mb: 8000, walltime_s: 3600}
"""


def test_the_service_says_which_schedd_is_unknown_and_keeps_its_flags() -> None:
    pool = FakePool(unknown=(("submit2", "does not answer"),))
    prov = Provisioner(parse_config(CONFIG, "t.yaml"), pool=pool,  # type: ignore[arg-type]
                       backends={"gsi": FakeBackend("gsi")},  # type: ignore[dict-item]
                       journal=Journal(""), clock=Clock())
    prov.controller.memory = replace(prov.controller.memory, flagged={"gsi/9": 1.0})
    cycle = prov.run_cycle("test")
    assert cycle.observation.snapshot.schedds_unknown == ("submit2",)
    assert cycle.observation.queue is None  # no growth from a queue read in part
    assert "schedd submit2 UNKNOWN (no scale-down)" in summary_line(cycle)
    assert prov.controller.memory.flagged == {"gsi/9": 1.0}  # a whole queue would drop it


def test_no_release_when_a_schedd_cannot_be_read_right_before_it() -> None:
    prov, pool, backends, _ = make_world()
    backends["gsi"].jobs = [running_job("7")]
    pool.ads = {"gsi/7": idle_ad("7")}
    plan_ = release_of(prov, "7")
    pool.unknown = (("submit2", "does not answer"),)  # it may run a job there now
    outcomes = prov.act(prov.observe(), plan_)
    assert backends["gsi"].calls == [] and "skipped" in outcomes[0][1]
    pool.unknown = ()
    prov.act(prov.observe(), plan_)
    assert backends["gsi"].calls == [("release", "7")]
