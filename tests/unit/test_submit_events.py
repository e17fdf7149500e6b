"""The event log follower against real event log files read by htcondor2.JobEventLog.

The files are written here in HTCondor's event log text format (what the schedd writes to
EVENT_LOG): "000 (cluster.proc.subproc) date time text", body lines, "...". Every wait has
a deadline and waits on a condition (a wake-up, a log line, a counter), never a fixed time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from provisioner.config import ConfigError, PolicyConfig, PoolConfig, parse_config
from provisioner.decide.cadence import CycleMark, Probe, cycle_due, gap_holds
from provisioner.model import Demand, JobShape
from provisioner.pool.submit_events import (
    Coalescer,
    EventLogFollower,
    FileId,
    Notice,
    Wakeup,
    file_change,
    resolve_path,
)
from tests.unit.test_service_act import make_world

DEADLINE_S = 20.0  # how long a test waits for what must happen (a bound, not a timing)
LOGGER = "provisioner.pool.submit_events"


def event(cluster: int, code: str = "000", text: str = "Job submitted from host: "
          "<10.10.0.10:9618?addrs=10.10.0.10-9618&alias=cm&noUDP&sock=schedd_1_1>") -> str:
    return f"{code} ({cluster:03d}.000.000) 2026-11-26 10:00:00 {text}\n...\n"


def submits(first: int, n: int) -> str:
    return "".join(event(c) for c in range(first, first + n))


HEADER = ("008 (000.000.000) 2026-11-26 09:00:00 Global JobLog: ctime=1795683600 "
          "id=cm.1.1 sequence=1 size=0 events=0 offset=0 event_off=0 max_rotation=1 "
          "creator_name=<>\n...\n")
EXECUTE = event(1, "001", "Job executing on host: <10.20.0.5:9618?sock=startd_1_1>")
USAGE = "".join(f"\n\t\tUsr 0 00:00:00, Sys 0 00:00:00  -  {w} Usage"
                for w in ("Run Remote", "Run Local", "Total Remote", "Total Local"))
BYTES = "".join(f"\n\t0  -  {w} By Job" for w in ("Run Bytes Sent", "Run Bytes Received",
                                                "Total Bytes Sent", "Total Bytes Received"))
TERMINATED = event(1, "005", "Job terminated.\n\t(1) Normal termination (return value 0)"
                   + USAGE + BYTES)
#: A terminated event without its usage lines: the bindings raise on it.
MALFORMED = event(1, "005", "Job terminated.\n\t(1) Normal termination (return value 0)")


def append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def wait_until(what: Callable[[], bool], why: str) -> None:
    """Wait for a condition the follower's thread brings about, up to DEADLINE_S."""
    deadline = time.monotonic() + DEADLINE_S
    while not what():
        assert time.monotonic() < deadline, f"not within {DEADLINE_S} s: {why}"
        time.sleep(0.01)


class Said(logging.Handler):
    """The follower's log lines, to wait on and count."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def count(self, text: str) -> int:
        return sum(text in line for line in self.lines)

    def wait(self, text: str, times: int = 1) -> None:
        wait_until(lambda: self.count(text) >= times, f"{text!r} said {times} time(s)")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Pokes:
    """The scheduler's side of a Wakeup: counts pokes."""

    def __init__(self, wakeup: Wakeup) -> None:
        self.n = 0
        self._lock = threading.Lock()
        wakeup.poke = self

    def __call__(self) -> None:
        with self._lock:
            self.n += 1


@pytest.fixture
def said() -> Iterator[Said]:
    handler = Said()
    logger = logging.getLogger(LOGGER)
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old)


@pytest.fixture
def follow() -> Iterator[Callable[..., tuple[EventLogFollower, Pokes]]]:
    """Start followers; each must stop cleanly at the end of the test."""
    started: list[EventLogFollower] = []

    def start(path: Path, coalesce_s: float = 0.0, clock: Callable[[], float] | None = None,
              ) -> tuple[EventLogFollower, Pokes]:
        wakeup = Wakeup()
        pokes = Pokes(wakeup)
        follower = EventLogFollower(str(path), wakeup, quick_check_s=10, coalesce_s=coalesce_s,
                                    clock=clock or time.monotonic, retry_s=0.05)
        started.append(follower)
        follower.start()
        return follower, pokes

    yield start
    for follower in started:
        assert follower.stop(timeout=DEADLINE_S), "the follower's thread did not end"


