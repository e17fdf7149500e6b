"""Faults of pilots and their nodes in the multi-host testbed, each survived with
nothing lost: a pilot killed under a running job, a pilot killed by SLURM (its node
set down) right after its jobs started, a hung container, a pilot reaching its
walltime, a site whose pilots die at start, a pilot drained by the site's admin, a worker
node's link cut (faults.py: what every fault test checks; test_faults.py: faults of the
service and the pool).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import htcondor2 as htcondor
import pytest
from conftest import (
    kill_pilot_processes,
    pilot_processes,
    run,
    slurm,
    split_startd,
)
from faults import assert_completed, assert_converged, running_on, running_service
from servicectl import (
    Service,
    SiteWatch,
    pilot_ids,
    service_dir,
    write_config,
)
from test_loop import (
    ALICE,
    GATE_SECONDS,
    clean_pool,
    gated_jobs_left,
    jobs_left,
    open_gates,
    submit_gated,
    submit_script,
    submits_in,
    wait_for,
)

from provisioner.pilot.procs import read_stat


@pytest.fixture
def service() -> Iterator[Service]:
    with running_service() as svc:
        yield svc


def _heard_from(name: str) -> int | None:
    """When the collector last heard from startd `name` ("pilot-<site>-<job>@<host>"),
    whose slots' ads are named "slot1@<name>", "slot1_1@<name>"... (None: no ad)."""
    ads = htcondor.Collector().query(htcondor.AdType.Startd, constraint=(
        f'Name == "slot1@{name}" || Name == "{name}"'), projection=["LastHeardFrom"])
    return max(int(ad["LastHeardFrom"]) for ad in ads) if ads else None


def _right_after_an_update(name: str) -> None:
    """Wait until startd `name` has just updated its ad: a fault injected now leaves a
    ghost ad for the collector's whole ad lifetime (120 s in the testbed)."""
    first = _heard_from(name)
    wait_for(f"an update from {name}", lambda: _heard_from(name) not in (first, None), 60,
             step=0.3)


def _assert_ghost_not_counted(service: Service, site: str, key: str, startd: str,
                              watch: SiteWatch) -> None:
    """The service's own view of `site`, read now (`status --json`), does not count pilot
    `key`, gone from SLURM, though its startd's ad is still in the collector."""
    status = json.loads(run(["/opt/venv/bin/provisioner", "-c", str(service.config),
                             "status", "--json"], user="provisioner").stdout)
    assert _heard_from(startd) is not None, "the ghost ad left before it was judged"
    [view] = [v for v in status["sites"] if v["name"] == site]
    assert view["known"], view
    counted = {k for v in view["pilots"].values() for k in v["keys"]}
    assert key not in counted, (status, watch.story())


def test_pilot_killed_under_a_running_job(service: Service) -> None:
    cluster = submit_gated("killed", 1)
    with SiteWatch() as watch:
        service.start()
        startd = wait_for("a job running", lambda: running_on(cluster), 120)[0]  # type: ignore[index]
        name, host = split_startd(startd)
        key = "/".join(name.removeprefix("pilot-").rsplit("-", 1))
        site, job = key.split("/")
        _right_after_an_update(startd)
        assert kill_pilot_processes(host) > 0
        mark = len(service.cycles())
        # SLURM and the collector disagree (ad without job); the service says so,
        # the job goes back to idle (its lease) and is provisioned for again.
        wait_for("the disagreement logged",
                 lambda: f"pilot {key} left SLURM while running jobs" in service.text()
                 or f"pilot {key}: startd ad in the collector but no SLURM job"
                 in service.text(), 120)
        # SLURM has ended the batch job (its processes are gone); the startd's ad is
        # still in the collector, and the service does not count it as a pilot.
        wait_for("the pilot gone from SLURM", lambda: job not in pilot_ids(site), 60, step=1)
        _assert_ghost_not_counted(service, site, key, startd, watch)
        # The dead pilot's ad is no capacity: a new pilot is submitted for the requeued
        # job while that ghost ad is still in the collector (counted, it would have
        # taken the job back, and nothing would be submitted until the ad expired).
        submitted = wait_for("a pilot submitted for the requeued job", lambda: [
            c for c in service.cycles()[mark:] if submits_in(c)], 180)
        assert _heard_from(startd) is not None, (
            f"the ghost ad left before the resubmission: {submitted}")
        wait_for("all jobs done", lambda: gated_jobs_left(cluster) == 0, 360, step=2)
        assert_converged(service, watch)
    assert_completed("killed", 1, may_requeue=True)


