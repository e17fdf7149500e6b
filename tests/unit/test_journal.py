"""The journal: upgrade of an older file, refusal of a newer one, pilot records from
successive `squeue` views, job runs kept once."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from provisioner.accounting import JobRun
from provisioner.journal import SCHEMA_VERSION, Journal, JournalError, SeenPilot

OLD_SCHEMA = """
CREATE TABLE cycles (id INTEGER PRIMARY KEY, at REAL, reason TEXT, summary TEXT,
    observe_s REAL, plan_s REAL, act_s REAL);
CREATE TABLE actions (id INTEGER PRIMARY KEY, cycle INTEGER, at REAL, kind TEXT, site TEXT,
    job_id TEXT, detail TEXT, outcome TEXT);
CREATE TABLE state (key TEXT PRIMARY KEY, value TEXT);
INSERT INTO state VALUES ('flagged', '{"gsi/1": 5.0}');
INSERT INTO cycles (at, reason, summary) VALUES (1.0, 'once', 'old');
"""


def test_older_journal_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(OLD_SCHEMA)
    j = Journal(str(path))
    assert j.get("flagged") == {"gsi/1": 5.0} and j.get("schema_version") == SCHEMA_VERSION
    assert j.pilots() == [] and j.job_runs() == [] and not j.empty()


def test_newer_journal_is_refused_naming_file_and_versions(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    Journal(str(path)).put("schema_version", 99)
    want = rf"j.sqlite: journal schema version 99 .* {SCHEMA_VERSION}"
    with pytest.raises(JournalError, match=want):
        Journal(str(path))


def test_open_existing_creates_nothing(tmp_path: Path) -> None:
    assert Journal.open_existing(str(tmp_path / "none.sqlite")) is None
    assert not (tmp_path / "none.sqlite").exists()


def test_pilot_lifecycle_from_squeue_views() -> None:
    j = Journal("")
    pending = SeenPilot("7", 4, 8000, 100.0, None, joined=False)
    ev = j.record_pilots("gsi", [pending], now=110.0)
    assert ev.started == [] and j.pilots()[0].start_at is None
    ev = j.record_pilots("gsi", [SeenPilot("7", 4, 8000, 100.0, 130.0, False)], now=140.0)
    assert ev.started == [("gsi", 30.0)]
    ev = j.record_pilots("gsi", [SeenPilot("7", 4, 8000, 100.0, 130.0, True)], now=200.0)
    assert ev.joined == [("gsi", 70.0)]
    ev = j.record_pilots("fra", [], now=300.0)  # another site says nothing about gsi's
    assert ev.ended == []
    ev = j.record_pilots("gsi", [], now=400.0)
    [rec] = ev.ended
    assert (rec.start_at, rec.join_at, rec.end_at) == (130.0, 200.0, 400.0)
    row = j.db.execute("SELECT end_source FROM pilots").fetchone()
    assert row == ("squeue",)
    # a job id the site reuses later does not reopen the ended record
    j.record_pilots("gsi", [SeenPilot("7", 4, 8000, 500.0, None, False)], now=510.0)
    assert j.pilots()[0].end_at == 400.0
    assert j.pilots(since=450.0) == []


def test_job_runs_are_kept_once() -> None:
    j = Journal("")
    r = JobRun("3.0", "alice", "gsi", "7", 2, 100.0, 200.0, 150.0)
    assert j.add_job_runs([r, r]) == 1 and j.add_job_runs([r]) == 0
    assert j.job_runs() == [r] and j.job_runs(since=250.0) == []


def test_a_batch_commits_once_at_its_end(tmp_path: Path) -> None:
    """A cycle's records land together: another reader sees none of them before the
    block ends, and all of them after."""
    path = tmp_path / "j.sqlite"
    journal = Journal(str(path))
    reader = sqlite3.connect(path)

    def cycles() -> int:
        return int(reader.execute("SELECT count(*) FROM cycles").fetchone()[0])

    with journal.batch():
        cid = journal.cycle("test", "line", {})
        journal.action(cid, "submit", "gsi", "", "submit 1 at gsi", "ok")
        with journal.batch():  # nested: commits with the outer block
            journal.put("k", 1)
        assert cycles() == 0
    assert cycles() == 1
    assert reader.execute("SELECT value FROM state WHERE key = 'k'").fetchone() == ("1",)
    journal.cycle("test", "line", {})  # outside a batch: at once
    assert cycles() == 2
