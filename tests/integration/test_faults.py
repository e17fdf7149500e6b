"""Faults of the service and the pool in the multi-host testbed, each survived with
nothing lost: the service killed mid-cycle, the collector restarted, the schedd down, a
site's controller or login node unreachable, a second service for the same id
(faults.py: what every fault test checks; test_faults_pilots.py: faults of pilots and
their nodes).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import htcondor2 as htcondor
import pytest
from conftest import (
    HOSTS,
    LOGIN,
    SITES,
    WORKERS,
    drop_output,
    pilot_processes,
    run,
    slurm,
)
from faults import assert_completed, assert_converged, running_on, running_service
from servicectl import (
    Service,
    SiteWatch,
    pilot_ids,
    sbatch_hook,
    workers_drained,
    write_config,
)
from test_loop import (
    ADMIN,
    gated_jobs_left,
    jobs_left,
    submit_gated,
    wait_for,
)

from provisioner.pool.pilot_view import runs_jobs


@pytest.fixture
def service() -> Iterator[Service]:
    with running_service() as svc:
        yield svc


#: While this directory exists, gsi's second sbatch waits (the service is then in the
#: middle of acting: one pilot submitted, the cycle not yet recorded) and then fails.
#: World-writable: sbatch runs as the sites' pilot account. (gsi: the site reached
#: through sbatch over SSH, where a hook can hold a submission.)
HOLD = Path("/run/test-hold-sbatch")
HOOK_SCRIPT = f"""# test_faults: gsi's second sbatch waits while {HOLD} exists, then fails.
if [ -d {HOLD} ] && [ "$SLURM_CONF" = /etc/slurm-gsi/slurm.conf ]; then
    echo sbatch >>{HOLD}/calls
    if [ "$(wc -l <{HOLD}/calls)" -ge 2 ]; then
        touch {HOLD}/reached
        while [ -d {HOLD} ]; do sleep 0.2; done
        echo "sbatch: held by the test, not submitted" >&2
        exit 1
    fi
