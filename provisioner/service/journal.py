"""SQLite journal: an audit trail of cycles and actions, the flags of the last cycle
for `provisioner status`, and the accounting records (`pilots` from `squeue`,
`job_runs` from the schedd's history). A cache, never the only copy: after a restart
the service rebuilds its picture from SLURM and the collector.

Schema versions: 1 (cycles, actions, state), 2 (+ pilots, job_runs), 3 (pilots'
`end_reason`; `end_source` "record" or "squeue", formerly "squeue-gone"), 4 (`gpus`
of pilots and job runs; 0 in rows an older version wrote) and 5 (pilots' SLURM
`account` and `allocation`, job runs' `acct_group`, "" in older rows; `slurm_readings`,
SLURM's charge of each allocation as the books read it). A journal of
an older version is upgraded in place when opened; one of a newer version is refused
(`JournalError`) rather than written with a schema this code does not know.

A pilot's end (and its start, if `squeue` never showed it running) comes from its own
end record (provisioner.pilot.endrecord) when the site has one, `end_source` "record";
otherwise from the cycle that no longer saw it in `squeue`, `end_source` "squeue".
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner.pilot.endrecord import EndRecord
from provisioner.service.accounting import JobRun, PilotRecord

SCHEMA_VERSION = 5

SCHEMA = """
CREATE TABLE IF NOT EXISTS cycles (
    id INTEGER PRIMARY KEY, at REAL, reason TEXT, summary TEXT,
    observe_s REAL, plan_s REAL, act_s REAL);
CREATE TABLE IF NOT EXISTS actions (
    id INTEGER PRIMARY KEY, cycle INTEGER, at REAL, kind TEXT, site TEXT,
    job_id TEXT, detail TEXT, outcome TEXT);
CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS pilots (
    site TEXT NOT NULL, job_id TEXT NOT NULL, cores INTEGER, memory_mb INTEGER,
    submit_at REAL, start_at REAL, join_at REAL, end_at REAL, end_source TEXT,
    end_reason TEXT, gpus INTEGER, account TEXT, allocation TEXT,
    PRIMARY KEY (site, job_id));
CREATE TABLE IF NOT EXISTS job_runs (
    job_id TEXT NOT NULL, start_at REAL NOT NULL, owner TEXT, site TEXT,
    pilot_job_id TEXT, cores INTEGER, end_at REAL, wall_s REAL, cpu_s REAL,
    gpus INTEGER, acct_group TEXT, PRIMARY KEY (job_id, start_at));
CREATE INDEX IF NOT EXISTS job_runs_pilot ON job_runs (site, pilot_job_id);
CREATE INDEX IF NOT EXISTS job_runs_end ON job_runs (end_at);
CREATE TABLE IF NOT EXISTS slurm_readings (
    site TEXT NOT NULL, allocation TEXT NOT NULL, at REAL NOT NULL, account TEXT,
    used REAL, grant_units REAL, PRIMARY KEY (site, allocation, at));
"""

#: Per allocation unit, a pilot's rate in SQL over `pilots p` (as
#: provisioner.decide.budget.pilot_rate) and the share of it a job run `r` claims (as
#: provisioner.service.spend.run_units): the books' sums, done by SQLite.
RATE_SQL = {"core-hours": "COALESCE(p.cores, 0)", "node-hours": "1.0",
            "gpu-hours": "COALESCE(p.gpus, 0)"}
SHARE_SQL = {"core-hours": "MIN(r.cores, COALESCE(p.cores, 0))",
             "node-hours": "CASE WHEN p.cores > 0 THEN MIN(1.0, r.cores * 1.0 / p.cores) "
                           "ELSE 0.0 END",
             "gpu-hours": "MIN(COALESCE(r.gpus, 0), COALESCE(p.gpus, 0))"}
#: The pilots of one allocation: those charged to its account (a row naming no account:
#: recorded under its name).
_OF_ALLOCATION = ("p.site = ? AND (p.account = ? OR (COALESCE(p.account, '') = '' "
                  "AND p.allocation = ?))")

#: Columns later schema versions added to a table (older rows read them as NULL).
ADDED_COLUMNS = (("pilots", "end_reason", "TEXT"), ("pilots", "gpus", "INTEGER"),
                 ("job_runs", "gpus", "INTEGER"), ("pilots", "account", "TEXT"),
                 ("pilots", "allocation", "TEXT"), ("job_runs", "acct_group", "TEXT"))


@dataclass(frozen=True)
class Reading:
    """SLURM's charge of one allocation's account at `at`, in the allocation's unit."""

    site: str
    allocation: str
    account: str
    at: float
    used: float  # unit-hours SLURM has charged the account (this period, if it resets)
    grant: float | None  # the GrpTRESMins grant in unit-hours; None: no grant set


