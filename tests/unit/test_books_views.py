"""What the allocations' books show: the service's cycle (the Snapshot's books, the
journal's records), `provisioner status` (text and JSON), the metrics exposition and
`provisioner report`'s tables and files; hand-written fakes for the pool and SLURM."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from provisioner.config import parse_config
from provisioner.decide.budget import budgets
from provisioner.errors import Unreachable
from provisioner.model import Demand, JobShape
from provisioner.service.accounting import JobRun
from provisioner.service.books import (
    GROUPS_EVERY_S,
    allocation_rows,
    stopped_of,
    stopped_read,
    stopped_record,
)
from provisioner.service.journal import Journal, Reading, SeenPilot
from provisioner.service.loop import Provisioner
from provisioner.service.report import report
from provisioner.service.status import gather, render
from provisioner.sites.base import SiteJob, SiteJobState
from tests.unit.fakes import Clock, FakeBackend, FakePool
from tests.unit.test_books import CONFIG, HOUR, T0, charge


def world(journal: Journal | None = None) -> tuple[Provisioner, FakePool,
                                                   dict[str, FakeBackend], Clock]:
    pool = FakePool()
    backends = {"gsi": FakeBackend("gsi"), "fra": FakeBackend("fra")}
    clock = Clock()
    clock.t = T0 + HOUR
    backends["gsi"].jobs = [SiteJob("7", SiteJobState.RUNNING, 4, 8000, T0 - 60, T0,
                                    T0 + 2 * HOUR, account="acct-a")]
    backends["gsi"].charges = {"acct-a": charge("acct-a", 104.0),
                               "acct-b": charge("acct-b", 0.0, 0.0)}
    prov = Provisioner(parse_config(CONFIG, "t.yaml"), pool=pool,  # type: ignore[arg-type]
                       backends=backends, journal=journal or Journal(""),  # type: ignore[arg-type]
                       clock=clock)
    return prov, pool, backends, clock


def value(prov: Provisioner, name: str, **labels: str) -> float | None:
    return prov.metrics.registry.get_sample_value(name, labels or None)


def test_a_cycle_builds_the_books_records_them_and_exports_them() -> None:
    prov, pool, backends, clock = world()
    cycle = prov.run_cycle()
    books = {b.allocation: b for b in cycle.observation.snapshot.books}
    assert set(books) == {"a", "b"} and books["a"].known
    assert books["a"].spent == pytest.approx(104)  # SLURM's, 100 above the ledger's 4
    [rec] = prov.journal.pilots(site="gsi")
    assert (rec.account, rec.allocation) == ("acct-a", "a")
    assert [r.used for r in prov.journal.readings(allocation="a")] == [104.0]
    labels = {"site": "gsi", "allocation": "a", "unit": "core-hours"}
    assert value(prov, "provisioner_allocation_amount", **labels) == 1000
    assert value(prov, "provisioner_allocation_spent", **labels) == pytest.approx(104)
    assert value(prov, "provisioner_allocation_ledger_spent", **labels) == pytest.approx(4)
    assert value(prov, "provisioner_allocation_slurm_spent", **labels) == pytest.approx(104)
    assert value(prov, "provisioner_allocation_slurm_grant", **labels) == 1000
    assert value(prov, "provisioner_allocation_difference", **labels) == pytest.approx(100)
    assert value(prov, "provisioner_allocation_known", **labels) == 1
    # committed as plan() counts it (the running pilot's last hour, once the pool
    # view names its account)
    budget = budgets(prov.config, cycle.observation.snapshot, clock.t)[("gsi", "a")]
    assert value(prov, "provisioner_allocation_committed", **labels) == budget.committed
    assert value(prov, "provisioner_allocation_left", **labels) == pytest.approx(
        1000 - 104 - budget.committed)
    assert value(prov, "provisioner_allocation_burn_rate", **labels) == pytest.approx(4 / 24)
    b = {"site": "gsi", "allocation": "b", "unit": "node-hours"}
    assert value(prov, "provisioner_allocation_paced", **b) == 1  # even, early in Q4
    assert value(prov, "provisioner_allocation_runout_timestamp_seconds", **b) == float("inf")
    # a group's finished run is read into the journal, its spend exported later
    pool.runs = [JobRun("1.0", "u", "gsi", "7", 2, T0, T0 + HOUR, group="group_a")]
    clock.t += 60
    prov.run_cycle()
    clock.t += GROUPS_EVERY_S
    prov.run_cycle()
    assert prov.journal.job_runs()[0].group == "group_a"
    assert value(prov, "provisioner_group_spent", group="group_a",
                 unit="core-hours") == pytest.approx(2)
    text = generate_latest(prov.metrics.registry).decode()
    assert 'provisioner_allocation_spent{allocation="a",site="gsi",unit="core-hours"}' in text
    assert 'provisioner_group_spent{group="group_a",unit="core-hours"} 2.0' in text
    # SLURM unreadable: the metric keeps SLURM's last reading, the books go on
    backends["gsi"].charges_error = Unreachable("sshare: slurmdbd down")
    clock.t += 60
    prov.run_cycle()
    assert value(prov, "provisioner_allocation_slurm_spent", **labels) == pytest.approx(104)
    assert value(prov, "provisioner_allocation_known", **labels) == 1


def status_of(prov: Provisioner) -> dict[str, object]:
    now = prov.clock()
    snap = prov.observe(now).snapshot
    rows = allocation_rows(prov.config, snap, prov.books.entries, now)
    return gather(prov.config, snap, now, {}, {}, [], None, allocations=rows)


def test_status_shows_each_allocation_its_books_and_the_demands_group() -> None:
    prov, pool, backends, clock = world()
    pool.demand = (Demand(JobShape(1, 1000, group="group_a"), 3),)
    st = status_of(prov)
    assert json.loads(json.dumps(st))["allocations"] == st["allocations"]
    a = next(x for x in st["allocations"] if x["allocation"] == "a")  # type: ignore[attr-defined]
    assert (a["spent"], a["ledger_spent"], a["slurm_spent"]) == (
        pytest.approx(104), pytest.approx(4), pytest.approx(104))
    assert a["differs"] and a["reading_age_s"] == 0 and a["read_error"] == ""
    assert st["demand"][0]["group"] == "group_a" and st["groups_in_use"]  # type: ignore[index]
    text = render(st)
    assert "Allocations (this period):" in text
    left = 1000 - 104 - a["committed"]  # type: ignore[operator]
    assert f"  gsi/a: open, {left:.0f} of 1000 core-h left for 22 days" in text
    assert "spent 104 core-h (SLURM 104, read 0 s ago; ledger 4); SLURM's grant 1000;" in text
    assert "DIFFERENCE: SLURM charged +100 core-h against the ledger" in text
    assert "gsi/b: paced" in text
    header = next(line for line in text.splitlines() if "fits sites" in line)
    assert header.split()[-1] == "group" and "group_a" in text
    # SLURM cannot be read a minute later: its error and the reading's age
    backends["gsi"].charges_error = Unreachable("sshare: slurmdbd down")
    clock.t += 90
    text = render(status_of(prov))
    assert "SLURM 104, read 90 s ago" in text
    assert "sshare: slurmdbd down (the reading of 90 s ago and the ledger since count)" in text


def test_status_says_when_the_books_are_unknown() -> None:
    prov, _pool, _backends, _clock = world()
    prov.journal.db.close()
    text = render(status_of(prov))
    assert "gsi/a: unknown: the books cannot be read, no new pilot" in text
    assert "books unknown: the journal cannot be read" in text


def test_report_tables_and_files(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    journal = Journal(str(path))
    journal.record_pilots("gsi", [
        SeenPilot("7", 4, 8000, T0 - 60, T0, True, account="acct-a", allocation="a"),
        SeenPilot("8", 4, 8000, T0 - 60, T0, True, account="acct-b", allocation="b")],
        now=T0 + HOUR)
    journal.record_pilots("gsi", [], now=T0 + 3 * HOUR)  # both end after 3 h
    journal.add_job_runs([
        JobRun("1.0", "u", "gsi", "7", 4, T0, T0 + 2 * HOUR, group="group_a"),
        JobRun("2.0", "u", "gsi", "8", 2, T0, T0 + 2 * HOUR, group="group_b")])
    journal.add_reading(Reading("gsi", "a", "acct-a", T0 + 2 * HOUR, 8.0, 1000.0))
    config = parse_config(CONFIG.replace("/j.db", str(path)), "t.yaml")
    text, files = report(str(path), T0 + 4 * HOUR, out=tmp_path / "out", config=config)
    lines = text.splitlines()
    row_a = next(line for line in lines if line.startswith("gsi/a "))
    assert row_a.split()[:9] == ["gsi/a", "core-h", "2026-12-01..2027-01-01", "asap",
                                 "1000", "12.00", "12.00", "8.00", "0.00"]
    assert "2027-" in row_a  # runs out at 0.5 core-h per hour: next year
    assert next(line for line in lines if line.startswith("group_b")).split()[:3] == [
        "group_b", "node-h", "1.00"]
    names = sorted(p.name for p in files)
    for name in ("allocations.csv", "groups.csv", "burndown-gsi-a.png", "burndown-gsi-b.png",
                 "report.csv"):
        assert name in names
    with (tmp_path / "out" / "allocations.csv").open() as f:
        rows = {r["allocation"]: r for r in csv.DictReader(f)}
    assert rows["a"]["slurm_spent"] == "8.0000" and rows["b"]["unit"] == "node-hours"
    assert float(rows["b"]["spent"]) == pytest.approx(3.0)
    with (tmp_path / "out" / "groups.csv").open() as f:
        groups = {r["group"]: r for r in csv.DictReader(f)}
    assert float(groups["group_a"]["spent"]) == pytest.approx(8.0)
    assert groups["group_a"]["allocations"] == "gsi/a"
    assert (tmp_path / "out" / "burndown-gsi-a.png").stat().st_size > 1000
    # without the configuration (report --journal): the days only
    text, files = report(str(path), T0 + 4 * HOUR)
    assert "gsi/a " not in text and "alloc core-h" in text


def test_stopped_allocations_reach_status_through_the_journal() -> None:
    class Stops:
        stopped_allocations = {("gsi", "b"): "stopped: SLURM refused its account"}

    record = stopped_record(stopped_of(Stops()))
    assert record == {"gsi/b": "stopped: SLURM refused its account"}
    journal = Journal("")
    journal.put("stopped_allocations", record)
    assert stopped_read(journal.get("stopped_allocations")) == Stops.stopped_allocations
    assert stopped_of(object()) == {} and stopped_read(None) == {}
    prov, _pool, _backends, _clock = world()
    prov.run_cycle()
    assert prov.journal.get("stopped_allocations") == stopped_record(stopped_of(prov.controller))
