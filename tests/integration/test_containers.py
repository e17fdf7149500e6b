"""Jobs in their own containers on the pilots, and jobs kept apart on a shared pilot.

The pilots' start-up test (`apptainer exec` nested in the pilot's container) passes in
the testbed, so their startds advertise container support; the example payload image
(images/payload.sif, built from images/payload.def) reaches jobs from a shared path the
sites bind into pilots (/opt/images) or by HTCondor file transfer from the submit host,
through CCB. Registry images are refused at submit. Two users' jobs on one pilot can
neither see nor signal each other's processes (each job has its own PID namespace) nor
read each other's sandbox."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import htcondor2 as htcondor
import pytest
from conftest import run, service_config, split_startd
from test_loop import (
    ALICE,
    GATE_SECONDS,
    assert_clean_completion,
    clean_pool,
    gated_jobs_left,
    jobs_left,
    submit_gated,
    submit_script,
    wait_for,
)

from provisioner.config import Config
from provisioner.pilot import testcache
from provisioner.pilot.containers import RUNNING
from provisioner.service.loop import Provisioner

PAYLOAD = "/opt/images/payload.sif"
BOB = Path("/home/bob")
GSI_ONLY = '+DesiredSites = "gsi"\nrequirements = PilotSite == "gsi"\n'
#: With container_image HTCondor takes an absolute executable path to be inside the
#: image unless told to send it.
SEND_EXE = "transfer_executable = true\n"
PROBE = ('echo "in=${APPTAINER_CONTAINER:+container} env=$EXPERIMENT_NAME/$EXPERIMENT_RELEASE '
         'tool=$(exp-info 2>&1)"\n')
#: The nodes' records (container test passes, starter answers): the pilots' scratch is
#: $TMPDIR on the nodes, the testbed's one shared /tmp.
NODE_RECORDS = Path("/tmp") / testcache.CACHE_DIR
PILOT_BOOT = ["Name", "PilotContainerTest", "HasContainer", "PilotBootMasterStart",
              "PilotBootTested"]


@pytest.fixture
def clean() -> Iterator[None]:
    clean_pool()
    yield
    clean_pool()


def submit_as(user: str, name: str, script: str, extra: str = "", check: bool = True
              ) -> str:
    """`user` submits one job running the shell `script`; output in ~user/out/name/."""
    return submit_script(name, script, extra=extra, user=user, check=check)


def drive(prov: Provisioner, clusters: list[str], timeout: float,
          left: Callable[[str], int] = jobs_left) -> None:
    """Cycles until every cluster is done (a cycle at most every 3 s); `left` counts
    a cluster's jobs left (`gated_jobs_left` to end gated jobs)."""
    prov.run_cycle("test")
    wait_for("the jobs done", lambda: all(left(c) == 0 for c in clusters)
             or (prov.run_cycle("test") and False), timeout, step=3)


def test_container_jobs_from_a_shared_path_by_transfer_and_singularity_image(
        clean: None) -> None:
    shutil.copyfile(PAYLOAD, ALICE / "payload.sif")
    prov = Provisioner(service_config())
    shared = submit_as("alice", "ctr-shared", PROBE,
                       GSI_ONLY + SEND_EXE
                       + f"container_image = {PAYLOAD}\ntransfer_container = false\n")
    sent = submit_as("alice", "ctr-sent", PROBE, GSI_ONLY + SEND_EXE
                     + "container_image = payload.sif\n")
    legacy = submit_as("alice", "ctr-legacy", PROBE,
                       GSI_ONLY + f'+SingularityImage = "{PAYLOAD}"\n')
    plain = submit_as("alice", "ctr-none", PROBE, GSI_ONLY)
    steal = submit_as("alice", "ctr-steal", (
        "for f in /tmp/pilot-*/tokens.d/pilot /var/tmp/pilot-*/tokens.d/pilot "
        "/etc/provisioner/pilot-keys/pilot-1; do cat $f >/dev/null 2>&1 && echo LEAK-$f; "
        "done\n"
        "echo procs=$(ls -d /proc/[0-9]* | wc -l)\n"),
        GSI_ONLY + SEND_EXE + f"container_image = {PAYLOAD}\ntransfer_container = false\n")
    drive(prov, [shared, sent, legacy, plain, steal], 240)
    out = (ALICE / "out" / "ctr-steal" / "0.out").read_text()
    assert "LEAK" not in out and int(out.split("procs=")[1]) <= 6, out
    for name in ("ctr-shared", "ctr-sent", "ctr-legacy"):
        out = (ALICE / "out" / name / "0.out").read_text().strip()
        assert out == "in=container env=example/2025.1 tool=example 2025.1", (name, out)
        assert_clean_completion(name, 1, outputs=False)
    out = (ALICE / "out" / "ctr-none" / "0.out").read_text()
    assert "env=/ " in out, out  # no image named, none set by the site: the pilot's own
    # What the slot that ran each container job advertised (the schedd records it in
    # the job: SYSTEM_JOB_MACHINE_ATTRS); the pilot itself may have left by now.
    ads = list(htcondor.Schedd().history(
        constraint=f"ClusterId == {shared} || ClusterId == {sent} || ClusterId == {legacy}",
        projection=["MachineAttrHasContainer0", "MachineAttrHasSIF0",
                    "MachineAttrPilotContainerTest0"]))
    assert len(ads) == 3, ads
    for ad in ads:
        assert ad.get("MachineAttrHasContainer0") is True, ad
        assert ad.get("MachineAttrHasSIF0") is True, ad
        assert str(ad.get("MachineAttrPilotContainerTest0", "")).startswith(
            "ok: apptainer exec"), ad


