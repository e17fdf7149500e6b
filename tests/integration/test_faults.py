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
import json
import os
import re
import shutil
import signal
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import htcondor2 as htcondor
import pytest
import yaml
from conftest import (
    HOSTS,
    LOGIN,
    SITES,
    WORKERS,
    drop_output,
    kill_pilot_processes,
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
    sbatch_hook,
    service_dir,
    workers_drained,
    write_config,
)
from test_loop import (
    ADMIN,
    ALICE,
    GATE_SECONDS,
    clean_pool,
    drop_dead_pilot_ads,
    gated_jobs_left,
    jobs_left,
    open_gates,
    pilot_ad_ages,
    pilot_process_counts,
    submit_gated,
    submit_script,
    submits_in,
    wait_for,
)

from provisioner.pilot.procs import read_stat


def caps_of(config: Path) -> dict[str, int]:
    """Each site's max_pilots in the configuration a service runs with."""
    data = yaml.safe_load(config.read_text())
    return {site["name"]: int(site["caps"]["max_pilots"]) for site in data["sites"]}


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
    # Nothing of a pilot runs on (a lost node once back: its orphans ended by SLURM).
    wait_for("no pilot process on any worker", lambda: not pilot_process_counts(), 120,
             step=2)
    # What the collector still has are dead pilots' ads (it would drop each only after
    # its ad lifetime): dropped, as the pool's administrator would.
    dropped = drop_dead_pilot_ads()
    try:
        wait_for("no pilot left in the collector", lambda: not pilot_ads(), 30, step=1)
    except AssertionError as exc:  # an ad back after the drop: something advertises
        raise AssertionError(f"{exc}; dropped {dropped}; pilot ads, seconds since last "
                             f"heard: {pilot_ad_ages()}") from None
    caps = caps_of(svc.config)
    watch.checked()
    for site in SITES:
        assert watch.most[site] <= caps[site], (site, watch.most, watch.story(), svc.text())


#: While this directory exists, Frankfurt's second sbatch waits (the service is then in
#: the middle of acting: one pilot submitted, the cycle not yet recorded) and then fails.
#: World-writable: sbatch runs as the sites' pilot account.
HOLD = Path("/run/test-hold-sbatch")
HOOK_SCRIPT = f"""# test_faults: Frankfurt's second sbatch waits while {HOLD} exists, then fails.
if [ -d {HOLD} ] && [ "$SLURM_CONF" = /etc/slurm-frankfurt/slurm.conf ]; then
    echo sbatch >>{HOLD}/calls
    if [ "$(wc -l <{HOLD}/calls)" -ge 2 ]; then
        touch {HOLD}/reached
        while [ -d {HOLD} ]; do sleep 0.2; done
        echo "sbatch: held by the test, not submitted" >&2
        exit 1
    fi
fi"""


@contextlib.contextmanager
def held_second_sbatch_at_frankfurt() -> Iterator[Path]:
    """Frankfurt's second sbatch blocks until the block ends; yields the file that
    appears once it blocks."""
    shutil.rmtree(HOLD, ignore_errors=True)
    HOLD.mkdir()
    HOLD.chmod(0o1777)
    try:
        with sbatch_hook(HOOK_SCRIPT):
            yield HOLD / "reached"
    finally:
        shutil.rmtree(HOLD, ignore_errors=True)


def test_kill_9_mid_cycle_then_restart_rebuilds_from_the_sites(service: Service) -> None:
    # One Frankfurt node drained: a second Frankfurt pilot stays pending.
    slurm("frankfurt", ["scontrol", "update", "nodename=fra-n2", "state=drain",
                        "reason=fault-test"])
    try:
        # 12 one-core jobs: gsi (cap 1) and Frankfurt take 4 each, a third pilot waits.
        # They run until the test has seen what it waits for (then their gates open).
        cluster = submit_gated("kill9", 12)
        with SiteWatch() as watch:
            with held_second_sbatch_at_frankfurt() as reached:
                service.start()
                wait_for("the service held in its second sbatch at frankfurt",
                         reached.exists, 90, step=0.2)
                # In the middle of acting: one Frankfurt pilot is in SLURM, but the
                # cycle has recorded nothing (its line comes after the act).
                [mid_act] = pilot_ids("frankfurt")
                assert service.cycles() == [], service.text()
                service.kill9()
            service.start()

            def pending_and_busy() -> bool:
                text = service.cycles()[-1] if service.cycles() else ""
                return "pending" in text and "busy" in text

            wait_for("pilots pending and busy", pending_and_busy, 120, step=1)
            # The restarted service found the pilot the killed one had submitted
            # unrecorded, and did not submit it again.
            assert mid_act in watch.checked().seen["frankfurt"], watch.story()
            assert len(watch.seen["frankfurt"]) == 2, (watch.story(), service.text())
            before = {s: set(pilot_ids(s)) for s in SITES}
            assert before["frankfurt"] == watch.seen["frankfurt"], watch.story()
            # Killed again between cycles, with pilots pending and busy: the next
            # service has every pilot it needs and submits none (two of its cycles
            # with the jobs still running, then the jobs end).
            service.kill9()
            mark = len(service.cycles())
            service.start()
            wait_for("two cycles of the restarted service with pilots pending and busy",
                     lambda: len([c for c in service.cycles()[mark:]
                                  if "pending" in c and "busy" in c]) >= 2, 120)
            wait_for("all jobs done", lambda: gated_jobs_left(cluster) == 0, 300, step=2)
            assert {s: watch.checked().seen[s] for s in SITES} == before, (
                watch.story(), service.text())
        assert_completed("kill9", 12)
    finally:
        slurm("frankfurt", ["scontrol", "update", "nodename=fra-n2", "state=resume"])
    assert_converged(service, watch)
    assert "Traceback" not in service.text()