fi"""


@contextlib.contextmanager
def held_second_sbatch_at_gsi() -> Iterator[Path]:
    """gsi's second sbatch blocks until the block ends; yields the file that appears
    once it blocks."""
    shutil.rmtree(HOLD, ignore_errors=True)
    HOLD.mkdir()
    HOLD.chmod(0o1777)
    try:
        with sbatch_hook(HOOK_SCRIPT):
            yield HOLD / "reached"
    finally:
        shutil.rmtree(HOLD, ignore_errors=True)


def _two_gsi_pilots(data: dict) -> None:  # type: ignore[type-arg]
    """gsi may hold two pilots, submitted in one cycle."""
    for s in data["sites"]:
        if s["name"] == "gsi":
            s["caps"] = {"max_pilots": 2, "max_pending": 2, "max_submit_per_cycle": 2}


def test_kill_9_mid_cycle_then_restart_rebuilds_from_the_sites() -> None:
    with running_service(_two_gsi_pilots) as service:
        _kill_9_mid_cycle(service)


def _kill_9_mid_cycle(service: Service) -> None:
    # One gsi node drained: a second gsi pilot stays pending.
    slurm("gsi", ["scontrol", "update", "nodename=gsi-n2", "state=drain",
                  "reason=fault-test"])
    try:
        # 12 one-core jobs: gsi and Frankfurt (cap 2 each) take 4 a pilot, a second gsi
        # pilot waits. They run until the test has seen what it waits for (then their
        # gates open).
        cluster = submit_gated("kill9", 12)
        with SiteWatch() as watch:
            with held_second_sbatch_at_gsi() as reached:
                service.start()
                wait_for("the service held in its second sbatch at gsi",
                         reached.exists, 90, step=0.2)
                # In the middle of acting: one gsi pilot is in SLURM, but the cycle has
                # recorded nothing (its line comes after the act).
                [mid_act] = pilot_ids("gsi")
                assert service.cycles() == [], service.text()
                service.kill9()
            service.start()

            def pending_and_busy() -> bool:
                text = service.cycles()[-1] if service.cycles() else ""
                return "pending" in text and "busy" in text

            wait_for("pilots pending and busy", pending_and_busy, 120, step=1)
            # The restarted service found the pilot the killed one had submitted
            # unrecorded, and did not submit it again.
            assert mid_act in watch.checked().seen["gsi"], watch.story()
            assert len(watch.seen["gsi"]) == 2, (watch.story(), service.text())
            before = {s: set(pilot_ids(s)) for s in SITES}
            assert before["gsi"] == watch.seen["gsi"], watch.story()
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
        slurm("gsi", ["scontrol", "update", "nodename=gsi-n2", "state=resume"])
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


def _only_busy_pilots(cluster: str) -> bool:
    """Whether every pilot in the sites' queues runs jobs of `cluster` (none pending,
    starting or idle)."""
    busy = frozenset(running_on(cluster))
    pilots = [(site, job) for site in SITES for job in pilot_ids(site)]
    return bool(pilots) and all(runs_jobs(site, job, busy) for site, job in pilots)


def test_collector_restarted_while_jobs_run(service: Service) -> None:
    """A restarted collector has no pilot ads until each startd's next update: the
    pool is half visible. Pilots the schedd runs jobs on are busy, not starting
    capacity, and nothing is decided for them. The window is held open by stopping
    the startds (SIGSTOP) until the service has seen it in two cycles. Every pilot
    is busy by then: a pilot still on its way, or idle beside the others' jobs (its
    jobs went to a pilot that joined first), would come up on its own, or be stopped
    while idle, and rightly be decided for."""
    cluster = submit_gated("restart-collector", 4)
    stopped: list[int] = []
    with SiteWatch() as watch:
        service.start()
        wait_for("jobs running", lambda: len(running_on(cluster)) >= 2, 120)
        wait_for("every pilot running jobs (an idle one released)",
                 lambda: _only_busy_pilots(cluster), 180, step=1)
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


#: What reading each site goes through, stopped in the test below: gsi's controller
#: (sbatch and squeue over SSH), frankfurt's slurmrestd (its controller stays up).
ENTRY = {"gsi": "slurmctld", "frankfurt": "slurmrestd"}
SLURMRESTD = "/src/deploy/testbed/inside/slurmrestd-ctl"


def _entry(site: str, start: bool) -> None:
    if ENTRY[site] == "slurmctld":
        _slurmctld(site, start)
        return
    run([SLURMRESTD, "start" if start else "stop"])
    # up: its port accepts a connection from the service's host
    wait_for(f"slurmrestd {'up' if start else 'down'}", lambda: (subprocess.run(
        ["/src/deploy/testbed/inside/on", "cm", "--", "python3", "-c",
         "import socket; socket.create_connection(('fra-login', 6820), timeout=5)"],
        capture_output=True, check=False).returncode == 0) == start, 60)


def _site_part(cycle: str, site: str) -> str:
    """What a cycle line says of `site` (up to the next "; ")."""
    return cycle.split(f"{site}: ", 1)[1].split("; ", 1)[0] if f"{site}: " in cycle else ""


@pytest.mark.parametrize("site", ["gsi", "frankfurt"],
                         ids=["ssh-gsi-slurmctld", "rest-frankfurt-slurmrestd"])
def test_site_controller_down_for_several_cycles(service: Service, site: str) -> None:
    """The way into a site stopped (gsi: its controller; frankfurt: its slurmrestd):
    the site is UNKNOWN, never empty, for as long as it is down: nothing is done
    there, its pilots run on, and the other site is served."""
    other = next(s for s in SITES if s != site)
    first = submit_gated("ctld-first", 6)  # more than gsi (cap 1 pilot of 4 cores) takes
    with SiteWatch() as watch:
        service.start()
        wait_for(f"a busy pilot at {site}",
                 lambda: "busy" in _site_part("".join(service.cycles()[-1:]), site), 120)
        running = set(pilot_ids(site))
        _entry(site, start=False)
        try:
            second = submit_gated("ctld-second", 4)
            wait_for(f"three cycles with {site} unknown",
                     lambda: sum(f"{site}: UNKNOWN" in c for c in service.cycles()) >= 3, 120)
            unknown = [c for c in service.cycles() if f"{site}: UNKNOWN" in c]
            # Nothing is done at the site while it is unknown; the other is served.
            for line in unknown:
                assert f"at {site}" not in line.split("actions:")[1]
                assert f"{site}/" not in line.split("actions:")[1]
                assert f"{other}: UNKNOWN" not in line, line
            assert f"site {site} unknown" in service.text()
            if ENTRY[site] == "slurmrestd":  # its controller, still up, says so:
                # unknown, not empty: the pilots it had run on
                assert running <= set(pilot_ids(site)), (running, pilot_ids(site))
        finally:
            _entry(site, start=True)
        wait_for("all jobs done", lambda: gated_jobs_left(first) + jobs_left(second) == 0,
                 300, step=2)
        assert_converged(service, watch)
    assert_completed("ctld-first", 6)
    assert_completed("ctld-second", 4)


FRANKFURT_JWT = Path("/etc/provisioner/tokens.d/frankfurt.jwt")
MINT_JWT = "/src/deploy/testbed/inside/mint-jwt"


def test_an_expired_token_is_named_and_the_other_site_goes_on(service: Service) -> None:
    """frankfurt's JWT expires (a token of 1 s in place of the service's): frankfurt is
    unknown, the log names the token file and its expiry; gsi goes on provisioning; a
    fresh token and frankfurt is read again."""
    saved = FRANKFURT_JWT.read_bytes()
    try:
        service.start()
        wait_for("a cycle with both sites known", lambda: service.cycles() and not any(
            "UNKNOWN" in c for c in service.cycles()[-1:]), 60)
        run([MINT_JWT, "1", str(FRANKFURT_JWT)])
        mark = len(service.cycles())
        cluster = submit_gated("expired", 2)
        lines = wait_for("two cycles with frankfurt unknown", lambda: _cycles_after(
            service, mark, "frankfurt: UNKNOWN", 2), 90)
        for line in lines:
            assert "gsi: UNKNOWN" not in line, line
        assert re.search(r"site frankfurt unknown this cycle .*sites\[frankfurt\]\.rest\."
                         r"token_file /etc/provisioner/tokens\.d/frankfurt\.jwt: the token "
                         r"expired at",
                         service.text()), service.text()
        wait_for("gsi serves the jobs", lambda: "busy" in _site_part(
            "".join(service.cycles()[-1:]), "gsi"), 120)
    finally:
        FRANKFURT_JWT.write_bytes(saved)
    mark = len(service.cycles())
    wait_for("frankfurt read again", lambda: any(
        "frankfurt: UNKNOWN" not in c for c in service.cycles()[mark:]), 120)
    wait_for("all jobs done", lambda: gated_jobs_left(cluster) == 0, 300, step=2)
    assert_completed("expired", 2)


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
