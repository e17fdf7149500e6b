"""The journal: upgrade of an older file, refusal of a newer one, pilot records from
successive `squeue` views, job runs kept once."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from provisioner.pilot.endrecord import EndRecord
from provisioner.service.accounting import JobRun, PilotRecord
from provisioner.service.journal import (
    SCHEMA_VERSION,
    Journal,
    JournalError,
    Reading,
    SeenPilot,
)

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


def test_gpus_of_pilots_and_runs_are_kept() -> None:
    j = Journal("")
    j.record_pilots("gsi", [SeenPilot("7", 4, 8000, 100.0, 130.0, False, gpus=2)], now=140.0)
    assert j.pilots()[0].gpus == 2
    r = JobRun("3.0", "alice", "gsi", "7", 2, 150.0, 200.0, 90.0, gpus=1)
    assert j.new_job_runs([r, r]) == [r] and j.new_job_runs([r]) == []
    assert j.job_runs() == [r]
    imported = PilotRecord("fra", "9", 8, 100.0, 110.0, 500.0, gpus=4)
    j.add_pilot_records([imported], "sim")
    assert j.pilots(site="fra")[0].gpus == 4


SCHEMA_3 = """
CREATE TABLE state (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE pilots (
    site TEXT NOT NULL, job_id TEXT NOT NULL, cores INTEGER, memory_mb INTEGER,
    submit_at REAL, start_at REAL, join_at REAL, end_at REAL, end_source TEXT,
    end_reason TEXT, PRIMARY KEY (site, job_id));
CREATE TABLE job_runs (
    job_id TEXT NOT NULL, start_at REAL NOT NULL, owner TEXT, site TEXT,
    pilot_job_id TEXT, cores INTEGER, end_at REAL, wall_s REAL, cpu_s REAL,
    PRIMARY KEY (job_id, start_at));
INSERT INTO state VALUES ('schema_version', '3');
INSERT INTO pilots VALUES ('gsi', '7', 4, 8000, 100.0, 130.0, 200.0, 400.0, 'record',
    'released');
INSERT INTO job_runs VALUES ('1.0', 150.0, 'alice', 'gsi', '7', 2, 350.0, 200.0, 180.0);
"""


def test_schema_3_journal_reads_with_no_gpus_and_takes_gpu_records(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(SCHEMA_3)
    j = Journal(str(path))
    assert j.get("schema_version") == SCHEMA_VERSION
    [old] = j.pilots()
    assert (old.cores, old.gpus, old.end_reason) == (4, 0, "released")
    assert [(r.job_id, r.cores, r.gpus) for r in j.job_runs()] == [("1.0", 2, 0)]
    j.record_pilots("gsi", [SeenPilot("8", 4, 8000, 500.0, 510.0, False, gpus=1)], now=520.0)
    j.add_job_runs([JobRun("2.0", "alice", "gsi", "8", 1, 515.0, 600.0, 80.0, gpus=1)])
    j.db.close()
    again = Journal(str(path))  # opened again: as is
    assert [p.gpus for p in again.pilots()] == [0, 1]
    assert sorted(r.gpus for r in again.job_runs()) == [0, 1]


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


SCHEMA_2 = """
CREATE TABLE cycles (id INTEGER PRIMARY KEY, at REAL, reason TEXT, summary TEXT,
    observe_s REAL, plan_s REAL, act_s REAL);
CREATE TABLE actions (id INTEGER PRIMARY KEY, cycle INTEGER, at REAL, kind TEXT, site TEXT,
    job_id TEXT, detail TEXT, outcome TEXT);
CREATE TABLE state (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE pilots (
    site TEXT NOT NULL, job_id TEXT NOT NULL, cores INTEGER, memory_mb INTEGER,
    submit_at REAL, start_at REAL, join_at REAL, end_at REAL, end_source TEXT,
    PRIMARY KEY (site, job_id));
CREATE TABLE job_runs (
    job_id TEXT NOT NULL, start_at REAL NOT NULL, owner TEXT, site TEXT,
    pilot_job_id TEXT, cores INTEGER, end_at REAL, wall_s REAL, cpu_s REAL,
    PRIMARY KEY (job_id, start_at));
INSERT INTO state VALUES ('schema_version', '2');
INSERT INTO pilots VALUES ('gsi', '7', 4, 8000, 100.0, 130.0, 200.0, 400.0, 'squeue-gone');
INSERT INTO pilots VALUES ('gsi', '8', 4, 8000, 100.0, 130.0, NULL, NULL, NULL);
"""


def test_schema_2_journal_is_upgraded_and_its_pilots_take_end_records(
        tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(SCHEMA_2)
    j = Journal(str(path))
    assert j.get("schema_version") == SCHEMA_VERSION == 5
    [ended, live] = j.pilots()
    assert (ended.end_at, ended.end_source, ended.end_reason) == (400.0, "squeue", None)
    assert live.end_at is None
    # the open pilot of the old journal ends, and its end record corrects the end
    j.record_pilots("gsi", [], now=900.0)
    assert j.awaiting_end_record("gsi", since=0.0) == ["8", "7"]
    j.apply_end_records("gsi", [EndRecord("8", "gsi", "p", 131.0, 600.0, 4, "released")])
    assert [(p.end_at, p.end_source, p.end_reason) for p in j.pilots()] == [
        (400.0, "squeue", None), (600.0, "record", "released")]
    j.db.close()
    assert Journal(str(path)).pilots()[1].end_source == "record"  # opened again: as is


def ended_pilot(j: Journal, start_at: float | None, gone_at: float = 1250.0) -> None:
    j.record_pilots("gsi", [SeenPilot("7", 4, 8000, 900.0, start_at, False)], now=1010.0)
    j.record_pilots("gsi", [], now=gone_at)


def test_an_end_record_ends_the_pilot_when_it_ended() -> None:
    j = Journal("")
    ended_pilot(j, start_at=1000.0)
    got = j.apply_end_records("gsi", [EndRecord("7", "gsi", "p", 1002.0, 1100.0, 4,
                                                "walltime-drain")])
    [p] = got.updated
    assert (p.start_at, p.end_at, p.end_source, p.end_reason) == \
        (1000.0, 1100.0, "record", "walltime-drain")  # squeue's start kept
    assert got.started == [] and got.refused == {}
    assert j.awaiting_end_record("gsi", since=0.0) == []
    # applied once: a second read of the same record changes nothing
    again = EndRecord("7", "gsi", "p", 1002.0, 1050.0, 4, "released")
    assert j.apply_end_records("gsi", [again]).updated == [] and j.pilots() == [p]


def test_a_start_squeue_never_saw_comes_from_the_record() -> None:
    j = Journal("")
    ended_pilot(j, start_at=None)  # started and ended between two cycles
    got = j.apply_end_records("gsi", [EndRecord("7", "gsi", "p", 1020.0, 1080.0, 4,
                                                "master-failed")])
    assert (got.updated[0].start_at, got.updated[0].end_at) == (1020.0, 1080.0)
    assert got.started == [("gsi", 120.0)]  # queue wait: submitted at 900


def test_record_times_are_kept_within_what_squeue_saw() -> None:
    j = Journal("")
    ended_pilot(j, start_at=None)
    # the node's clock runs ahead: its end is after the cycle that saw the job gone
    [p] = j.apply_end_records("gsi", [EndRecord("7", "gsi", "p", 800.0, 1300.0, 4,
                                                "released")]).updated
    assert (p.start_at, p.end_at) == (900.0, 1250.0)  # from submission to seen gone


def test_a_record_older_than_its_pilot_is_refused() -> None:
    j = Journal("")
    ended_pilot(j, start_at=1000.0)
    old = EndRecord("7", "gsi", "p", 100.0, 200.0, 4, "released")  # job id reused
    unknown = EndRecord("99", "gsi", "p", 100.0, 200.0, 4, "released")
    got = j.apply_end_records("gsi", [old, unknown])
    assert got.updated == [] and set(got.refused) == {"7", "99"}
    assert "before the pilot was submitted" in got.refused["7"]
    assert j.pilots()[0].end_at == 1250.0 and j.pilots()[0].end_source == "squeue"


SCHEMA_4 = """
CREATE TABLE state (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE pilots (
    site TEXT NOT NULL, job_id TEXT NOT NULL, cores INTEGER, memory_mb INTEGER,
    submit_at REAL, start_at REAL, join_at REAL, end_at REAL, end_source TEXT,
    end_reason TEXT, gpus INTEGER, PRIMARY KEY (site, job_id));
CREATE TABLE job_runs (
    job_id TEXT NOT NULL, start_at REAL NOT NULL, owner TEXT, site TEXT,
    pilot_job_id TEXT, cores INTEGER, end_at REAL, wall_s REAL, cpu_s REAL,
    gpus INTEGER, PRIMARY KEY (job_id, start_at));
INSERT INTO state VALUES ('schema_version', '4');
INSERT INTO pilots VALUES ('gsi', '7', 4, 8000, 100.0, 130.0, 200.0, 400.0, 'record',
    'released', 0);
INSERT INTO pilots VALUES ('gsi', '8', 4, 8000, 100.0, 130.0, NULL, NULL, NULL, NULL, 0);
INSERT INTO job_runs VALUES ('1.0', 150.0, 'alice', 'gsi', '7', 2, 350.0, 200.0, 180.0, 0);
"""


def test_schema_4_journal_gains_accounts_groups_and_readings_in_place(
        tmp_path: Path) -> None:
    """Schema 4 -> 5: its rows read with no account, allocation or group; an open
    pilot takes its account from the next `squeue`; new rows keep all three; SLURM's
    readings are kept."""
    path = tmp_path / "j.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(SCHEMA_4)
    j = Journal(str(path))
    assert j.get("schema_version") == SCHEMA_VERSION == 5
    assert [(p.job_id, p.account, p.allocation) for p in j.pilots()] == [
        ("7", "", ""), ("8", "", "")]
    assert [r.group for r in j.job_runs()] == [""]
    j.record_pilots("gsi", [SeenPilot("8", 4, 8000, 100.0, 130.0, True, account="alloc-a",
                                      allocation="a"),
                            SeenPilot("9", 2, 4000, 500.0, None, False, account="alloc-b",
                                      allocation="b")], now=510.0)
    j.add_job_runs([JobRun("2.0", "bob", "gsi", "8", 1, 515.0, 600.0, 80.0, group="group_a")])
    reading = Reading("gsi", "a", "alloc-a", 520.0, 12.5, 100.0)
    j.add_reading(reading)
    j.add_reading(Reading("gsi", "a", "alloc-a", 580.0, 13.0, 100.0))
    j.add_reading(Reading("gsi", "b", "alloc-b", 590.0, 1.0, None))
    j.db.close()
    again = Journal(str(path))
    assert [(p.job_id, p.account, p.allocation) for p in again.pilots()] == [
        ("7", "", ""), ("8", "alloc-a", "a"), ("9", "alloc-b", "b")]
    assert sorted(r.group for r in again.job_runs()) == ["", "group_a"]
    assert again.readings(site="gsi", allocation="a")[0] == reading
    assert {k: r.used for k, r in again.last_readings().items()} == {
        ("gsi", "a"): 13.0, ("gsi", "b"): 1.0}
    assert again.last_readings()[("gsi", "b")].grant is None
    assert [r.at for r in again.readings(since=585.0)] == [590.0]
