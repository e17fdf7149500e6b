"""`make demo`: the whole story on the local mini-grid, in a few minutes.

alice submits a mix of jobs with plain condor_submit that read data from GSI's
storage with a plain root:// URL (at Frankfurt the pilot sends it through the
site's XCache); the provisioner runs its loop with a
short interval, pilots start at both SLURM sites, their startds join through
CCB from inside Apptainer, the jobs run, and once the queue is empty the busy
pilots are told to leave as their jobs end (idle ones are flagged, then released).
Ends when every job is done and no pilot is left;
prints the latency breakdown of the first job and what the allocation bought
(`provisioner report` of the run). Runs inside the testbed as root.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import htcondor2 as htcondor

from provisioner.config import load_config
from provisioner.errors import BackendError
from provisioner.pilot import boot
from provisioner.pilot.containers import RUNNING
from provisioner.pool.condor import PoolUnreachable
from provisioner.service.loop import Provisioner, summary_line
from provisioner.service.report import report

CONFIG = "/src/deploy/testbed/provisioner.yaml"
WORK = Path("/home/alice/demo")
#: site -> (login node, SLURM configuration there)
SITES = {"gsi": ("gsi-login", "/etc/slurm-gsi/slurm.conf"),
         "frankfurt": ("fra-login", "/etc/slurm-frankfurt/slurm.conf")}
ON = "/src/deploy/testbed/inside/on"
ROOT_TOKEN = "/root/.condor/tokens.d/provisioner"
TIMEOUT_S = 600
DATA_URL = "root://gsi-storage:1094//data/small.dat"

READER = """#!/bin/sh
# Read the input with its plain URL, check it. Where the site has a cache, the
# pilot's XRootD client plugin sends the read through it.
set -e
url=$1
via="directly from the origin"
if [ -n "${XROOT_PROXY:-}" ]; then via="through XCache $XCACHE"; fi
xrdcp -s -f "$url" input.dat
echo "$(sha256sum input.dat | cut -d' ' -f1) read $via on $(hostname)"
sleep "$2"
"""

SUBMIT = """executable = {work}/reader.sh
arguments = "{url} $(seconds)"
output = {work}/out/$(name)-$(Process).out
error = {work}/out/$(name)-$(Process).err
log = {work}/jobs.log
request_cpus = $(cpus)
request_memory = $(memory)
should_transfer_files = YES
queue name, cpus, memory, seconds from (
  single, 1, 500, 20
  single, 1, 500, 20
  single, 1, 500, 25
  single, 1, 500, 25
  single, 1, 800, 30
  single, 1, 800, 30
  double, 2, 1500, 30
  double, 2, 1500, 30
)
"""


def sh(argv: list[str], **kw: object) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw).stdout  # type: ignore[call-overload, no-any-return]


def pilot_jobs() -> dict[str, list[str]]:
    """Pilot jobs per site, from squeue on the site's login node."""
    return {site: sh([ON, login, "--", "squeue", "-h", "-u", "pilot", "-o", "%i"],
                     env={"SLURM_CONF": conf, "PATH": "/usr/bin:/bin"}).split()
            for site, (login, conf) in SITES.items()}


@dataclass
class First:
    """The first pilot: SLURM's submit and start times, its startd ad (boot marks)
    when first seen in the collector."""

    submitted: float | None = None
    started: float | None = None
    ad: dict[str, Any] | None = None
    tested: dict[str, Any] | None = None  # its ad once its self-test beside the master ended


def first_ad(name: str = "") -> dict[str, Any] | None:
    """The first pilot startd ad in the collector (the earliest to start), if any; or
    the one of the slot `name`."""
    constraint = "PilotBootMasterStart =!= undefined"
    if name:
        constraint += f" && Name == {json.dumps(name)}"
    ads = htcondor.Collector().query(htcondor.AdType.Startd, constraint=constraint,
                                     projection=[*boot.MARKS, "DaemonStartTime",
                                                 "LastHeardFrom", "PilotSlurmJobId",
                                                 "PilotContainerTest", "Name"])
    return dict(min(ads, key=lambda a: a.get("DaemonStartTime", 0))) if ads else None


