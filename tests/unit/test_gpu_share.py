"""GPU pilots serve GPU jobs: the pilot's START (condor_config/pilot.conf, evaluated with
the ClassAd bindings as the startd evaluates it on its partitionable slot) lets a job that
asks for no GPU take only the cores and memory beyond the free GPUs' share, and plan()
packs demand by the same rule, so CPU-only demand never counts as fitting into the cores
a GPU needs and a new GPU pilot holds GPU jobs only."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import classad2 as classad
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.decide.packing import Item, gpu_share
from provisioner.decide.plan import plan
from provisioner.model import JobShape, PilotState, round_memory
from tests.unit.helpers import NOW, config, memory, pilot, snap
from tests.unit.test_gpus import gpu_site

PILOT_CONF = Path(__file__).resolve().parents[2] / "condor_config" / "pilot.conf"


def macros(text: str) -> dict[str, str]:
    """NAME = value definitions of a condor config (continuation lines joined); inside
    ``if $(PILOT_GPUS)`` the GPU pilot's branch is taken (its definitions win)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out: dict[str, str] = {}
    for line in joined.splitlines():
        found = re.match(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*=\s*(.*)$", line)
        if found:
            out[found.group(1)] = found.group(2).strip()
    return out


def expand(value: str, defs: dict[str, str], fixed: dict[str, str]) -> str:
    for _ in range(20):
        new = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_.]*)\)",
                     lambda m: fixed.get(m.group(1), defs.get(m.group(1), m.group(0))), value)
        if new == value:
            return new
        value = new
    raise AssertionError(f"macro loop in {value}")


def gpu_start(cpus: int, memory_mb: int, gpus: int) -> classad.ExprTree:
    """The START clause about GPUs that a pilot of this allocation gets (the walltime
    clauses are tested elsewhere), as the GPU pilot's branch of the config sets it."""
    text = PILOT_CONF.read_text()
    defs = macros(text)
    block = text[text.index("if $(PILOT_GPUS)"):text.index("endif", text.index(
        "if $(PILOT_GPUS)"))]
    assert "RANK = (TARGET.RequestGPUs ?: 0)" in block
    assert "$(PILOT_GPU_START)" in defs["START"]
    fixed = {"NUM_CPUS": str(cpus), "MEMORY": str(memory_mb), "PILOT_GPUS": str(gpus)}
    return classad.ExprTree(expand(defs["PILOT_GPU_START"], defs, fixed))


def pslot(free_cpus: int, free_mem: int, free_gpus: int) -> classad.ClassAd:
    return classad.ClassAd({"Cpus": free_cpus, "Memory": free_mem, "GPUs": free_gpus,
                            "SlotType": "Partitionable"})


def job(cpus: int, memory_mb: int, gpus: int | None) -> classad.ClassAd:
    ad = classad.ClassAd({"RequestCpus": cpus, "RequestMemory": memory_mb})
    if gpus is not None:
        ad["RequestGPUs"] = gpus
    return ad


def starts(expr: classad.ExprTree, slot: classad.ClassAd, ad: classad.ClassAd) -> bool:
    return expr.eval(scope=slot, target=ad) is True


def test_a_fresh_gpu_pilot_sized_for_gpu_jobs_starts_no_cpu_only_job() -> None:
    start = gpu_start(8, 32000, 2)  # two GPU jobs of 4 cores and 16 GB each
    fresh = pslot(8, 32000, 2)
    assert starts(start, fresh, job(4, 16000, 1))
    assert not starts(start, fresh, job(1, 1000, 0))
    assert not starts(start, fresh, job(1, 1000, None))  # no RequestGPUs at all
    # one GPU job runs: the other GPU still keeps its 4 cores
    assert not starts(start, pslot(4, 16000, 1), job(1, 1000, None))
    # both GPUs taken: what is left is anybody's
    assert starts(start, pslot(2, 4000, 0), job(1, 1000, None))


def test_cpu_only_jobs_take_only_the_room_beyond_the_gpus_share() -> None:
    start = gpu_start(16, 64000, 2)  # 8 cores, 32 GB per GPU
    one_gpu_job = pslot(14, 56000, 1)  # a GPU job of 2 cores, 8 GB runs
    assert starts(start, one_gpu_job, job(6, 23936, 0))  # 187 x 128 MB
    assert not starts(start, one_gpu_job, job(7, 1000, 0))  # would eat the GPU's cores
    assert not starts(start, one_gpu_job, job(1, 23937, 0))  # or its memory
    assert starts(start, one_gpu_job, job(1, 2000, 1))  # a GPU job may take anything