def _container_parent(host: str, name: str) -> int:
    """The Apptainer process that runs pilot `name`'s master on `host`."""
    for pid in pilot_processes(host):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            found = read_stat(Path(f"/proc/{pid}/stat").read_text())
        except OSError:
            continue
        if (found is not None and argv[0].endswith(b"condor_master")
                and f"/{name}/".encode() in b" ".join(argv)):
            parent = found.ppid
            cmd = Path(f"/proc/{parent}/cmdline").read_bytes()
            assert cmd.startswith(b"Apptainer runtime parent"), cmd
            return parent
    raise AssertionError(f"no master of {name} on {host}")


def test_a_container_that_hangs_after_its_master_ended_does_not_hold_the_allocation(
        service: Service) -> None:
    # The container's runtime process stops (SIGSTOP: it can neither reap the master
    # nor clean up), so the batch job would wait for SLURM's walltime kill, holding
    # its cores for nothing. The wrapper sees the master gone and ends what is left.
    cluster = submit_gated("hang", 1)
    parent = 0
    try:
        with SiteWatch() as watch:
            service.start()
            startd = wait_for("a job running", lambda: running_on(cluster), 120)[0]  # type: ignore[index]
            name, host = split_startd(startd)
            site, job = name.removeprefix("pilot-").rsplit("-", 1)
            parent = _container_parent(host, name)
            os.kill(parent, signal.SIGSTOP)
            wait_for("the job done", lambda: gated_jobs_left(cluster) == 0, 120)
            # released when idle (two quick checks), then 20 s of grace: far below
            # the pilot's walltime (an hour), where SLURM would have ended it
            wait_for("the pilot out of SLURM", lambda: job not in pilot_ids(site), 180, step=2)
            assert_converged(service, watch)
        text = Path(f"/var/log/pilots/htcpilot-testbed-{site}-{job}.out").read_text()
        assert "its container is still there" in text, text
        assert f"{parent} " in text, text  # the hung Apptainer process was named and ended
    finally:
        if parent:
            with contextlib.suppress(ProcessLookupError):
                os.kill(parent, signal.SIGKILL)
    assert_completed("hang", 1)


def _short_walltime(data: dict) -> None:
    """gsi pilots live 3 minutes, SLURM's shortest (it warns 80 s before the end, up to
    60 s early: 40 s after the start at the soonest, long after the job started; the
    jobs' end, 60 s before the walltime, is 20 s or more after the warning); Frankfurt
    takes none."""
    for site in data["sites"]:
        if site["name"] == "gsi":
            site["pilot"].update(walltime_s=180, shutdown_margin_s=80)
        else:
            site["caps"].update(max_pilots=0, max_pending=0)


def _event_times(logfile: Path, code: str) -> list[float]:
    """When each event `code` of a job event log happened (the log's local time)."""
    return [datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
            for m in re.finditer(rf"^{code} \(\S+\) (\S+ \S+)", logfile.read_text(), re.M)]


