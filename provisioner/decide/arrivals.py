"""How the queue moved over the reserve's window (pure; the service keeps one).

The schedd query gives the jobs in the queue now with their QDate, so the arrivals of the
last window are counted directly. Departures (jobs that finished, were removed or held)
are no longer in the queue; they follow from the queue size one window ago:
``departures = size_then - (jobs now with QDate < then)``. Jobs that arrived and left
within the window appear in neither count, so the queue's net growth is exact.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class QueueHistory:
    """Queue sizes seen at past cycles, enough to look one window back."""

    window_s: float
    samples: deque[tuple[float, int]] = field(default_factory=deque)  # (time, jobs)

    def baseline(self, now: float, window_s: float | None = None) -> tuple[float, int | None]:
        """(start of the arrival window, queue size then): the newest sample at least
        `window_s` (at most the history's own) old, or (now - window_s, None) while none
        is that old."""
        window = self.window_s if window_s is None else min(window_s, self.window_s)
        best: tuple[float, int] | None = None
        for t, size in self.samples:
            if t <= now - window:
                best = (t, size)
            else:
                break
        if best is None:
            return now - window, None
        return best

    def record(self, now: float, size: int) -> None:
        """Remember the queue size at `now`; forget samples no window will need."""
        if self.samples and now < self.samples[-1][0]:
            self.samples.clear()  # the clock went back: start over rather than mislead
        self.samples.append((now, size))
        while len(self.samples) > 1 and self.samples[1][0] <= now - self.window_s:
            self.samples.popleft()


def departures(size_then: int | None, older_now: int) -> int | None:
    """Jobs that were in the queue at the window's start and have left it since; None if
    the size then is unknown. Never negative (a job released from hold re-enters with its
    old QDate)."""
    if size_then is None:
        return None
    return max(0, size_then - older_now)


@dataclass
class ArrivalTimes:
    """The distinct arrival times seen (the newest job's QDate of each cycle that saw a
    newer one) over ``evidence_s``: the rate of arrival events, which sizes the
    reserve's window, and a count of arrivals that jobs leaving the queue do not
    lower."""

    evidence_s: float
    apart_s: float  # closer times are one arrival (a batch submitted over seconds)
    times: deque[float] = field(default_factory=deque)

    def count(self, newest: float | None, now: float) -> None:
        """Remember the newest job's submission time if it is new, that is later than
        the last one remembered by more than `apart_s`; forget old ones."""
        if newest is not None and (not self.times or newest > self.times[-1] + self.apart_s):
            self.times.append(newest)
        while self.times and self.times[0] < now - self.evidence_s:
            self.times.popleft()

    def window(self, now: float, least_s: float, gaps: float) -> float:
        """The arrival window at `now`: `least_s`, or longer when arrivals are sparse, so
        that it spans `gaps` mean gaps between the times seen (at most ``evidence_s``)."""
        if not self.times:
            return self.evidence_s
        gap = max(now - self.times[0], 0.0) / len(self.times)
        return max(least_s, min(self.evidence_s, gaps * gap))

    def since(self, start: float) -> int:
        """The times seen from `start` on."""
        return sum(1 for t in self.times if t >= start)

    def __len__(self) -> int:
        return len(self.times)
