"""An allocation carried onto a pilot and read back, with plain data: the account in
sbatch's argv and the REST job description, the pilot's parameters and its START, the
account from squeue and the ads, and the queue told apart by accounting group only
where groups are in use."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provisioner.config import GROUP_PATTERN, AllocationConfig, parse_config
from provisioner.errors import Rejected
from provisioner.model import JobShape, PilotState, Submit
from provisioner.pilot.params import (
    ALLOCATION_NAME,
    GROUP_NAME,
    GROUPS_START,
    PilotError,
    allocation_config,
    local_config,
    params_from_env,
)
from provisioner.pilot.script import check_templates, render_pilot_script
from provisioner.pool.classads import PilotAd, pilot_ads_of, queue_view
from provisioner.pool.condor import GROUP_ATTRS, group_attrs, job_run_of
from provisioner.pool.pilot_view import ad_only_pilots, merge_pilots
from provisioner.service.journal import Journal
from provisioner.service.loop import Provisioner
from provisioner.sites.base import PilotRequest, SiteJob, SiteJobState
from provisioner.sites.slurm_cli import SlurmCliBackend
from provisioner.sites.slurm_jobs import parse_squeue
from provisioner.sites.slurm_rest import SlurmRestBackend
from tests.unit.fakes import Clock, FakeBackend, FakePool
from tests.unit.test_boundaries import ENV, Ad, squeue_job

CONFIG = """
pool: {collector: "cm:9618", provisioner_id: t, uid_domain: example}
journal: JOURNAL
sites:
  - name: gsi
    partition: main
    max_walltime_s: 7200
    template: gsi.sh.j2
    image: /images/pilot.sif
    xcache: "root://cache:1094"
    pilot: {cpus: 4, memory_mb: 8000, walltime_s: 3600}
    allocations:
      - {name: alloc-a, account: alloc-a, amount: 1000, period: monthly, groups: [group_a]}
      - {name: both, account: acct-b, amount: 1000, period: monthly,
         groups: [group_a, group_b]}
