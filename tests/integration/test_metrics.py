"""What the allocation bought, checked against the real daemons: the service's
Prometheus series as the testbed's Prometheus server scraped them, and the
accounting report of a scripted run whose answer is known in advance (two 1-core
jobs that keep a core busy for 40 s each, at the GSI site); each pilot's end is the one
its own end record states; and a GPU job's GPU-hours, claimed and allocated, in both."""

from __future__ import annotations

import csv
import json
import sqlite3
import urllib.parse
import urllib.request
from pathlib import Path

import htcondor2 as htcondor
from conftest import run
from servicectl import Service, SiteWatch, service_dir, write_config
from test_loop import (
    all_pilot_jobs,
    assert_clean_completion,
    clean_pool,
    jobs_left,
    submit_script,
    wait_for,
)

PROMETHEUS = "http://127.0.0.1:9090"
END_RECORDS = Path("/var/log/pilots/end")  # the sites' runtime.log_dir + /end
BUSY_S = 40
# One process spinning on its core for BUSY_S seconds (no child per iteration: the
# CPU time of short-lived children is not what a payload's efficiency measures).
BUSY = (f"timeout {BUSY_S} sh -c 'while :; do :; done' || true\necho job-$1-ok\n")
AT_GSI = 'requirements = PilotSite == "gsi"\n+DesiredSites = "gsi"\n'


def query(expr: str) -> dict[str, float]:
    """Instant query: {label set as text: value}."""
    url = f"{PROMETHEUS}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return {json.dumps(r["metric"], sort_keys=True): float(r["value"][1])
            for r in body["data"]["result"]}


def total(expr: str) -> float:
    return sum(query(expr).values())