# --- the follower on real files -----------------------------------------------------------
def test_a_submit_wakes_the_loop_and_old_or_other_events_do_not(tmp_path: Path, said: Said,
                                                               follow) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "EventLog"
    log.write_text(HEADER + submits(1, 3))  # there before the service: old
    follower, pokes = follow(log)
    said.wait("following the schedd's event log")
    # skipped, not read through one by one, and waking nothing
    assert follower.read == 0 and follower.wakeups == 0 and pokes.n == 0
    append(log, EXECUTE + TERMINATED)
    wait_until(lambda: follower.read == 2, "execute and terminate read")
    assert follower.wakeups == 0 and not follower.wakeup.take()
    append(log, event(7))
    wait_until(lambda: pokes.n == 1, "the submit pokes the scheduler")
    assert follower.wakeup.take() and follower.wakeups == 1
    assert said.count("cannot follow") == 0


def test_a_malformed_event_is_skipped_without_falling_back(tmp_path: Path, said: Said,
                                                           follow) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "EventLog"
    log.write_text(HEADER + MALFORMED + event(1))  # old, read past at start
    follower, pokes = follow(log)
    said.wait("following")
    assert follower.read == 0 and pokes.n == 0
    append(log, MALFORMED + event(2))
    wait_until(lambda: pokes.n == 1, "the submit after it wakes")
    assert follower.read == 1 and said.count("an event skipped") == 1
    assert said.count("cannot follow") == 0


def test_a_submit_right_after_the_start_wakes_the_loop(tmp_path: Path, said: Said,
                                                       follow) -> None:  # type: ignore[no-untyped-def]
    """start() returns once the log is open and skipped to its end: a job submitted
    right after (before the service's first cycle has read the queue) wakes the loop
    instead of counting as old."""
    log = tmp_path / "EventLog"
    log.write_text(HEADER + submits(1, 3))
    follower, pokes = follow(log)
    append(log, event(4))  # at once: no wait for "following" first
    wait_until(lambda: pokes.n == 1, "the submit wakes the loop")
    assert follower.read == 1


def test_a_long_old_log_is_skipped_at_once_and_a_submit_after_it_wakes(
        tmp_path: Path, said: Said, follow) -> None:  # type: ignore[no-untyped-def]
    """What the log held when the service started is not read through event by event
    (20,000 events took seconds; a submit made meanwhile woke nothing): the follower
    starts where the file ended."""
    log = tmp_path / "EventLog"
    log.write_text(HEADER + submits(1, 20_000))
    follower, pokes = follow(log)
    said.wait("following the schedd's event log")
    append(log, event(20_001))
    wait_until(lambda: pokes.n == 1, "the new submit wakes the loop")
    assert follower.read == 1 and follower.wakeups == 1


def test_a_burst_is_one_wake_up_per_coalescing_window(tmp_path: Path, said: Said,
                                                      follow) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "EventLog"
    log.write_text(HEADER)
    clock = Clock()
    follower, pokes = follow(log, coalesce_s=1.0, clock=clock)
    said.wait("following")  # the header skipped
    append(log, submits(1, 50))
    wait_until(lambda: follower.read == 50, "the burst read")
    assert pokes.n == 1  # the first at once; 49 held back within the window
    clock.t = 1.0  # the window ends: one trailing wake-up for the 49
    wait_until(lambda: pokes.n == 2, "the trailing wake-up")
    append(log, submits(51, 50))  # a second burst within the next window
    wait_until(lambda: follower.read == 100, "the second burst read")
    assert pokes.n == 2
    clock.t = 2.0
    wait_until(lambda: pokes.n == 3, "the second trailing wake-up")
    assert follower.wakeups == 3


