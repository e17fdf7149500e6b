"""SQLite journal: an audit trail of cycles and actions, and the flags of the
last cycle for `provisioner status`. A cache, never the only copy: after a
restart the service rebuilds its picture from SLURM and the collector.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS cycles (
    id INTEGER PRIMARY KEY, at REAL, reason TEXT, summary TEXT,
    observe_s REAL, plan_s REAL, act_s REAL);
CREATE TABLE IF NOT EXISTS actions (
    id INTEGER PRIMARY KEY, cycle INTEGER, at REAL, kind TEXT, site TEXT,
    job_id TEXT, detail TEXT, outcome TEXT);
CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value TEXT);
"""


class Journal:
    """Append-only record; `path` "" keeps it in memory (nothing survives)."""

    def __init__(self, path: str) -> None:
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path or ":memory:", check_same_thread=False)
        self.db.executescript(SCHEMA)
        if path:
            Path(path).chmod(0o600)

    def cycle(self, reason: str, summary: str, timings: Mapping[str, float]) -> int:
        cur = self.db.execute(
            "INSERT INTO cycles (at, reason, summary, observe_s, plan_s, act_s) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (time.time(), reason, summary, timings.get("observe", 0.0),
             timings.get("plan", 0.0), timings.get("act", 0.0)))
        self.db.commit()
        return int(cur.lastrowid or 0)

    def action(self, cycle: int, kind: str, site: str, job_id: str, detail: str,
               outcome: str) -> None:
        self.db.execute(
            "INSERT INTO actions (cycle, at, kind, site, job_id, detail, outcome) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (cycle, time.time(), kind, site, job_id, detail, outcome))
        self.db.commit()

    def put(self, key: str, value: Any) -> None:
        self.db.execute("INSERT OR REPLACE INTO state (key, value) VALUES (?, ?)",
                        (key, json.dumps(value)))
        self.db.commit()

    def get(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default
