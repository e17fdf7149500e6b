"""Faults in the multi-host testbed, each survived with nothing lost.

Every test runs the provisioner as a real service (its own account, on cm,
reaching both sites over SSH), injects one fault while jobs run, and asserts at
the end: every user job completed (none removed, none evicted unless the fault
itself took its node away), no pilot left in SLURM or the collector once the
queue is empty, never more pilots at a site than its cap, and the service log
says what happened.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import htcondor2 as htcondor
import pytest
from conftest import (
    LOGIN,
    SITES,
    WORKERS,
    kill_pilot_processes,
    pilot_process_count,
    pilot_processes,
    run,
    slurm,
)
from servicectl import (
    Service,
    SiteWatch,
    job_events,
    pilot_ads,
    pilot_ids,
    service_dir,
    write_config,
)
from test_loop import (
    ADMIN,
    ALICE,
    clean_pool,
    jobs_left,
    pilot_ad_ages,
    submit,
    submit_script,
    wait_for,
)

from provisioner.pilot.procs import read_stat

#: Caps of the testbed configuration (deploy/testbed/provisioner.yaml).
CAPS = {"gsi": 1, "frankfurt": 2}


@pytest.fixture
def service() -> Iterator[Service]:
    clean_pool()
    directory = service_dir()
    svc = Service(write_config(directory), directory / "service.log")
    try:
        yield svc
    finally:
        svc.stop()
        print(f"--- service log ({svc.log}) ---\n{svc.text()}")
        clean_pool()


def assert_completed(name: str, count: int, may_requeue: bool = False) -> None:
    """Every job of `name` terminated normally; none removed or held. With
    may_requeue a job may have been evicted by the fault and run again."""
    out = ALICE / "out" / name
    codes = job_events(out / "job.log")
    assert codes.count("005") == count, (out / "job.log").read_text()
    assert "009" not in codes and "012" not in codes, (out / "job.log").read_text()
    if not may_requeue:
        assert "004" not in codes, (out / "job.log").read_text()
    for i in range(count):
        assert (out / f"{i}.out").read_text().strip() == f"job-{i}-ok"


def assert_converged(svc: Service, watch: SiteWatch) -> None:
    """Queue empty, then no pilot left anywhere; caps never exceeded."""
    wait_for("no pilot left in SLURM", lambda: not any(pilot_ids(s) for s in SITES), 240,
             step=2)
    # A pilot that SLURM killed without warning (a lost node once back) leaves its
    # ad behind: it goes after the collector's ad lifetime plus up to one sweep.
    try:
        wait_for("no pilot left in the collector", lambda: not pilot_ads(), 300, step=2)
    except AssertionError as exc:  # say whether an orphan still runs or an ad is stale
        raise AssertionError(f"{exc}; pilot ads, seconds since last heard: "
                             f"{pilot_ad_ages()}; pilot processes per worker: "
                             f"{ {h: pilot_process_count(h) for s in SITES for h in WORKERS[s]} }"
                             ) from None
    for site in SITES:
        assert watch.most[site] <= CAPS[site], (site, watch.most, watch.story(), svc.text())


def test_kill_9_mid_cycle_then_restart_rebuilds_from_the_sites(service: Service) -> None:
    # One Frankfurt node drained: a second Frankfurt pilot stays pending.
    slurm("frankfurt", ["scontrol", "update", "nodename=fra-n2", "state=drain",
                        "reason=fault-test"])
    try:
        # 12 one-core jobs: gsi (cap 1) and Frankfurt take 4 each, a third pilot waits.
        cluster = submit("kill9", 12, 40)
        with SiteWatch() as watch:
            service.start()
            # Killed the moment its first sbatch returned: in the middle of acting.
            wait_for("a first pilot", lambda: any(pilot_ids(s) for s in SITES), 60, step=0.2)
            service.kill9()
            service.start()

            def pending_and_busy() -> bool:
                text = service.cycles()[-1] if service.cycles() else ""
                return "pending" in text and "busy" in text

            wait_for("pilots pending and busy", pending_and_busy, 120, step=1)
            before = {s: set(pilot_ids(s)) for s in SITES}
            service.kill9()
            service.start()
            wait_for("all jobs done", lambda: jobs_left(cluster) == 0, 300, step=2)
            # The restarted service saw the pilots it had: none submitted twice.
            after_restart = [line for line in service.cycles()
                             if "pending" in line or "busy" in line]
            assert after_restart
            assert watch.seen["frankfurt"] >= before["frankfurt"]
        assert_completed("kill9", 12)
    finally:
        slurm("frankfurt", ["scontrol", "update", "nodename=fra-n2", "state=resume"])
    assert_converged(service, watch)
    assert "Traceback" not in service.text()


@pytest.mark.parametrize("daemon", ["collector", "schedd"])
def test_pool_daemon_restarted_while_jobs_run(service: Service, daemon: str) -> None:
    cluster = submit(f"restart-{daemon}", 4, 60)
    with SiteWatch() as watch:
        service.start()
        wait_for("jobs running", lambda: len(_running_on(cluster)) >= 2, 120)
        # The pool's administrator restarts it.
        run(["condor_restart", "-daemon", daemon], env=ADMIN)
        wait_for("all jobs done", lambda: jobs_left(cluster) == 0, 300, step=2)
        assert_converged(service, watch)
    if daemon == "collector":
        # A restarted collector hears from the negotiator only at its next update
        # (5 minutes); the next tests expect the pool whole, so ask for it now.
        run(["condor_reconfig"], env=ADMIN)
        wait_for("every pool daemon advertised again", lambda: all(
            htcondor.Collector().locateAll(d) for d in (htcondor.DaemonType.Negotiator,
                                                         htcondor.DaemonType.Schedd)), 60)
    # No job evicted: no busy pilot was released or cancelled while the pool was
    # half-visible.
    assert_completed(f"restart-{daemon}", 4)


def _slurmctld(site: str, start: bool) -> None:
    conf = f"/etc/slurm-{site}/slurm.conf"
    if start:
        run(["slurmctld", "-f", conf], host=LOGIN[site])
        wait_for(f"slurmctld at {site}", lambda: slurm(
            site, ["sinfo", "-h"], check=False).returncode == 0, 60)
    else:
        pid = Path(f"/run/slurm/slurmctld-{site}.pid").read_text().strip()
        run(["kill", "-TERM", pid])
        wait_for(f"slurmctld at {site} stopped", lambda: slurm(
            site, ["sinfo", "-h"], check=False, timeout=30).returncode != 0, 60)


def test_site_controller_down_for_several_cycles(service: Service) -> None:
    first = submit("ctld-first", 4, 90)
    with SiteWatch() as watch:
        service.start()
        wait_for("a busy pilot at gsi", lambda: "gsi: 1 busy" in "".join(service.cycles()[-1:]),
                 120)
        _slurmctld("gsi", start=False)
        try:
            second = submit("ctld-second", 4, 20)
            wait_for("three cycles with gsi unknown",
                     lambda: sum("gsi: UNKNOWN" in c for c in service.cycles()) >= 3, 120)
            unknown = [c for c in service.cycles() if "gsi: UNKNOWN" in c]
            # Nothing is done at gsi while it is unknown; Frankfurt is served.
            for line in unknown:
                assert "at gsi" not in line.split("actions:")[1]
                assert "gsi/" not in line.split("actions:")[1]
            assert "site gsi unknown" in service.text()
        finally:
            _slurmctld("gsi", start=True)
        wait_for("all jobs done", lambda: jobs_left(first) + jobs_left(second) == 0, 300,
                 step=2)
        assert_converged(service, watch)
    assert_completed("ctld-first", 4)
    assert_completed("ctld-second", 4)


def _link(host: str, up: bool) -> None:
    """Cut or restore a host's link (its veth port on the router)."""
    run(["nsenter", "--net=/proc/1/ns/net", "--", "ip", "link", "set", f"v-{host}",
         "up" if up else "down"])


