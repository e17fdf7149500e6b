"""SLURM's refusals and limits as signals (issue 23, item 1), with plain data and a
hand-written site that refuses as SLURM does: sbatch failures classified from SLURM's
own words; a site at its submission limit gets at most one refused sbatch per cycle, no
further sbatch until one of its pilots leaves, and its share of the demand goes to the
other site in the same cycle; a refused configuration stops that site only; a busy
controller backs its sbatch off; a pilot pending at a job-count limit is no capacity."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.config import parse_config
from provisioner.decide.controller import Controller
from provisioner.decide.limits import SiteLimits
from provisioner.decide.plan import plan
from provisioner.errors import (
    AtLimit,
    BackendError,
    Misconfigured,
    Rejected,
    Transient,
    Unreachable,
)
from provisioner.model import Demand, JobShape, PilotState, Submit
from provisioner.service.journal import Journal
from provisioner.service.loop import Provisioner
from provisioner.service.status import gather, render
from provisioner.service.submitter import submit_all
from provisioner.sites.base import SiteJob, SiteJobState
from provisioner.sites.slurm_jobs import parse_squeue
from provisioner.sites.slurm_refusals import classify_sbatch
from tests.unit.fakes import Clock, FakePool

from .helpers import NOW, config, memory, pilot, site, snap
from .test_boundaries import squeue_job

LIMIT_TEXT = ("sbatch: error: QOSMaxSubmitJobPerUserLimit\n"
              "sbatch: error: Batch job submission failed: Job violates accounting/QOS "
              "policy (job submit limit, user's size and/or time limits)\n")
ACCOUNT_TEXT = ("sbatch: error: Batch job submission failed: Invalid account or "
                "account/partition combination specified\n")
BUSY_TEXT = "sbatch: error: Batch job submission failed: Resource temporarily unavailable\n"


@pytest.mark.parametrize(("text", "kind", "detail"), [
    (LIMIT_TEXT, AtLimit, "QOSMaxSubmitJobPerUserLimit"),
    ("sbatch: error: AssocMaxSubmitJobLimit\nsbatch: error: Batch job submission failed: "
     "Job violates accounting/QOS policy (job submit limit, user's size and/or time "
     "limits)", AtLimit, "AssocMaxSubmitJobLimit"),
    ("sbatch: error: QOSGrpSubmitJobsLimit\n", AtLimit, "QOSGrpSubmitJobsLimit"),
    ("sbatch: error: AssocGrpSubmitJobsLimit\n", AtLimit, "AssocGrpSubmitJobsLimit"),
    (ACCOUNT_TEXT, Misconfigured, "account (with partition)"),
    ("sbatch: error: Batch job submission failed: Invalid partition name specified",
     Misconfigured, "partition"),
    ("sbatch: error: Batch job submission failed: Requested time limit is invalid "
     "(missing or exceeds some limit)", Misconfigured, "pilot.walltime_s"),
    (BUSY_TEXT, Transient, ""),
    ("sbatch: error: Batch job submission failed: Socket timed out on send/recv operation",
     Transient, ""),
    ("sbatch: error: Batch job submission failed: Rate limit exceeded, please retry "
     "momentarily", Transient, ""),
    ("sbatch: error: Slurm temporarily unable to accept job, sleeping and retrying\n"
     "sbatch: error: Batch job submission failed: Resource temporarily unavailable",
     Transient, ""),
    ("sbatch: error: Batch job submission failed: Unable to contact slurm controller "
     "(connect failure)", Unreachable, ""),
    ("sbatch: error: Batch job submission failed: Something new", Rejected, ""),
])
def test_sbatch_failures_are_classified_from_slurms_words(
        text: str, kind: type[BackendError], detail: str) -> None:
    err = classify_sbatch("gsi", text)
    assert type(err) is kind
    assert "gsi" in str(err) and "sbatch: error" not in str(err)
    if isinstance(err, AtLimit):
        assert err.reason == detail
    if isinstance(err, Misconfigured):
        assert err.field == detail and err.slurm_message in text


def test_squeue_reason_of_a_job_count_limit_is_read_for_pending_jobs_only() -> None:
    doc = {"jobs": [squeue_job(1, "PENDING", state_reason="QOSMaxJobsPerUserLimit"),
                    squeue_job(2, "PENDING", state_reason="Priority"),
                    squeue_job(3, "RUNNING", state_reason="AssocMaxJobsLimit")]}
    jobs = {j.job_id: j.limit_reason for j in parse_squeue(doc, "htcpilot-t")}
    assert jobs == {"1": "QOSMaxJobsPerUserLimit", "2": "", "3": ""}


SHAPE = JobShape(cpus=4, memory_mb=1000)
SMALL = JobShape(cpus=2, memory_mb=1000)


def test_a_pilot_pending_at_a_job_limit_is_no_capacity_and_the_site_takes_no_more() -> None:
    cfg = config(site("gsi", cpus=4, weight=2.0), site("fra", cpus=4))
    plain = pilot("7", PilotState.PENDING, cpus=4, memory_mb=16000)
    limited = replace(plain, limit_reason="QOSMaxJobsPerUserLimit")
    ctl = Controller(cfg)
    result = ctl.cycle(snap([(SHAPE, 2)], [limited], sites=("gsi", "fra")), NOW)
    assert {(a.site, a.count) for a in result.submits} == {("fra", 2)}
    assert "gsi" in ctl.limits.caps and ctl.limits.caps["gsi"].jobs == 0
    assert any("gsi: at its job limit (0 jobs)" in t for t in ctl.transitions)
    # safeguard off: the same pilot without its reason is capacity on its way
    before = plan(snap([(SHAPE, 2)], [plain], sites=("gsi", "fra")), memory(), cfg, NOW)
    assert sum(a.count for a in before.submits) == 1


CONFIG = """
pool: {collector: "cm:9618", provisioner_id: t, uid_domain: example}
sites:
  - name: gsi
    weight: 2
    max_walltime_s: 7200
    template: gsi.sh.j2
    image: /images/pilot.sif
    pilot: {cpus: 4, memory_mb: 8000, walltime_s: 3600}
    caps: {max_pilots: 20, max_pending: 20, max_submit_per_cycle: 10}
  - name: fra
    max_walltime_s: 7200
    template: frankfurt.sh.j2
    image: /images/pilot.sif
    pilot: {cpus: 4, min_cpus: 4, memory_mb: 8000, walltime_s: 3600}
    caps: {max_pilots: 20, max_pending: 20, max_submit_per_cycle: 10}