def test_metrics_in_prometheus_and_a_report_with_a_known_answer(tmp_path: Path) -> None:
    clean_pool()
    directory = service_dir()
    svc = Service(write_config(directory), tmp_path / "service.log")
    journal = directory / "journal.sqlite"
    svc.start()
    try:
        with SiteWatch() as watch:
            cluster = submit_script("acct", BUSY, 2, AT_GSI)
            wait_for("both jobs done", lambda: jobs_left(cluster) == 0, 300, step=2)
            wait_for("the pilots gone", lambda: not any(all_pilot_jobs().values()), 180)
        assert_clean_completion("acct", 2)
        pilots = sorted(watch.checked().seen["gsi"])
        assert pilots and not watch.seen["frankfurt"]

        # Prometheus scraped the service (every 5 s): the counters say what happened.
        def scraped() -> bool:
            return total('provisioner_pilots_submitted_total{site="gsi"}') == len(pilots) \
                and total("provisioner_pilots") == 0
        wait_for("the scrape after the run", scraped, 60, step=2)
        # The pilot ran both jobs with nothing else queued: told to retire.
        assert total('provisioner_pilots_retired_total{site="gsi"}') >= 1
        assert total('provisioner_cycle_phase_seconds_count{phase="observe"}') > 0
        assert total('provisioner_pilot_boot_seconds_count{site="gsi"}') >= 1
        assert total("provisioner_pool_known") == 1
        assert total('up{job="provisioner"}') == 1

        # The journal: each pilot's SLURM life (its end from its end record, read in
        # the cycle that saw it leave squeue) and both job runs from the schedd's history.
        def recorded() -> bool:
            with sqlite3.connect(journal) as db:
                ended = db.execute("SELECT count(*) FROM pilots WHERE site = 'gsi' AND "
                                   "end_at IS NOT NULL").fetchone()[0]
                # (a new journal also reads the last day of history: earlier tests' jobs)
                runs = db.execute("SELECT count(*) FROM job_runs WHERE job_id LIKE ?",
                                  (f"{cluster}.%",)).fetchone()[0]
            return ended == len(pilots) and runs == 2
        wait_for("pilot ends and job runs in the journal", recorded, 60, step=2)
    finally:
        svc.stop()
        print(f"--- service log ---\n{svc.text()}")

    out = tmp_path / "report"
    text = run(["provisioner", "report", "--journal", str(journal), "--site", "gsi",
                "--out", str(out)]).stdout
    assert "gsi" in text, text
    rows = list(csv.DictReader((out / "report.csv").open()))
    assert rows and {r["site"] for r in rows} == {"gsi"}
    ended = {r["end_reason"]: int(r["pilots"]) for r in csv.DictReader((out / "ends.csv").open())}
    assert "pilot end" in text and ended.get("retired", 0) >= 1, (text, ended)
    claimed = sum(float(r["claimed_core_h"]) for r in rows) * 3600
    allocated = sum(float(r["allocated_core_h"]) for r in rows) * 3600
    # The known answer: 2 jobs x 1 core x 40 s of work, plus each job's start-up
    # (how long that takes on this host is a figure, printed, not a bound).
    assert claimed >= 2 * BUSY_S, (claimed, text)
    print(f"claimed {claimed:.1f} core-s for {2 * BUSY_S} s of work")
    # And exactly what HTCondor says the jobs used.
    hist = list(htcondor.Schedd().history(
        constraint=f"ClusterId == {cluster}",
        projection=["RemoteWallClockTime", "RequestCpus", "RemoteUserCpu", "RemoteSysCpu"]))
    condor = sum(float(ad["RemoteWallClockTime"]) * int(ad["RequestCpus"]) for ad in hist)
    condor_cpu = sum(float(ad["RemoteUserCpu"]) + float(ad["RemoteSysCpu"]) for ad in hist)
    assert abs(claimed - condor) <= 0.02 * condor + 2, (claimed, condor)
    # Allocated: the pilots' cores for their SLURM lives, which hold the jobs.
    with sqlite3.connect(journal) as db:
        lives = db.execute("SELECT cores, start_at, end_at FROM pilots WHERE site = 'gsi'"
                           ).fetchall()
    assert allocated >= claimed
    assert abs(allocated - sum(c * (e - s) for c, s, e in lives)) <= 1, (allocated, lives)
    # Each pilot that ran ended when its end record says (one clock in the testbed),
    # retired by the service (or released, had it been idle first); one cancelled
    # before it started left none.
    with sqlite3.connect(journal) as db:
        ends = db.execute("SELECT job_id, start_at, end_at, end_source, end_reason, "
                          "cores FROM pilots WHERE site = 'gsi'").fetchall()
    ran = [e for e in ends if e[1] is not None]
    assert ran, ends
    for job_id, _start, end_at, source, reason, cores in ran:
        record = json.loads((END_RECORDS / f"gsi-{job_id}.json").read_text())
        assert source == "record" and reason in ("retired", "released"), (ends, record)
        assert (record["job_id"], record["site"], record["cores"]) == (job_id, "gsi", cores)
        assert abs(end_at - record["end"]) < 0.01, (ends, record)
        # the pilot's slot was matchable at once: no start-up benchmarks (RUNBENCHMARKS)
        logs = list(END_RECORDS.parent.glob(f"pilot-gsi-{job_id}@*/StartLog"))
        assert len(logs) == 1, logs
        text = logs[0].read_text()
        assert "Changing state: Owner -> Unclaimed" in text and "BENCHMARK" not in text, text
    # E2: the CPU time HTCondor measured over the wall time it measured (the jobs
    # spin, sharing this machine's cores with the testbed: the value is printed).
    e2 = [float(r["e2_cpu"]) for r in rows if r["e2_cpu"]]
    assert len(e2) == 1 and abs(e2[0] - condor_cpu / condor) <= 0.02, (rows, condor_cpu)
    assert condor_cpu > 0, hist
    print(f"E2 (CPU over wall time) {e2[0]:.2f}")
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    assert len(list(out.glob("*.png"))) >= 2


GPU_S = 40
GPU_JOB = f"sleep {GPU_S}\necho job-$1-ok\n"