def test_login_node_unreachable_then_back(service: Service) -> None:
    first = submit("login-first", 6, 60)  # more than gsi (cap 1 pilot of 4 cores) takes
    with SiteWatch() as watch:
        service.start()
        wait_for("a busy pilot at frankfurt",
                 lambda: "busy" in "".join(service.cycles()[-1:]).split("frankfurt:")[-1], 120)
        _link(LOGIN["frankfurt"], up=False)
        try:
            second = submit("login-second", 4, 20)
            wait_for("two cycles with frankfurt unknown",
                     lambda: sum("frankfurt: UNKNOWN" in c for c in service.cycles()) >= 2,
                     180)
            assert "site frankfurt unknown" in service.text()
            assert "gsi" in "".join(service.cycles()[-1:])
        finally:
            _link(LOGIN["frankfurt"], up=True)
        wait_for("all jobs done", lambda: jobs_left(first) + jobs_left(second) == 0, 300,
                 step=2)
        assert_converged(service, watch)
    assert_completed("login-first", 6)
    assert_completed("login-second", 4)


def _running_on(cluster: str) -> list[str]:
    """Startd names ("pilot-<site>-<job>@<host>") running the cluster's jobs."""
    ads = htcondor.Schedd().query(constraint=f"ClusterId == {cluster} && JobStatus == 2",
                                  projection=["RemoteHost"])
    return [ad["RemoteHost"].split("@", 1)[1] for ad in ads if "RemoteHost" in ad]


