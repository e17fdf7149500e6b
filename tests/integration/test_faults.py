"""Faults in the multi-host testbed, each survived with nothing lost.

Every test runs the provisioner as a real service (its own account, on cm,
reaching both sites over SSH), injects one fault while jobs run, and asserts at
the end: every user job completed (none removed, none evicted unless the fault
itself took its node away), no pilot left in SLURM or the collector once the
queue is empty, never more pilots at a site than its cap, and the service log
says what happened.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import LOGIN, SITES, run, slurm
from servicectl import Service, SiteWatch, job_events, pilot_ads, pilot_ids, write_config
from test_loop import ALICE, clean_pool, jobs_left, submit, wait_for

#: Caps of the testbed configuration (deploy/testbed/provisioner.yaml).
CAPS = {"gsi": 1, "frankfurt": 2}


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    clean_pool()
    svc = Service(write_config(tmp_path), tmp_path / "service.log")
    try:
        yield svc
    finally:
        svc.stop()
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
    wait_for("no pilot left in the collector", lambda: not pilot_ads(), 120, step=2)
    for site in SITES:
        assert watch.most[site] <= CAPS[site], (site, watch.most, svc.text())


def test_kill_9_mid_cycle_then_restart_rebuilds_from_the_sites(service: Service) -> None:
    # One Frankfurt node drained: a second Frankfurt pilot stays pending.
    slurm("frankfurt", ["scontrol", "update", "nodename=fra-n2", "state=drain",
                        "reason=fault-test"])
    try:
        cluster = submit("kill9", 8, 40)
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
        assert_completed("kill9", 8)
    finally:
        slurm("frankfurt", ["scontrol", "update", "nodename=fra-n2", "state=resume"])
    assert_converged(service, watch)
    assert "Traceback" not in service.text()


@pytest.mark.parametrize("daemon", ["collector", "schedd"])
def test_pool_daemon_restarted_while_jobs_run(service: Service, daemon: str) -> None:
    cluster = submit(f"restart-{daemon}", 4, 60)
    with SiteWatch() as watch:
        service.start()
        wait_for("jobs running", lambda: _running(cluster) >= 2, 120)
        # The pool's administrator restarts it (root on cm authenticates with FS).
        run(["condor_restart", "-daemon", daemon],
            env={"_CONDOR_SEC_CLIENT_AUTHENTICATION_METHODS": "FS"})
        wait_for("all jobs done", lambda: jobs_left(cluster) == 0, 300, step=2)
        assert_converged(service, watch)
    # No job evicted: no busy pilot was released or cancelled while the pool was
    # half-visible.
    assert_completed(f"restart-{daemon}", 4)


def _running(cluster: str) -> int:
    import htcondor2 as htcondor

    return len(htcondor.Schedd().query(constraint=f"ClusterId == {cluster} && JobStatus == 2",
                                       projection=["ProcId"]))


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
    first = submit("login-first", 2, 60)
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
    assert_completed("login-first", 2)
    assert_completed("login-second", 4)
