"""Accounting per site and day: exact small cases and properties."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.service.accounting import (
    DAY_S,
    JobRun,
    PilotRecord,
    core_timeline,
    percentile,
    site_days,
    split_days,
    totals,
)

T0 = 20_000 * DAY_S  # a midnight UTC (1970 + 20000 days)
H = 3600.0


def run(pilot: str, start: float, end: float, cores: int = 1, cpu: float | None = None,
        site: str = "gsi", job: str = "1.0") -> JobRun:
    return JobRun(job, "alice", site, pilot, cores, start, end,
                  (end - start) * cores if cpu is None else cpu)


def test_one_pilot_one_day_exact() -> None:
    # 4 cores from 01:00 to 05:00; a 2-core job 02:00-03:00, a 4-core job 03:30-04:00.
    p = PilotRecord("gsi", "7", 4, T0, T0 + 1 * H, T0 + 5 * H)
    runs = [run("7", T0 + 2 * H, T0 + 3 * H, 2, cpu=H), run("7", T0 + 3.5 * H, T0 + 4 * H, 4)]
    [row] = site_days([p], runs, now=T0 + 10 * H)
    assert row.allocated == 16 and row.claimed == 4
    assert row.startup == 4 and row.tail == 4 and row.between == 4  # 2x1 h + 4x0.5 h
    assert row.e1 == 0.75 and row.total == 0.25
    assert row.e2 == (1 + 2) / (2 + 2)


def test_never_ran_a_job_is_all_startup_and_e1_zero() -> None:
    p = PilotRecord("gsi", "1", 8, T0, T0, T0 + 2 * H)
    [row] = site_days([p], [], now=T0 + 3 * H)
    assert row.allocated == 16 and row.startup == 16 and row.e1 == 0 and row.e2 is None


def test_interval_across_midnight_is_split() -> None:
    p = PilotRecord("gsi", "1", 2, T0 - 2 * H, T0 - 1 * H, T0 + 3 * H)
    runs = [run("1", T0 - 1 * H, T0 + 1 * H, 2)]
    rows = site_days([p], runs, now=T0 + 5 * H)
    assert [(r.day, r.allocated, r.claimed) for r in rows] == [
        ("2024-10-03", 2.0, 2.0), ("2024-10-04", 6.0, 2.0)]
    assert rows[1].tail == 4.0 and rows[0].e1 == 1.0


def test_live_pilot_counts_until_now_and_pending_counts_nothing() -> None:
    live = PilotRecord("fra", "2", 10, T0, T0 + H, None)
    pending = PilotRecord("fra", "3", 10, T0, None, None)
    [row] = site_days([live, pending], [], now=T0 + 3 * H)
    assert row.allocated == 20 and row.pilots == {"fra/2"}


def test_job_outside_pilot_life_and_overcommit_are_clipped() -> None:
    p = PilotRecord("gsi", "1", 2, T0, T0 + H, T0 + 2 * H)
    runs = [run("1", T0, T0 + 1.5 * H, 2), run("1", T0 + H, T0 + 2 * H, 2, job="2.0")]
    [row] = site_days([p], runs, now=T0 + 3 * H)
    assert row.claimed == 2.0 == row.allocated  # 4 cores of jobs on a 2-core pilot: 2


def test_totals_percentile_and_timeline() -> None:
    p = PilotRecord("gsi", "1", 4, T0, T0, T0 + 2 * H)
    rows = site_days([p], [run("1", T0 + H, T0 + 2 * H, 1)], now=T0 + 2 * H)
    assert totals(rows)["gsi"].allocated == 8
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile([], 50) is None
    line = core_timeline([p], [run("1", T0 + H, T0 + 2 * H, 1)], T0 + 2 * H, H)["gsi"]
    assert line[:2] == [(T0, 4, 0), (T0 + H, 4, 1)]
    assert list(split_days(T0 - 1, T0 + 1)) == [("2024-10-03", T0 - 1, T0),
                                                  ("2024-10-04", T0, T0 + 1)]


@st.composite
def worlds(draw: st.DrawFn) -> tuple[list[PilotRecord], list[JobRun], float]:
    pilots, runs = [], []
    for i in range(draw(st.integers(1, 5))):
        site = draw(st.sampled_from(["gsi", "fra"]))
        start = T0 + draw(st.floats(0, 3 * DAY_S))
        life = draw(st.floats(1, 2 * DAY_S))
        ended = draw(st.booleans())
        cores = draw(st.integers(1, 16))
        pilots.append(PilotRecord(site, str(i), cores, start - 60, start,
                                  start + life if ended else None))
        for j in range(draw(st.integers(0, 4))):
            a = start + draw(st.floats(-DAY_S, 2 * DAY_S))
            b = a + draw(st.floats(1, DAY_S))
            runs.append(JobRun(f"{i}.{j}", "bob", site, str(i), draw(st.integers(1, 16)),
                               a, b, draw(st.floats(0, 1)) * (b - a)))
    return pilots, runs, T0 + 6 * DAY_S


@settings(max_examples=200, deadline=None)
@given(worlds())
def test_properties(world: tuple[list[PilotRecord], list[JobRun], float]) -> None:
    pilots, runs, now = world
    rows = site_days(pilots, runs, now)
    for r in rows:
        assert -1e-6 <= r.claimed <= r.allocated + 1e-6
        assert math.isclose(r.startup + r.between + r.tail, r.allocated - r.claimed,
                            rel_tol=1e-9, abs_tol=1e-6)
        assert min(r.startup, r.between, r.tail) >= -1e-6
        assert r.e2 is None or r.e2 <= 1 + 1e-9
    # the days add up to each pilot's whole life, computed without any split
    for site, tot in totals(rows).items():
        whole = sum(p.cores * ((p.end_at if p.end_at is not None else now) - p.start_at)
                    for p in pilots if p.site == site and p.start_at is not None) / 3600
        assert math.isclose(tot.allocated, whole, rel_tol=1e-9, abs_tol=1e-6)