def test_pilot_killed_under_a_running_job(service: Service) -> None:
    cluster = submit("killed", 2, 45)
    with SiteWatch() as watch:
        service.start()
        startd = wait_for("a job running", lambda: _running_on(cluster), 120)[0]  # type: ignore[index]
        name, host = startd.split("@")
        key = "/".join(name.removeprefix("pilot-").rsplit("-", 1))
        assert kill_pilot_processes(host) > 0
        # SLURM and the collector disagree (ad without job); the service says so,
        # the job goes back to idle (its lease) and is provisioned for again.
        wait_for("the disagreement logged",
                 lambda: f"pilot {key} left SLURM while running jobs" in service.text()
                 or f"pilot {key}: startd ad in the collector but no SLURM job"
                 in service.text(), 120)
        wait_for("all jobs done", lambda: jobs_left(cluster) == 0, 360, step=2)
        assert_converged(service, watch)
    assert_completed("killed", 2, may_requeue=True)


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
    cluster = submit("hang", 1, 20)
    parent = 0
    try:
        with SiteWatch() as watch:
            service.start()
            startd = wait_for("a job running", lambda: _running_on(cluster), 120)[0]  # type: ignore[index]
            name, host = startd.split("@")
            site, job = name.removeprefix("pilot-").rsplit("-", 1)
            parent = _container_parent(host, name)
            os.kill(parent, signal.SIGSTOP)
            wait_for("the job done", lambda: jobs_left(cluster) == 0, 120)
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
    """gsi pilots live 4 minutes (SLURM warns 90 s before); Frankfurt takes none."""
    for site in data["sites"]:
        if site["name"] == "gsi":
            site["pilot"].update(walltime_s=240, shutdown_margin_s=90)
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
        assert len(watch.seen["gsi"]) >= 2
        # SLURM's warning (90 s before the end, up to 60 s early) drains the startd;
        # the running job retires on until the pilot's last minute, not cut at the
        # warning. The first pilot's walltime end is in its log.
        first = min(watch.seen["gsi"], key=int)
        log = Path(f"/var/log/pilots/htcpilot-testbed-gsi-{first}.out").read_text()
        found = re.search(r"walltime end (\d+)\)", log)
        assert found is not None, log
        end = int(found.group(1))
        [evicted, *_] = _event_times(ALICE / "out" / "walltime" / "job.log", "004")
        assert end - 80 <= evicted <= end - 40, (
            f"evicted {end - evicted:.0f} s before the walltime end (expected about 60)")
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
    data["policy"]["breaker"] = {"threshold": 2, "base_s": 60, "max_s": 600}
    for site in data["sites"]:
        if site["name"] == "frankfurt":
            site["image"] = "/opt/images/missing.sif"