"""


def request(account: str | None = None) -> PilotRequest:
    return PilotRequest(cpus=2, memory_mb=3000, walltime_s=3600, shutdown_margin_s=120,
                        script="#!/bin/bash\n", account=account)


def accounts(argv: list[str]) -> list[str]:
    return [a for a in argv if a.startswith("--account")]


# --- the account on the way out --------------------------------------------------------

def test_sbatch_charges_the_allocations_account_over_the_sites() -> None:
    b = SlurmCliBackend(name="gsi", provisioner_id="t", executor=None, account="hpc-physics")
    assert accounts(b.sbatch_argv(request("alloc-a"))) == ["--account=alloc-a"]
    assert accounts(b.sbatch_argv(request())) == ["--account=hpc-physics"]
    b.account = None
    assert accounts(b.sbatch_argv(request())) == []  # the pilot account's default
    assert accounts(b.sbatch_argv(request("alloc-a"))) == ["--account=alloc-a"]


def test_the_site_gate_lets_an_allocations_sbatch_through(tmp_path: Path) -> None:
    from tests.unit.test_site_gate import INI, gate

    ini = tmp_path / "gate.ini"
    ini.write_text(INI.format(log=tmp_path / "gate.log"))
    b = SlurmCliBackend(name="gsi", provisioner_id="testbed", executor=None,
                        partition="main", account="hpc-physics")
    gate.check_sbatch(b.sbatch_argv(request("alloc-a"))[1:], gate.settings(str(ini)))


@pytest.mark.parametrize("bad", ["alloc a", "alloc;id", "-x", "a" * 65, "$(id)", "a\nb",
                                 "alloc-a\n"])
def test_an_account_that_is_no_slurm_name_reaches_no_argv(bad: str) -> None:
    b = SlurmCliBackend(name="gsi", provisioner_id="t", executor=None)
    with pytest.raises(Rejected, match="not a SLURM account"):
        b.sbatch_argv(request(bad))


def test_the_rest_job_description_charges_the_allocations_account() -> None:
    b = SlurmRestBackend(name="fra", provisioner_id="t", client=None,  # type: ignore[arg-type]
                         account="hpc-physics")
    assert b.job_description(request("alloc-b"))["account"] == "alloc-b"
    assert b.job_description(request())["account"] == "hpc-physics"
    b.account = None
    assert "account" not in b.job_description(request())
    with pytest.raises(Rejected):
        b.job_description(request("a b"))


class RecordingBackend(FakeBackend):
    requests: list[PilotRequest]

    def submit(self, request: object) -> str:
        self.__dict__.setdefault("requests", []).append(request)
        return super().submit(request)


def test_a_submit_of_an_allocation_sends_its_account_and_groups(tmp_path: Path) -> None:
    config = parse_config(CONFIG.replace("JOURNAL", str(tmp_path / "j.sqlite")), "t.yaml")
    backend = RecordingBackend("gsi")
    prov = Provisioner(config, pool=FakePool(), backends={"gsi": backend},  # type: ignore[arg-type]
                       journal=Journal(""), clock=Clock())
    ids, error = prov._submit(Submit("gsi", 2, 4, 8000, 3600, allocation="both"))
    assert error is None and len(ids) == 2
    assert [r.account for r in backend.requests] == ["acct-b", "acct-b"]
    script = backend.requests[0].script
    assert "export PILOT_ALLOCATION=both\nexport PILOT_GROUPS=group_a,group_b\n" in script
    prov._submit(Submit("gsi", 1, 4, 8000, 3600))  # no allocation: as ever
    assert backend.requests[-1].account is None
    assert "PILOT_ALLOCATION" not in backend.requests[-1].script


def test_the_batch_script_carries_the_allocation_only_where_there_is_one(
        tmp_path: Path) -> None:
    config = parse_config(CONFIG.replace("JOURNAL", str(tmp_path / "j.sqlite")), "t.yaml")
    site = config.site("gsi")
    plain = render_pilot_script(config, site, 3600)
    assert "PILOT_ALLOCATION" not in plain and "PILOT_GROUPS" not in plain
    script = render_pilot_script(config, site, 3600, allocation="alloc-a")
    assert "export PILOT_ALLOCATION=alloc-a\nexport PILOT_GROUPS=group_a\n" in script
    # the rest of the script is the plain one's
    extra = [line for line in script.splitlines() if line not in plain.splitlines()]
    assert len(extra) == 3 and extra[0].startswith("#"), extra
    with pytest.raises(KeyError):
        render_pilot_script(config, site, 3600, allocation="alloc-x")
    check_templates(config)  # every allocation's script renders


# --- the pilot's parameters and its START -----------------------------------------------

def test_the_pilots_patterns_are_the_configurations() -> None:
    assert GROUP_NAME.pattern == GROUP_PATTERN
    name = AllocationConfig.model_fields["name"].metadata
    assert ALLOCATION_NAME.pattern in [getattr(m, "pattern", None) for m in name]


def test_an_allocated_pilot_advertises_its_groups_and_starts_only_their_jobs(
        tmp_path: Path) -> None:
    env = {**ENV, "PILOT_XCACHE": "root://cache:1094", "PILOT_ALLOCATION": "alloc-a",
           "PILOT_GROUPS": "group_a,group_b.sub"}
    p = params_from_env(env, now=1000.0)
    assert (p.allocation, p.groups) == ("alloc-a", ("group_a", "group_b.sub"))
    conf = local_config(p, tmp_path)
    assert 'PilotAllocation = "alloc-a"\n' in conf
    assert 'PilotGroups = "group_a,group_b.sub"\n' in conf
    assert f"START = $(START) && {GROUPS_START}\n" in conf
    # one STARTD_ATTRS line for all it adds: a second would replace the first
    assert re.findall(r"^STARTD_ATTRS = .*$", conf, re.M) == [
        "STARTD_ATTRS = $(STARTD_ATTRS) PilotXCache PilotAllocation PilotGroups"]


def test_a_pilot_of_no_allocation_is_configured_as_before(tmp_path: Path) -> None:
    p = params_from_env({**ENV, "PILOT_XCACHE": "root://cache:1094"}, now=1000.0)
    assert (p.allocation, p.groups) == ("", ())
    conf = local_config(p, tmp_path)
    assert not re.search(r"^START =", conf, re.M) and "PilotGroups" not in conf
    assert "STARTD_ATTRS = $(STARTD_ATTRS) PilotXCache\n" in conf
    assert "STARTD_ATTRS" not in local_config(params_from_env(ENV, now=1000.0), tmp_path)


@pytest.mark.parametrize("allocation, groups", [
    ("alloc-a", ""),                     # an allocation serves some group
    ("", "group_a"),                     # groups without an allocation
    ("alloc a", "group_a"),              # names outside the patterns
    ("alloc-a", 'group_a" || true || "'),
    ("alloc-a", "group_a,,group_b"),
    ("alloc-a", "group_a group_b"),
    ("alloc-a", "$(START)"),
    ("alloc-a", "group_a\nSTART = true"),
    ('a"b', "group_a"),
    ("alloc-a\n", "group_a"),
    ("alloc-a", "group_a\n"),
])
def test_the_pilot_refuses_an_allocation_or_group_outside_the_patterns(
        allocation: str, groups: str) -> None:
    env = {**ENV, "PILOT_ALLOCATION": allocation, "PILOT_GROUPS": groups}
    with pytest.raises(PilotError, match="PILOT_"):
        params_from_env(env, now=0.0)


@given(st.text(max_size=40), st.lists(st.text(max_size=20), min_size=1, max_size=4))
def test_what_reaches_the_configuration_is_only_pattern_text(
        allocation: str, groups: list[str]) -> None:
    """Whatever the batch script says, the pilot's settings get names and groups of the
    patterns' characters only, or the pilot refuses to start."""
    env = {**ENV, "PILOT_ALLOCATION": allocation, "PILOT_GROUPS": ",".join(groups)}
    try:
        p = params_from_env(env, now=0.0)
    except PilotError:
        return
    if not p.allocation:
        assert p.groups == ()
        return
    lines = allocation_config(p.allocation, p.groups)
    for key in ("PilotAllocation", "PilotGroups"):
        assert re.fullmatch(r'"[A-Za-z0-9_.,-]+"', lines[key]), lines


