"""`make bench-small`: issue 10's small workload in the testbed, on the production defaults.

Per run (as root on cm): a clean pool; the provisioner service as its own account with
the testbed's sites and every `policy` setting at its default (configuration, journal,
log in a fresh /var/tmp directory); a random offset after its first cycle (within one
quick check; seeded by --seed and the run number), then alice submits 8 one-minute
jobs, six minutes later 4 more. The run is over when all are done and no pilot is in
either site's `squeue` (at most --timeout s after the second batch, else it fails,
saying what is left). The service stops; a pilot it did not see end ends when its
end record says. Figures (bench/small_workload.py) go to
bench/results/testbed-small.md, the first completed run's cores to testbed-small.png.
`--workload testbed-first`: 4 one-minute jobs from zero pilots, nothing more (issue 26's
first jobs), to bench/results/testbed-first.md.

    python /src/deploy/testbed/smallload.py [--runs 3] [--seed 1] [--timeout 1200]
                                            [--workload testbed-small|testbed-first]

Exit status 1 if a run did not complete; a missed target is reported, not a failure.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import htcondor2 as htcondor
import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import small_workload as small  # noqa: E402
from provisioner.config import Config  # noqa: E402
from provisioner.pool.condor import HISTORY_ATTRS, job_run_of  # noqa: E402
from provisioner.service.accounting import JobRun, PilotRecord  # noqa: E402
from provisioner.service.journal import Journal  # noqa: E402

CONFIG = ROOT / "deploy/testbed/provisioner.yaml"
RESULTS = ROOT / "bench/results"
ON = str(ROOT / "deploy/testbed/inside/on")
SITES = {"gsi": ("gsi-login", "/etc/slurm-gsi/slurm.conf"),
         "frankfurt": ("fra-login", "/etc/slurm-frankfurt/slurm.conf")}
PATH = "/opt/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin"
WORK = Path("/home/alice/smallload")
END_RECORDS = Path("/var/log/pilots/end")  # the sites' runtime.log_dir + /end
PROGRESS_S = 15
SUBMIT = """executable = /bin/sleep
transfer_executable = false
arguments = 60
output = {work}/out/$(Cluster).$(Process).out
error = {work}/out/$(Cluster).$(Process).err
log = {work}/jobs.log
request_cpus = 1
request_memory = 500
queue {count}
"""


class RunFailed(Exception):
    """The run did not complete; the message says what is left."""


def sh(argv: list[str], check: bool = True, cwd: Path | None = None,
       **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=120,
                          cwd=cwd, env={**os.environ, "PATH": PATH, **env})


def squeue() -> dict[str, list[str]]:
    """Site -> the states of its pilot jobs; CalledProcessError if a site cannot be read."""
    return {site: sh([ON, login, "--", "squeue", "-h", "-u", "pilot", "-o", "%T"],
                     SLURM_CONF=conf).stdout.split() for site, (login, conf) in SITES.items()}


def jobs_left(constraint: str = "true") -> Counter[int]:
    return Counter(int(ad["JobStatus"]) for ad in
                   htcondor.Schedd().query(constraint=constraint, projection=["JobStatus"]))


def until(what: str, predicate: Any, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if predicate():
                return
        except Exception:  # unknown is not done: poll again
            pass
        time.sleep(1)
    raise RunFailed(f"timed out after {timeout:.0f} s waiting for {what}")


def clean_pool(provisioner_id: str) -> None:
    """No jobs, no pilots, no pilot ads (as tests/integration/test_loop.clean_pool)."""
    sh(["condor_rm", "-all"], check=False)
    for login, conf in SITES.values():
        sh([ON, login, "--", "scancel", "-u", "pilot", "--batch", "--signal=TERM"],
           check=False, SLURM_CONF=conf)
    try:
        until("pilot jobs to stop", lambda: not any(squeue().values()), 60)
    except RunFailed:
        for login, conf in SITES.values():
            sh([ON, login, "--", "scancel", "-u", "pilot"], check=False, SLURM_CONF=conf)
        until("no pilot jobs left", lambda: not any(squeue().values()), 30)
    until("no pilot startds left", lambda: not htcondor.Collector().query(
        htcondor.AdType.Startd, constraint=f'PilotProvisionerId =?= "{provisioner_id}"',
        projection=["Name"]), 30)
    until("an empty queue", lambda: not jobs_left(), 60)


def start_service(directory: Path, data: dict[str, Any]
                  ) -> tuple[Path, subprocess.Popen[bytes]]:
    """`provisioner run` as its own account; configuration, journal, log in `directory`."""
    config = directory / "provisioner.yaml"
    config.write_text(yaml.safe_dump({**data, "journal": str(directory / "journal.sqlite")},
                                     sort_keys=False))
    sh(["chown", "-R", "provisioner:", str(directory)])
    directory.chmod(0o755)
    with (directory / "service.log").open("ab") as log:
        proc = subprocess.Popen(
            ["runuser", "-u", "provisioner", "--", "/opt/venv/bin/provisioner", "-c",
             str(config), "run"], stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, "PATH": PATH})
    return config, proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def submit(count: int) -> int:
    """alice submits `count` one-minute jobs; returns the cluster id."""
    sub = WORK / f"batch-{count}.sub"
    sub.write_text(SUBMIT.format(work=WORK, count=count))
    sh(["chown", "alice:alice", str(sub)])
    out = sh(["runuser", "-u", "alice", "--", "condor_submit", "-terse", str(sub)], cwd=WORK,
             HOME=str(WORK.parent), USER="alice").stdout
    return int(out.split(".")[0])


def watch(t0: float, deadline: float, clusters: list[int], total: int, log: Path,
          proc: subprocess.Popen[bytes], end: bool) -> bool:
    """Poll (every 5 s, a line every PROGRESS_S) until `deadline`, or with `end` until
    every job is done and no pilot is in `squeue`; False if the deadline came first."""
    mine = " || ".join(f"ClusterId == {c}" for c in clusters)
    last = 0.0
    jobs: Counter[int] | None = None
    pilots: dict[str, list[str]] | None = None
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RunFailed(f"the service exited ({proc.returncode}); see {log}")
        try:
            jobs = jobs_left(mine)
        except Exception:  # the schedd busy: unknown, never "empty"
            jobs = None
        try:
            pilots = squeue()
        except (subprocess.SubprocessError, OSError):
            pilots = None
        if time.time() - last >= PROGRESS_S:
            last = time.time()
            cycles = log.read_text(errors="replace").count(" cycle ")
            print(small.progress(last - t0, jobs, total, pilots, cycles), flush=True)
        if end and jobs is not None and not jobs and pilots is not None \
                and not any(pilots.values()):
            return True
        time.sleep(5)
    if end:
        raise RunFailed(f"not over by the deadline: jobs left {dict(jobs or {})}, "
                        f"pilots in squeue {pilots}")
    return False


Records = tuple[list[PilotRecord], list[JobRun], float]


def workload(offset: float, timeout: float, provisioner_id: str,
             data: dict[str, Any], batches: tuple[int, ...] = small.SMALL.batches,
             gap_s: float = small.SMALL.gap_s) -> tuple[Path, Path, list[int]]:
    """A clean pool, the service, the two batches; returns once all jobs are done and
    no pilot is left (the service stopped), or raises RunFailed (the pool cleaned)."""
    proc = None
    try:
        clean_pool(provisioner_id)
        shutil.rmtree(WORK, ignore_errors=True)
        (WORK / "out").mkdir(parents=True)
        sh(["chown", "-R", "alice:alice", str(WORK)])
        directory = Path(tempfile.mkdtemp(prefix="service.small.", dir="/var/tmp"))
        config, proc = start_service(directory, data)
        log = directory / "service.log"
        print(f"   service started (log {log}); submit {offset:.1f} s after its first cycle")
        until("the service's first cycle", lambda: "(first cycle)" in log.read_text(), 60)
        time.sleep(offset)
        t0, clusters = time.time(), []
        for i, count in enumerate(batches):
            if i:
                watch(t0, t0 + i * gap_s, clusters, sum(batches[:i]), log, proc, end=False)
            clusters.append(submit(count))
            print(f"   alice submitted {count} jobs (cluster {clusters[-1]})", flush=True)
        watch(t0, time.time() + timeout, clusters, sum(batches), log, proc, end=True)
        stop(proc)
        if any(squeue().values()):  # sbatch'd between the last look and the stop
            print("   a pilot came after the end; stopping it (its time counts)")
            clean_pool(provisioner_id)
        return directory, config, clusters
    except (RunFailed, subprocess.SubprocessError) as exc:
        if proc is not None:
            stop(proc)
        try:
            clean_pool(provisioner_id)
        except RunFailed as again:
            print(f"   and the pool is not clean: {again}")
        raise RunFailed(str(exc)) from exc


def one_run(n: int, args: argparse.Namespace, data: dict[str, Any], config: Config
            ) -> tuple[small.RunResult, Records | None]:
    offset = random.Random(f"{args.seed}/{n}").uniform(0, config.policy.quick_check_s)
    print(f"== run {n}: clean pool", flush=True)
    try:
        directory, _cfg, clusters = workload(offset, args.timeout,
                                            config.pool.provisioner_id, data,
                                            args.workload.batches, args.workload.gap_s)
    except RunFailed as exc:
        print(f"   run {n} FAILED: {exc}", flush=True)
        return small.RunResult(run=n, offset_s=offset, error=str(exc)), None
    journal = Journal.open_existing(str(directory / "journal.sqlite"))
    pilots = small.with_recorded_ends(journal.pilots() if journal else [],
                                      config.pool.provisioner_id, END_RECORDS)
    ads = list(htcondor.Schedd().history(
        constraint=" || ".join(f"ClusterId == {c}" for c in clusters),
        projection=[*HISTORY_ATTRS, "QDate"], match=100))
    runs = [r for r in map(job_run_of, ads) if r is not None]
    completed = sum(1 for ad in ads if int(ad.get("JobStatus", 0)) == 4)
    now = time.time()
    if completed != sum(args.workload.batches):
        error = f"{completed}/{sum(args.workload.batches)} jobs completed"
        print(f"   run {n} FAILED: {error}", flush=True)
        return small.RunResult(run=n, offset_s=offset, error=error), None
    result = small.measure(n, offset, pilots, runs, small.job_waits(ads), now)
    eff = "-" if result.efficiency is None else f"{result.efficiency:.3f}"
    print(f"   run {n}: efficiency {eff}, wait p95 {result.wait(95)} s, {result.pilots} "
          f"pilots ({result.never_claimed} never claimed); pilot ends from "
          f"{dict(Counter(p.end_source for p in pilots))}", flush=True)
    return result, (pilots, runs, now)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1200,
                        help="seconds after the second submission for jobs and pilots to end")
    parser.add_argument("--workload", choices=sorted(small.WORKLOADS), default="testbed-small",
                        help="testbed-small: 8 jobs, 4 more 6 min later (H2H-12); "
                        "testbed-first: 4 jobs from zero pilots")
    args = parser.parse_args()
    args.workload = small.WORKLOADS[args.workload]
    htcondor.param["SEC_TOKEN_DIRECTORY"] = "/root/.condor/tokens.d"  # read as the provisioner
    data, reset = small.reset_policy(yaml.safe_load(CONFIG.read_text()))
    config = Config.model_validate(data)
    print("== reset to the provisioner's defaults:\n   " + "\n   ".join(reset or ["nothing"]))
    results: list[small.RunResult] = []
    plot: tuple[str, int] | None = None
    for n in range(1, args.runs + 1):
        result, records = one_run(n, args, data, config)
        results.append(result)
        if records and plot is None and find_spec("matplotlib"):
            from provisioner.service.plots import plot_cores
            plot_cores(*records, RESULTS / f"{args.workload.name}.png")
            plot = (f"{args.workload.name}.png", n)
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = small.document(results, date, reset, plot, args.workload)
    out = RESULTS / f"{args.workload.name}.md"
    out.write_text(text)
    print(f"\n{text}\nwrote {out}")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
