"""Demand from every schedd: a job submitted on the second submit host (submit2, its
own schedd) gets a pilot and completes; while that schedd is down its queue is unknown,
not empty: cycles say so and no busy pilot is flagged, released, retired or cancelled
for want of its demand."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import htcondor2 as htcondor
import pytest
from conftest import run
from faults import assert_converged
from servicectl import Service, SiteWatch, job_events, service_dir, write_config
from test_loop import (
    ADMIN,
    ALICE,
    GATE_SECONDS,
    clean_pool,
    negotiator_interval,
    open_gates,
    wait_for,
)

HOST = "submit2"
#: Each cycle line of the service while submit2's schedd cannot be read.
PARTIAL = f"schedd {HOST} UNKNOWN (no scale-down)"
#: submit2's schedd log (its own LOG directory, etc/condor-host-submit2.conf): each
#: command with the identity that sent it (SCHEDD_DEBUG D_COMMAND in the testbed).
SCHEDD_LOG = Path(f"/var/log/condor-{HOST}/SchedLog")


def submit2_schedd() -> htcondor.Schedd:
    """The second submit host's schedd, as the collector lists it."""
    ads = [ad for ad in htcondor.Collector().locateAll(htcondor.DaemonType.Schedd)
           if str(ad.get("Machine", "")).split(".")[0] == HOST]
    assert len(ads) == 1, f"schedds on {HOST}: {ads}"
    return htcondor.Schedd(ads[0])


def submit_there(name: str, seconds: int) -> str:
    """alice submits one job on submit2 that sleeps, then prints job-0-ok; the cluster."""
    out = ALICE / "out" / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    executable = ALICE / f"{name}.sh"
    executable.write_text(f"#!/bin/sh\nsleep {seconds}; echo job-$1-ok\n")
    executable.chmod(0o755)
    sub = ALICE / f"{name}.sub"
    sub.write_text(f"executable = {executable}\narguments = $(Process)\n"
                   f"output = {out}/$(Process).out\nerror = {out}/$(Process).err\n"
                   f"log = {out}/job.log\nrequest_cpus = 1\nrequest_memory = 500\nqueue 1\n")
    run(["chown", "-R", "alice:alice", str(ALICE)])
    res = run(["condor_submit", "-terse", str(sub)], user="alice", cwd=str(ALICE), host=HOST)
    return res.stdout.split(".")[0].strip()


def jobs_there(cluster: str, status: int | None = None) -> int:
    constraint = f"ClusterId == {cluster}" + (f" && JobStatus == {status}" if status else "")
    return len(submit2_schedd().query(constraint=constraint, projection=["JobStatus"]))


def completed(name: str) -> None:
    """The job ran once, to its end: not evicted, removed or held."""
    out = ALICE / "out" / name
    codes = job_events(out / "job.log")
    assert codes.count("005") == 1, (out / "job.log").read_text()
    for bad in ("004", "009", "012"):
        assert bad not in codes, (out / "job.log").read_text()
    assert (out / "0.out").read_text().strip() == "job-0-ok"


def schedd_on() -> None:
    run(["condor_on", "-daemon", "schedd"], env=ADMIN, host=HOST, check=False)
    wait_for(f"the schedd on {HOST}", lambda: jobs_there("0") == 0, 120)


@pytest.fixture
def service() -> Iterator[Service]:
    clean_pool()
    run(["condor_rm", "-all"], env=ADMIN, host=HOST, check=False)
    directory = service_dir()
    svc = Service(write_config(directory), directory / "service.log")
    try:
        yield svc
    finally:
        svc.stop()
        print(f"--- service log ({svc.log}) ---\n{svc.text()}")
        schedd_on()
        run(["condor_rm", "-all"], env=ADMIN, host=HOST, check=False)
        clean_pool()


def test_a_job_on_the_second_submit_host_gets_a_pilot(service: Service) -> None:
    """Its demand is read, a pilot is submitted for it, and the negotiation is asked of
    submit2's schedd (the negotiator's own cycle is an hour away: without the request
    the job would not run)."""
    before = SCHEDD_LOG.stat().st_size if SCHEDD_LOG.exists() else 0
    with SiteWatch() as watch, negotiator_interval(3600):
        cluster = submit_there("schedds-first", 5)
        service.start()
        wait_for(f"the job on {HOST} done", lambda: jobs_there(cluster) == 0, 300, step=2)
        assert_converged(service, watch)
    completed("schedds-first")
    assert re.search(r"submit \d+ at ", service.text()), service.text()
    with SCHEDD_LOG.open() as f:
        f.seek(before)
        log = f.read()
    assert "command 421 (RESCHEDULE) from provisioner@testbed" in log, log[-3000:]


def _down_cycles(svc: Service, mark: int) -> list[str]:
    lines = [line for line in svc.cycles()[mark:] if PARTIAL in line]
    return lines if len(lines) >= 2 else []


def test_its_schedd_down_is_unknown_and_no_busy_pilot_goes(service: Service) -> None:
    cluster = submit_there("schedds-down", GATE_SECONDS)  # runs until its gate opens
    with SiteWatch() as watch:
        service.start()
        wait_for(f"the job on {HOST} running", lambda: jobs_there(cluster, 2) == 1, 300,
                 step=2)
        mark = len(service.cycles())
        run(["condor_off", "-daemon", "schedd"], env=ADMIN, host=HOST)
        try:
            down = wait_for(f"two cycles with {HOST} unknown",
                            lambda: _down_cycles(service, mark), 120)
            for line in down:  # type: ignore[attr-defined]
                actions = line.split("actions:")[1]
                for verb in ("flag", "release", "retire", "cancel"):
                    assert f"{verb} " not in actions, line
        finally:
            schedd_on()
        wait_for(f"the job on {HOST} done",
                 lambda: (open_gates(), jobs_there(cluster) == 0)[1], 300, step=2)
        assert_converged(service, watch)
    assert f"schedd {HOST} unknown this cycle" in service.text()
    completed("schedds-down")
