"""GPUs end to end, with plain data: the site's GPU settings, the sbatch request, the
pilot's batch script and condor config, squeue and slot ads read back, the prototype ad,
and plan() putting GPU jobs on GPU pilots only."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.config import ConfigError, PilotShapeConfig, SiteConfig, parse_config
from provisioner.decide.plan import plan
from provisioner.model import Demand, JobShape, PilotState, Submit
from provisioner.pilot.script import render_pilot_script
from provisioner.pool.classads import pilot_ads_of
from provisioner.pool.prototype import SiteMatcher
from provisioner.service.loop import merge_pilots
from provisioner.sites import make_backend
from provisioner.sites.base import PilotRequest, SiteJob, SiteJobState
from provisioner.sites.slurm_cli import SlurmCliBackend
from provisioner.sites.slurm_jobs import parse_squeue
from tests.unit.helpers import NOW, config, memory, pilot, site, snap

PILOT_CONF = Path(__file__).resolve().parents[2] / "condor_config" / "pilot.conf"


class Ad(dict):  # type: ignore[type-arg]
    """A ClassAd stand-in: attribute values already evaluated."""

    def eval(self, attr: str) -> object:
        return self[attr]


def gpu_site(name: str = "gpu", gpus: int = 4, cpus: int = 16, **update: object) -> SiteConfig:
    s = site(name, cpus=cpus)
    return s.model_copy(update={"pilot": PilotShapeConfig(
        cpus=cpus, memory_mb=64000, memory_per_cpu_mb=4000, walltime_s=86400,
        shutdown_margin_s=600, gpus=gpus), **update})


SITE_YAML = """
pool: {collector: "cm:9618", provisioner_id: t, uid_domain: example}
sites:
  - name: gpu
    max_walltime_s: 7200
    template: gsi.sh.j2
    image: /images/pilot.sif
    pilot: {cpus: 8, memory_mb: 32000, walltime_s: 3600, gpus: 2}
    runtime: {gpu_discovery_extra: "-simulate:2,4"}
    gpu_type: a100