def test_a_registry_image_is_refused_at_submit_with_the_reason(clean: None) -> None:
    out = submit_as("alice", "ctr-docker", PROBE, "container_image = docker://debian:12\n",
                    check=False)
    assert "cannot reach a container registry" in out, out
    assert "docker://debian:12" in out, out


def test_two_users_on_one_pilot_cannot_see_or_signal_each_others_jobs(clean: None) -> None:
    prov = Provisioner(service_config())
    # alice's job runs until bob's has looked (then the test opens its gate).
    victim = submit_as("alice", "victim", 'echo mine >"$_CONDOR_SCRATCH_DIR/alice-file"\n'
                                          f"sleep {GATE_SECONDS}\necho done\n", GSI_ONLY)
    attacker = submit_as("bob", "attacker", (
        "sleep 8\n"
        f"grep -l 'sleep.{GATE_SECONDS}' /proc/[0-9]*/cmdline >/dev/null 2>&1 && echo LEAK-sees"
        " || echo hidden\n"
        f"pkill -f 'sleep {GATE_SECONDS}' 2>/dev/null && echo LEAK-killed || echo hidden\n"
        'ls "$_CONDOR_SCRATCH_DIR"/../*/alice-file >/dev/null 2>&1 && echo LEAK-sandbox '
        "|| echo hidden\n"
        "echo procs=$(ls -d /proc/[0-9]* | wc -l)\n"), GSI_ONLY)
    drive(prov, [attacker], 300)
    drive(prov, [victim], 120, left=gated_jobs_left)
    out = (BOB / "out" / "attacker" / "0.out").read_text().split()
    assert out[:3] == ["hidden", "hidden", "hidden"], out
    assert int(out[3].split("=")[1]) <= 6, out
    assert_clean_completion("victim", 1, outputs=False)
    log = (ALICE / "out" / "victim" / "job.log").read_text()
    host = [line for line in log.splitlines() if "Job executing on host" in line]
    assert host, log
    bob_log = (BOB / "out" / "attacker" / "job.log").read_text()
    assert host[0].split("host:")[1].strip() in bob_log, "the two jobs ran on different pilots"


def _gsi_payload_image() -> Config:
    """The testbed's configuration with gsi's default payload image set
    (`runtime.payload_image`: every job there runs in a container)."""
    config = service_config()
    gsi = next(s for s in config.sites if s.name == "gsi")
    runtime = gsi.runtime.model_copy(update={"payload_image": PAYLOAD})
    sites = [s.model_copy(update={"runtime": runtime}) if s.name == "gsi" else s
             for s in config.sites]
    return config.model_copy(update={"sites": sites})


def test_a_sites_default_payload_image_runs_jobs_that_name_none(clean: None) -> None:
    """`runtime.payload_image`: jobs without an image of their own run in the site's."""
    prov = Provisioner(_gsi_payload_image())
    plain = submit_as("alice", "ctr-default", PROBE, GSI_ONLY)
    drive(prov, [plain], 240)
    out = (ALICE / "out" / "ctr-default" / "0.out").read_text().strip()
    assert out == "in=container env=example/2025.1 tool=example 2025.1", out


