"""The queue history behind the reserve's departures (provisioner.decide.arrivals) and the
schedd fold that feeds it."""

from __future__ import annotations

from provisioner.decide.arrivals import QueueHistory, departures
from provisioner.pool.classads import queue_view

from .test_boundaries import Ad

JOB = {"RequestCpus": 1, "RequestMemory": 500, "RequestDisk": 10, "RequestGPUs": 0,
       "MaxRuntime": 0, "DesiredSites": "", "RemoteHost": ""}


def test_no_baseline_until_one_window_was_watched() -> None:
    h = QueueHistory(window_s=900)
    assert h.baseline(1000.0) == (100.0, None)
    h.record(1000.0, 40)
    assert h.baseline(1500.0) == (600.0, None)  # the only sample is 500 s old
    assert h.baseline(1900.0) == (1000.0, 40)


def test_baseline_is_the_newest_sample_at_least_one_window_old() -> None:
    h = QueueHistory(window_s=900)
    for t, size in [(0.0, 10), (300.0, 20), (600.0, 30), (900.0, 40), (1200.0, 50)]:
        h.record(t, size)
    assert h.baseline(1250.0) == (300.0, 20)
    h.record(1500.0, 60)
    # samples no future window needs are forgotten; the one at 600 s is kept for 1500 s
    assert h.samples[0][0] == 600.0
    assert h.baseline(1500.0) == (600.0, 30)


def test_clock_going_back_restarts_the_history() -> None:
    h = QueueHistory(window_s=900)
    h.record(5000.0, 10)
    h.record(100.0, 3)
    assert list(h.samples) == [(100.0, 3)]
    assert h.baseline(1000.0) == (100.0, 3)


def test_departures_from_the_queue_size_then_and_the_old_jobs_now() -> None:
    assert departures(None, 5) is None
    assert departures(40, 25) == 15
    assert departures(10, 12) == 0  # jobs released from hold re-enter with an old QDate


def test_queue_view_counts_all_jobs_and_those_older_than_the_window() -> None:
    ads = [Ad(JOB, JobStatus=1, QDate=100), Ad(JOB, JobStatus=2, QDate=200,
                                               RemoteHost="slot1_1@p@n"),
           Ad(JOB, JobStatus=1, QDate=500), Ad(JOB, JobStatus=1, QDate=900)]
    view = queue_view(ads, since=400)
    assert view.total == 4 and view.older == 2
    assert sum(d.idle for d in view.recent_arrivals) == 2
    plain = queue_view(ads)
    assert plain.total == 4 and plain.older == 0
