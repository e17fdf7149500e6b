"""GPU efficiency in the accounting, `provisioner report` and the metrics: GPU-hours
allocated (pilot GPUs x SLURM life) against GPU-hours claimed by GPU jobs (RequestGPUs x
wall on that pilot), with plain records, a temp journal and the service's fakes."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

from provisioner.model import PilotState
from provisioner.service.accounting import (
    DAY_S,
    JobRun,
    PilotRecord,
    gpu_timeline,
    site_days,
    totals,
)
from provisioner.service.journal import Journal, SeenPilot
from provisioner.service.metrics import cores_by_site, gpu_hours
from provisioner.service.report import report
from provisioner.sites.base import SiteJob, SiteJobState
from tests.unit.helpers import pilot
from tests.unit.test_service_act import idle_ad, make_world

T0 = 20_000 * DAY_S  # a midnight UTC
H = 3600.0


def gpu_run(pilot_id: str, start: float, end: float, gpus: int, cores: int = 1,
            job: str = "1.0", site: str = "gsi") -> JobRun:
    return JobRun(job, "alice", site, pilot_id, cores, start, end, 0.0, gpus=gpus)


def test_gpu_hours_count_gpu_jobs_only() -> None:
    # 8 cores + 2 GPUs from 01:00 to 05:00: a 1-GPU job 02:00-04:00, and a CPU-only job
    # on the rest of the cores all along (it claims cores, never GPUs)
    p = PilotRecord("gsi", "7", 8, T0, T0 + H, T0 + 5 * H, gpus=2)
    runs = [gpu_run("7", T0 + 2 * H, T0 + 4 * H, gpus=1, cores=2, job="1.0"),
            gpu_run("7", T0 + H, T0 + 5 * H, gpus=0, cores=4, job="2.0")]
    [row] = site_days([p], runs, now=T0 + 6 * H)
    assert row.allocated_gpu == 8 and row.claimed_gpu == 2
    assert row.gpu_efficiency == 0.25
    assert row.claimed == 2 * 2 + 4 * 4  # the cores are accounted as before


def test_sites_without_gpus_have_no_gpu_efficiency() -> None:
    cpu = PilotRecord("fra", "3", 4, T0, T0, T0 + 2 * H)
    [row] = site_days([cpu], [gpu_run("3", T0, T0 + H, gpus=0, site="fra")], now=T0 + 3 * H)
    assert row.allocated_gpu == 0 and row.gpu_efficiency is None
    # a GPU job on a pilot the journal knows without GPUs (an older journal) claims none
    [row] = site_days([cpu], [gpu_run("3", T0, T0 + H, gpus=1, site="fra")], now=T0 + 3 * H)
    assert row.claimed_gpu == 0 and row.gpu_efficiency is None


def test_gpu_claims_are_clipped_to_the_pilot_life_and_its_gpus_and_split_by_day() -> None:
    p = PilotRecord("gsi", "7", 8, T0 - 3 * H, T0 - 2 * H, T0 + 2 * H, gpus=2)
    runs = [gpu_run("7", T0 - 4 * H, T0 - H, gpus=3, job="1.0"),  # before start, 3 > 2
            gpu_run("7", T0 + H, T0 + 9 * H, gpus=1, job="2.0")]  # past the end
    rows = site_days([p], runs, now=T0 + 10 * H)
    assert [(r.day, r.allocated_gpu, r.claimed_gpu) for r in rows] == [
        ("2024-10-03", 4.0, 2.0), ("2024-10-04", 4.0, 1.0)]
    total = totals(rows)["gsi"]
    assert (total.allocated_gpu, total.claimed_gpu, total.gpu_efficiency) == (8.0, 3.0, 3 / 8)


def test_live_gpu_pilot_counts_until_now_and_the_timeline_shows_gpus() -> None:
    live = PilotRecord("gsi", "7", 4, T0, T0 + H, None, gpus=2)
    cpu = PilotRecord("fra", "3", 4, T0, T0 + H, None)
    runs = [gpu_run("7", T0 + H, T0 + 2 * H, gpus=2)]
    rows = site_days([live, cpu], runs, now=T0 + 3 * H)
    assert [(r.site, r.allocated_gpu, r.claimed_gpu) for r in rows] == [
        ("fra", 0.0, 0.0), ("gsi", 4.0, 2.0)]
    lines = gpu_timeline([live, cpu], runs, now=T0 + 3 * H, step_s=H)
    assert list(lines) == ["gsi"]  # fra held no GPU
    assert lines["gsi"][:2] == [(T0 + H, 2, 2), (T0 + 2 * H, 2, 0)]


def gpu_journal(path: Path) -> None:
    j = Journal(str(path))
    j.record_pilots("gsi", [SeenPilot("7", 8, 16000, T0, T0 + H, True, gpus=2)], T0 + H)
    j.record_pilots("fra", [SeenPilot("3", 4, 8000, T0, T0 + H, True)], T0 + H)
    j.record_pilots("gsi", [], T0 + 5 * H)
    j.record_pilots("fra", [], T0 + 3 * H)
    j.add_job_runs([gpu_run("7", T0 + 2 * H, T0 + 4 * H, gpus=1, cores=2, job="1.0"),
                    gpu_run("7", T0 + H, T0 + 5 * H, gpus=0, cores=4, job="2.0"),
                    gpu_run("3", T0 + H, T0 + 3 * H, gpus=0, cores=4, job="3.0", site="fra")])
    j.db.close()


def test_report_shows_gpu_hours_and_efficiency_and_dashes_without_gpus(
        tmp_path: Path) -> None:
    gpu_journal(tmp_path / "j.sqlite")
    out = tmp_path / "out"
    text, written = report(str(tmp_path / "j.sqlite"), T0 + DAY_S, out=out)
    head = text.splitlines()[0]
    assert "alloc GPU-h" in head and "GPU-h of GPU jobs" in head and "GPU eff" in head
    rows = {line.split()[0] + " " + line.split()[1]: line.split()
            for line in text.split("\n\n")[0].splitlines()[2:]}
    assert rows["gsi 2024-10-04"][-3:] == ["8.00", "2.00", "25.0%"]
    assert rows["fra 2024-10-04"][-3:] == ["-", "-", "-"]  # no GPUs: not 0 %
    assert rows["gsi total"][-1] == "25.0%" and rows["fra total"][-1] == "-"
    by_site = {r["site"]: r for r in csv.DictReader((out / "report.csv").open())}
    assert float(by_site["gsi"]["allocated_gpu_h"]) == 8
    assert float(by_site["gsi"]["claimed_gpu_h"]) == 2
    assert float(by_site["gsi"]["gpu_eff"]) == 0.25 and by_site["fra"]["gpu_eff"] == ""
    assert out / "gpus.png" in written and (out / "gpus.png").stat().st_size > 0


def test_report_without_gpu_pilots_draws_no_gpu_plot(tmp_path: Path) -> None:
    j = Journal(str(tmp_path / "j.sqlite"))
    j.record_pilots("fra", [SeenPilot("3", 4, 8000, T0, T0 + H, True)], T0 + H)
    j.db.close()
    _text, written = report(str(tmp_path / "j.sqlite"), T0 + 2 * H, out=tmp_path / "out")
    assert written and not (tmp_path / "out" / "gpus.png").exists()


def test_gpu_hours_for_the_counters() -> None:
    ended = [PilotRecord("gsi", "7", 8, T0, T0 + H, T0 + 3 * H, gpus=2),
             PilotRecord("gsi", "8", 8, T0, None, T0 + H, gpus=2),  # never started
             PilotRecord("fra", "3", 4, T0, T0 + H, T0 + 3 * H)]
    runs = [gpu_run("7", T0 + H, T0 + 2 * H, gpus=1),
            gpu_run("3", T0 + H, T0 + 2 * H, gpus=0, site="fra"),
            gpu_run("9", T0, T0 + H, gpus=1, site="")]  # no pilot site known
    assert gpu_hours(ended, runs) == {"gsi": [4.0, 1.0]}


def test_gpus_allocated_and_claimed_now() -> None:
    busy = dataclasses.replace(pilot("7", PilotState.BUSY, cpus=8, free_cpus=2),
                               gpus=2, free_gpus=1)
    starting = dataclasses.replace(pilot("8", PilotState.STARTING, cpus=8), gpus=2,
                                   free_gpus=2)
    cores = cores_by_site([busy, starting], ["gsi", "fra"])
    assert (cores["gsi"].allocated_gpus, cores["gsi"].claimed_gpus) == (4, 1)
    assert (cores["fra"].allocated_gpus, cores["fra"].claimed_gpus) == (0, 0)


def test_service_exposes_gpus_and_gpu_hours() -> None:
    prov, pool, backends, clock = make_world()

    def value(name: str, **labels: str) -> float | None:
        return prov.metrics.registry.get_sample_value(name, labels or None)

    start = clock.t - 2 * H
    backends["gsi"].jobs = [SiteJob("7", SiteJobState.RUNNING, 4, 8000, start - 60, start,
                                    start + DAY_S, gpus=2)]
    pool.ads = {"gsi/7": dataclasses.replace(idle_ad("7"), gpus=2, free_gpus=1,
                                             free_cpus=3, claimed_slots=1)}
    prov.run_cycle()
    assert value("provisioner_allocated_gpus", site="gsi") == 2
    assert value("provisioner_claimed_gpus", site="gsi") == 1
    assert value("provisioner_allocated_gpus", site="fra") == 0
    # its GPU job ends (1 GPU for 1 h), then the pilot leaves squeue 2 h after its start
    pool.runs = [gpu_run("7", start, start + H, gpus=1),
                 gpu_run("99", start, start + H, gpus=1, job="9.0")]  # not our pilot
    backends["gsi"].jobs = []
    pool.ads = {}
    prov.run_cycle()
    assert value("provisioner_gpu_hours_claimed_total", site="gsi") == 1.0
    assert value("provisioner_gpu_hours_allocated_total", site="gsi") == 4.0
    prov.journal.put("history_after", start - 1)  # the same history read again
    prov.run_cycle()  # counted once
    assert value("provisioner_gpu_hours_claimed_total", site="gsi") == 1.0
    assert prov.journal.pilots(site="gsi")[0].gpus == 2
    assert [r.gpus for r in prov.journal.job_runs()] == [1, 1]
