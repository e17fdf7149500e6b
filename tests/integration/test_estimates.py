"""The site lead times placement learns come from SLURM's own submit and start times,
and survive a restart of the service: the restarted service keeps them, and does not
learn the queue waits of the pilots still running a second time."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator

import pytest
from conftest import SITES, run, slurm
from faults import running_service
from servicectl import Service
from test_loop import gated_jobs_left, submit_gated, wait_for

from provisioner.config import PlacementConfig

DEFAULT_BOOT_S = PlacementConfig().default_boot_s


@pytest.fixture
def service() -> Iterator[Service]:
    with running_service() as svc:
        yield svc


def _number(value: object) -> float | None:
    if isinstance(value, dict):  # squeue --json: {"set": ..., "number": ...}
        return float(value["number"]) if value.get("set") else None
    return float(value) if isinstance(value, int | float) else None


def started_pilots(site: str) -> dict[str, float]:
    """The site's running pilots by SLURM job id: their queue wait, start - submit."""
    out = slurm(site, ["squeue", "-u", "pilot", "--json"], check=False)
    if out.returncode != 0:
        return {}
    waits = {}
    for job in json.loads(out.stdout).get("jobs", []):
        submitted, started = _number(job.get("submit_time")), _number(job.get("start_time"))
        if "RUNNING" in job.get("job_state", []) and submitted and started:
            waits[str(job["job_id"])] = started - submitted
    return waits


def learnt(svc: Service) -> dict[str, dict[str, float]]:
    """The estimates the service last wrote to its journal (read-only)."""
    journal = svc.config.parent / "journal.sqlite"
    if not journal.exists():
        return {}
    with sqlite3.connect(f"file:{journal}?mode=ro", uri=True) as db:
        row = db.execute("SELECT value FROM state WHERE key = 'controller'").fetchone()
    return dict(json.loads(row[0]).get("estimates") or {}) if row else {}


def test_site_estimates_come_from_squeue_and_survive_a_restart(service: Service) -> None:
    waits: dict[str, dict[str, float]] = {s: {} for s in SITES}

    def watch() -> None:
        for s in SITES:
            waits[s].update(started_pilots(s))

    cluster = submit_gated("estimates", 8)  # running until the end (their gates open)
    service.start()

    def learnt_a_running_pilot() -> bool:
        watch()
        est = learnt(service)
        return any(waits[s] and est.get(s, {}).get("samples", 0) >= 1 for s in SITES)

    wait_for("a running pilot's queue wait in the journal", learnt_a_running_pilot, 180, step=1)
    before = learnt(service)
    running_at_kill = {s: set(started_pilots(s)) for s in SITES}
    service.kill9()
    cycles = len(service.cycles())
    service.start()
    wait_for("two cycles after the restart",
             lambda: (watch(), len(service.cycles()) >= cycles + 2)[1], 120, step=1)
    after_restart = learnt(service)
    still = {s: running_at_kill[s] & set(started_pilots(s)) for s in SITES}
    # the restart is only a test of not counting twice if a counted pilot still runs
    assert any(still[s] for s in before), (running_at_kill, still, before)
    for site, est in before.items():
        assert after_restart[site]["samples"] >= est["samples"], (before, after_restart)

    shown = learnt(service)
    status = run(["provisioner", "-c", str(service.config), "status"], user="provisioner")
    shown_after = learnt(service)  # a cycle may have learnt one more meanwhile
    for site in SITES:
        counts = {e.get(site, {}).get("samples", 0) for e in (shown, shown_after)} - {0}
        if counts:
            assert any(f"learnt from {n} pilot(s)" in status.stdout for n in counts), \
                status.stdout

    wait_for("all jobs done", lambda: (watch(), gated_jobs_left(cluster) == 0)[1], 300, step=2)
    service.stop()
    watch()  # a pilot that started at the very end
    final = learnt(service)
    assert final, "no estimates in the journal"
    for site in SITES:
        seen = waits[site]
        if not seen:
            assert final.get(site, {}).get("samples", 0) == 0, (site, final)
            continue
        # each pilot's wait learnt once, across the restart; the estimate is a moving
        # average of SLURM's own waits (1 s resolution)
        assert final[site]["samples"] == len(seen), (site, seen, final)
        assert min(seen.values()) - 1 <= final[site]["wait_s"] <= max(seen.values()) + 1, \
            (site, seen, final)
        # boot learnt from the startd's own start (the pilots join within ~10 s here):
        # the estimate has moved from the configured default towards it
        assert final[site]["boot_s"] < DEFAULT_BOOT_S, (site, final)
    assert "Traceback" not in service.text()
