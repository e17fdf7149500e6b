"""The translation at the I/O boundaries, with plain data: squeue JSON -> SiteJob,
job/slot ClassAds -> demand and pilot ads, SLURM job + ad -> pilot state, the
pilot's environment -> its HTCondor settings, the batch script's quoting."""

from __future__ import annotations

import pytest

from provisioner.config import parse_config
from provisioner.model import JobShape, PilotState
from provisioner.pilot.params import PilotError, local_config, params_from_env
from provisioner.pilot.script import render_pilot_script
from provisioner.pool.classads import pilot_ads_of, queue_view, startd_of
from provisioner.pool.pilot_view import idle_ad_keys
from provisioner.service.loop import merge_pilots, pilot_state
from provisioner.sites.base import PilotRequest, SiteJob, SiteJobState
from provisioner.sites.slurm_cli import SlurmCliBackend
from provisioner.sites.slurm_jobs import STATE_TABLE, parse_squeue


class Ad(dict):  # type: ignore[type-arg]
    """A ClassAd stand-in: attribute values already evaluated."""

    def eval(self, attr: str) -> object:
        return self[attr]


def squeue_job(job_id: int, state: str, name: str = "htcpilot-t", **extra: object) -> dict:
    job = {"job_id": job_id, "name": name, "job_state": [state],
           "cpus": {"set": True, "infinite": False, "number": 4},
           "memory_per_node": {"set": True, "infinite": False, "number": 7800},
           "submit_time": {"set": True, "infinite": False, "number": 1000},
           "start_time": {"set": True, "infinite": False, "number": 1010},
           "end_time": {"set": True, "infinite": False, "number": 4610}}
    job.update(extra)
    return job


def test_parse_squeue_translates_states_and_drops_finished_and_foreign_jobs() -> None:
    doc = {"jobs": [squeue_job(1, "PENDING"), squeue_job(2, "RUNNING"),
                    squeue_job(3, "COMPLETING"), squeue_job(4, "COMPLETED"),
                    squeue_job(5, "RUNNING", name="someone-else")]}
    jobs = {j.job_id: j for j in parse_squeue(doc, "htcpilot-t")}
    assert set(jobs) == {"1", "2", "3"}
    assert jobs["1"].state is SiteJobState.PENDING and jobs["1"].started_at is None
    assert jobs["2"] == SiteJob("2", SiteJobState.RUNNING, 4, 7800, 1000.0, 1010.0, 4610.0)
    assert jobs["3"].state is SiteJobState.ENDING


def test_parse_squeue_unknown_state_counts_as_not_started_never_as_gone(
        caplog: pytest.LogCaptureFixture) -> None:
    jobs = parse_squeue({"jobs": [squeue_job(1, "WEIRD")]}, "htcpilot-t")
    assert [j.state for j in jobs] == [SiteJobState.PENDING]
    assert "WEIRD" in caplog.text
    assert "WEIRD" not in STATE_TABLE


def test_memory_per_cpu_fallback() -> None:
    job = squeue_job(1, "RUNNING", memory_per_node={"set": False, "number": 0},
                     memory_per_cpu={"set": True, "number": 1000})
    assert parse_squeue({"jobs": [job]}, "htcpilot-t")[0].memory_mb == 4000


def test_sbatch_argv_carries_the_shape_and_never_a_shell_string() -> None:
    b = SlurmCliBackend(name="gsi", provisioner_id="t", executor=None, partition="main",
                        account="acc")
    argv = b.sbatch_argv(PilotRequest(cpus=2, memory_mb=3000, walltime_s=3601,
                                      shutdown_margin_s=120, script="#!/bin/bash\n"))
    assert argv[:2] == ["sbatch", "--parsable"]
    assert {"--cpus-per-task=2", "--mem=3000M", "--time=61", "--signal=B:TERM@120",
            "--no-requeue", "--chdir=/",
            "--partition=main", "--account=acc", "--job-name=htcpilot-t"} <= set(argv)
    assert "--output=/dev/null" in argv
    # sites that share a log directory (the testbed's) get a file each for one job id
    b.output_dir = "/var/log/pilots"
    argv = b.sbatch_argv(PilotRequest(cpus=2, memory_mb=3000, walltime_s=3601,
                                      shutdown_margin_s=120, script="#!/bin/bash\n"))
    assert "--output=/var/log/pilots/%x-gsi-%j.out" in argv


