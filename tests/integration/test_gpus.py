"""GPUs end to end: a job that asks for a GPU gets a pilot at the site with GPUs (gsi:
SLURM counts 2 per node, the pilots' HTCondor simulates them), the pilot asks SLURM for
exactly the GPU its job needs (`--gres=gpu:1`), its startd advertises that one GPU, and
the job runs with it assigned."""

from __future__ import annotations

import json
from pathlib import Path

import htcondor2 as htcondor
from conftest import slurm
from servicectl import submissions_busy
from test_loop import (  # noqa: F401 (clean, service: fixtures)
    ALICE,
    GATE_SECONDS,
    assert_clean_completion,
    clean,
    gated_jobs_left,
    service,
    submit_script,
    wait_for,
)

#: A GPU job: says which GPU it was given, then runs until the test opens its gate.
SCRIPT = f"""echo "assigned=$_CONDOR_AssignedGPUs visible=${{CUDA_VISIBLE_DEVICES:-none}}"
sleep {GATE_SECONDS}
echo job-$1-ok
"""


def gsi_pilots_gres() -> list[str]:
    doc = json.loads(slurm("gsi", ["squeue", "--json", "-u", "pilot"]).stdout)
    return [str(j.get("tres_per_node") or j.get("tres_req_str") or "") for j in doc["jobs"]]


def gpu_startds() -> list[dict]:
    ads = htcondor.Collector().query(
        htcondor.AdType.Startd, constraint='PilotSite =?= "gsi" && SlotType =?= "Partitionable"',
        projection=["Name", "TotalSlotGPUs", "DetectedGPUs", "GPUs"])
    return [dict(a) for a in ads]


def test_a_gpu_job_gets_a_pilot_with_one_gpu_and_runs_with_it(service: Path) -> None:  # noqa: F811
    cluster = submit_script("gpu", SCRIPT, 1, extra="request_gpus = 1\n")
    gres = wait_for("a gsi pilot asking for a GPU", lambda: [g for g in gsi_pilots_gres()
                                                            if "gpu" in g], 60)
    assert gres == ["gres/gpu:1"] or all("gpu:1" in g or "gpu=1" in g for g in gres), gres
    ads = wait_for("the pilot's startd with its GPU", gpu_startds, 120)
    assert [a.get("TotalSlotGPUs") for a in ads] == [1], ads
    wait_for("the GPU job done", lambda: gated_jobs_left(cluster) == 0, 180, step=2)
    assert_clean_completion("gpu", 1, outputs=False)
    out = (ALICE / "out" / "gpu" / "0.out").read_text()
    assert "assigned=GPU-" in out and "visible=none" not in out, out
    assert out.strip().endswith("job-0-ok"), out


def running(cluster: str) -> int:
    return len(htcondor.Schedd().query(f"ClusterId == {cluster} && JobStatus == 2",
                                       projection=["ProcId"]))


def gpu_pilot_of(ad: dict) -> bool:  # type: ignore[type-arg]
    """Whether the job ran on a pilot with GPUs: only those advertise RoomForCPUOnlyJobs
    (condor_config/pilot.conf), recorded in the job by job_machine_attrs. The job ad of
    one that ran elsewhere holds the attribute too, as undefined: only a boolean counts."""
    return isinstance(ad.get("MachineAttrRoomForCPUOnlyJobs0"), bool)

def test_while_gpu_jobs_wait_no_cpu_only_job_starts_on_a_gpu_pilot(
        service: Path) -> None:  # noqa: F811
    """CPU-only jobs first in the queue, then GPU jobs: the GPU pilot is sized to the GPU
    jobs (1 core + 1 GPU each) and keeps those cores for them (its START). Frankfurt's
    submissions fail (busy: its job_submit.lua, a test switch) until the GPU pilot has
    started two jobs, so when it joins the CPU-only jobs wait before the GPU jobs with
    nowhere else to go: it must
    still start the GPU jobs and no CPU-only job. Then every job completes, the GPU jobs
    with their GPU. With the START clause switched off (pilot.conf's GPU block,
    ``PILOT_GPU_START = True``) the pilot takes two CPU-only jobs and this test fails
    (checked)."""
    attrs = "job_machine_attrs = RoomForCPUOnlyJobs PilotSlurmJobId\n"
    with submissions_busy("frankfurt"):
        cpu = submit_script("cpuonly", f"sleep {GATE_SECONDS}; echo job-$1-ok\n", 4,
                            extra=attrs)
        gpu = submit_script("gpujobs", SCRIPT, 2, extra="request_gpus = 1\n" + attrs)
        wait_for("two jobs started on the GPU pilot",
                 lambda: running(cpu) + running(gpu) >= 2, 180, step=1)
        assert running(cpu) == 0, "a CPU-only job started on the GPU pilot"
    wait_for("every job done", lambda: gated_jobs_left(cpu) + gated_jobs_left(gpu) == 0, 300,
             step=2)
    history = [dict(a) for a in htcondor.Schedd().history(
        constraint=f"ClusterId == {cpu} || ClusterId == {gpu}",
        projection=["ClusterId", "ProcId", "RequestGPUs", "MachineAttrRoomForCPUOnlyJobs0",
                    "MachineAttrPilotSlurmJobId0", "NumJobStarts"])]
    assert len(history) == 6, history
    on_gpu_pilots = [a for a in history if a["ClusterId"] == int(cpu) and gpu_pilot_of(a)]
    assert on_gpu_pilots == [], on_gpu_pilots
    assert all(gpu_pilot_of(a) for a in history if a["ClusterId"] == int(gpu)), history
    assert all(a.get("NumJobStarts", 1) == 1 for a in history), history
    assert_clean_completion("cpuonly", 4)
    assert_clean_completion("gpujobs", 2, outputs=False)