def test_a_gpu_jobs_gpu_hours_in_the_metrics_and_the_report(tmp_path: Path) -> None:
    """One 1-GPU job at gsi (its nodes have 2 GPUs; the pilot asks SLURM for 1): the
    GPU-hours it claimed are what HTCondor says it ran (RemoteWallClockTime x
    RequestGPUs), in Prometheus and in `provisioner report`; the GPU-hours allocated are
    the GPU pilot's GPUs x its SLURM life, as the journal recorded them."""
    clean_pool()
    directory = service_dir()
    svc = Service(write_config(directory), tmp_path / "service.log")
    journal = directory / "journal.sqlite"
    svc.start()
    try:
        with SiteWatch() as watch:
            cluster = submit_script("gpuacct", GPU_JOB, 1, "request_gpus = 1\n" + AT_GSI)
            wait_for("the GPU job done", lambda: jobs_left(cluster) == 0, 300, step=2)
            wait_for("the pilots gone", lambda: not any(all_pilot_jobs().values()), 180)
        assert_clean_completion("gpuacct", 1)
        assert watch.checked().seen["gsi"] and not watch.seen["frankfurt"]

        def recorded() -> bool:
            with sqlite3.connect(journal) as db:
                open_ = db.execute("SELECT count(*) FROM pilots WHERE site = 'gsi' AND "
                                   "end_at IS NULL").fetchone()[0]
                runs = db.execute("SELECT count(*) FROM job_runs WHERE job_id LIKE ?",
                                  (f"{cluster}.%",)).fetchone()[0]
            return open_ == 0 and runs == 1
        wait_for("the pilot's end and the job run in the journal", recorded, 60, step=2)

        def scraped() -> bool:
            return total('provisioner_gpu_hours_claimed_total{site="gsi"}') > 0 and \
                total('provisioner_gpu_hours_allocated_total{site="gsi"}') > 0
        wait_for("the GPU-hours scraped", scraped, 60, step=2)
        # the gauges showed the GPU claimed while the job ran (every 10 s cycle, 5 s
        # scrape; the window may reach into an earlier test's run: at least, not equal)
        seen_claimed = total('max_over_time(provisioner_claimed_gpus{site="gsi"}[5m])')
        seen_alloc = total('max_over_time(provisioner_allocated_gpus{site="gsi"}[5m])')
        assert seen_claimed >= 1 and seen_alloc >= 1, (seen_claimed, seen_alloc)
        claimed_metric = total('provisioner_gpu_hours_claimed_total{site="gsi"}') * 3600
        alloc_metric = total('provisioner_gpu_hours_allocated_total{site="gsi"}') * 3600
    finally:
        svc.stop()
        print(f"--- service log ---\n{svc.text()}")

    [ad] = htcondor.Schedd().history(constraint=f"ClusterId == {cluster}",
                                     projection=["RemoteWallClockTime", "RequestGPUs"])
    condor = float(ad["RemoteWallClockTime"]) * int(ad["RequestGPUs"])
    assert int(ad["RequestGPUs"]) == 1 and condor >= GPU_S, ad
    with sqlite3.connect(journal) as db:
        lives = db.execute("SELECT gpus, start_at, end_at FROM pilots WHERE site = 'gsi' "
                           "AND start_at IS NOT NULL").fetchall()
    gpu_pilots = [g for g, _s, _e in lives if g]
    assert gpu_pilots and set(gpu_pilots) == {1}, lives  # each asked SLURM for 1 GPU
    journal_alloc = sum((g or 0) * (e - s) for g, s, e in lives)
    # the metrics: the job's GPU-seconds as HTCondor measured them; the pilot's life
    assert abs(claimed_metric - condor) <= 0.02 * condor + 2, (claimed_metric, condor)
    assert abs(alloc_metric - journal_alloc) <= 1, (alloc_metric, lives)

    out = tmp_path / "report"
    text = run(["provisioner", "report", "--journal", str(journal), "--site", "gsi",
                "--out", str(out)]).stdout
    assert "GPU eff" in text, text
    rows = list(csv.DictReader((out / "report.csv").open()))
    claimed = sum(float(r["claimed_gpu_h"]) for r in rows) * 3600
    allocated = sum(float(r["allocated_gpu_h"]) for r in rows) * 3600
    assert abs(claimed - condor) <= 0.02 * condor + 2, (claimed, condor, text)
    assert abs(allocated - journal_alloc) <= 1 and allocated >= claimed, (allocated, lives)
    effs = [float(r["gpu_eff"]) for r in rows if r["gpu_eff"]]
    assert effs and all(0 < e <= 1 for e in effs), rows
    print(f"GPU efficiency {claimed / allocated:.2f} ({claimed:.0f} of {allocated:.0f} "
          "GPU-s; the rest is the pilot's start-up and tail)")
    png = out / "gpus.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
