"""How closely an allocation's spend followed its ideal even line, and how much of it was
used (pure: the burn-down points and the group's samples in, numbers out).

The ideal even line is the amount spread evenly over the period. Every whole hour of the
period the spend is compared with it, as a share of the amount (%):

- run-ahead: the most the spend was above the line, at any hour;
- lag: the most it was below the line, at any hour. Below the line while the group asks
  for less than the pace is no pacing failure: no pace can spend what nobody asks for;
- in demand hours: hours through which the group's jobs waited at every sample (its
  demand exceeded what the allocation let in): there the spend should be on the line,
  and `error` is the largest deviation either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.sim.accounts import Point

HOUR = 3600.0


@dataclass(frozen=True)
class Pace:
    """An allocation's spend against its ideal even line (% of its amount)."""

    hours: int  # whole hours of the period compared
    demand_hours: int  # of which the group's jobs waited throughout
    run_ahead: float  # max (spent - ideal), 0 if never above
    lag: float  # max (ideal - spent), 0 if never below
    demand_lag: float  # max (ideal - spent) in demand hours
    error: float  # max |spent - ideal| in demand hours (0 without any)
    worst_hour: int = 0  # the hour of the period where `error` was (0: none)


def ideal(point: Point, amount: float) -> float:
    """The even line at `point`'s time."""
    span = point.end - point.start
    return amount * min(1.0, max(0.0, (point.t - point.start) / span))


def hourly(points: Sequence[Point]) -> list[Point]:
    """The points at whole hours after the period's start, within the period (the last
    one at its end, if sampled)."""
    return [p for p in points if p.start < p.t <= p.end and (p.t - p.start) % HOUR == 0]


def waited_throughout(idle: Sequence[tuple[float, int]], start: float,
                      end: float) -> bool:
    """Whether the group had idle jobs at every sample `(t, idle jobs)` in (start, end]
    (and there was at least one)."""
    inside = [n for t, n in idle if start < t <= end]
    return bool(inside) and min(inside) > 0


def pace(points: Sequence[Point], amount: float,
         idle: Sequence[tuple[float, int]]) -> Pace:
    """`points`: the allocation's burn-down (time order); `idle`: its group's idle jobs
    at each sample (time order)."""
    ahead = lag = demand_lag = error = 0.0
    hours = demand_hours = worst = 0
    for p in hourly(points):
        dev = 100.0 * (p.spent - ideal(p, amount)) / amount
        hours += 1
        ahead, lag = max(ahead, dev), max(lag, -dev)
        if waited_throughout(idle, p.t - HOUR, p.t):
            demand_hours += 1
            demand_lag = max(demand_lag, -dev)
            if abs(dev) > error:
                error, worst = abs(dev), hours
    return Pace(hours, demand_hours, ahead, lag, demand_lag, error, worst)


def used(points: Sequence[Point], amount: float) -> float:
    """What the allocation had spent by its period's end, % of its amount (the last
    point sampled at or after the end; else the last point)."""
    if not points:
        return 0.0
    after = [p for p in points if p.t >= p.end]
    last = after[0] if after else points[-1]
    return 100.0 * last.spent / amount