def test_rotation_reads_the_renamed_file_to_its_end_then_the_new_one_from_its_start(
        tmp_path: Path, said: Said, follow) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "EventLog"
    log.write_text(HEADER)
    follower, pokes = follow(log)
    said.wait("following")
    append(log, event(1))
    wait_until(lambda: follower.read == 1, "the first submit read (the header skipped)")
    os.rename(log, tmp_path / "EventLog.old")  # EVENT_LOG_MAX_SIZE reached
    append(tmp_path / "EventLog.old", event(2))  # written just before the rename
    log.write_text(HEADER + event(3) + event(4))  # the schedd's new log
    said.wait("rotated: reading it anew")
    wait_until(lambda: follower.read == 1 + 1 + 3, "both files read, the new one whole")
    append(log, event(5))
    wait_until(lambda: follower.read == 6, "the new file followed")
    assert follower.wakeups == pokes.n == 5  # every submit, none twice (no coalescing here)
    assert said.count("cannot follow") == 0


def test_truncation_reads_the_log_again_from_its_start(tmp_path: Path, said: Said,
                                                       follow) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "EventLog"
    log.write_text(HEADER + submits(1, 5))
    follower, pokes = follow(log)
    said.wait("following")
    log.write_text(event(6))  # cut and written anew, shorter than what was read
    said.wait("truncated: reading it anew")
    wait_until(lambda: pokes.n == 1, "the submit after the truncation wakes")
    assert follower.read == 1  # the 6 old events skipped, not read
    assert said.count("cannot follow") == 0


def test_a_log_missing_at_start_is_followed_once_it_appears(tmp_path: Path, said: Said,
                                                            follow) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "EventLog"
    follower, pokes = follow(log)
    said.wait("cannot follow the schedd's event log")
    wait_until(lambda: follower.attempts >= 5, "tried again and again")
    assert said.count("cannot follow") == 1 and "(missing)" in said.lines[-1]
    assert "quick check (every 10 s)" in said.lines[-1]
    log.write_text(HEADER + event(1))  # written after the service started: new
    said.wait("event log " + str(log) + " again")
    wait_until(lambda: pokes.n == 1, "its submit wakes the loop")
    assert said.count("cannot follow") == 1 and said.count("following") == 1


def test_an_unreadable_log_falls_back_said_once_and_is_followed_when_readable(
        tmp_path: Path, said: Said, follow) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "EventLog"
    log.mkdir()  # not a file: even root cannot read events from it
    follower, pokes = follow(log)
    said.wait("cannot follow")
    wait_until(lambda: follower.attempts >= 5, "tried again and again")
    assert said.count("cannot follow") == 1 and "not a regular file" in said.lines[-1]
    log.rmdir()
    log.write_text(HEADER + event(1))
    said.wait("again")
    wait_until(lambda: pokes.n == 1, "its submit wakes the loop")
    assert said.count("cannot follow") == 1


@contextlib.contextmanager
def unprivileged() -> Iterator[None]:
    """As root, the block runs with nobody's effective ids (root reads a file of mode
    0000); otherwise as is."""
    if os.geteuid() != 0:
        yield
        return
    os.setegid(65534)
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


def test_a_log_without_read_permission_falls_back_said_once(tmp_path: Path, said: Said,
                                                            follow) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "EventLog"
    log.write_text(HEADER)
    log.chmod(0)
    with unprivileged():
        follower, _ = follow(log)
        said.wait("cannot follow")
        wait_until(lambda: follower.attempts >= 5, "tried again and again")
    assert said.count("cannot follow") == 1 and "Permission denied" in said.lines[-1]
    log.chmod(0o644)
    said.wait("again")


class Broken:
    """A reader whose reads fail (a JobEventLog whose file went bad under it)."""

    def events(self, stop_after: int | None = None) -> Iterator[object]:
        raise OSError("Input/output error")

    def close(self) -> None:
        pass


def test_a_read_that_keeps_failing_falls_back_said_once(tmp_path: Path, said: Said) -> None:
    log = tmp_path / "EventLog"
    log.write_text(HEADER)
    follower = EventLogFollower(str(log), Wakeup(), 10, open_log=lambda path: Broken(),
                                retry_s=0.01)
    follower.start()
    try:
        wait_until(lambda: follower.attempts >= 5, "opened again and again")
    finally:
        assert follower.stop(timeout=DEADLINE_S)
    assert said.count("cannot follow") == 1 and "Input/output error" in said.lines[0]
    assert said.count("following") == 0  # it never read