def test_pilot_reaching_walltime_with_a_job_that_stated_no_runtime() -> None:
    clean_pool()
    directory = service_dir()
    svc = Service(write_config(directory, _short_walltime), directory / "service.log")
    # Its first run outlives the pilot; once started again, it finishes at once.
    cluster = submit_script("walltime", (
        'if grep -q "^NumJobStarts = 0" "$_CONDOR_JOB_AD"; then sleep 900; fi\n'
        'echo job-$1-ok\n'))
    watch = SiteWatch()
    try:
        with watch:
            svc.start()
            wait_for("the job done on a second pilot", lambda: jobs_left(cluster) == 0, 600,
                     step=3)
            assert_converged(svc, watch)
        assert "reached its walltime with jobs running" in svc.text(), svc.text()
        assert len(watch.checked().seen["gsi"]) >= 2
        # SLURM's warning (90 s before the end, up to 60 s early) drains the startd;
        # the running job retires on until the pilot's last minute (PILOT_JOBS_END in
        # condor_config/pilot.conf: the walltime end - 60 s), not cut at the warning,
        # and is evicted before the walltime. The first pilot's walltime end is in its log.
        first = min(watch.seen["gsi"], key=int)
        log = Path(f"/var/log/pilots/htcpilot-testbed-gsi-{first}.out").read_text()
        found = re.search(r"walltime end (\d+)\)", log)
        assert found is not None, log
        end = int(found.group(1))
        [evicted, *_] = _event_times(ALICE / "out" / "walltime" / "job.log", "004")
        print(f"evicted {end - evicted:.0f} s before the walltime end")
        # the event log has whole seconds: 1 s of slack on the retirement's end
        assert end - 60 - 1 <= evicted < end, (
            f"evicted {end - evicted:.0f} s before the walltime end (retirement ends 60 s "
            "before it)")
    finally:
        svc.stop()
        print(f"--- service log ({svc.log}) ---\n{svc.text()}")
        print(f"--- pilot jobs in SLURM ---\n{watch.story()}")
        for job in sorted(watch.seen["gsi"], key=int)[:1]:  # the pilot that reached its end
            logs = Path("/var/log/pilots")
            for path in (logs / f"htcpilot-testbed-gsi-{job}.out",
                         *logs.glob(f"pilot-gsi-{job}@*/MasterLog")):
                lines = path.read_text(errors="replace").splitlines() if path.exists() else []
                tail = "\n".join(x for x in lines if "pilot INFO master: " not in x)
                print(f"--- {path} ---\n{tail[-4000:]}")
        clean_pool()
    assert_completed("walltime", 1, may_requeue=True)


def _black_hole(data: dict) -> None:
    """Frankfurt's pilots point at an image that does not exist: they start and die."""
    data["policy"]["breaker"] = {"threshold": 2, "base_s": 30, "max_s": 600}
    for site in data["sites"]:
        if site["name"] == "frankfurt":
            site["image"] = "/opt/images/missing.sif"


def test_black_hole_site_is_put_behind_a_circuit_breaker() -> None:
    clean_pool()
    directory = service_dir()
    config = write_config(directory, _black_hole)
    svc = Service(config, directory / "service.log")
    # More jobs than gsi's one pilot runs at once, running until the breaker has
    # opened twice (then their gates open): demand outlasts the first pause.
    cluster = submit_gated("blackhole", 12)
    try:
        with SiteWatch() as watch:
            svc.start()
            wait_for("the breaker open", lambda: "circuit breaker OPEN" in svc.text(), 120)
            status = run(["/opt/venv/bin/provisioner", "-c", str(config), "status"],
                         user="provisioner").stdout
            # Frankfurt is the black hole: readable, behind an open breaker.
            assert "Site frankfurt: ok; circuit open (" in status, status
            assert "Site gsi: ok; circuit closed" in status, status
            # After the pause one pilot tests the site; it dies too: a longer pause.
            wait_for("a failed test", lambda: "circuit breaker OPEN for 60 s" in svc.text(),
                     200, step=2)
            wait_for("all jobs done at gsi", lambda: gated_jobs_left(cluster) == 0, 240,
                     step=2)
            assert_converged(svc, watch)
        # Two pilots opened it, one tested it: Frankfurt was not fed more.
        assert len(watch.checked().seen["frankfurt"]) <= 4, watch.seen
        assert "half-open" in svc.text()
    finally:
        svc.stop()
        print(f"--- service log ({svc.log}) ---\n{svc.text()}")
        clean_pool()
    assert_completed("blackhole", 12)