def test_a_job_edited_to_a_registry_image_is_held_with_the_reason(clean: None) -> None:
    """Past the submit check (condor_qedit): the schedd's periodic hold catches it."""
    cluster = submit_as("alice", "ctr-edited", PROBE, "hold = true\n")
    run(["condor_qedit", cluster, "SingularityImage", '"docker://debian:12"'], user="alice")
    run(["condor_release", cluster], user="alice")

    def reason() -> str:
        ads = htcondor.Schedd().query(constraint=f"ClusterId == {cluster}",
                                      projection=["JobStatus", "HoldReason"])
        return str(ads[0].get("HoldReason", "")) if ads and ads[0]["JobStatus"] == 5 else ""

    # Released, then held again by SYSTEM_PERIODIC_HOLD (every PERIODIC_EXPR_INTERVAL).
    held = wait_for("the job held again", lambda: "registry" in reason() and reason(), 150,
                    step=3)
    assert "docker://debian:12" in str(held) and "cannot reach a container registry" in str(
        held), held


FROM_RECORD = "the starter's capabilities: this node's record"


def _ran_on(cluster: str) -> tuple[str, str]:
    """(pilot name, node) of the pilot that ran the cluster's one job."""
    ads = htcondor.Schedd().history(f"ClusterId == {cluster}", ["LastRemoteHost"], 1)
    host = str(next(iter(ads))["LastRemoteHost"])  # slot1_1@pilot-gsi-7@<identity>.gsi-n1
    return split_startd(host.split("@", 1)[1])


def test_the_next_pilot_on_a_node_takes_the_starters_answer_from_its_record(
        clean: None) -> None:
    """The startd's capability query (two nested containers in the starter) is answered
    from the node's record once a pilot there has asked the real starter: a container
    job still matches and runs in its container on the next pilot there."""
    prov = Provisioner(service_config())
    first_on: dict[str, str] = {}
    for i in range(3):  # two gsi nodes: by the third pilot two have shared one
        name = f"ctr-record-{i}"
        cluster = submit_as("alice", name, PROBE, GSI_ONLY + SEND_EXE
                            + f"container_image = {PAYLOAD}\ntransfer_container = false\n")
        drive(prov, [cluster], 180)
        assert "in=container" in (ALICE / "out" / name / "0.out").read_text()
        pilot, node = _ran_on(cluster)
        site, job = pilot.removeprefix("pilot-").rsplit("-", 1)
        log = Path(f"/var/log/pilots/htcpilot-testbed-{site}-{job}.out").read_text()
        clean_pool()  # the next job gets a new pilot
        if node not in first_on:
            first_on[node] = pilot
            # the first pilot on this node in this test: the record may hold the
            # answer already (an earlier test's pilot), else this one kept it
            assert FROM_RECORD in log or "the starter's capabilities kept" in log, log
            continue
        assert FROM_RECORD in log, (first_on, pilot, log)
        # the real starter never answered the capability query here: it would have
        # written its log of the launch tests (StarterLog.testing)
        assert not list(Path("/var/log/pilots").glob(f"{pilot}@*/StarterLog.testing"))
        return
    raise AssertionError(f"no two pilots on one node: {first_on}")


# --- the start-up test before or beside the master --------------------------------------


def _cold_nodes() -> None:
    """Every node as if no pilot had run there: no pass, no starter answer kept."""
    for record in NODE_RECORDS.glob("container-test-*.json"):
        record.unlink()


def _running(cluster: str) -> dict[str, object] | None:
    """The cluster's one job while it runs: where, and since when."""
    ads = htcondor.Schedd().query(constraint=f"ClusterId == {cluster} && JobStatus == 2",
                                  projection=["RemoteHost", "JobCurrentStartDate"])
    return dict(ads[0]) if ads and ads[0].get("JobCurrentStartDate") else None


def _pilot_ad(job: dict[str, object]) -> dict[str, object] | None:
    """The partitionable slot ad of the pilot a running `job` is on."""
    pilot = str(job["RemoteHost"]).split("@", 1)[1]  # slot1_1@pilot-gsi-7@gsi-n1
    ads = htcondor.Collector().query(htcondor.AdType.Startd,
                                     constraint=f'Name == "slot1@{pilot}"',
                                     projection=PILOT_BOOT)
    return dict(ads[0]) if ads else None


def _tested(job: dict[str, object]) -> dict[str, object] | None:
    """The pilot's ad once its start-up test has ended (None while it runs)."""
    ad = _pilot_ad(job)
    return ad if ad and not str(ad.get("PilotContainerTest", RUNNING)).startswith(
        RUNNING) else None


