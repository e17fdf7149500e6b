"""SLURM's refusals and limits as signals (issue 23, item 1), with plain data and a
hand-written site that refuses as SLURM does: sbatch failures classified from SLURM's
own words; a site at its submission limit gets at most one refused sbatch per cycle, no
further sbatch until one of its pilots leaves, and its share of the demand goes to the
other site in the same cycle; a refused configuration stops that site only; a busy
controller backs its sbatch off; a pilot pending at a job-count limit is no capacity."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

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


def test_learnt_limits_survive_a_restart_and_are_forgotten_after_an_hour() -> None:
    limits = SiteLimits(forget_s=3600)
    limits.refused("gsi", AtLimit("x", "QOSMaxSubmitJobPerUserLimit"), 20, NOW)
    again = SiteLimits()
    again.load(limits.to_dict())
    assert again.room("gsi", 19, NOW) == 1 and again.room("gsi", 20, NOW) == 0
    assert "at its submission limit (20 jobs" in again.describe("gsi", 20, NOW)
    assert "forgotten" in again.observe("gsi", 20, {}, NOW + 3600)[0]
    assert again.room("gsi", 20, NOW + 3600) is None
