"""Push instead of polling: follow the schedd's global event log and wake the loop early.

Where the service runs beside the schedd, the schedd writes every SUBMIT event to its
global event log (`EVENT_LOG`) when the submit commits. `EventLogFollower` reads that
log in a background thread (`htcondor2.JobEventLog(...).events(stop_after=...)`, which
waits on inotify) and calls `Wakeup.ask()` on the events that add idle jobs (`WAKE_EVENTS`):
the loop then runs its quick check at once instead of at its next timer tick. A burst is
one wake-up per `COALESCE_S` window (the first event at once, the rest in one trailing
wake-up), and the loop's own `min_cycle_gap_s` makes it one cycle.

The follower only wakes; the cycle still reads the queue. Nothing is lost when it cannot
follow: the quick check (every `policy.quick_check_s`) stays the fallback, and the
follower says once that it fell back and once that it follows again. JobEventLog keeps
reading the file it opened, so rotation (`EVENT_LOG_MAX_SIZE`: the log is renamed to
``.old`` or ``.1`` and a new one started) is seen by the path's inode changing: the old
file is read to its end, then the new one from its start. A log shorter than the read
offset was truncated: it is read again from its start.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)

#: Event types that add an idle job: submitted, evicted (back to idle), released from hold.
WAKE_EVENTS = frozenset({"SUBMIT", "JOB_EVICTED", "JOB_RELEASED"})
#: Seconds one wait for new events lasts (JobEventLog takes whole seconds); also how
#: soon a rotation, a truncation or a stop request is noticed.
WAIT_S = 1
#: At most one wake-up per this many seconds; events within it give one more at its end.
COALESCE_S = 1.0
#: Seconds between attempts to open a log that is missing or unreadable.
RETRY_S = 1.0
#: Read errors in a row (no event read between) after which the log counts as unreadable.
READ_ERRORS = 3


# --- pure decisions -----------------------------------------------------------------------
@dataclass(frozen=True)
class FileId:
    """Which file a path names and how long it is."""

    dev: int
    ino: int
    size: int


def file_change(opened: FileId, now: FileId | None, offset: int) -> str:
    """What happened to the followed file: "" (nothing: keep reading), "missing" (the
    path is gone), "rotated" (the path names another file) or "truncated" (the file is
    shorter than what was read of it)."""
    if now is None:
        return "missing"
    if (now.dev, now.ino) != (opened.dev, opened.ino):
        return "rotated"
    if now.size < offset:
        return "truncated"
    return ""


class Coalescer:
    """When to wake the loop for a stream of events: the first at once, then at most one
    wake-up per `window_s` (events in between give one wake-up at the window's end).
    Pure: the caller passes the time."""

    def __init__(self, window_s: float = COALESCE_S) -> None:
        self.window_s = window_s
        self.last: float | None = None  # when the loop was last woken
        self.pending = False  # events since then, not woken for yet

    def event(self, now: float) -> bool:
        """An event arrived at `now`: whether to wake the loop now."""
        if self.last is None or now - self.last >= self.window_s:
            self.last, self.pending = now, False
            return True
        self.pending = True
        return False

    def due(self, now: float) -> bool:
        """Whether a trailing wake-up for events held back is due at `now`."""
        if self.pending and self.last is not None and now - self.last >= self.window_s:
            self.last, self.pending = now, False
            return True
        return False


class Notice:
    """What to say about following, each change once: fell back, following (again)."""

    def __init__(self) -> None:
        self.following: bool | None = None  # None: nothing said yet

    def followed(self, path: str) -> str | None:
        if self.following:
            return None
        again = " again" if self.following is False else ""
        self.following = True
        return (f"following the schedd's event log {path}{again}: new jobs wake the loop "
                "at once")

    def fell_back(self, path: str, reason: str, quick_check_s: float) -> str | None:
        if self.following is False:
            return None
        self.following = False
        return (f"cannot follow the schedd's event log {path} ({reason}): new jobs are "
                f"seen by the quick check (every {quick_check_s:g} s) until it can")


# --- the loop's side ----------------------------------------------------------------------
class Wakeup:
    """An early quick check, asked for from any thread, taken by the loop.

    `ask()` (the follower) marks a check as due and pokes the scheduler, unless a check
    runs now: then the poke follows when it ends. `take()` (the loop) says whether a
    check was asked for and clears it. `hold()` (the loop) keeps a woken check asked for,
    for the next timer tick, without a poke (the cycle was held back by
    `min_cycle_gap_s`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked = False
        self._held = False
        self._busy = False
        self.poke: Callable[[], None] | None = None

    def ask(self) -> None:
        with self._lock:
            self._asked = True
            poke = None if self._busy else self.poke
        if poke is not None:
            poke()

    def hold(self) -> None:
        with self._lock:
            self._held = True

    def take(self) -> bool:
        with self._lock:
            asked = self._asked or self._held
            self._asked = self._held = False
        return asked

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Around one check: asks that arrive meanwhile poke once it ends."""
        with self._lock:
            self._busy = True
        try:
            yield
        finally:
            with self._lock:
                self._busy = False
                poke = self.poke if self._asked else None
            if poke is not None:
                poke()


# --- which log ----------------------------------------------------------------------------
def resolve_path(setting: str, param: Any) -> str | None:
    """The event log to follow for the `pool.event_log` setting: "off" -> None; an
    absolute path -> it; "auto" -> the HTCondor configuration's EVENT_LOG (`param`, e.g.
    `htcondor2.param`) if it is set and its directory exists on this host (the service
    runs beside the schedd), else None."""
    if setting == "off":
        return None
    if setting != "auto":
        return setting
    try:
        path = str(param.get("EVENT_LOG") or "")
    except Exception as exc:  # the bindings' configuration cannot be read
        log.info("EVENT_LOG not readable from the HTCondor configuration: %s", exc)
        return None
    if not path or not os.path.isabs(path) or not os.path.isdir(os.path.dirname(path)):
        return None
    return path


# --- the follower -------------------------------------------------------------------------
class EventLog(Protocol):
    """What the follower needs of `htcondor2.JobEventLog`."""

    def events(self, stop_after: int | None = None) -> Iterable[Any]: ...

    def close(self) -> None: ...


#: How long starting the follower waits for its first attempt to open the log.
FIRST_OPEN_WAIT_S = 5.0


def _open_job_event_log(path: str) -> EventLog:
    import htcondor2

    return htcondor2.JobEventLog(path)  # type: ignore[no-any-return]


def _offset(reader: EventLog) -> int | None:
    """How far `reader` has read (bytes), None if the bindings cannot say."""
    try:
        from htcondor2.htcondor2_impl import _job_event_log_get_offset

        return int(_job_event_log_get_offset(reader, reader._handle))  # type: ignore[attr-defined]
    except Exception:
        return None


def _skip_to(reader: EventLog, offset: int) -> bool:
    """Move `reader` to byte `offset` without reading what lies before it through the
    bindings, one event at a time (a 22 MB log took 13 s, and submits made meanwhile
    woke nothing); False if the bindings cannot (then the caller reads through)."""
    try:
        from htcondor2.htcondor2_impl import _job_event_log_set_offset

        _job_event_log_set_offset(reader, reader._handle, offset)  # type: ignore[attr-defined]
    except Exception:
        return False
    return _offset(reader) == offset


def _file_id(path: str) -> FileId | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return FileId(st.st_dev, st.st_ino, st.st_size)


class EventLogFollower:
    """Follows one event log in a daemon thread and asks `wakeup` for early checks.

    Contract: never raises into the service and never stops it; whatever goes wrong
    (missing, unreadable, rotated, truncated, a read error) ends in the quick check as the
    fallback, said once (following again is said once it reads), and another try every
    `retry_s`. Content the log holds at the
    first attempt to open it is old (the service's first cycle reads the queue) and wakes
    nothing; a file that appears or comes back later is read from its start."""

    def __init__(self, path: str, wakeup: Wakeup, quick_check_s: float,
                 open_log: Callable[[str], EventLog] = _open_job_event_log,
                 clock: Callable[[], float] = time.monotonic, coalesce_s: float = COALESCE_S,
                 retry_s: float = RETRY_S) -> None:
        self.path = path
        self.wakeup = wakeup
        self.quick_check_s = quick_check_s
        self.open_log = open_log
        self.clock = clock
        self.retry_s = retry_s
        self.coalescer = Coalescer(coalesce_s)
        self.notice = Notice()
        self.attempts = 0  # attempts to open the log
        self.read = 0  # events read (old ones included)
        self.wakeups = 0  # how often the loop was woken
        self._stop = threading.Event()
        self._tried = threading.Event()  # the first attempt to open the log is over
        self._thread: threading.Thread | None = None

    def start(self, wait_s: float = FIRST_OPEN_WAIT_S) -> None:
        """Start following; return once the first attempt to open the log is over (at
        most `wait_s`), so that a cycle run next reads the queue after the point from
        which submits wake the loop: none falls between the two."""
        self._thread = threading.Thread(target=self._run, name="event-log", daemon=True)
        self._thread.start()
        self._tried.wait(wait_s)

    def stop(self, timeout: float = 5.0) -> bool:
        """Ask the thread to end and wait up to `timeout` s; whether it ended."""
        self._stop.set()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        reader: EventLog | None = None
        opened: FileId | None = None
        first = True
        while not self._stop.is_set():
            try:
                if reader is None:
                    self.attempts += 1
                    got = self._open()
                    old, first = first, False
                    if isinstance(got, str):
                        self._fell_back(got)
                        self._tried.set()
                        self._stop.wait(self.retry_s)
                        continue
                    reader, opened = got
                    # what the log held at the first try is old: skipped at once where
                    # the bindings can seek (to where the file ended when opened)
                    if old and not _skip_to(reader, opened.size):
                        self._read(reader, 0, wake=False)
                    self._tried.set()
                self._read(reader, WAIT_S)
                self._say(logging.INFO, self.notice.followed(self.path))  # once it reads
                assert opened is not None
                change = file_change(opened, _file_id(self.path), _offset(reader) or 0)
                if change:
                    log.info("event log %s %s: reading it anew", self.path, change)
                    if change != "truncated":
                        self._read(reader, 0)  # the renamed file to its end
                    self._close(reader)
                    reader = None
            except Exception as exc:  # one bad read must never end the follower
                self._close(reader)
                reader = None
                self._fell_back(f"read failed: {type(exc).__name__}: {exc}")
                self._tried.set()
                self._stop.wait(self.retry_s)
        self._tried.set()
        self._close(reader)

    def _open(self) -> tuple[EventLog, FileId] | str:
        """The log opened and the file it is, or why it cannot be opened."""
        try:
            st = os.stat(self.path)
            if not stat.S_ISREG(st.st_mode):
                return "not a regular file"
            with open(self.path, "rb"):
                pass  # readable by this account (JobEventLog does not say so)
        except FileNotFoundError:
            return "missing"
        except OSError as exc:
            return f"unreadable: {exc.strerror or exc}"
        try:
            reader = self.open_log(self.path)
        except Exception as exc:
            return f"cannot be opened: {exc}"
        now = _file_id(self.path)
        if now is None or (now.dev, now.ino) != (st.st_dev, st.st_ino):
            self._close(reader)
            return "rotated while being opened"
        return reader, FileId(st.st_dev, st.st_ino, st.st_size)

    def _read(self, reader: EventLog, stop_after: int, wake: bool = True) -> None:
        """Read the events that come within `stop_after` s; wake the loop as due. An event
        the bindings cannot parse is skipped (they raise on it and read on after it);
        `READ_ERRORS` errors in a row without an event between raise the last."""
        errors = 0
        while True:
            try:
                for event in reader.events(stop_after=stop_after):
                    errors = 0
                    self.read += 1
                    now = self.clock()
                    woke = wake and event.type.name in WAKE_EVENTS and self.coalescer.event(now)
                    if woke or self.coalescer.due(now):
                        self._wake()
                    if self._stop.is_set():
                        return
                break
            except Exception as exc:
                errors += 1
                if errors >= READ_ERRORS:
                    raise
                log.debug("event log %s: an event skipped: %s", self.path, exc)
        if self.coalescer.due(self.clock()):
            self._wake()

    def _wake(self) -> None:
        self.wakeups += 1
        self.wakeup.ask()

    def _fell_back(self, reason: str) -> None:
        self._say(logging.WARNING, self.notice.fell_back(self.path, reason, self.quick_check_s))

    @staticmethod
    def _say(level: int, message: str | None) -> None:
        if message is not None:
            log.log(level, "%s", message)

    @staticmethod
    def _close(reader: EventLog | None) -> None:
        if reader is not None:
            try:
                reader.close()
            except Exception as exc:
                log.debug("closing the event log: %s", exc)