class JournalError(Exception):
    """The journal file cannot be used by this version; the message names file and versions."""


@dataclass
class PilotEvents:
    """What one cycle's `squeue` taught the journal, for the metrics."""

    started: list[tuple[str, float]] = field(default_factory=list)  # (site, queue wait s)
    joined: list[tuple[str, float]] = field(default_factory=list)  # (site, boot s)
    ended: list[PilotRecord] = field(default_factory=list)


@dataclass
class RecordsApplied:
    """What a site's end records changed in the journal."""

    updated: list[PilotRecord] = field(default_factory=list)
    started: list[tuple[str, float]] = field(default_factory=list)  # starts squeue missed
    refused: dict[str, str] = field(default_factory=dict)  # job id -> why not used


@dataclass(frozen=True)
class SeenPilot:
    """A pilot job as one cycle saw it at a site it could read."""

    job_id: str
    cores: int
    memory_mb: int
    submit_at: float
    start_at: float | None
    joined: bool  # its startd is in the pool
    gpus: int = 0
    account: str = ""  # the SLURM account charged (squeue's); "" = not reported
    allocation: str = ""  # the site's allocation of that account; "" = none


class Journal:
    """Append-only record; `path` "" keeps it in memory (nothing survives)."""

    def __init__(self, path: str) -> None:
        self.path = path
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path or ":memory:", check_same_thread=False)
        self._depth = 0  # open batch() blocks: their writes are committed at the end
        self._upgrade()
        if path:
            Path(path).chmod(0o600)

    @classmethod
    def open_existing(cls, path: str) -> Journal | None:
        """The journal at `path` if the file exists (None otherwise, nothing created)."""
        if not path or not Path(path).is_file():
            return None
        return cls(path)

    def _upgrade(self) -> None:
        tables = {r[0] for r in self.db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        version = 0
        if "state" in tables:
            row = self.db.execute(
                "SELECT value FROM state WHERE key = 'schema_version'").fetchone()
            version = int(json.loads(row[0])) if row else 1
        if version > SCHEMA_VERSION:
            raise JournalError(
                f"{self.path or ':memory:'}: journal schema version {version} is newer than "
                f"this provisioner's {SCHEMA_VERSION}; use a newer provisioner or move the "
                "file away (it is a cache: a new one is rebuilt from SLURM and the pool)")
        self.db.executescript(SCHEMA)
        if version < SCHEMA_VERSION:
            self._upgrade_pilots()
            self.put("schema_version", SCHEMA_VERSION)

    def _upgrade_pilots(self) -> None:
        """Schema 2 -> 3: the pilots table gains end_reason; "squeue-gone" is "squeue".
        3 -> 4: pilots and job_runs gain gpus (NULL in older rows, read as 0).
        4 -> 5: pilots gain account and allocation, job_runs acct_group (NULL in older
        rows, read as ""); slurm_readings is new (created by SCHEMA)."""
        for table, column, kind in ADDED_COLUMNS:
            columns = {r[1] for r in self.db.execute(f"PRAGMA table_info({table})")}
            if column not in columns:
                self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        self.db.execute("UPDATE pilots SET end_source = 'squeue' "
                        "WHERE end_source = 'squeue-gone'")

    def _commit(self) -> None:
        if self._depth == 0:
            self.db.commit()

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """The writes in the block are committed together when it ends (a cycle's
        records cost one commit, not one each); nested blocks commit with the outer.
        A block left by an exception is rolled back whole (a cycle half recorded is
        not recorded)."""
        self._depth += 1
        done = False
        try:
            yield
            done = True
        finally:
            self._depth -= 1
            if self._depth == 0:
                if done:
                    self.db.commit()
                else:
                    with contextlib.suppress(sqlite3.Error):
                        self.db.rollback()

    # --- audit trail -----------------------------------------------------
    def cycle(self, reason: str, summary: str, timings: Mapping[str, float]) -> int:
        cur = self.db.execute(
            "INSERT INTO cycles (at, reason, summary, observe_s, plan_s, act_s) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (time.time(), reason, summary, timings.get("observe", 0.0),
             timings.get("plan", 0.0), timings.get("act", 0.0)))
        self._commit()
        return int(cur.lastrowid or 0)

    def action(self, cycle: int, kind: str, site: str, job_id: str, detail: str,
               outcome: str, at: float | None = None) -> None:
        """One action of `cycle`, done at `at` (default: now)."""
        self.db.execute(
            "INSERT INTO actions (cycle, at, kind, site, job_id, detail, outcome) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (cycle, time.time() if at is None else at, kind, site, job_id, detail, outcome))
        self._commit()

    def put(self, key: str, value: Any) -> None:
        self.db.execute("INSERT OR REPLACE INTO state (key, value) VALUES (?, ?)",
                        (key, json.dumps(value)))
        self._commit()

    def get(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def empty(self) -> bool:
        """No pilot and no cycle recorded yet."""
        return not (self.db.execute("SELECT 1 FROM pilots LIMIT 1").fetchone()
                    or self.db.execute("SELECT 1 FROM cycles LIMIT 1").fetchone())

    # --- accounting ------------------------------------------------------
    def record_pilots(self, site: str, seen: Iterable[SeenPilot], now: float) -> PilotEvents:
        """One cycle's `squeue` of a site it could read: new pilots are added, starts
        and first joins noted, and pilots of this site still open in the journal that
        are no longer in `squeue` end at `now` (end_source "squeue": its end record,
        if it left one, corrects that with `apply_end_records`)."""
        events = PilotEvents()
        open_rows = {r[0]: r for r in self.db.execute(
            "SELECT job_id, start_at, join_at, account FROM pilots "
            "WHERE site = ? AND end_at IS NULL", (site,))}
        present = set()
        for p in seen:
            present.add(p.job_id)
            row = open_rows.get(p.job_id)
            if row is None:
                cur = self.db.execute(
                    "INSERT OR IGNORE INTO pilots (site, job_id, cores, memory_mb, submit_at, "
                    "gpus, account, allocation) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (site, p.job_id, p.cores, p.memory_mb, p.submit_at, p.gpus, p.account,
                     p.allocation))
                if not cur.rowcount:
                    continue  # ended earlier (a job id reused): leave it closed
                row = (p.job_id, None, None, p.account)
            elif p.account and not row[3]:  # a row an older version wrote
                self.db.execute("UPDATE pilots SET account = ?, allocation = ? "
                                "WHERE site = ? AND job_id = ?",
                                (p.account, p.allocation, site, p.job_id))
            start_at, join_at = row[1], row[2]
            if start_at is None and p.start_at is not None:
                start_at = p.start_at
                self.db.execute("UPDATE pilots SET start_at = ? WHERE site = ? AND job_id = ?",
                                (start_at, site, p.job_id))
                events.started.append((site, max(0.0, start_at - p.submit_at)))
            if join_at is None and p.joined:
                self.db.execute("UPDATE pilots SET join_at = ? WHERE site = ? AND job_id = ?",
                                (now, site, p.job_id))
                if start_at is not None:
                    events.joined.append((site, max(0.0, now - start_at)))
        for job_id in set(open_rows) - present:
            self.db.execute("UPDATE pilots SET end_at = ?, end_source = 'squeue' "
                            "WHERE site = ? AND job_id = ?", (now, site, job_id))
            events.ended.extend(self.pilots(site=site, job_id=job_id))
        self._commit()
        return events

    def awaiting_end_record(self, site: str, since: float) -> list[str]:
        """Job ids of the site's pilots that ended by `squeue` at or after `since` (their
        end record, if any, not applied yet), the most recent end first."""
        return [r[0] for r in self.db.execute(
            "SELECT job_id FROM pilots WHERE site = ? AND end_source = 'squeue' "
            "AND end_at >= ? ORDER BY end_at DESC, job_id", (site, since))]

    def apply_end_records(self, site: str, records: Iterable[EndRecord]) -> RecordsApplied:
        """Pilots of `site` that ended by `squeue` take the end (and, where `squeue`
        never showed them running, the start) of their own end record; end_source
        becomes "record". A record ends a pilot no later than the cycle that saw it
        gone (clocks differ between nodes) and starts it no earlier than its submission;
        one that ended before its pilot was submitted (a job id reused) is refused."""
        out = RecordsApplied()
        for rec in records:
            row = self.db.execute(
                "SELECT submit_at, start_at, end_at, end_source FROM pilots "
                "WHERE site = ? AND job_id = ?", (site, rec.job_id)).fetchone()
            if row is None or row[2] is None:
                out.refused[rec.job_id] = "no ended pilot of that job id in the journal"
                continue
            submit_at, start_at, seen_gone, source = float(row[0] or 0.0), row[1], row[2], row[3]
            if source == "record":
                continue  # applied before
            if rec.end_at < submit_at:
                out.refused[rec.job_id] = (f"ended at {rec.end_at:.0f}, before the pilot was "
                                           f"submitted at {submit_at:.0f}: an older job's")
                continue
            end = min(rec.end_at, seen_gone)
            if start_at is None:
                start_at = min(max(rec.start_at, submit_at), end)
                out.started.append((site, max(0.0, start_at - submit_at)))
            end = max(end, start_at)
            self.db.execute(
                "UPDATE pilots SET start_at = ?, end_at = ?, end_source = 'record', "
                "end_reason = ? WHERE site = ? AND job_id = ?",
                (start_at, end, rec.reason, site, rec.job_id))
            out.updated.extend(self.pilots(site=site, job_id=rec.job_id))
        self._commit()
        return out

    def pilots(self, since: float | None = None, site: str | None = None,
               job_id: str | None = None) -> list[PilotRecord]:
        """Pilot records, those alive at or after `since` (None: all)."""
        sql = ("SELECT site, job_id, cores, submit_at, start_at, end_at, memory_mb, join_at, "
               "end_source, end_reason, gpus, account, allocation FROM pilots WHERE 1=1")
        args: list[Any] = []
        if since is not None:
            sql += " AND (end_at IS NULL OR end_at >= ?)"
            args.append(since)
        if site is not None:
            sql += " AND site = ?"
            args.append(site)
        if job_id is not None:
            sql += " AND job_id = ?"
            args.append(job_id)
        return [PilotRecord(r[0], r[1], int(r[2] or 0), float(r[3] or 0.0), r[4], r[5],
                            int(r[6] or 0), r[7], r[8], r[9], int(r[10] or 0), r[11] or "",
                            r[12] or "")
                for r in self.db.execute(sql + " ORDER BY site, submit_at", args)]

    def known_pilots(self, keys: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
        """Of the (site, job id) pairs, those the journal has a pilot record of."""
        return {k for k in set(keys) if self.db.execute(
            "SELECT 1 FROM pilots WHERE site = ? AND job_id = ?", k).fetchone()}

    def add_pilot_records(self, records: Iterable[PilotRecord], source: str) -> None:
        """Store whole pilot records (an import, e.g. from the simulator), replacing any
        with the same site and job id; `source` goes into end_source of ended ones."""
        self.db.executemany(
            "INSERT OR REPLACE INTO pilots (site, job_id, cores, memory_mb, submit_at, "
            "start_at, join_at, end_at, end_source, gpus, account, allocation) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(r.site, r.job_id, r.cores, r.memory_mb, r.submit_at, r.start_at, r.join_at,
              r.end_at, source if r.end_at is not None else None, r.gpus, r.account,
              r.allocation) for r in records])
        self._commit()

    def add_job_runs(self, runs: Iterable[JobRun]) -> int:
        """Store finished runs (a run seen twice is kept once); returns how many were new."""
        return len(self.new_job_runs(runs))

    def new_job_runs(self, runs: Iterable[JobRun]) -> list[JobRun]:
        """Store finished runs (a run seen twice is kept once); returns those that were new."""
        new = []
        for r in runs:
            cur = self.db.execute(
                "INSERT OR IGNORE INTO job_runs (job_id, start_at, owner, site, pilot_job_id, "
                "cores, end_at, wall_s, cpu_s, gpus, acct_group) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (r.job_id, r.start_at, r.owner, r.site, r.pilot_job_id, r.cores, r.end_at,
                 r.wall_s, r.cpu_s, r.gpus, r.group))
            if cur.rowcount:
                new.append(r)
        self._commit()
        return new

    def job_runs(self, since: float | None = None, site: str | None = None) -> list[JobRun]:
        sql = ("SELECT job_id, owner, site, pilot_job_id, cores, start_at, end_at, cpu_s, "
               "gpus, acct_group FROM job_runs WHERE 1=1")
        args: list[Any] = []
        if since is not None:
            sql += " AND end_at >= ?"
            args.append(since)
        if site is not None:
            sql += " AND site = ?"
            args.append(site)
        return [JobRun(r[0], r[1] or "", r[2] or "", r[3] or "", int(r[4] or 0), float(r[5]),
                       float(r[6]), float(r[7] or 0.0), int(r[8] or 0), r[9] or "")
                for r in self.db.execute(sql, args)]

    # --- the allocations' books (provisioner.service.books) --------------------
    def charged(self, site: str, account: str, allocation: str, unit: str, t0: float,
                t1: float, now: float) -> float:
        """Unit-hours the allocation's recorded pilots held within [t0, t1): each from
        its start to its end (or `now` while it runs) at its rate
        (provisioner.service.spend.charged, summed here by SQLite)."""
        end = "MIN(COALESCE(p.end_at, MAX(?, p.start_at)), ?)"
        sql = (f"SELECT SUM({RATE_SQL[unit]} * ({end} - MAX(p.start_at, ?))) FROM pilots p "
               f"WHERE {_OF_ALLOCATION} AND p.start_at IS NOT NULL AND p.start_at < ? "
               f"AND {end} > MAX(p.start_at, ?)")
        row = self.db.execute(sql, (now, t1, t0, site, account, allocation, t1, now, t1,
                                    t0)).fetchone()
        return float(row[0] or 0.0) / 3600.0

    def group_claims(self, site: str, account: str, allocation: str, unit: str, t0: float,
                     t1: float) -> dict[str, float]:
        """Accounting group ("" = none) -> unit-hours its finished runs claimed of the
        allocation's recorded pilots within [t0, t1) (provisioner.service.spend.run_units,
        summed here by SQLite)."""
        sql = (f"SELECT COALESCE(r.acct_group, ''), SUM({SHARE_SQL[unit]} * "
               "(MIN(r.end_at, ?) - MAX(r.start_at, ?))) FROM pilots p JOIN job_runs r "
               f"ON r.site = p.site AND r.pilot_job_id = p.job_id WHERE {_OF_ALLOCATION} "
               "AND r.end_at > ? AND r.start_at < ? AND MIN(r.end_at, ?) > MAX(r.start_at, ?) "
               "GROUP BY 1")
        rows = self.db.execute(sql, (t1, t0, site, account, allocation, t0, t1, t1, t0))
        return {str(g): float(v or 0.0) / 3600.0 for g, v in rows if v}

    # --- SLURM's charge of the allocations (provisioner.service.books) ---------
    def add_reading(self, reading: Reading) -> None:
        """One reading of SLURM's charge of an allocation (a reading of the same time
        kept once)."""
        self.db.execute(
            "INSERT OR REPLACE INTO slurm_readings (site, allocation, at, account, used, "
            "grant_units) VALUES (?, ?, ?, ?, ?, ?)",
            (reading.site, reading.allocation, reading.at, reading.account, reading.used,
             reading.grant))
        self._commit()

    def readings(self, site: str | None = None, allocation: str | None = None,
                 since: float | None = None) -> list[Reading]:
        """The readings kept, oldest first (of one site's allocation, from `since`)."""
        sql = ("SELECT site, allocation, account, at, used, grant_units FROM slurm_readings "
               "WHERE 1=1")
        args: list[Any] = []
        for column, value in (("site", site), ("allocation", allocation)):
            if value is not None:
                sql += f" AND {column} = ?"
                args.append(value)
        if since is not None:
            sql += " AND at >= ?"
            args.append(since)
        return [Reading(r[0], r[1], r[2] or "", float(r[3]), float(r[4] or 0.0), r[5])
                for r in self.db.execute(sql + " ORDER BY at", args)]

    def last_readings(self) -> dict[tuple[str, str], Reading]:
        """The newest reading of each (site, allocation)."""
        rows = self.db.execute(
            "SELECT site, allocation, account, MAX(at), used, grant_units FROM slurm_readings "
            "GROUP BY site, allocation")
        return {(r[0], r[1]): Reading(r[0], r[1], r[2] or "", float(r[3]), float(r[4] or 0.0),
                                      r[5]) for r in rows}