def _admin_drain(startd: str) -> None:
    """The site's admin drains a pilot (graceful, no exit), as the pilot account on
    its node with the pilot's own configuration, like any condor_drain there."""
    name, host = split_startd(startd)
    site, job_id = name.removeprefix("pilot-").rsplit("-", 1)
    workdir = f"/tmp/pilot-{site}-{job_id}"
    run(["apptainer", "-s", "exec", "--cleanenv", "--no-home", "--bind", workdir, "--env",
         f"CONDOR_CONFIG={workdir}/condor_config", "/opt/images/pilot.sif", "condor_drain",
         "-graceful", "-reason", "maintenance by the site", startd],
        user="pilot", host=host)


def test_pilot_drained_by_an_admin_is_cancelled_once_its_jobs_are_done(
        service: Service) -> None:
    cluster = submit_gated("drained", 1)
    with SiteWatch() as watch:
        service.start()
        startd = wait_for("the job running", lambda: running_on(cluster), 120)[0]  # type: ignore[index]
        _admin_drain(startd)
        key = "/".join(startd.split("@")[0].removeprefix("pilot-").rsplit("-", 1))
        wait_for("the job done", lambda: gated_jobs_left(cluster) == 0, 120, step=2)
        wait_for("the drained pilot cancelled", lambda: f"cancel {key}" in
                 "".join(service.cycles()), 90)
        assert_converged(service, watch)
    assert_completed("drained", 1)  # the drain let it finish; the provisioner killed nothing


def _link(host: str, up: bool) -> None:
    """Cut or restore a host's link (its veth port on the router)."""
    run(["nsenter", "--net=/proc/1/ns/net", "--", "ip", "link", "set", f"v-{host}",
         "up" if up else "down"])


def _node_usable(site: str, node: str) -> bool:
    out = slurm(site, ["sinfo", "-h", "-n", node, "-o", "%t"], check=False).stdout.strip()
    return out in ("idle", "mix", "alloc")


def test_worker_link_cut_while_a_job_runs_there(service: Service) -> None:
    cluster = submit_gated("linkcut", 2)
    with SiteWatch() as watch:
        service.start()
        startd = wait_for("a job running", lambda: running_on(cluster), 120)[0]  # type: ignore[index]
        name, host = split_startd(startd)
        site = "gsi" if host.startswith("gsi") else "frankfurt"
        key = "/".join(name.removeprefix("pilot-").rsplit("-", 1))
        job = key.split("/")[1]
        _right_after_an_update(startd)
        _link(host, up=False)
        try:
            # SLURM declares the node dead and drops the pilot; the collector still
            # has its ad: the service reports the disagreement, and the job, back to
            # idle after its lease, is provisioned for again elsewhere. Which report
            # comes depends on who notices first: SLURM (the pilot still runs jobs
            # when it leaves) or the schedd (the jobs are already back in the queue,
            # and the pilot leaves SLURM with its stale ad in the collector).
            lost = (f"pilot {key} left SLURM while running jobs",
                    f"pilot {key}: startd ad in the collector but no SLURM job")
            wait_for("the lost pilot reported",
                     lambda: any(line in service.text() for line in lost), 240, step=2)
            # Once SLURM has dropped the pilot, its ad (the startd is cut off, not
            # dead) is a ghost: the service's own view of the site, read now, does
            # not count it as a pilot.
            wait_for("the pilot gone from SLURM", lambda: job not in pilot_ids(site), 180,
                     step=2)
            _assert_ghost_not_counted(service, site, key, startd, watch)
            wait_for("all jobs done", lambda: gated_jobs_left(cluster) == 0, 360, step=2)
        finally:
            _link(host, up=True)
        try:  # the node's SLURM name is its host name
            wait_for(f"{host} back in SLURM", lambda: _node_usable(site, host), 120, step=2)
        except AssertionError:
            slurm(site, ["scontrol", "update", f"nodename={host}", "state=resume"], check=False)
            wait_for(f"{host} resumed", lambda: _node_usable(site, host), 60, step=2)
        assert_converged(service, watch)
    assert_completed("linkcut", 2, may_requeue=True)