"""


# --- the request ------------------------------------------------------------------


def request(gpus: int) -> PilotRequest:
    return PilotRequest(cpus=4, memory_mb=8000, walltime_s=3600, shutdown_margin_s=120,
                        script="#!/bin/bash\n", gpus=gpus)


@pytest.mark.parametrize(("form", "gpu_type", "gpus", "expected"), [
    ("gres", None, 0, None),
    ("gpus", "a100", 0, None),
    ("gres", None, 1, "--gres=gpu:1"),
    ("gres", None, 3, "--gres=gpu:3"),
    ("gres", "a100", 2, "--gres=gpu:a100:2"),
    ("gpus", None, 1, "--gpus=1"),
    ("gpus", None, 4, "--gpus=4"),
    ("gpus", "h100.80g", 2, "--gpus=h100.80g:2"),
])
def test_sbatch_asks_for_the_pilots_gpus_in_the_sites_form(
        form: str, gpu_type: str | None, gpus: int, expected: str | None) -> None:
    b = SlurmCliBackend(name="gpu", provisioner_id="t", executor=None,  # type: ignore[arg-type]
                        gpu_request=form, gpu_type=gpu_type)
    argv = b.sbatch_argv(request(gpus))
    asked = [a for a in argv if a.startswith(("--gres", "--gpus"))]
    assert asked == ([expected] if expected else [])


def test_the_backend_takes_the_gpu_form_from_the_site_config() -> None:
    cfg = parse_config(SITE_YAML.replace("gpu_type: a100", "gpu_type: a100\n    "
                                         "gpu_request: gpus"), "t.yaml")
    backend = make_backend(cfg.site("gpu"), cfg.pool)
    assert isinstance(backend, SlurmCliBackend)
    assert "--gpus=a100:2" in backend.sbatch_argv(request(2))


@pytest.mark.parametrize(("old", "new", "field"), [
    ("gpu_type: a100", "gpu_type: 'a100:2,mps'", "sites[0].gpu_type"),
    ("gpu_type: a100", "gpu_type: 'a100 --wrap=id'", "sites[0].gpu_type"),
    ("gpu_type: a100", "gpu_request: cuda", "sites[0].gpu_request"),
    ('"-simulate:2,4"', '"-simulate:2,4; rm -rf ~"', "sites[0].runtime.gpu_discovery_extra"),
    ('"-simulate:2,4"', '"-simulate:9,4"', "sites[0].runtime.gpu_discovery_extra"),
    ('"-simulate:2,4"', '"$(touch /tmp/x)"', "sites[0].runtime.gpu_discovery_extra"),
    ("gpus: 2}", "gpus: -1}", "sites[0].pilot.gpus"),
    ("gpus: 2}", "gpus: 0}", "sites[0].gpu_type"),
])
def test_bad_gpu_settings_are_refused_naming_the_field(old: str, new: str, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(SITE_YAML.replace(old, new, 1), "t.yaml")
    assert "t.yaml:" in str(err.value) and field in str(err.value)


def test_gpu_discovery_options_are_normalised_and_simulation_is_recognised() -> None:
    cfg = parse_config(SITE_YAML.replace('"-simulate:2,4"', '"  -extra   -simulate:2,4,4,1 "'),
                       "t.yaml")
    rt = cfg.site("gpu").runtime
    assert rt.gpu_discovery_extra == "-extra -simulate:2,4,4,1" and rt.simulates_gpus
    assert not parse_config(SITE_YAML.replace('"-simulate:2,4"', '"-uuid"'),
                            "t.yaml").site("gpu").runtime.simulates_gpus


# --- the pilot: batch script and condor config --------------------------------------


def test_the_batch_script_exports_the_gpus_into_the_container() -> None:
    cfg = parse_config(SITE_YAML, "t.yaml")
    script = render_pilot_script(cfg, cfg.site("gpu"), 3600, gpus=2)
    assert "export PILOT_GPUS=2\n" in script
    assert "export PILOT_GPU_DISCOVERY_EXTRA=-simulate:2,4\n" in script
    assert 'export APPTAINERENV_PILOT_GPUS="$PILOT_GPUS"\n' in script
    assert 'export APPTAINERENV_CUDA_VISIBLE_DEVICES="$CUDA_VISIBLE_DEVICES"' in script
    assert "APPTAINER_NV" not in script  # simulated: no driver to bind


def test_real_gpus_bind_the_driver_and_a_cpu_pilot_exports_nothing_else() -> None:
    cfg = parse_config(SITE_YAML.replace('"-simulate:2,4"', '""'), "t.yaml")
    assert "export APPTAINER_NV=1\n" in render_pilot_script(cfg, cfg.site("gpu"), 3600, 1)
    cpu = render_pilot_script(cfg, cfg.site("gpu"), 3600, gpus=0)
    assert "export PILOT_GPUS=0\n" in cpu
    assert "export APPTAINERENV_" not in cpu and "PILOT_GPU_DISCOVERY_EXTRA" not in cpu


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("gpus", [0, 2])
def test_the_rendered_script_is_valid_bash(gpus: int) -> None:
    cfg = parse_config(SITE_YAML, "t.yaml")
    script = render_pilot_script(cfg, cfg.site("gpu"), 3600, gpus=gpus)
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_pilot_conf_turns_gpu_discovery_on_only_for_a_pilot_with_gpus() -> None:
    text = PILOT_CONF.read_text()
    block = text[text.index("PILOT_GPUS = $ENV(PILOT_GPUS:0)"):]
    block = block[:block.index("endif") + len("endif")]
    lines = [line.strip() for line in block.splitlines()]
    assert lines == ["PILOT_GPUS = $ENV(PILOT_GPUS:0)", "PILOT_GPU_START = True",
                     "if $(PILOT_GPUS)",
                     "use feature : GPUs",
                     "GPU_DISCOVERY_EXTRA = $(GPU_DISCOVERY_EXTRA) "
                     "$ENV(PILOT_GPU_DISCOVERY_EXTRA:)",
                     "SLOT_TYPE_1 = $(SLOT_TYPE_1), gpus=$(PILOT_GPUS)",
                     "PILOT_GPU_START = $(PILOT_GPU_JOBS_FIRST)",
                     "RANK = (TARGET.RequestGPUs ?: 0)",
                     "STARTD_ATTRS = $(STARTD_ATTRS) RoomForCPUOnlyJobs", "endif"]
    # the partitionable slot it extends comes first
    assert text.index("SLOT_TYPE_1 = cpus=100%") < text.index("if $(PILOT_GPUS)")


# --- read back: squeue and slot ads ---------------------------------------------------


def squeue_job(job_id: int, state: str, **extra: object) -> dict:  # type: ignore[type-arg]
    job = {"job_id": job_id, "name": "htcpilot-t", "job_state": [state],
           "cpus": {"set": True, "number": 4},
           "memory_per_node": {"set": True, "number": 8000},
           "submit_time": {"set": True, "number": 1000},
           "start_time": {"set": True, "number": 1010},
           "end_time": {"set": True, "number": 4610}}
    job.update(extra)
    return job


def test_squeue_gpus_of_pending_and_running_pilots() -> None:
    doc = {"jobs": [
        squeue_job(1, "PENDING", tres_req_str="cpu=4,mem=8000M,node=1,gres/gpu=2"),
        squeue_job(2, "RUNNING", tres_req_str="cpu=4,gres/gpu=2",
                   tres_alloc_str="cpu=4,mem=8000M,node=1,gres/gpu=2,gres/gpu:a100=2"),
        squeue_job(3, "PENDING", tres_per_node="gres/gpu:a100:3"),
        squeue_job(4, "PENDING", tres_per_job="gres/gpu:1"),
        squeue_job(5, "RUNNING", tres_alloc_str="cpu=4,mem=8000M,node=1,billing=4"),
        squeue_job(6, "RUNNING", tres_per_node="gres/gpu:a100:3", tres_req_str=""),
    ]}
    gpus = {j.job_id: j.gpus for j in parse_squeue(doc, "htcpilot-t")}
    assert gpus == {"1": 2, "2": 2, "3": 3, "4": 1, "5": 0, "6": 3}


def slot(name: str, **attrs: object) -> Ad:
    base = {"Name": name, "PilotSite": "gpu", "PilotSlurmJobId": "7", "PilotWalltimeEnd": 5000,
            "TotalSlotCpus": 4, "TotalSlotMemory": 8000, "State": "Unclaimed"}
    base.update(attrs)
    return Ad(base)


def pslot(**attrs: object) -> Ad:
    return slot("slot1@pilot-gpu-7@node1", PartitionableSlot=True, **attrs)


def dslot(i: int, **attrs: object) -> Ad:
    return slot(f"slot1_{i}@pilot-gpu-7@node1", DynamicSlot=True, State="Claimed", **attrs)


@pytest.mark.parametrize(("ads", "gpus", "free"), [
    # a CPU pilot advertises no GPU attribute at all
    ([pslot(Cpus=4, Memory=8000)], 0, 0),
    ([pslot(Cpus=4, Memory=8000, GPUs=2, TotalSlotGPUs=2)], 2, 2),
    ([pslot(Cpus=3, Memory=7000, GPUs=1, TotalSlotGPUs=2),
      dslot(1, Cpus=1, Memory=1000, GPUs=1)], 2, 1),
    # the partitionable slot's ad lags behind a new dynamic slot: its GPU is not free
    ([pslot(Cpus=4, Memory=8000, GPUs=2, TotalSlotGPUs=2),
      dslot(1, Cpus=1, Memory=1000, GPUs=1)], 2, 1),
    # an older startd without TotalSlotGPUs
    ([pslot(Cpus=4, Memory=8000, GPUs=2)], 2, 2),
    ([pslot(Cpus=2, Memory=6000, GPUs=0, TotalSlotGPUs=2),
      dslot(1, Cpus=1, Memory=1000, GPUs=1), dslot(2, Cpus=1, Memory=1000, GPUs=1)], 2, 0),
])
def test_slot_ads_give_the_pilots_gpus_and_its_free_gpus(ads: list[Ad], gpus: int,
                                                         free: int) -> None:
    ad = pilot_ads_of(ads)["gpu/7"]
    assert (ad.gpus, ad.free_gpus) == (gpus, free)


def test_a_pilot_whose_gpu_is_claimed_is_busy_and_a_pending_one_has_slurms_gpus() -> None:
    running = SiteJob("7", SiteJobState.RUNNING, 4, 8000, 1000.0, 1010.0, 4610.0, gpus=2)
    pending = SiteJob("8", SiteJobState.PENDING, 4, 8000, 1000.0, None, None, gpus=2)
    # a job holds one GPU (and, oddly, nothing else the ad shows as used)
    ads = pilot_ads_of([pslot(Cpus=4, Memory=8000, GPUs=1, TotalSlotGPUs=2)])
    p7, p8 = merge_pilots("gpu", [running, pending], ads)
    assert (p7.state, p7.gpus, p7.free_gpus) == (PilotState.BUSY, 2, 1)
    assert (p8.state, p8.gpus, p8.free_gpus) == (PilotState.PENDING, 2, 2)
    idle = merge_pilots("gpu", [running], pilot_ads_of([pslot(Cpus=4, Memory=8000, GPUs=2,
                                                              TotalSlotGPUs=2)]))
    assert idle[0].state is PilotState.IDLE and idle[0].free_gpus == 2


# --- the prototype ad --------------------------------------------------------------

#: What condor_submit adds for request_gpus (and a vanilla job's usual clauses).
GPU_REQ = ('(TARGET.Arch == "X86_64") && (TARGET.OpSys == "LINUX") && '
           '(TARGET.Disk >= RequestDisk) && (TARGET.Memory >= RequestMemory) && '
           '(TARGET.GPUs >= RequestGPUs) && (TARGET.HasFileTransfer)')


def test_the_gpu_sites_prototype_matches_a_gpu_job_and_a_cpu_sites_does_not() -> None:
    cfg = config(site("cpu"), gpu_site("gpu", gpus=2))
    shape = JobShape(1, 2000, disk_kb=1000, gpus=1, requirements=GPU_REQ)
    [d] = list(SiteMatcher(cfg).annotate([Demand(shape, 3)]))
    assert d.sites == frozenset({"gpu"})
    assert SiteMatcher(cfg).ads["cpu"].get("GPUs") is None  # like a real CPU pilot
    ad = SiteMatcher(cfg).ads["gpu"]
    assert (ad["GPUs"], ad["TotalSlotGPUs"], ad["TotalGPUs"]) == (2, 2, 2)


# --- plan ----------------------------------------------------------------------------

GPU_JOB = JobShape(2, 4000, gpus=1)
CPU_JOB = JobShape(2, 4000)


def test_a_gpu_job_is_planned_onto_the_gpu_site_only() -> None:
    cfg = config(site("cpu"), gpu_site("gpu", gpus=4))
    result = plan(snap([(GPU_JOB, 3)], sites=("cpu", "gpu")), memory(), cfg, NOW)
    assert [(s.site, s.count, s.gpus) for s in result.submits] == [("gpu", 1, 3)]
    assert result.unmatchable == ()


def test_new_pilots_ask_for_the_gpus_their_jobs_use_and_cpu_jobs_ask_for_none() -> None:
    cfg = config(gpu_site("gpu", gpus=2, cpus=8))
    result = plan(snap([(GPU_JOB, 5)], sites=("gpu",)), memory(), cfg, NOW)
    assert sorted(s.gpus for s in result.submits for _ in range(s.count)) == [1, 2, 2]
    cpu = plan(snap([(CPU_JOB, 2)], sites=("gpu",)), memory(), cfg, NOW)
    assert [s.gpus for s in cpu.submits] == [0]


def test_gpu_jobs_on_a_cpu_only_config_are_unmatchable_with_a_reason() -> None:
    cfg = config(site("gsi"), site("frankfurt"))
    result = plan(snap([(GPU_JOB, 2)], sites=("gsi", "frankfurt")), memory(), cfg, NOW)
    assert result.submits == ()
    [u] = result.unmatchable
    assert u.idle == 2 and u.reason == "RequestGPUs 1 GPUs > largest pilot 0 GPUs"


def test_free_gpus_of_running_and_pending_pilots_are_used_before_new_pilots() -> None:
    cfg = config(gpu_site("gpu", gpus=2))
    running = pilot("1", PilotState.BUSY, site="gpu", free_cpus=8, free_mem=32000)
    with_gpu = replace(running, gpus=2, free_gpus=1)
    result = plan(snap([(GPU_JOB, 1)], [with_gpu], sites=("gpu",)), memory(), cfg, NOW)
    assert result.submits == ()
    # the same pilot with its GPUs taken: the job needs a new pilot
    no_gpu = replace(running, gpus=2, free_gpus=0)
    result = plan(snap([(GPU_JOB, 1)], [no_gpu], sites=("gpu",)), memory(), cfg, NOW)
    assert [(s.count, s.gpus) for s in result.submits] == [(1, 1)]
    pending = pilot("2", PilotState.PENDING, site="gpu")
    pending = replace(pending, gpus=2, free_gpus=2)
    assert plan(snap([(GPU_JOB, 2)], [pending], sites=("gpu",)), memory(), cfg, NOW).submits == ()


@settings(max_examples=60, deadline=None)
@given(jobs=st.lists(st.tuples(st.integers(1, 8), st.integers(0, 3), st.integers(1, 6)),
                     min_size=1, max_size=5),
       site_gpus=st.integers(1, 4))
def test_property_gpu_demand_lands_on_gpu_pilots_within_their_gpus(
        jobs: list[tuple[int, int, int]], site_gpus: int) -> None:
    cfg = config(site("cpu", max_pilots=50, max_submit=50, max_pending=50),
                 gpu_site("gpu", gpus=site_gpus).model_copy(update={"caps": site(
                     max_pilots=50, max_submit=50, max_pending=50).caps}),
                 max_submit=100)
    demand = [(JobShape(c, 1000 * c, gpus=g), n) for c, g, n in jobs]
    result = plan(snap(demand, sites=("cpu", "gpu")), memory(), cfg, NOW)
    subs: list[Submit] = list(result.submits)
    assert all(s.gpus == 0 for s in subs if s.site == "cpu")
    assert all(0 <= s.gpus <= site_gpus for s in subs)
    wanted = sum(g * n for _c, g, n in jobs if 0 < g <= site_gpus)
    assert sum(s.gpus * s.count for s in subs) >= wanted
    unmatchable = {u.shape for u in result.unmatchable}
    assert unmatchable == {JobShape(c, 1000 * c, gpus=g) for c, g, _n in jobs if g > site_gpus}