def test_queue_view_groups_idle_jobs_and_names_busy_startds() -> None:
    ads = [Ad(JobStatus=1, RequestCpus=1, RequestMemory=500, RequestDisk=10, RequestGPUs=0,
              MaxRuntime=0, DesiredSites="", RemoteHost="")] * 3 + [
        Ad(JobStatus=1, RequestCpus=2, RequestMemory=3000, RequestDisk=10, RequestGPUs=0,
           MaxRuntime=600, DesiredSites="gsi, frankfurt", RemoteHost=""),
        Ad(JobStatus=2, RequestCpus=1, RequestMemory=500, RequestDisk=10, RequestGPUs=0,
           MaxRuntime=0, DesiredSites="", RemoteHost="slot1_3@pilot-gsi-7@node1")]
    view = queue_view(ads)
    demand = {d.shape: d.idle for d in view.demand}
    assert demand[JobShape(1, 500, 10)] == 3
    assert demand[JobShape(2, 3000, 10, runtime_s=600, desired_sites=("frankfurt", "gsi"))] == 1
    assert view.running_on == frozenset({"pilot-gsi-7@node1"})
    assert view.recent_arrivals == ()
    assert startd_of("pilot-x@y") == "pilot-x@y"


def test_recent_arrivals_count_queued_jobs_submitted_in_the_window() -> None:
    job = {"RequestCpus": 1, "RequestMemory": 500, "RequestDisk": 10, "RequestGPUs": 0,
           "MaxRuntime": 0, "DesiredSites": "", "RemoteHost": ""}
    ads = [Ad(job, JobStatus=1, QDate=100), Ad(job, JobStatus=1, QDate=500),
           Ad(job, JobStatus=2, QDate=600, RemoteHost="slot1_1@p@n")]
    view = queue_view(ads, since=400)
    assert [(d.shape, d.idle) for d in view.recent_arrivals] == [(JobShape(1, 500, 10), 2)]
    assert [d.idle for d in view.demand] == [2]


def slot(name: str, **attrs: object) -> Ad:
    base = {"Name": name, "PilotSite": "gsi", "PilotSlurmJobId": "7", "PilotWalltimeEnd": 5000,
            "TotalSlotCpus": 4, "TotalSlotMemory": 7800, "State": "Unclaimed"}
    base.update(attrs)
    return Ad(base)


def test_pilot_ads_fold_dynamic_slots_into_their_pilot() -> None:
    ads = pilot_ads_of([
        slot("slot1@pilot-gsi-7@node1", PartitionableSlot=True, Cpus=3, Memory=7288,
             DaemonStartTime=4000),
        slot("slot1_1@pilot-gsi-7@node1", DynamicSlot=True, State="Claimed", Cpus=1,
             Memory=512),
        Ad(Name="slot1@other", PilotSite="", PilotSlurmJobId="")])
    ad = ads["gsi/7"]
    assert (ad.name, ad.cpus, ad.free_cpus, ad.claimed_slots) == ("pilot-gsi-7@node1", 4, 3, 1)
    assert ad.walltime_end == 5000.0 and ad.started_at == 4000.0
    job = SiteJob("7", SiteJobState.RUNNING, 4, 7800, submitted_at=3000.0, started_at=3990.0,
                  ends_at=None)
    assert merge_pilots("gsi", [job], ads, frozenset())[0].joined_at == 4000.0


def test_an_idle_pilot_that_starts_to_offer_containers_looks_newly_idle() -> None:
    def keys(**attrs: object) -> frozenset[str]:
        return idle_ad_keys(pilot_ads_of([slot("slot1@pilot-gsi-7@node1",
                                               PartitionableSlot=True, **attrs)]))

    testing = keys(Cpus=4, Memory=7800, HasContainer=False)
    tested = keys(Cpus=4, Memory=7800, HasContainer=True)
    assert testing == {"gsi/7"} and tested == {"gsi/7 containers"}
    assert tested - testing  # the quick check's "pilot became idle": a negotiation
    assert keys(Cpus=3, Memory=7288, HasContainer=True) == frozenset()  # busy: not idle