"""


@dataclass
class SlurmSite:
    """A site that answers as SLURM does: it refuses sbatch with SLURM's words (a
    submit limit once it holds `limit` jobs, or `refuse` for every sbatch)."""

    name: str
    limit: int = 1000
    refuse: str = ""
    jobs: list[SiteJob] = field(default_factory=list)
    sbatch: int = 0
    refused: int = 0
    next_id: int = 100

    def submit(self, request: object) -> str:
        self.sbatch += 1
        text = self.refuse or (LIMIT_TEXT if len(self.jobs) >= self.limit else "")
        if text:
            self.refused += 1
            raise classify_sbatch(self.name, text)
        self.next_id += 1
        self.jobs.append(SiteJob(str(self.next_id), SiteJobState.PENDING, 4, 8000, 0.0,
                                 None, None))
        return str(self.next_id)

    def list_pilots(self) -> list[SiteJob]:
        return list(self.jobs)

    def cancel(self, job_id: str, only_pending: bool = False) -> None:
        self.jobs = [j for j in self.jobs if j.job_id != job_id]

    def release(self, job_id: str) -> None: ...
    def retire(self, job_id: str, retire: bool = True) -> None: ...
    def end_records(self, job_ids: object) -> dict[str, object]:
        return {}


def make(gsi: SlurmSite, fra: SlurmSite, idle: int) -> tuple[Provisioner, FakePool, Clock]:
    pool = FakePool(demand=(Demand(SHAPE, idle),))
    clock = Clock()
    prov = Provisioner(parse_config(CONFIG, "t.yaml"), pool=pool,  # type: ignore[arg-type]
                       backends={"gsi": gsi, "fra": fra},  # type: ignore[dict-item]
                       journal=Journal(""), clock=clock)
    return prov, pool, clock


def test_a_site_at_its_submission_limit_is_refused_once_and_the_rest_goes_elsewhere(
        caplog: pytest.LogCaptureFixture) -> None:
    gsi, fra = SlurmSite("gsi", limit=3), SlurmSite("fra")
    prov, pool, clock = make(gsi, fra, idle=8)
    caplog.set_level(logging.WARNING)
    cycle = prov.run_cycle()
    # the cheaper site took what its limit allows, was refused once, and the other site
    # got the rest in the same cycle: every idle job has a pilot
    assert (gsi.sbatch, gsi.refused, len(gsi.jobs)) == (4, 1, 3)
    assert len(fra.jobs) == 5
    assert "gsi: at its submission limit (3 jobs)" in caplog.text
    assert any("placed anew" in text and "fra" in text for text, _o in cycle.outcomes)
    st = gather(prov.config, cycle.observation.snapshot, clock.t, {}, {}, [], None,
                limits=prov.journal.get("limits"))
    assert "gsi: at its submission limit (3 jobs" in render(st)
    # the next cycles: no sbatch at gsi while it holds 3 (more demand goes to fra)
    pool.demand = (Demand(SHAPE, 4),)
    for _ in range(3):
        clock.t += 60
        prov.run_cycle()
    assert (gsi.sbatch, gsi.refused) == (4, 1)
    # one of its pilots leaves: one sbatch there, accepted
    gsi.jobs.pop()
    clock.t += 60
    prov.run_cycle()
    assert (gsi.sbatch, gsi.refused, len(gsi.jobs)) == (5, 1, 3)


def test_a_refused_configuration_stops_that_site_only_naming_field_and_message(
        caplog: pytest.LogCaptureFixture) -> None:
    gsi, fra = SlurmSite("gsi", refuse=ACCOUNT_TEXT), SlurmSite("fra")
    prov, pool, clock = make(gsi, fra, idle=3)
    caplog.set_level(logging.WARNING)
    prov.run_cycle()
    assert (gsi.sbatch, len(fra.jobs)) == (1, 3)
    line = next(r.getMessage() for r in caplog.records if "stopped" in r.getMessage())
    assert "gsi" in line and "account" in line
    assert "Invalid account or account/partition combination specified" in line
    assert "circuit" not in line
    pool.demand = (Demand(SHAPE, 6),)
    for _ in range(3):
        clock.t += 3600
        prov.run_cycle()
    assert gsi.sbatch == 1 and len(fra.jobs) == 6  # the other site goes on
    assert prov.controller.breakers.snapshot(clock.t).get("gsi", "closed") == "closed"


def test_a_busy_controller_backs_sbatch_off_and_is_asked_again_later() -> None:
    gsi, fra = SlurmSite("gsi", refuse=BUSY_TEXT), SlurmSite("fra")
    prov, pool, clock = make(gsi, fra, idle=2)
    prov.run_cycle()
    assert gsi.sbatch == 1 and len(fra.jobs) == 2
    pool.demand = (Demand(SHAPE, 4),)
    clock.t += 30
    prov.run_cycle()
    assert gsi.sbatch == 1  # backed off
    gsi.refuse = ""
    clock.t += 60
    prov.run_cycle()
    assert gsi.sbatch >= 2 and len(gsi.jobs) >= 1


@settings(max_examples=40, deadline=None)
@given(limits=st.tuples(st.integers(0, 6), st.integers(0, 30)),
       demand=st.lists(st.integers(0, 25), min_size=1, max_size=6),
       leave=st.lists(st.integers(0, 3), min_size=6, max_size=6))
def test_at_most_one_refused_sbatch_per_site_per_cycle(
        limits: tuple[int, int], demand: list[int], leave: list[int]) -> None:
    cfg = parse_config(CONFIG, "t.yaml")
    ctl = Controller(cfg)
    held: dict[str, list[str]] = {"gsi": [], "fra": []}
    cap = dict(zip(("gsi", "fra"), limits, strict=True))
    now = NOW
    for n, gone in zip(demand, leave, strict=False):
        for name in held:
            del held[name][:gone]
        pilots = [pilot(j, PilotState.PENDING, site=s, cpus=4, memory_mb=8000)
                  for s, ids in held.items() for j in ids]
        # two job shapes: a site gets a Submit per pilot size (4 and 2 cores)
        result = ctl.cycle(snap([(SHAPE, n), (SMALL, n // 2 + 1)], pilots,
                                sites=("gsi", "fra")), now)
        refused = {"gsi": 0, "fra": 0}

        def send(a: Submit, refused: dict[str, int] = refused,
                 now: float = now) -> tuple[list[str], BackendError | None]:
            ids: list[str] = []
            for _ in range(a.count):
                if len(held[a.site]) >= cap[a.site]:
                    refused[a.site] += 1
                    return ids, classify_sbatch(a.site, LIMIT_TEXT)
                held[a.site].append(f"{now:.0f}-{len(held[a.site])}")
                ids.append(held[a.site][-1])
            return ids, None

        submit_all(ctl, result.submits, send, now)
        assert max(refused.values()) <= 1
        now += 300


def test_learnt_limits_survive_a_restart_and_a_submission_limit_is_tested_again() -> None:
    limits = SiteLimits(probe_s=300)
    limits.refused("gsi", AtLimit("x", "QOSMaxSubmitJobPerUserLimit"), 20, NOW)
    again = SiteLimits(probe_s=300)
    again.load(limits.to_dict())
    assert again.room("gsi", 19, NOW) == 1 and again.room("gsi", 20, NOW) == 0
    assert "at its submission limit (20 jobs" in again.describe("gsi", 20, NOW)
    # no timer forgets it: after probe_s one sbatch past it, no more
    assert again.room("gsi", 20, NOW + 299) == 0
    assert again.room("gsi", 20, NOW + 300) == 1 and again.room("gsi", 21, NOW + 300) == 0
    assert "tests it" in again.describe("gsi", 20, NOW + 300)
    # refused again: learnt again, the next test twice as late
    line = again.refused("gsi", AtLimit("x", "QOSMaxSubmitJobPerUserLimit"), 20, NOW + 300)
    assert "600 s" in line
    assert again.room("gsi", 20, NOW + 300 + 599) == 0
    assert again.room("gsi", 20, NOW + 300 + 600) == 1
    # accepted past it: the limit was raised or removed, and is dropped
    line = again.submitted("gsi", 21)
    assert "raised or removed" in line and "gsi" not in again.caps
    assert again.room("gsi", 21, NOW + 900) is None
    # an old journal's entry (no probe time) is tested probe_s after it was learnt
    old = SiteLimits(probe_s=300)
    old.load({"gsi": {"jobs": 2, "kind": "submission limit", "reason": "r",
                      "learnt_at": NOW}})
    assert old.room("gsi", 2, NOW + 300) == 1


def test_a_job_limit_is_kept_while_slurm_gives_its_reason_and_dropped_when_raised() -> None:
    limits = SiteLimits()
    events = limits.observe("gsi", 5, {"AssocMaxJobsLimit": 2}, NOW, started=3)
    assert "at its job limit (3 jobs)" in events[0]
    # no timer: a day later, still pending with the reason, still kept, no room
    for hours in (1, 2, 24):
        assert limits.observe("gsi", 5, {"AssocMaxJobsLimit": 2}, NOW + hours * 3600,
                              started=3) == []
        assert limits.room("gsi", 5, NOW + hours * 3600) == 0
    # the reason gone (the pending ones cancelled): one pilot past the limit tests it
    events = limits.observe("gsi", 3, {}, NOW + 90000, started=3)
    assert "tests it" in events[0]
    assert limits.room("gsi", 3, NOW + 90000) == 1 and limits.room("gsi", 4, NOW) == 0
    # it pends with the reason again: kept, no test
    limits.observe("gsi", 4, {"AssocMaxJobsLimit": 1}, NOW + 90100, started=3)
    assert limits.room("gsi", 4, NOW + 90100) == 0 and not limits.caps["gsi"].probing
    # an admin raised it: the pending one starts, the next test starts too: dropped
    limits.observe("gsi", 4, {}, NOW + 90200, started=4)
    assert "gsi" not in limits.caps
    assert limits.room("gsi", 4, NOW + 90200) is None


def test_an_unknown_pending_reason_is_named_once_per_site_never_capacity_nor_a_limit(
        ) -> None:
    doc = {"jobs": [squeue_job(1, "PENDING", state_reason="QOSMaxJobsPerUserLimitNew"),
                    squeue_job(2, "PENDING", state_reason="ReqNodeNotAvail, UnavailableNodes:n1"),
                    squeue_job(3, "PENDING", state_reason="AssocGrpCpuLimit")]}
    jobs = {j.job_id: j.limit_reason for j in parse_squeue(doc, "htcpilot-t")}
    assert jobs == {"1": "QOSMaxJobsPerUserLimitNew", "2": "", "3": ""}
    cfg = config(site("gsi", cpus=4, weight=2.0), site("fra", cpus=4))
    odd = replace(pilot("7", PilotState.PENDING, cpus=4, memory_mb=16000),
                  limit_reason="QOSMaxJobsPerUserLimitNew")
    ctl = Controller(cfg)
    result = ctl.cycle(snap([(SHAPE, 2)], [odd], sites=("gsi", "fra")), NOW)
    named = [t for t in ctl.transitions if "QOSMaxJobsPerUserLimitNew" in t]
    assert len(named) == 1 and "gsi" in named[0]
    assert "gsi" not in ctl.limits.caps  # not learnt as a limit
    # not capacity on its way: both jobs get new pilots
    assert sum(a.count for a in result.submits) == 2
    ctl.cycle(snap([(SHAPE, 2)], [odd], sites=("gsi", "fra")), NOW + 60)
    assert not [t for t in ctl.transitions if "QOSMaxJobsPerUserLimitNew" in t]


@settings(max_examples=60, deadline=None)
@given(first=st.integers(0, 8), second=st.one_of(st.none(), st.integers(0, 12)),
       change=st.integers(1, 20), leave=st.lists(st.integers(0, 2), min_size=40,
                                                  max_size=40))
def test_a_changed_submission_limit_is_noticed_with_one_refused_sbatch_per_test(
        first: int, second: int | None, change: int, leave: list[int]) -> None:
    """A site whose submit limit changes (or goes) while work waits: each cycle sends
    sbatch up to the learnt room and stops at the first refusal; at most one sbatch
    past a learnt limit per test, and a raised or removed limit is noticed within the
    longest wait between tests."""
    limits = SiteLimits(probe_s=300, probe_max_s=1200)
    held, now, refused_at = 0, NOW, []
    noticed = None
    for step, gone in enumerate(leave):
        cap = first if step < change else second
        held = max(0, held - gone)
        room = limits.room("gsi", held, now)
        before = limits.caps.get("gsi")
        sent = 0
        for _ in range(6 if room is None else min(room, 6)):
            if cap is not None and held >= cap:
                limits.refused("gsi", AtLimit("x", "AssocMaxSubmitJobLimit"), held, now)
                refused_at.append(now)
                break
            held += 1
            sent += 1
            limits.submitted("gsi", held)
        if before is not None:  # a learnt limit: at most one sbatch past it
            assert held <= max(before.jobs + 1, held - sent)
        if step >= change and (second is None or second > first) and noticed is None \
                and "gsi" not in limits.caps:
            noticed = now
        now += 60
    # refusals: at most one per cycle, and a learnt limit is tested no more often than
    # every probe_s
    assert len(refused_at) == len(set(refused_at))
    gaps = [b - a for a, b in pairwise(refused_at)]
    assert all(g >= 300 for g in gaps if g > 0) or len(refused_at) <= 1 or all(
        g >= 60 for g in gaps)
    if (second is None or second > first + 6) and change + 22 < len(leave):
        assert noticed is not None and noticed - (NOW + 60 * change) <= 1200 + 60


@settings(max_examples=60, deadline=None)
@given(limit=st.integers(0, 6), raised=st.one_of(st.none(), st.integers(7, 15)),
       change=st.integers(2, 15), ends=st.lists(st.integers(0, 2), min_size=30,
                                                  max_size=30))
def test_a_job_limit_lets_at_most_one_pilot_past_it_and_follows_the_site(
        limit: int, raised: int | None, change: int, ends: list[int]) -> None:
    """A site that runs at most `limit` pilots (then `raised`, or no limit) and pends
    the rest with SLURM's reason; the service wants many pilots. Once a limit is
    learnt, no more than one pilot beyond it is added while it holds, and a raised or
    removed limit is learnt anew or dropped."""
    limits = SiteLimits()
    running, pending, now = 0, 0, NOW
    dropped_after_raise = None
    for step, gone in enumerate(ends):
        cap = limit if step < change else raised
        running = max(0, running - gone)
        start = pending if cap is None else max(0, min(pending, cap - running))
        running, pending = running + start, pending - start
        limited = {"AssocMaxJobsLimit": pending} if pending else {}
        limits.observe("gsi", running + pending, limited, now, started=running)
        learnt = limits.caps.get("gsi")
        room = limits.room("gsi", running + pending, now)
        add = 10 if room is None else room
        if learnt is not None and cap == limit and step < change:
            assert learnt.jobs == limit or not limited
            assert add == 0 or running + pending + add <= learnt.jobs + 1
        pending += add
        if step >= change and dropped_after_raise is None and (
                learnt is None or learnt.jobs == raised):
            dropped_after_raise = step
        now += 60
    if change + 4 < len(ends):
        assert dropped_after_raise is not None
