"""Whether the journal can be written, and what the service does while it cannot.

The journal (`provisioner.service.journal`) is a cache and an audit trail; what it
protects across a restart is the record of the pilots submitted. When it cannot be
written (its file system full, its file or directory not writable, a corrupt file),
each cycle still runs: idle pilots are flagged and released, busy ones retired,
lingering ones cancelled, since SLURM and the collector are the truth for those.
Submissions wait until the journal can be written again. The fault is one log line
when it begins and one when it ends (never a traceback per cycle), the
`provisioner_journal_writable` metric, and a line of `provisioner status`, which reads
it from a small file beside the service's lock in its runtime directory (`fault_path`;
not on the journal's file system, which may be the full one).

What was done while the journal could not be written is recorded once it can: the
actions (releases, retirements, cancels, with their outcomes and times) go into the
first cycle recorded after, marked as done while the journal was unwritable; the
controller's state, the flags and the limits are written whole every cycle; a pilot
that ended meanwhile gets its end from its own end record (else from that first
cycle's `squeue`); finished job runs are read from the schedd's history from where the
journal left off. A service stopped before the journal is back loses the backlog of
actions (its log has them).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from provisioner.service.journal import Journal

log = logging.getLogger(__name__)

#: The service's runtime directory (systemd's RuntimeDirectory=provisioner).
RUNTIME_DIR = Path("/run/provisioner")
#: Actions kept for the journal while it cannot be written (the oldest dropped past it).
BACKLOG_MAX = 1000
#: The outcome of a submission that waits for the journal.
WAITING = "waiting: the journal cannot be written; submissions resume once it can"


def fault_path(provisioner_id: str) -> Path:
    """Where the service says its journal cannot be written, for `provisioner status`:
    its runtime directory when there is one, else the temporary directory."""
    base = RUNTIME_DIR if RUNTIME_DIR.is_dir() else Path(tempfile.gettempdir())
    return base / f"journal-fault-{provisioner_id}.json"


def kind_of(exc: BaseException) -> str:
    """A journal error in one word: full, permission, corrupt or other."""
    text = str(exc).lower()
    if "full" in text or "no space" in text:
        return "full"
    if "readonly" in text or "read-only" in text or "permission" in text \
            or "unable to open" in text:
        return "permission"
    if "not a database" in text or "malformed" in text or "corrupt" in text:
        return "corrupt"
    return "other"


@dataclass(frozen=True)
class JournalFault:
    """Why the journal cannot be written, and since when."""

    kind: str
    error: str
    since: float

    def line(self, path: str) -> str:
        return (f"journal {path or ':memory:'} cannot be written ({self.kind}: "
                f"{self.error}): submissions wait until it can; releases, retirements "
                "and cancels go on and are recorded once it can")


class JournalHealth:
    """The journal's state as the service sees it: transitions logged once, the metric
    set, the fault file written and removed; the actions done meanwhile kept."""

    def __init__(self, path: str, fault_file: Path | None = None,
                 metric: object | None = None) -> None:
        self.path = path
        self.fault_file = fault_file
        self.metric = metric  # a Gauge (or None): 1 writable, 0 not
        self.fault: JournalFault | None = None
        self.unopened = False  # the journal could not be opened: one in memory meanwhile
        self.said_waiting = False  # the submissions that wait were logged
        #: (at, kind, site, job id, text, outcome) of actions not recorded yet
        self.backlog: list[tuple[float, str, str, str, str, str]] = []
        self._set_metric(1)

    @property
    def writable(self) -> bool:
        return self.fault is None

    def _set_metric(self, value: int) -> None:
        if self.metric is not None:
            self.metric.set(value)  # type: ignore[attr-defined]

    def failed(self, exc: BaseException, now: float) -> None:
        """A write failed at `now`: the first failure is logged and published."""
        if self.fault is not None:
            return
        self.fault = JournalFault(kind_of(exc), str(exc), now)
        log.error("%s", self.fault.line(self.path))
        self._set_metric(0)
        self._publish()

    def succeeded(self, now: float) -> None:
        """A cycle was recorded at `now`: a fault ends, logged once."""
        if self.fault is None:
            return
        log.warning("journal %s writable again after %.0f s; %d action(s) done meanwhile "
                    "recorded", self.path, now - self.fault.since, len(self.backlog))
        self.fault = None
        self.said_waiting = False
        self.backlog.clear()
        self._set_metric(1)
        self._publish()

    def waiting(self, submits: list[str]) -> None:
        """This cycle's submissions wait for the journal: logged once per fault."""
        if submits and not self.said_waiting:
            log.warning("%d submission(s) wait for the journal (said once until it can be "
                        "written): %s", len(submits), "; ".join(submits))
            self.said_waiting = True

    def keep(self, at: float, row: tuple[str, str, str, str, str]) -> None:
        """An action done while the journal could not be written: recorded later."""
        self.backlog.append((at, *row))
        del self.backlog[:-BACKLOG_MAX]

    def record(self, journal: Journal, write: Callable[[], None],
               outcomes: list[tuple[str, str]], now: float) -> None:
        """Run `write` (a cycle's records) in one journal batch, after the backlog; a
        failure is rolled back and marks the fault, the cycle's actions kept."""
        try:
            with journal.batch():
                if self.backlog:
                    cid = journal.cycle("backlog", f"{len(self.backlog)} action(s) done "
                                        "while the journal could not be written", {})
                    for at, kind, site, job_id, text, outcome in self.backlog:
                        journal.action(cid, kind, site, job_id, f"{text} (done while the "
                                       "journal could not be written)", outcome, at=at)
                write()
        except (sqlite3.Error, OSError) as exc:
            self.failed(exc, now)
            self.missed(outcomes, now)
            return
        self.succeeded(now)

    def missed(self, outcomes: list[tuple[str, str]], now: float) -> None:
        """A cycle's actions the journal could not take: kept for it."""
        for row in backlog_rows(outcomes):
            self.keep(now, row)

    def _publish(self) -> None:
        """The fault file: written while there is a fault, removed when it ends."""
        if self.fault_file is None:
            return
        try:
            if self.fault is None:
                self.fault_file.unlink(missing_ok=True)
                return
            tmp = self.fault_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"path": self.path, "kind": self.fault.kind,
                                       "error": self.fault.error,
                                       "since": self.fault.since}))
            os.replace(tmp, self.fault_file)
        except OSError as exc:
            log.warning("%s: not written (status will not show the journal's state): %s",
                        self.fault_file, exc)


def read_fault(path: Path) -> dict[str, object] | None:
    """The service's journal fault as its fault file says (None: none, or unreadable)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def backlog_rows(outcomes: list[tuple[str, str]]) -> list[tuple[str, str, str, str, str]]:
    """A cycle's outcomes as journal action rows (kind, site, job id, text, outcome),
    submissions that waited left out."""
    from provisioner.service.cycle_text import action_target

    rows = []
    for text, outcome in outcomes:
        if outcome == WAITING:
            continue
        site, job_id = action_target(text)
        rows.append((text.split(" ", 1)[0], site, job_id, text, outcome))
    return rows