@pytest.mark.parametrize(("slurm", "ad_attrs", "running_on", "expected"), [
    (SiteJobState.PENDING, None, (), PilotState.PENDING),
    (SiteJobState.RUNNING, None, (), PilotState.STARTING),
    (SiteJobState.ENDING, {}, (), PilotState.ENDING),
    (SiteJobState.RUNNING, {"Cpus": 4, "Memory": 7800}, (), PilotState.IDLE),
    (SiteJobState.RUNNING, {"Cpus": 3, "Memory": 7288}, (), PilotState.BUSY),
    # The schedd already runs a job there; the collector's ad lags: busy.
    (SiteJobState.RUNNING, {"Cpus": 4, "Memory": 7800}, ("pilot-gsi-7@node1",), PilotState.BUSY),
    (SiteJobState.RUNNING, {"Cpus": 4, "Memory": 7800, "Draining": True}, (),
     PilotState.DRAINING),
])
def test_pilot_state_table(slurm: SiteJobState, ad_attrs: dict[str, object] | None,
                           running_on: tuple[str, ...], expected: PilotState) -> None:
    job = SiteJob("7", slurm, 4, 7800, 1000.0, 1010.0, 4610.0)
    ad = None
    if ad_attrs is not None:
        attrs = {"Cpus": 4, "Memory": 7800, **ad_attrs}
        ad = pilot_ads_of([slot("slot1@pilot-gsi-7@node1", PartitionableSlot=True,
                                **attrs)])["gsi/7"]
    assert pilot_state(job, ad, frozenset(running_on)) is expected
    pilots = merge_pilots("gsi", [job], {"gsi/7": ad} if ad else {}, frozenset(running_on))
    assert pilots[0].state is expected and pilots[0].key == "gsi/7"


def test_a_running_pilot_without_an_ad_is_ending_past_its_stop_time() -> None:
    job = SiteJob("7", SiteJobState.RUNNING, 4, 7800, 1000.0, 1010.0, 4610.0)
    assert pilot_state(job, None, past_stop=True) is PilotState.ENDING
    # the schedd still runs a job there: busy, whatever the time
    assert pilot_state(job, None, frozenset({"pilot-gsi-7@n"}), "gsi", True) is PilotState.BUSY
    states = [merge_pilots("gsi", [job], {}, now=now, margin_s=150.0)[0].state
              for now in (4459.0, 4460.0, 4600.0)]
    assert states == [PilotState.STARTING, PilotState.ENDING, PilotState.ENDING]
    # without a known end (or a time), never guessed
    unknown = SiteJob("8", SiteJobState.RUNNING, 4, 7800, 1000.0, 1010.0, None)
    assert merge_pilots("gsi", [unknown], {}, now=9e9, margin_s=150.0)[0].state \
        is PilotState.STARTING


ENV = {"PILOT_SITE": "gsi", "PILOT_PROVISIONER_ID": "t", "PILOT_COLLECTOR": "cm.example:9618",
       "PILOT_UID_DOMAIN": "example", "PILOT_IMAGE": "/img.sif", "PILOT_TOKEN_FILE": "/t",
       "PILOT_CONDOR_CONFIG": "/c", "PILOT_WALLTIME_S": "3600", "SLURM_JOB_ID": "42",
       "SLURM_CPUS_ON_NODE": "4", "SLURM_MEM_PER_NODE": "7800"}


def test_pilot_settings_from_slurm_environment(tmp_path: object) -> None:
    p = params_from_env({**ENV, "SLURM_JOB_END_TIME": "9999"}, now=1000.0)
    assert (p.cpus, p.memory_mb, p.walltime_end, p.job_id) == (4, 7800, 9999, "42")
    assert params_from_env(ENV, now=1000.0).walltime_end == 4600
    conf = local_config(p, tmp_path)  # type: ignore[arg-type]
    assert "NUM_CPUS = 4\n" in conf and "MEMORY = 7800\n" in conf
    assert 'PilotSite = "gsi"\n' in conf and "PilotWalltimeEnd = 9999\n" in conf
    assert "CONDOR_HOST = cm.example\n" in conf
    # Payloads run through the wrapper that hides the pilot's private dirs, FS
    # authentication happens in one of them.
    assert f"USER_JOB_WRAPPER = {tmp_path}/job-wrapper.sh\n" in conf
    assert f"FS_LOCAL_DIR = {tmp_path}/fsauth\n" in conf


def test_pilot_refuses_to_start_without_its_settings() -> None:
    env = dict(ENV)
    del env["PILOT_COLLECTOR"]
    with pytest.raises(PilotError, match="PILOT_COLLECTOR"):
        params_from_env(env, now=0.0)
    with pytest.raises(PilotError, match="SLURM_CPUS_ON_NODE"):
        params_from_env({**ENV, "SLURM_CPUS_ON_NODE": "four"}, now=0.0)