def step(prov: Provisioner, t_submit: float, first: First) -> bool:
    """One tick of the demo: the service's check (maybe a cycle), progress, the end test."""
    cycle = prov.tick()
    if cycle is not None:
        line = summary_line(cycle).rsplit("; observe", 1)[0]
        print(f"  [{time.time() - t_submit:5.0f} s] {cycle.reason}: {line}", flush=True)
    jobs = htcondor.Schedd().query(projection=["JobStatus"])
    if first.ad is not None and first.tested is None:
        ad = first_ad(str(first.ad.get("Name", "")))
        if ad and not str(ad.get("PilotContainerTest", "")).startswith(RUNNING):
            first.tested = ad
    if first.ad is None:
        first.ad = first_ad()
        started = [j for b in prov.backends.values() for j in b.list_pilots()
                   if first.ad and j.job_id == first.ad.get("PilotSlurmJobId")]
        if started:
            first.submitted, first.started = started[0].submitted_at, started[0].started_at
    return not jobs and not any(pilot_jobs().values())


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    config = load_config(CONFIG)
    # The service's identity; root reads it from its own copy of the token
    # (HTCondor reads a token only from a file its reader owns). Its journal is
    # the demo's own (a root-owned file in the service's directory would lock the
    # service out of it).
    shutil.rmtree(WORK, ignore_errors=True)
    (WORK / "out").mkdir(parents=True)
    journal = WORK / "journal.sqlite"
    config = config.model_copy(update={"journal": str(journal), "pool": config.pool.model_copy(
        update={"token_file": ROOT_TOKEN})})
    prov = Provisioner(config)  # from here on, the bindings read as the provisioner
    if any(pilot_jobs().values()) or htcondor.Schedd().query(projection=["ClusterId"]):
        print("demo: the testbed is busy (jobs or pilots left from earlier); "
              "run `make clean-testbed` and try again", file=sys.stderr)
        return 1
    (WORK / "reader.sh").write_text(READER)
    (WORK / "reader.sh").chmod(0o755)
    (WORK / "demo.sub").write_text(SUBMIT.format(work=WORK, url=DATA_URL))
    sh(["chown", "-R", "alice:alice", str(WORK)])
    expected = dict(reversed(line.split()) for line in
                    Path("/srv/origin/data/SHA256SUMS").read_text().splitlines())["small.dat"]

    print("== alice submits 8 jobs (6 x 1 core, 2 x 2 cores) that read data from GSI storage")
    t_submit = time.time()
    print(sh(["runuser", "-u", "alice", "--", "condor_submit", str(WORK / "demo.sub")],
             cwd=str(WORK)).strip().splitlines()[-1])
    njobs = 8

    print(f"== the provisioner runs (interval {config.policy.interval_s:.0f} s, quick check "
          f"{config.policy.quick_check_s:.0f} s); one line per cycle")
    first = First()
    done = False
    deadline = time.time() + TIMEOUT_S
    while time.time() < deadline:
        began = time.time()
        try:
            finished = step(prov, t_submit, first)
        except (PoolUnreachable, BackendError) as exc:  # a hiccup: the next step retries
            print(f"  (transient: {exc})")
            finished = False
        if finished:
            done = True
            break
        time.sleep(max(0.0, began + config.policy.tick_s - time.time()))  # the service's timer
    if not done:
        print(f"demo: not finished after {TIMEOUT_S} s", file=sys.stderr)
        return 1
    total = time.time() - t_submit

    outputs = sorted((WORK / "out").glob("*.out"))
    good = sum(1 for f in outputs if f.read_text().startswith(expected))
    events = (WORK / "jobs.log").read_text()
    codes = Counter(line[:3] for line in events.splitlines() if line[:3].isdigit())
    starts = [line for line in events.splitlines() if line.startswith("001 (")]
    print(f"== all {njobs} jobs done and every pilot gone after {total:.0f} s")
    print(f"   outputs with the right checksum: {good}/{njobs}; job log: "
          f"{codes['005']} terminated, {codes['004']} evicted, {codes['009']} aborted")
    if first.ad and starts:
        first_run = time.mktime(time.strptime(starts[0].split(")", 1)[1].strip()[:19],
                                              "%Y-%m-%d %H:%M:%S"))
        print(f"   first job: running {first_run - t_submit:.0f} s after condor_submit; "
              "the steps (SLURM and the job log have 1 s resolution):")
        known = [("provisioner reaction (submit -> sbatch)",
                  None if first.submitted is None else max(0.0, first.submitted - t_submit)),
                 ("SLURM dispatch (sbatch -> start)",
                  None if first.submitted is None or first.started is None else
                  max(0.0, first.started - first.submitted))]
        print(boot.table(known + boot.steps(first.ad, first.ad.get("LastHeardFrom"),
                                            first_run)))
        beside = boot.tested_beside(first.tested) if first.tested else None
        if beside is not None:
            print(f"     (the self-test ran beside the master: done {beside:.1f} s after "
                  "the master's start, then container support was switched on)")
    # One more cycle records the pilots' ends (they just left squeue).
    prov.run_cycle("demo end")
    text, written = report(str(journal), time.time(), out=WORK / "report")
    print("== what the allocation bought (provisioner report --journal "
          f"{journal}):\n{text}")
    for path in written:
        print(f"   wrote {path}")
    ok = good == njobs and codes["005"] == njobs and not (codes["004"] or codes["009"])
    print("demo: OK" if ok else "demo: FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