def test_the_thread_stops_cleanly_while_following_or_fallen_back(tmp_path: Path,
                                                                 said: Said) -> None:
    log = tmp_path / "EventLog"
    log.write_text(HEADER)
    following = EventLogFollower(str(log), Wakeup(), 10)
    missing = EventLogFollower(str(tmp_path / "nothing"), Wakeup(), 10)
    for follower in (following, missing):
        follower.start()
    said.wait("following")
    said.wait("cannot follow")
    for follower in (following, missing):
        assert follower._thread is not None and follower._thread.is_alive()
        assert follower.stop(timeout=DEADLINE_S)
        assert not follower._thread.is_alive()
    assert EventLogFollower(str(log), Wakeup(), 10).stop()  # never started


# --- the pure parts -----------------------------------------------------------------------
def test_file_change_names_what_happened_to_the_followed_file() -> None:
    opened = FileId(1, 100, 500)
    assert file_change(opened, FileId(1, 100, 900), 500) == ""  # grew
    assert file_change(opened, FileId(1, 100, 500), 500) == ""
    assert file_change(opened, None, 500) == "missing"
    assert file_change(opened, FileId(1, 101, 10), 500) == "rotated"
    assert file_change(opened, FileId(2, 100, 900), 500) == "rotated"
    assert file_change(opened, FileId(1, 100, 499), 500) == "truncated"


def test_coalescer_wakes_at_once_then_once_per_window() -> None:
    c = Coalescer(1.0)
    assert c.event(10.0) and not c.due(10.5)
    assert not c.event(10.2) and not c.event(10.9) and not c.due(10.99)
    assert c.due(11.0) and not c.due(11.5)  # one trailing wake-up for both
    assert not c.event(11.5)
    assert c.event(12.5) and not c.due(14.0)  # the window passed: at once, nothing held


def test_notice_says_each_change_once() -> None:
    n = Notice()
    assert "cannot follow the schedd's event log /l (missing)" in str(n.fell_back("/l",
                                                                        "missing", 10))
    assert n.fell_back("/l", "unreadable", 10) is None
    assert str(n.followed("/l")).endswith("/l again: new jobs wake the loop at once")
    assert n.followed("/l") is None
    assert " again" not in str(Notice().followed("/l"))


def test_wakeup_pokes_at_once_or_after_a_running_check() -> None:
    w = Wakeup()
    pokes = Pokes(w)
    w.ask()
    assert pokes.n == 1 and w.take() and not w.take()
    with w.busy():
        w.ask()
        w.ask()
        assert pokes.n == 1  # no second check while one runs
    assert pokes.n == 2 and w.take()
    with w.busy():
        w.hold()  # held for the next timer tick: no poke
    assert pokes.n == 2 and w.take() and not w.take()


def test_resolve_path_follows_event_log_only_beside_the_schedd(tmp_path: Path) -> None:
    here = str(tmp_path / "EventLog")
    assert resolve_path("auto", {"EVENT_LOG": here}) == here
    assert resolve_path("auto", {"EVENT_LOG": str(tmp_path / "no" / "EventLog")}) is None
    assert resolve_path("auto", {}) is None
    assert resolve_path("off", {"EVENT_LOG": here}) is None
    assert resolve_path("/var/log/condor/EventLog", {}) == "/var/log/condor/EventLog"

    class Unreadable:
        def get(self, key: str) -> str:
            raise RuntimeError("no HTCondor configuration")

    assert resolve_path("auto", Unreadable()) is None


def test_event_log_setting_is_validated() -> None:
    assert PoolConfig().event_log == "auto"
    assert PoolConfig(event_log="off").event_log == "off"
    with pytest.raises(ConfigError, match=r"pool\.event_log.*auto, off or an absolute path"):
        parse_config("pool: {event_log: $(LOG)/EventLog}\nsites: []\n", "t.yaml")
    with pytest.raises(ConfigError, match=r"pool\.event_log"):
        parse_config("pool: {event_log: 'log; rm -rf /'}\nsites: []\n", "t.yaml")


