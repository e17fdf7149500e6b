"""Jobs that fail at start are held, with the reason, and then keep no pilot.

Run with the provisioner as a service. Three causes, each a job of alice's:
- a truncated SIF (container_image, sent by HTCondor file transfer): the starter's
  container test fails and HTCondor sends the job back to idle (VacateReasonCode 1007);
  the pool's policy (condor_config/central-manager.conf) holds it after its third failed
  start, naming the image and Apptainer's error;
- an input file removed after submit (condor_submit refuses a missing one): the shadow
  cannot send it, HTCondor holds the job itself (HoldReasonCode 13) naming the file;
- an executable that is not on the worker (transfer_executable = false): the starter
  runs the pilots' job wrapper, which finds no executable and says so in HTCondor's
  wrapper error file; the starter fails the start with that message (1007), and the
  pool's policy holds the job after its third failed start, naming the path.
Each is held within 5 minutes of its submission after at most 3 starts, a failed start
within 3 minutes of its first start; the service reports it once with its cause, never
as stuck; no pilot is left in SLURM afterwards. HTCondor 23.9 reports a 1007 start as
executing a second before it fails (NumJobStarts counts it).

The pool is quiet: nothing else happens in it. HTCondor 23.9's schedd keeps its list of
runnable jobs until a job goes idle or changes priority (or 20 minutes pass: qmgmt.cpp,
PrioRecRebuildMaxInterval); a job whose cool-down ends is not offered to the negotiator
before then, unless the service passes the end on (`provisioner.pool.cooldowns`). To see
that matter: make `Nudger.nudge` return [] at once and rerun test_a_truncated_image: it
is not held within 3 minutes of its first start (its second start comes up to 20
minutes after the first).

To see the pool's safeguard matter: comment out the SYSTEM_PERIODIC_HOLD_NAMES line of
the ProvisionerFailedStarts block in /etc/condor/config.d/20-central-manager.conf,
condor_reconfig, and rerun test_a_truncated_image: it is never held (times out) and
NumShadowStarts grows past 3.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import htcondor2 as htcondor
import pytest
from conftest import run
from servicectl import Service, service_dir, write_config
from test_loop import ALICE, all_pilot_jobs, clean_pool, submit_script, wait_for

PAYLOAD = Path("/opt/images/payload.sif")
GSI_ONLY = '+DesiredSites = "gsi"\nrequirements = PilotSite == "gsi"\n'
HELD_WITHIN_S = 300
#: a job that fails at start: from its first start to its hold, in a quiet pool
FAILED_HELD_WITHIN_S = 180
#: idle pilots are flagged, released a cycle later, and leave SLURM once drained
RELEASED_WITHIN_S = 180


@pytest.fixture
def svc() -> Iterator[Service]:
    clean_pool()
    directory = service_dir()
    service = Service(write_config(directory), directory / "service.log")
    service.start()
    yield service
    service.stop()
    print(f"--- service log ({service.log}) ---\n{service.text()}")
    clean_pool()


def job_ad(cluster: str) -> dict[str, object]:
    ads = htcondor.Schedd().query(
        constraint=f"ClusterId == {cluster}",
        projection=["JobStatus", "HoldReason", "HoldReasonCode", "HoldReasonSubCode",
                    "NumShadowStarts", "NumJobStarts", "NumJobCoolDowns"])
    return dict(ads[0]) if ads else {}


def wait_held(logfile: Path, timeout: float) -> float | None:
    """Until the job's event log has a hold event (012) other than its hold at submit
    (HoldReasonCode 15, SubmittedOnHold); the seconds from its first start (execute
    event) to the hold, None if it never started."""
    deadline = time.time() + timeout
    events = htcondor.JobEventLog(str(logfile))
    started: float | None = None
    while time.time() < deadline:
        for event in events.events(stop_after=min(5, max(1, int(deadline - time.time())))):
            if event.type == htcondor.JobEventType.EXECUTE and started is None:
                started = float(event.timestamp)
            if event.type == htcondor.JobEventType.JOB_HELD and \
                    event.get("HoldReasonCode") != 15:
                return None if started is None else float(event.timestamp) - started
    raise AssertionError(f"not held within {timeout:.0f} s: {logfile.read_text()}")


def assert_held_then_released(svc: Service, cluster: str, name: str, max_starts: int
                              ) -> dict[str, object]:
    start_to_hold = wait_held(ALICE / "out" / name / "job.log", HELD_WITHIN_S)
    print(f"{name}: held {start_to_hold} s after its first start")
    if max_starts > 1:  # failed starts, retried: held on time in a quiet pool
        assert start_to_hold is not None and start_to_hold <= FAILED_HELD_WITHIN_S, \
            (start_to_hold, Path(ALICE / "out" / name / "job.log").read_text())
    ad = job_ad(cluster)
    assert ad["JobStatus"] == 5, ad
    assert 1 <= int(ad.get("NumShadowStarts", 0)) <= max_starts, ad  # type: ignore[call-overload]
    # condor_q -hold shows the user the same reason
    shown = run(["condor_q", "-hold", cluster, "-af", "HoldReason"], user="alice").stdout
    assert shown.strip() == str(ad["HoldReason"]), (shown, ad)
    wait_for("no pilot left in SLURM", lambda: not any(all_pilot_jobs().values()),
             RELEASED_WITHIN_S, step=3)
    # the service's own job (provisioner.pool.cooldowns): one at most, held
    own = htcondor.Schedd().query(constraint="ProvisionerCoolDownNudge =!= undefined",
                                  projection=["JobStatus", "Owner"])
    assert len(own) <= 1 and all(a["JobStatus"] == 5 for a in own), own
    log = svc.text()
    assert "Traceback" not in log
    assert "stuck: matches no pilot" not in log and "no longer stuck" not in log, log
    return ad


def test_a_truncated_image_is_held_after_three_failed_starts_naming_it(svc: Service
                                                                       ) -> None:
    broken = ALICE / "broken.sif"
    data = PAYLOAD.read_bytes()
    broken.write_bytes(data[: len(data) // 2])
    os.chown(broken, ALICE.stat().st_uid, ALICE.stat().st_gid)
    cluster = submit_script("broken-image", "echo never\n", extra=GSI_ONLY
                            + "transfer_executable = true\ncontainer_image = broken.sif\n")
    ad = assert_held_then_released(svc, cluster, "broken-image", max_starts=3)
    reason = str(ad["HoldReason"])
    assert reason.startswith(f"container image {broken} could not be used: "), ad
    assert "3 failed starts" in reason, ad
    assert ad["HoldReasonCode"] == 26 and ad["HoldReasonSubCode"] == 1007, ad
    assert ad.get("NumJobCoolDowns") == 3, ad
    assert ad.get("NumJobStarts") == ad.get("NumShadowStarts"), ad  # executing, then failed
    lines = [ln for ln in svc.text().splitlines() if "failed to start" in ln]
    assert len(lines) == 1 and "Singularity test failed" in lines[0], lines


def test_an_input_file_removed_after_submit_is_held_naming_it(svc: Service) -> None:
    missing = ALICE / "gone-input.dat"
    missing.write_text("data\n")
    cluster = submit_script("gone-input", "cat gone-input.dat\n", extra=GSI_ONLY
                            + f"transfer_input_files = {missing}\nhold = true\n")
    missing.unlink()
    run(["condor_release", cluster], user="alice")
    ad = assert_held_then_released(svc, cluster, "gone-input", max_starts=1)
    assert str(missing) in str(ad["HoldReason"]), ad
    assert ad["HoldReasonCode"] == 13, ad  # TransferInputError: HTCondor's own hold


def test_an_executable_not_on_the_worker_is_held_naming_it(svc: Service) -> None:
    gone = ALICE / "gone-exe.sh"
    cluster = submit_script("gone-exe", "echo never\n", extra=GSI_ONLY
                            + "transfer_executable = false\nhold = true\n")
    # the submit file names ~alice/gone-exe.sh, not sent: absent on the worker once gone
    gone.unlink()
    run(["condor_release", cluster], user="alice")
    ad = assert_held_then_released(svc, cluster, "gone-exe", max_starts=3)
    reason = str(ad["HoldReason"])
    assert reason.startswith(f"the job could not be started: executable {gone} does not "
                             "exist on this worker node (3 failed starts"), ad
    # the job wrapper's error file made it a starter error: the pool's policy held it
    assert ad["HoldReasonCode"] == 26 and ad["HoldReasonSubCode"] == 1007, ad
    lines = [ln for ln in svc.text().splitlines() if "failed to start" in ln]
    assert len(lines) == 1 and str(gone) in lines[0], lines