def test_black_hole_site_is_put_behind_a_circuit_breaker() -> None:
    clean_pool()
    directory = service_dir()
    config = write_config(directory, _black_hole)
    svc = Service(config, directory / "service.log")
    # Three waves on gsi's one pilot: demand outlasts the first pause.
    cluster = submit("blackhole", 12, 45)
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
            wait_for("a failed test", lambda: "circuit breaker OPEN for 120 s" in svc.text(),
                     200, step=2)
            wait_for("all jobs done at gsi", lambda: jobs_left(cluster) == 0, 240, step=2)
            assert_converged(svc, watch)
        # Two pilots opened it, one tested it: Frankfurt was not fed more.
        assert len(watch.seen["frankfurt"]) <= 4, watch.seen
        assert "half-open" in svc.text()
    finally:
        svc.stop()
        print(f"--- service log ({svc.log}) ---\n{svc.text()}")
        clean_pool()
    assert_completed("blackhole", 12)


def _admin_drain(startd: str) -> None:
    """The site's admin drains a pilot (graceful, no exit), as the pilot account on
    its node with the pilot's own configuration, like any condor_drain there."""
    name, host = startd.split("@")
    site, job_id = name.removeprefix("pilot-").rsplit("-", 1)
    workdir = f"/tmp/pilot-{site}-{job_id}"
    run(["apptainer", "-s", "exec", "--cleanenv", "--no-home", "--bind", workdir, "--env",
         f"CONDOR_CONFIG={workdir}/condor_config", "/opt/images/pilot.sif", "condor_drain",
         "-graceful", "-reason", "maintenance by the site", startd],
        user="pilot", host=host)


def test_pilot_drained_by_an_admin_is_cancelled_once_its_jobs_are_done(
        service: Service) -> None:
    cluster = submit("drained", 1, 30)
    with SiteWatch() as watch:
        service.start()
        startd = wait_for("the job running", lambda: _running_on(cluster), 120)[0]  # type: ignore[index]
        _admin_drain(startd)
        key = "/".join(startd.split("@")[0].removeprefix("pilot-").rsplit("-", 1))
        wait_for("the job done", lambda: jobs_left(cluster) == 0, 120, step=2)
        wait_for("the drained pilot cancelled", lambda: f"cancel {key}" in
                 "".join(service.cycles()), 90)
        assert_converged(service, watch)
    assert_completed("drained", 1)  # the drain let it finish; the provisioner killed nothing


def test_second_service_for_the_same_id_refuses_to_start(service: Service) -> None:
    service.start()
    wait_for("the first service cycling", lambda: service.cycles(), 60)
    second = run(["/opt/venv/bin/provisioner", "-c", str(service.config), "run"],
                 user="provisioner", check=False, timeout=60)
    assert second.returncode == 3, second.stdout + second.stderr
    assert "another provisioner service holds" in second.stderr and "(pid " in second.stderr
    # A killed service's lock never blocks its restart.
    service.kill9()
    service.start()
    wait_for("the restarted service cycling", lambda: len(
        [c for c in service.cycles() if "cycle 1 " in c]) >= 2, 60)


def _node_usable(site: str, node: str) -> bool:
    out = slurm(site, ["sinfo", "-h", "-n", node, "-o", "%t"], check=False).stdout.strip()
    return out in ("idle", "mix", "alloc")


def test_worker_link_cut_while_a_job_runs_there(service: Service) -> None:
    cluster = submit("linkcut", 2, 60)
    with SiteWatch() as watch:
        service.start()
        startd = wait_for("a job running", lambda: _running_on(cluster), 120)[0]  # type: ignore[index]
        name, host = startd.split("@")
        site = "gsi" if host.startswith("gsi") else "frankfurt"
        key = "/".join(name.removeprefix("pilot-").rsplit("-", 1))
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
            wait_for("all jobs done", lambda: jobs_left(cluster) == 0, 360, step=2)
        finally:
            _link(host, up=True)
        try:  # the node's SLURM name is its host name
            wait_for(f"{host} back in SLURM", lambda: _node_usable(site, host), 120, step=2)
        except AssertionError:
            slurm(site, ["scontrol", "update", f"nodename={host}", "state=resume"], check=False)
            wait_for(f"{host} resumed", lambda: _node_usable(site, host), 60, step=2)
        assert_converged(service, watch)
    assert_completed("linkcut", 2, may_requeue=True)