def test_gap_holds_within_min_cycle_gap_only() -> None:
    policy = PolicyConfig()  # gap 5 s, quick check 10 s: 1 s slack
    mark = CycleMark(at=100.0, idle_jobs=0)
    assert gap_holds(103.9, mark, policy) and not gap_holds(104.0, mark, policy)
    assert not gap_holds(100.0, None, policy)


# --- the service's tick -------------------------------------------------------------------
def test_jobs_in_a_queue_the_last_cycle_saw_empty_bring_a_cycle_at_once() -> None:
    prov, pool, _, clock = make_world()
    assert prov.tick() is not None  # the first cycle, nothing waits
    pool.demand = (Demand(JobShape(1, 2000), 3),)  # submitted
    prov.wakeup.ask()
    clock.t += 1  # 1 s after the cycle: well within min_cycle_gap_s
    cycle = prov.tick()
    assert cycle is not None and cycle.reason == "idle jobs rose" and cycle.plan.submits
    policy = PolicyConfig()
    empty, waiting = CycleMark(at=100.0, idle_jobs=0), CycleMark(at=100.0, idle_jobs=2)
    assert cycle_due(101.0, Probe(3, frozenset()), empty, policy) == "idle jobs rose"
    assert cycle_due(101.0, Probe(3, frozenset()), waiting, policy) == ""  # the gap holds
    assert cycle_due(101.0, Probe(0, frozenset()), empty, policy) == ""


def test_a_wake_up_makes_the_next_tick_a_quick_check_and_a_cycle_once_the_gap_allows(
        ) -> None:
    prov, pool, _, clock = make_world()
    pool.demand = (Demand(JobShape(1, 2000), 1),)  # one job waits at the first cycle
    assert prov.tick() is not None  # the first cycle
    probes: list[float] = []
    count = pool.idle_count

    def counted() -> int:
        probes.append(clock.t)
        return count()

    pool.idle_count = counted  # type: ignore[method-assign]
    pool.demand = (Demand(JobShape(1, 2000), 4),)  # 3 more submitted
    clock.t += 1
    assert prov.tick() is None and probes == []  # no wake-up: the next quick check
    prov.wakeup.ask()
    clock.t += 1  # 2 s after the cycle: min_cycle_gap_s (5 s, less 1 s slack) holds it
    assert prov.tick() is None and len(probes) == 1
    clock.t += 1
    assert prov.tick() is None and len(probes) == 2  # held: looked again
    clock.t += 1  # 4 s after the cycle
    cycle = prov.tick()
    assert cycle is not None and cycle.reason == "idle jobs rose" and cycle.plan.submits
    assert len(probes) == 3 and not prov.wakeup.take()


def test_a_submit_runs_the_schedulers_tick_job_long_before_its_timer(tmp_path: Path,
                                                                     said: Said) -> None:
    """The service's wiring (`follow_submits`) with a real APScheduler: the tick job's
    timer is an hour away; a submit in the event log runs it."""
    from apscheduler.schedulers.background import BackgroundScheduler

    from provisioner.service.schedule import TICK_JOB, follow_submits

    log = tmp_path / "EventLog"
    log.write_text(HEADER)
    prov, _, _, _ = make_world()
    prov.config = prov.config.model_copy(
        update={"pool": prov.config.pool.model_copy(update={"event_log": str(log)})})
    ran = threading.Event()

    def job() -> None:
        with prov.wakeup.busy():
            if prov.wakeup.take():
                ran.set()

    sched = BackgroundScheduler()
    sched.add_job(job, "interval", seconds=3600, id=TICK_JOB, max_instances=1, coalesce=True)
    follower = follow_submits(prov, sched)
    assert follower is not None
    sched.start()
    follower.start()
    try:
        said.wait("following")
        assert not ran.is_set()
        append(log, event(1))
        assert ran.wait(DEADLINE_S), "the submit did not run the tick job"
    finally:
        assert follower.stop(timeout=DEADLINE_S)
        sched.shutdown()
    off = prov.config.model_copy(
        update={"pool": prov.config.pool.model_copy(update={"event_log": "off"})})
    prov.config = off
    assert follow_submits(prov, sched) is None