def start_of(acct_group: str | None, pilot_groups: str = "group_a,group_c") -> object:
    """The clause as HTCondor's ClassAd library evaluates it, for a job whose AcctGroup
    is `acct_group` (ClassAd text; None: the job has none)."""
    import classad2

    job = classad2.ClassAd() if acct_group is None else classad2.ClassAd(
        f"[AcctGroup = {acct_group}]")
    slot = classad2.ClassAd({"PilotGroups": pilot_groups})
    return classad2.ExprTree(GROUPS_START).eval(slot, job)


@pytest.mark.parametrize("acct_group, starts", [
    ('"group_a"', True), ('"group_c"', True),
    (None, False), ("undefined", False), ('""', False),
    ('"group_a_evil"', False), ('"evil_group_a"', False), ('"group"', False),
    ('"group_a,group_b"', False), ('"group_b,group_a"', False), ('"group_a group_b"', False),
    ('" group_a"', False), ('"GROUP_A"', False), ('"group_a\\""', False),
    ('"group_a.sub"', False),
])
def test_the_start_clause_takes_only_a_whole_own_group(acct_group: str | None,
                                                       starts: bool) -> None:
    assert start_of(acct_group) is starts


@pytest.mark.parametrize("acct_group", ["5", "error", "true", '{"group_a"}'])
def test_a_group_that_is_no_string_starts_nothing(acct_group: str) -> None:
    assert start_of(acct_group) is not True


# --- the account on the way back --------------------------------------------------------

def test_squeue_and_rest_jobs_give_the_account() -> None:
    jobs = parse_squeue({"jobs": [squeue_job(1, "RUNNING", account="alloc-a"),
                                  squeue_job(2, "PENDING")]}, "htcpilot-t")
    assert [j.account for j in jobs] == ["alloc-a", ""]


def ad(job_id: str, allocation: str = "") -> PilotAd:
    return PilotAd(site="gsi", job_id=job_id, name=f"pilot-gsi-{job_id}@n", walltime_end=None,
                   cpus=4, memory_mb=8000, free_cpus=4, free_memory_mb=8000, claimed_slots=0,
                   draining=False, allocation=allocation)


def test_a_pilots_account_is_slurms_first_then_its_ads_allocations() -> None:
    run = SiteJob("1", SiteJobState.RUNNING, 4, 8000, 0.0, 1.0, 9999.0, account="alloc-a")
    quiet = SiteJob("2", SiteJobState.RUNNING, 4, 8000, 0.0, 1.0, 9999.0)
    ads = {"gsi/1": ad("1", "both"), "gsi/2": ad("2", "both")}
    names = {"alloc-a": "alloc-a", "both": "acct-b"}
    pilots = merge_pilots("gsi", [run, quiet], ads, accounts=names)
    assert [(p.state, p.account) for p in pilots] == [(PilotState.IDLE, "alloc-a"),
                                                      (PilotState.IDLE, "acct-b")]
    assert [p.account for p in merge_pilots("gsi", [quiet], {})] == [""]
    only = ad_only_pilots("gsi", {"gsi/2": ad("2", "both"), "gsi/3": ad("3", "gone")}, 0.0,
                          accounts=names)
    assert [p.account for p in only] == ["acct-b", ""]


def test_the_slot_ad_gives_the_allocation() -> None:
    pslot = Ad(PilotSite="gsi", PilotSlurmJobId="7", PartitionableSlot=True,
               Name="slot1@pilot-gsi-7@n", Cpus=4, Memory=8000, PilotAllocation="alloc-a")
    assert pilot_ads_of([pslot])["gsi/7"].allocation == "alloc-a"
    del pslot["PilotAllocation"]
    assert pilot_ads_of([pslot])["gsi/7"].allocation == ""