def test_a_pilot_without_gpus_starts_everything() -> None:
    start = gpu_start(8, 32000, 2)
    assert starts(start, classad.ClassAd({"Cpus": 8, "Memory": 32000}), job(8, 32000, 0))
    assert starts(start, pslot(8, 32000, 0), job(8, 32000, 0))


@settings(max_examples=300, deadline=None)
@given(gpus=st.integers(1, 4), per_gpu=st.integers(1, 8), mem_per_gpu=st.integers(1, 64),
       used=st.tuples(st.integers(0, 32), st.integers(0, 256), st.integers(0, 4)),
       request=st.tuples(st.integers(1, 16), st.integers(1, 64_000), st.integers(0, 2)))
def test_property_the_planner_and_the_pilots_start_agree(
        gpus: int, per_gpu: int, mem_per_gpu: int, used: tuple[int, int, int],
        request: tuple[int, int, int]) -> None:
    """Whatever a GPU pilot holds, a job fits its free resources in the planner exactly
    when the startd has the resources and its START says yes."""
    cpus, memory = gpus * per_gpu + used[0] % 3, gpus * mem_per_gpu * 1000
    free = (max(0, cpus - used[0]), max(0, memory - used[1] * 1000),
            max(0, gpus - used[2]))
    c, m, g = request
    item = Item(c, round_memory(m), g)
    planner = item.per_bin(*free, gpu_share(cpus, memory, gpus)) > 0
    resources = c <= free[0] and round_memory(m) <= free[1] and g <= free[2]
    assert planner == (resources and starts(gpu_start(cpus, memory, gpus),
                                            pslot(*free), job(c, m, g)))


# --- plan ------------------------------------------------------------------------------

GPU_JOB = JobShape(4, 16000, gpus=1)
CPU_JOB = JobShape(1, 2000)


def gpu_pilot(job_id: str, state: PilotState, cpus: int = 8, gpus: int = 2,
              free_gpus: int | None = None, **kw: object):  # type: ignore[no-untyped-def]
    p = pilot(job_id, state, site="gpu", cpus=cpus, memory_mb=cpus * 4000, **kw)  # type: ignore[arg-type]
    return replace(p, gpus=gpus, free_gpus=gpus if free_gpus is None else free_gpus)


def test_cpu_only_demand_does_not_count_as_fitting_into_a_pending_gpu_pilot() -> None:
    cfg = config(gpu_site("gpu", gpus=4))
    pending = gpu_pilot("1", PilotState.PENDING)
    result = plan(snap([(CPU_JOB, 2)], [pending], sites=("gpu",)), memory(), cfg, NOW)
    assert [(s.count, s.cpus, s.gpus) for s in result.submits] == [(1, 2, 0)]
    # a GPU job does fit there
    assert plan(snap([(GPU_JOB, 2)], [pending], sites=("gpu",)), memory(), cfg, NOW).submits == ()


def test_cpu_only_demand_uses_the_room_a_running_gpu_pilot_has_beyond_its_gpus() -> None:
    cfg = config(gpu_site("gpu", gpus=4))
    # 16 cores, 2 GPUs (8 cores each); one GPU job of 2 cores runs: 6 cores are room
    busy = gpu_pilot("1", PilotState.BUSY, cpus=16, free_gpus=1, free_cpus=14,
                     free_mem=56000)
    assert plan(snap([(CPU_JOB, 6)], [busy], sites=("gpu",)), memory(), cfg, NOW).submits == ()
    result = plan(snap([(CPU_JOB, 7)], [busy], sites=("gpu",)), memory(), cfg, NOW)
    assert [(s.count, s.cpus, s.gpus) for s in result.submits] == [(1, 1, 0)]


def test_new_gpu_pilots_hold_gpu_jobs_only_sized_to_them() -> None:
    """CPU-only jobs (largest first: they are packed before the GPU jobs) open pilots
    without GPUs; the GPU jobs' pilots have 4 cores and 16 GB per GPU."""
    cfg = config(gpu_site("gpu", gpus=4, cpus=16), max_submit=50)
    cfg = cfg.model_copy(update={"sites": (cfg.sites[0].model_copy(update={
        "caps": cfg.sites[0].caps.model_copy(update={"max_pilots": 50,
                                                     "max_submit_per_cycle": 50})}),)})
    big_cpu = JobShape(8, 8000)
    result = plan(snap([(big_cpu, 1), (CPU_JOB, 3), (GPU_JOB, 6)], sites=("gpu",)), memory(),
                  cfg, NOW)
    gpu_pilots = [s for s in result.submits if s.gpus]
    assert sum(s.gpus * s.count for s in gpu_pilots) == 6
    assert all(s.cpus == 4 * s.gpus and s.memory_mb == 16000 * s.gpus for s in gpu_pilots)
    assert sum(s.cpus * s.count for s in result.submits if not s.gpus) == 8 + 3