def _startds(host: str) -> list[int]:
    """Pids of the pilot startds on `host`."""
    out = []
    for pid in pilot_processes(host):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(
                    b"condor_startd"):
                out.append(pid)
    return out


def _cycles_after(svc: Service, mark: int, text: str, count: int) -> list[str]:
    """The service's cycle lines after the first `mark` ones that contain `text`, once
    there are `count` of them (else an empty list)."""
    lines = [line for line in svc.cycles()[mark:] if text in line]
    return lines if len(lines) >= count else []


def _decided_nothing_for_pilots(lines: list[str]) -> None:
    for line in lines:
        actions = line.split("actions:")[1]
        for verb in ("flag", "release", "cancel"):
            assert f"{verb} " not in actions, line


def test_collector_restarted_while_jobs_run(service: Service) -> None:
    """A restarted collector has no pilot ads until each startd's next update: the
    pool is half visible. Pilots the schedd runs jobs on are busy, not starting
    capacity, and nothing is decided for them. The window is held open by stopping
    the startds (SIGSTOP) until the service has seen it in two cycles."""
    cluster = submit_gated("restart-collector", 4)
    stopped: list[int] = []
    with SiteWatch() as watch:
        service.start()
        wait_for("jobs running", lambda: len(_running_on(cluster)) >= 2, 120)
        try:
            stopped = [pid for s in SITES for h in WORKERS[s] for pid in _startds(h)]
            assert stopped, "no pilot startd found"
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)
            mark = len(service.cycles())
            # The pool's administrator restarts it.
            run(["condor_restart", "-daemon", "collector"], env=ADMIN)
            # The central manager's own daemons advertise again at once (else at
            # their next update); the stopped pilot startds cannot.
            wait_for("the collector back", lambda: htcondor.Collector().locateAll(
                htcondor.DaemonType.Collector), 60)
            run(["condor_reconfig"], env=ADMIN)
            # The second submit host's daemons too (their own master): else its schedd
            # is unknown to the pool until its next update, minutes on.
            run(["condor_reconfig"], env=ADMIN, host=SUBMIT2)
            half = wait_for("two cycles that saw busy pilots without ads", lambda: _cycles_after(
                service, mark, "busy without a startd ad", 2), 120)
            _decided_nothing_for_pilots(half)  # type: ignore[arg-type]
            assert " starting" not in " ".join(half), half  # type: ignore[arg-type]
        finally:
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        wait_for("all jobs done", lambda: gated_jobs_left(cluster) == 0, 300, step=2)
        assert_converged(service, watch)
    wait_for("every pool daemon advertised again", lambda: htcondor.Collector().locateAll(
        htcondor.DaemonType.Negotiator) and len(htcondor.Collector().locateAll(
            htcondor.DaemonType.Schedd)) == len(SCHEDDS), 60)
    # No job evicted: no busy pilot was released or cancelled while the pool was
    # half-visible.
    assert_completed("restart-collector", 4)


def test_schedd_down_while_jobs_wait_for_a_pending_pilot(service: Service) -> None:
    """While the schedd is down the queue is unknown, not empty: cycles say so and act
    on nothing. A pilot is pending for the waiting jobs (every worker node drained) and
    the service cancels a pending pilot no demand needs in the first such cycle
    (pending_cancel_cycles 1), so one that read the unknown queue as empty would cancel
    it at once (checked: with the rule switched off it does). When the schedd and the
    nodes are back, the pilot runs the jobs. (With the second submit host up the pool
    is read in part, "schedd cm UNKNOWN"; without it, "pool UNKNOWN".)"""
    def cancel_at_once(data: dict) -> None:  # type: ignore[type-arg]
        data["policy"].setdefault("placement", {})["pending_cancel_cycles"] = 1

    service.config = write_config(service.config.parent, cancel_at_once)
    with SiteWatch() as watch:
        with workers_drained():
            cluster = submit_gated("restart-schedd", 2)
            service.start()
            wait_for("a pilot pending", lambda: " 1 pending" in "".join(service.cycles()[-1:]),
                     120)
            pending = {site: pilot_ids(site) for site in SITES}
            mark = len(service.cycles())
            run(["condor_off", "-daemon", "schedd"], env=ADMIN)
            try:
                down = wait_for("two cycles with the pool unknown", lambda: _cycles_after(
                    service, mark, "pool UNKNOWN", 2) or _cycles_after(
                    service, mark, "UNKNOWN (no scale-down)", 2), 90)
                for line in down:  # type: ignore[attr-defined]
                    assert line.split("actions:")[1].startswith(" none"), line
                assert {site: pilot_ids(site) for site in SITES} == pending, pending
            finally:
                run(["condor_on", "-daemon", "schedd"], env=ADMIN)
        wait_for("all jobs done", lambda: gated_jobs_left(cluster) == 0, 300, step=2)
        assert_converged(service, watch)
    assert re.search(r"(pool|schedd \S+) unknown this cycle", service.text())
    assert_completed("restart-schedd", 2)


