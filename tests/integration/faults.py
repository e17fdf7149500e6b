"""What the fault tests share (test_faults.py: faults of the service and the pool;
test_faults_pilots.py: faults of pilots and their nodes): the service each runs and the
checks each ends with.

Every test runs the provisioner as a real service (its own account, on cm,
reaching both sites over SSH), injects one fault while jobs run, and asserts at
the end: every user job completed (none removed, none evicted unless the fault
itself took its node away), no pilot left in SLURM or the collector once the
queue is empty, never more pilots at a site than its cap, and the service log
says what happened.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import htcondor2 as htcondor
import yaml
from conftest import SITES
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
    ALICE,
    clean_pool,
    drop_dead_pilot_ads,
    pilot_ad_ages,
    pilot_process_counts,
    wait_for,
)


def caps_of(config: Path) -> dict[str, int]:
    """Each site's max_pilots in the configuration a service runs with."""
    data = yaml.safe_load(config.read_text())
    return {site["name"]: int(site["caps"]["max_pilots"]) for site in data["sites"]}


@contextlib.contextmanager
def running_service(edit: Callable[[dict], None] | None = None  # type: ignore[type-arg]
                    ) -> Iterator[Service]:
    """A service on the testbed's configuration (`edit` may change it) in a clean pool
    (cleaned again after it, its log printed); started by the test."""
    clean_pool()
    directory = service_dir()
    svc = Service(write_config(directory, edit), directory / "service.log")
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


def running_on(cluster: str) -> list[str]:
    """Startd names ("pilot-<site>-<job>@<host>") running the cluster's jobs."""
    ads = htcondor.Schedd().query(constraint=f"ClusterId == {cluster} && JobStatus == 2",
                                  projection=["RemoteHost"])
    return [ad["RemoteHost"].split("@", 1)[1] for ad in ads if "RemoteHost" in ad]
