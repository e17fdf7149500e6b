"""A journal that cannot be written: one log line per transition, the metric, the
fault file `provisioner status` reads; releases go on while submissions wait; what was
done meanwhile is recorded once the journal can be written again. The journal is a real
SQLite file made unwritable by SQLite itself (query_only), or a corrupt file."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from provisioner.config import parse_config
from provisioner.model import Demand, JobShape
from provisioner.service.journal import Journal
from provisioner.service.journal_health import WAITING, kind_of, read_fault
from provisioner.service.loop import Provisioner
from provisioner.service.status import render
from tests.unit.fakes import Clock, FakeBackend, FakePool
from tests.unit.test_service_act import CONFIG, idle_ad, running_job

ONE_CORE = JobShape(cpus=1, memory_mb=1000)


def make(tmp_path: Path, journal: Journal | None = None
         ) -> tuple[Provisioner, FakePool, dict[str, FakeBackend], Clock]:
    pool = FakePool()
    backends = {"gsi": FakeBackend("gsi"), "fra": FakeBackend("fra")}
    clock = Clock()
    config = parse_config(CONFIG.replace("uid_domain: example}", "uid_domain: example}\n"
                                         f"journal: {tmp_path / 'j.sqlite'}"), "t.yaml")
    prov = Provisioner(config, pool=pool, backends=backends,  # type: ignore[arg-type]
                       journal=journal, clock=clock, fault_file=tmp_path / "fault.json")
    return prov, pool, backends, clock


def cycles(prov: Provisioner, clock: Clock, n: int) -> None:
    for _ in range(n):
        clock.t += 60
        prov.run_cycle("timer")


def journal_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "provisioner.service.journal_health"]


def test_releases_go_on_submissions_wait_and_all_is_recorded_once_back(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    prov, pool, backends, clock = make(tmp_path)
    cycles(prov, clock, 1)
    backends["gsi"].jobs = [running_job("7")]
    pool.ads = {"gsi/7": idle_ad("7")}
    prov.journal.db.execute("PRAGMA query_only = ON")  # every write refused from now on
    caplog.set_level(logging.INFO)
    cycles(prov, clock, 3)
    assert ("release", "7") in backends["gsi"].calls  # flagged, then released
    # the pilot leaves; a job arrives: its pilot waits for the journal
    backends["gsi"].jobs, pool.ads = [], {}
    pool.demand = (Demand(ONE_CORE, 1),)
    clock.t += 60
    outcomes = prov.run_cycle("timer").outcomes
    assert [o for t, o in outcomes if t.startswith("submit")] == [WAITING], outcomes
    assert not any(c[0] == "submit" for b in backends.values() for c in b.calls)
    cycles(prov, clock, 2)  # said once
    waiting = [a for a in prov.journal_health.backlog if a[-1] == WAITING]
    assert waiting == []  # a submission that waited is not an action done
    lines = journal_lines(caplog)
    assert len(lines) == 2 and "cannot be written (permission:" in lines[0], lines
    assert "submissions wait" in lines[0]
    assert lines[1].startswith("1 submission(s) wait for the journal"), lines
    assert not [r for r in caplog.records if r.exc_info]  # no traceback per cycle
    assert prov.metrics.gauge("journal_writable")._value.get() == 0
    fault = read_fault(tmp_path / "fault.json")
    assert fault is not None and fault["kind"] == "permission"
    # status shows it in one line
    st = {"at": clock.t, "pool": {"collector": "cm", "provisioner_id": "t", "known": True},
          "sites": [], "demand": [], "unmatchable": [], "last_cycle": None,
          "journal": {"path": "j", "writable": False, "kind": "full",
                      "error": "database or disk is full", "since": clock.t - 300}}
    shown = [ln for ln in render(st).splitlines() if "journal" in ln]
    assert shown == ["  journal j: CANNOT BE WRITTEN for 5 min (full: database or disk is "
                     "full): submissions wait; releases, retirements and cancels go on"]

    prov.journal.db.execute("PRAGMA query_only = OFF")  # space returns
    cycles(prov, clock, 1)
    lines = journal_lines(caplog)
    assert len(lines) == 3 and "writable again" in lines[2], lines
    cycles(prov, clock, 1)  # the first cycle that acts after it
    assert any(c[0] == "submit" for b in backends.values() for c in b.calls)
    assert prov.metrics.gauge("journal_writable")._value.get() == 1
    assert not (tmp_path / "fault.json").exists()
    rows = prov.journal.db.execute(
        "SELECT kind, job_id, detail FROM actions WHERE detail LIKE '%journal could not%'"
    ).fetchall()
    assert ("release", "7") in {(k, j) for k, j, _ in rows}, rows
    cycles(prov, clock, 2)
    assert len(journal_lines(caplog)) == 3  # nothing more while it stays writable


def test_a_corrupt_journal_is_kept_in_memory_until_it_can_be_opened(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "j.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    caplog.set_level(logging.INFO)
    prov, pool, backends, clock = make(tmp_path, None)
    assert not prov.journal_health.writable and prov.journal_health.fault is not None
    assert prov.journal_health.fault.kind == "corrupt"
    pool.demand = (Demand(ONE_CORE, 1),)
    cycles(prov, clock, 2)
    assert not any(c[0] == "submit" for b in backends.values() for c in b.calls)
    path.unlink()  # the operator moves it away
    cycles(prov, clock, 2)  # opened after the first one acted, so the second submits
    assert prov.journal_health.writable and prov.journal.path == str(path)
    assert any(c[0] == "submit" for b in backends.values() for c in b.calls)
    assert len(journal_lines(caplog)) == 3  # the fault, the waiting, the end


@pytest.mark.parametrize(("text", "kind"), [
    ("database or disk is full", "full"), ("[Errno 28] No space left on device", "full"),
    ("attempt to write a readonly database", "permission"),
    ("unable to open database file", "permission"),
    ("file is not a database", "corrupt"), ("database disk image is malformed", "corrupt"),
    ("disk I/O error", "other")])
def test_kinds(text: str, kind: str) -> None:
    assert kind_of(Exception(text)) == kind