SITE_YAML = """
pool: {collector: "cm:9618", provisioner_id: t, uid_domain: example}
sites:
  - name: gsi
    partition: main
    max_walltime_s: 7200
    template: gsi.sh.j2
    image: /images/pilot.sif
    xcache: "root://cache:1094"
    pilot: {cpus: 4, memory_mb: 8000, walltime_s: 3600}
    runtime: {log_dir: "/logs/pilot dir"}
"""


def test_batch_script_quotes_every_configured_value() -> None:
    config = parse_config(SITE_YAML.replace('"/logs/pilot dir"', "/logs/pilots"), "t.yaml")
    script = render_pilot_script(config, config.site("gsi"), 3600)
    assert script.startswith("#!/bin/bash\n#SBATCH --nodes=1\n")
    assert "export PILOT_XCACHE=root://cache:1094\n" in script
    assert "exec /opt/venv/bin/python -m provisioner.pilot.wrapper" in script


def test_the_quote_filter_neutralises_shell_metacharacters(tmp_path: object) -> None:
    from provisioner.pilot.script import _environment

    q = _environment(tmp_path).filters["q"]  # type: ignore[arg-type]
    assert q("a; rm -rf / $(id) `id`") == "'a; rm -rf / $(id) `id`'"
    assert q("it's") == "'it'\"'\"'s'"


def test_config_refuses_shell_metacharacters_in_paths() -> None:
    with pytest.raises(Exception, match="log_dir"):
        parse_config(SITE_YAML, "t.yaml")
    with pytest.raises(Exception, match="partition"):
        parse_config(SITE_YAML.replace("partition: main", "partition: 'main; rm -rf /'"),
                     "t.yaml")


def test_history_ad_to_job_run() -> None:
    from provisioner.pool.condor import history_constraint, job_run_of

    ad = Ad(ClusterId=12, ProcId=3, Owner="alice", JobStatus=4, RequestCpus=2,
            JobCurrentStartDate=1000, JobStartDate=900, CompletionDate=4600,
            EnteredCurrentStatus=4601, RemoteUserCpu=5000.0, RemoteSysCpu=200.0,
            MachineAttrPilotSite0="gsi", MachineAttrPilotSlurmJobId0="77")
    run = job_run_of(ad)
    assert run is not None and (run.job_id, run.site, run.pilot_job_id) == ("12.3", "gsi", "77")
    assert (run.cores, run.start_at, run.end_at, run.cpu_s) == (2, 1000.0, 4600.0, 5200.0)
    assert run.gpus == 0  # no RequestGPUs: a CPU-only job
    gpu_run = job_run_of(Ad(ad, RequestGPUs=2))
    assert gpu_run is not None and gpu_run.gpus == 2
    # removed while running: no CompletionDate, the end is when it entered that status
    removed = Ad(ad, JobStatus=3, CompletionDate=0, JobCurrentStartDate=0)
    del removed["MachineAttrPilotSite0"]
    run = job_run_of(removed)
    assert run is not None and (run.start_at, run.end_at, run.site) == (900.0, 4601.0, "")
    assert job_run_of(Ad(ClusterId=1, ProcId=0, JobStartDate=0, CompletionDate=0,
                         EnteredCurrentStatus=5)) is None  # never started
    assert history_constraint(99.7).startswith("CompletionDate > 99 ||")


def test_the_cycle_line_says_which_busy_pilots_have_no_ad() -> None:
    """A collector restarted, not yet updated: the schedd runs jobs on pilots whose ads
    are missing; the line counts them busy and says how many lack an ad."""
    import dataclasses

    from provisioner.decide.plan import plan
    from provisioner.service.loop import CycleResult, Observation, summary_line
    from tests.unit.helpers import NOW, config, memory, pilot, snap

    seen = dataclasses.replace(pilot("1", PilotState.BUSY), name="pilot-gsi-1@n1")
    unseen = pilot("2", PilotState.BUSY)  # name None: no startd ad
    s = snap(pilots=[seen, unseen])
    line = summary_line(CycleResult("test", Observation(s, {}, {}),
                                    plan(s, memory(), config(), NOW)))
    assert "gsi: 2 busy (1 busy without a startd ad)" in line, line