def _processes(match: Callable[[list[bytes], list[bytes]], bool]) -> list[int]:
    """Processes whose (argv, environment) `match`: every testbed host shares this PID
    namespace."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if match(argv, env):
            found.append(int(entry.name))
    return found


def _wrapper_with_its_master(site: str) -> int | None:
    """The pid of the `site` pilot's wrapper once its master runs (None before)."""
    wrappers = _processes(lambda argv, env: b"provisioner.pilot.wrapper" in argv
                          and f"PILOT_SITE={site}".encode() in env)
    masters = _processes(lambda argv, env: argv[0].endswith(b"condor_master") and any(
        e.startswith(f"CONDOR_CONFIG=/tmp/pilot-{site}-".encode()) for e in env))
    return wrappers[0] if len(wrappers) == 1 and masters else None


@contextmanager
def _held(pid: int) -> Iterator[None]:
    """The process stopped (SIGSTOP) until the block ends."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_cold_pilot_runs_a_plain_job_before_its_container_test_ended_then_containers(
        clean: None) -> None:
    """No pass on the node, no payload image: the master starts before the test, a plain
    job runs while the test has not ended; once it passed the startd is reconfigured,
    advertises containers, and a container job runs. The plain job runs on through the
    reconfig. The wrapper (whose thread runs the test once the startd is ready) is held
    from its master's start until the plain job runs: the order does not hang on how
    fast the negotiation is against the test."""
    _cold_nodes()
    prov = Provisioner(service_config())
    plain = submit_gated("ctr-cold-plain", 1, GSI_ONLY)
    container = submit_as("alice", "ctr-cold", PROBE, GSI_ONLY + SEND_EXE
                          + f"container_image = {PAYLOAD}\ntransfer_container = false\n")
    wrapper = wait_for("the pilot's master started", lambda: _wrapper_with_its_master("gsi")
                       or (prov.tick() and None), 180, step=0.1)
    assert isinstance(wrapper, int)
    with _held(wrapper):
        job = wait_for("the plain job running", lambda: _running(plain)
                       or (prov.tick() and None), 120, step=0.5)
        assert isinstance(job, dict)
        ad = _pilot_ad(job)
        assert ad is not None and str(ad["PilotContainerTest"]).startswith(RUNNING), ad
        assert ad.get("HasContainer") is not True, ad  # containers never before the test
    ad = wait_for("its pilot's container test ended", lambda: _tested(job), 120, step=0.5)
    assert isinstance(ad, dict)
    assert str(ad["PilotContainerTest"]).startswith("ok: apptainer exec"), ad
    assert "cached" not in str(ad["PilotContainerTest"]), ad
    tested, started = float(ad["PilotBootTested"]), float(job["JobCurrentStartDate"])
    assert tested > float(ad["PilotBootMasterStart"]), ad  # beside the master
    assert started < tested, (job, ad)  # the plain job did not wait for the test
    wait_for("its pilot advertising containers", lambda: (_pilot_ad(job) or {}).get(
        "HasContainer") is True, 60, step=0.5)
    drive(prov, [container], 180)
    out = (ALICE / "out" / "ctr-cold" / "0.out").read_text().strip()
    assert out == "in=container env=example/2025.1 tool=example 2025.1", out
    ran = next(iter(htcondor.Schedd().history(
        f"ClusterId == {container}", ["MachineAttrPilotContainerTest0"], 1)))
    assert str(ran.get("MachineAttrPilotContainerTest0", "")).startswith("ok: "), ran
    # the reconfig did not touch the job that ran through it
    wait_for("the plain job done", lambda: gated_jobs_left(plain) == 0, 90, step=1)
    assert_clean_completion("ctr-cold-plain", 1)


def test_a_cold_pilot_of_a_site_with_a_payload_image_tests_before_any_job(
        clean: None) -> None:
    """With a payload image every job runs in a container: the test runs before the
    master even on a node without a pass, and no job starts before it ended."""
    _cold_nodes()
    prov = Provisioner(_gsi_payload_image())
    plain = submit_gated("ctr-cold-payload", 1, GSI_ONLY)
    prov.run_cycle("test")
    job = wait_for("the job running", lambda: _running(plain)
                   or (prov.run_cycle("test") and None), 180, step=1)
    assert isinstance(job, dict)
    ad = _tested(job)
    assert ad is not None, "the job runs on a pilot whose container test had not ended"
    assert str(ad["PilotContainerTest"]).startswith("ok: apptainer exec"), ad
    assert "cached" not in str(ad["PilotContainerTest"]), ad
    assert float(ad["PilotBootTested"]) <= float(ad["PilotBootMasterStart"]), ad
    assert float(job["JobCurrentStartDate"]) >= int(float(ad["PilotBootTested"])), (job, ad)
    wait_for("the job done", lambda: gated_jobs_left(plain) == 0, 90, step=1)