#: The testbed's submit hosts, each with a schedd (cm and the second submit host).
SUBMIT2 = "submit2"
SCHEDDS = ("cm", SUBMIT2)


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
    first = submit_gated("ctld-first", 4)
    with SiteWatch() as watch:
        service.start()
        wait_for("a busy pilot at gsi", lambda: "gsi: 1 busy" in "".join(service.cycles()[-1:]),
                 120)
        _slurmctld("gsi", start=False)
        try:
            second = submit_gated("ctld-second", 4)
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
        wait_for("all jobs done", lambda: gated_jobs_left(first) + jobs_left(second) == 0,
                 300, step=2)
        assert_converged(service, watch)
    assert_completed("ctld-first", 4)
    assert_completed("ctld-second", 4)


def _link(host: str, up: bool) -> None:
    """Cut or restore a host's link (its veth port on the router)."""
    run(["nsenter", "--net=/proc/1/ns/net", "--", "ip", "link", "set", f"v-{host}",
         "up" if up else "down"])


def _login_unreachable(site: str, cut: bool) -> None:
    """Drop (or stop dropping) what the submit host, where the service runs, sends to
    the site's login node: its SSH fails as in a broken route. The login node also runs
    the site's slurmctld, which its compute nodes must still reach: cutting its whole
    link would make SLURM declare them down after SlurmdTimeout and kill the pilots,
    another fault, whose outcome races the test's own timing."""
    address = HOSTS[LOGIN[site]][0]
    drop_output("cm", f"ip daddr {address} drop" if cut else None, "logincut")


def test_login_node_unreachable_then_back(service: Service) -> None:
    first = submit_gated("login-first", 6)  # more than gsi (cap 1 pilot of 4 cores) takes
    with SiteWatch() as watch:
        service.start()
        wait_for("a busy pilot at frankfurt",
                 lambda: "busy" in "".join(service.cycles()[-1:]).split("frankfurt:")[-1], 120)
        _login_unreachable("frankfurt", cut=True)
        try:
            second = submit_gated("login-second", 4)
            wait_for("two cycles with frankfurt unknown",
                     lambda: sum("frankfurt: UNKNOWN" in c for c in service.cycles()) >= 2,
                     180)
            assert "site frankfurt unknown" in service.text()
            unknown = [c for c in service.cycles() if "frankfurt: UNKNOWN" in c]
            # Nothing is decided at frankfurt while it is unknown (its pilots are
            # neither counted gone nor fed); gsi, read as usual, is served.
            for line in unknown:
                actions = line.split("actions:")[1]
                assert "at frankfurt" not in actions and "frankfurt/" not in actions, line
                assert "gsi: UNKNOWN" not in line, line
        finally:
            _login_unreachable("frankfurt", cut=False)
        wait_for("all jobs done", lambda: gated_jobs_left(first) + jobs_left(second) == 0,
                 300, step=2)
        assert_converged(service, watch)
    assert_completed("login-first", 6)
    assert_completed("login-second", 4)


def _running_on(cluster: str) -> list[str]:
    """Startd names ("pilot-<site>-<job>@<host>") running the cluster's jobs."""
    ads = htcondor.Schedd().query(constraint=f"ClusterId == {cluster} && JobStatus == 2",
                                  projection=["RemoteHost"])
    return [ad["RemoteHost"].split("@", 1)[1] for ad in ads if "RemoteHost" in ad]


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
        startd = wait_for("a job running", lambda: _running_on(cluster), 120)[0]  # type: ignore[index]
        name, host = startd.split("@")
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
            startd = wait_for("a job running", lambda: _running_on(cluster), 120)[0]  # type: ignore[index]
            name, host = startd.split("@")
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
    name, host = startd.split("@")
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
        startd = wait_for("the job running", lambda: _running_on(cluster), 120)[0]  # type: ignore[index]
        _admin_drain(startd)
        key = "/".join(startd.split("@")[0].removeprefix("pilot-").rsplit("-", 1))
        wait_for("the job done", lambda: gated_jobs_left(cluster) == 0, 120, step=2)
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
    cluster = submit_gated("linkcut", 2)
    with SiteWatch() as watch:
        service.start()
        startd = wait_for("a job running", lambda: _running_on(cluster), 120)[0]  # type: ignore[index]
        name, host = startd.split("@")
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
        running = wait_for("4 jobs running", lambda: len(_running_on(cluster)) == 4 and
                           _running_on(cluster), 180, step=0.5)
        [startd] = set(running)  # type: ignore[call-overload]
        name, host = startd.split("@")
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