#: The gated jobs of the node-down test: gsi only (one pilot of 4 cores there), so that
#: all four run on the pilot SLURM kills, and the next pilots are gsi's too.
GSI_ONLY = '+DesiredSites = "gsi"\nrequirements = PilotSite == "gsi"\n'
#: From a pilot's end in SLURM to its jobs running on the next one: the jobs go idle (at
#: once, or after their 30 s lease), the service submits a pilot, it starts and its
#: startd joins, and the jobs are matched (negotiation every 10 s). HTCondor 23.9's
#: schedd keeps a job whose cool-down ended from the negotiator for up to 20 minutes in a
#: queue where nothing else goes idle.
RUN_AGAIN_WITHIN_S = 240


def _payloads_on(host: str) -> int:
    """How many gated jobs' payloads (their `sleep`) run on testbed host `host`."""
    count = 0
    for pid in pilot_processes(host):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            count += argv[:2] == [b"sleep", str(GATE_SECONDS).encode()]
    return count


def test_pilot_killed_by_slurm_right_after_its_jobs_started(service: Service) -> None:
    # SLURM declares the pilot's node down seconds after its 4 jobs began to execute and
    # kills the batch job. A starter that outlives the pilot's other daemons a moment ends
    # its job with a starter error of its own (1007: it lost the ProcD or its startd),
    # well within the failed-start window; one killed at once leaves its job to its
    # lease. Neither is a failed start: no cool-down (23.9's schedd would not offer the
    # job again before it rebuilt its runnable list, up to 20 minutes, while the next
    # pilot waits unclaimed: "Got NO_MORE_JOBS" in the NegotiatorLog), and every job runs
    # again on the next pilot(s).
    cluster = submit_gated("nodedown", 4, GSI_ONLY)
    with SiteWatch() as watch:
        service.start()
        running = wait_for("4 jobs running", lambda: len(running_on(cluster)) == 4 and
                           running_on(cluster), 180, step=0.5)
        [startd] = set(running)  # type: ignore[call-overload]
        name, host = split_startd(startd)
        job = name.removeprefix("pilot-").rsplit("-", 1)[1]
        wait_for("their 4 payloads executing", lambda: _payloads_on(host) == 4, 60, step=0.3)
        slurm("gsi", ["scontrol", "update", f"nodename={host}", "state=down",
                      "reason=test-node-down"])
        try:
            wait_for("the pilot gone from SLURM", lambda: job not in pilot_ids("gsi"), 60,
                     step=1)
            idle = wait_for("the jobs idle again", lambda: htcondor.Schedd().query(
                constraint=f"ClusterId == {cluster} && JobStatus == 1 && "
                "VacateReasonCode =!= undefined",
                projection=["ProcId", "VacateReasonCode", "VacateReason",
                            "NumJobCoolDowns", "JobCoolDownExpiration"]), 120, step=0.5)
            print(f"vacated: {[dict(ad) for ad in idle]}")  # type: ignore[attr-defined]
            # Each job runs again on another pilot (or has run and ended: gates opened,
            # so that a next pilot sized to the jobs idle at its submission makes room).
            ran: set[int] = set()

            def all_ran_again() -> bool:
                open_gates()
                ads = htcondor.Schedd().query(constraint=f"ClusterId == {cluster}",
                                              projection=["ProcId", "JobStatus",
                                                          "RemoteHost"])
                left = {int(ad["ProcId"]) for ad in ads}
                ran.update(int(ad["ProcId"]) for ad in ads if ad["JobStatus"] == 2 and
                           not str(ad.get("RemoteHost", "")).endswith(f"@{startd}"))
                ran.update(set(range(4)) - left)  # gone from the queue: it ran
                return len(ran) == 4
            wait_for("every job run again on the next pilot(s)", all_ran_again,
                     RUN_AGAIN_WITHIN_S, step=1)
            cooled = [dict(ad) for ad in idle if "NumJobCoolDowns" in ad]  # type: ignore[attr-defined]
            assert not cooled, f"a killed pilot's jobs put into a cool-down: {cooled}"
        finally:
            slurm("gsi", ["scontrol", "update", f"nodename={host}", "state=resume"],
                  check=False)
        wait_for(f"{host} back in SLURM", lambda: _node_usable("gsi", host), 120, step=2)
        wait_for("all jobs done", lambda: gated_jobs_left(cluster) == 0, 120, step=2)
        assert_converged(service, watch)
    assert_completed("nodedown", 4, may_requeue=True)