def test_the_history_gives_a_runs_group() -> None:
    base = dict(ClusterId=1, ProcId=0, JobCurrentStartDate=10, CompletionDate=20)
    run = job_run_of(Ad(base, AcctGroup="group_a"))
    assert run is not None and run.group == "group_a"
    run = job_run_of(Ad(base))
    assert run is not None and run.group == ""


# --- the queue, by group only where groups are in use ----------------------------------

def job(status: int = 1, group: str | None = None, qdate: int = 100, cpus: int = 1,
        count: int = 1) -> Ad:
    a = Ad(JobStatus=status, RequestCpus=cpus, RequestMemory=500, QDate=qdate,
           JobCount=count)
    if group is not None:
        a["AcctGroup"] = group
    return a


def test_without_groups_the_queue_is_read_and_shaped_as_before() -> None:
    assert group_attrs(False) == GROUP_ATTRS and "AcctGroup" not in GROUP_ATTRS
    ads = [job(group="group_a"), job(group="group_b"), job()]
    view = queue_view(ads, since=50)
    assert [(d.shape, d.idle) for d in view.demand] == [(JobShape(1, 500), 3)]
    assert [(d.shape.group, d.idle) for d in view.recent_arrivals] == [("", 3)]


def test_with_groups_demand_and_arrivals_split_by_group() -> None:
    assert group_attrs(True) == [*GROUP_ATTRS, "AcctGroup"]
    ads = [job(group="group_a", count=2), job(group="group_b"), job(), job(group="group_a")]
    view = queue_view(ads, since=50, groups=True)
    assert sorted((d.shape.group, d.idle) for d in view.demand) == [
        ("", 1), ("group_a", 3), ("group_b", 1)]
    assert sorted((d.shape.group, d.idle) for d in view.recent_arrivals) == [
        ("", 1), ("group_a", 3), ("group_b", 1)]


def test_failed_starts_carry_their_group() -> None:
    from provisioner.decide.failed_starts import STARTER_ERROR

    failed = Ad(job(group="group_b"), VacateReasonCode=STARTER_ERROR,
                VacateReason="Singularity test failed", JobCurrentStartDate=90,
                LastVacateTime=95, NumJobCoolDowns=0)
    view = queue_view([failed], now=100.0, groups=True)
    assert [f.shape.group for f in view.failing] == ["group_b"]


@given(st.lists(st.tuples(st.sampled_from([None, "group_a", "group_b", ""]),
                          st.integers(1, 3), st.integers(1, 5)), max_size=12))
def test_grouping_by_group_splits_each_shape_and_loses_no_job(
        jobs: list[tuple[str | None, int, int]]) -> None:
    ads = [job(group=g, cpus=c, count=n) for g, c, n in jobs]
    plain = {d.shape: d.idle for d in queue_view(ads).demand}
    split = queue_view(ads, groups=True).demand
    folded: dict[JobShape, int] = {}
    for d in split:
        key = JobShape(d.shape.cpus, d.shape.memory_mb)
        folded[key] = folded.get(key, 0) + d.idle
    assert folded == plain
    assert {d.shape.group for d in split} <= {g or "" for g, _, _ in jobs}


def test_why_finds_a_job_of_a_group_under_the_services_grouped_shape() -> None:
    from dataclasses import replace

    from provisioner.decide.explain import Report, ShapeEntry, shape_key
    from provisioner.decide.reasons import Reason, Why
    from provisioner.pool.job_ads import facts_of
    from provisioner.service.why import answer

    plain = JobShape(1, 500)
    grouped = replace(plain, group="group_b")
    job = facts_of({"ClusterId": 5, "ProcId": 0, "Owner": "alice", "JobStatus": 1,
                    "QDate": 900, "AcctGroup": "group_b",
                    "AccountingGroup": "group_b.alice"}, plain, 1000.0)
    assert job.shapes == (grouped, plain)
    pending = Why(Reason.PILOT_PENDING, {"site": "gsi", "cores": 4, "since": 950.0})

    def report(shape: JobShape) -> Report:
        return Report("t", 995.0, 10.0, True, (ShapeEntry(shape_key(shape), 1, pending),))

    # the service read groups (some site has allocations), or did not: found either way
    for shape in (grouped, plain):
        got = answer(job, [report(shape)], 1000.0, "alice")
        assert (got["reason"], got["shape"]["key"]) == ("pilot_pending", shape_key(shape))
