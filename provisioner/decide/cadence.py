"""When to run a full cycle (pure): the interval is the ceiling, not the floor.

The service (and the simulator) run a cheap probe every `policy.quick_check_s` seconds: the
number of idle jobs that are demand (a schedd count, less the jobs waiting out a failed
start's cool-down) and the set of idle pilots (one collector query).
`cycle_due()` turns the probe into a decision, rate-limited by `policy.min_cycle_gap_s`.
"""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.config import PolicyConfig

#: Share of `quick_check_s` by which a period may fall short and still count as passed.
SLACK = 0.1


@dataclass(frozen=True)
class Probe:
    """What the cheap check sees."""

    idle_jobs: int
    idle_pilots: frozenset[str] = frozenset()  # pilot keys without claimed resources


@dataclass(frozen=True)
class CycleMark:
    """What the last full cycle saw and left behind."""

    at: float
    idle_jobs: int
    idle_pilots: frozenset[str] = frozenset()
    flagged: int = 0  # pilots left flagged (waiting for their next idle observation)
    unplaced: int = 0  # idle jobs the cycle could not provision for (caps)
    reserve: int = 0  # reserve job slots the cycle wanted (Plan.reserve_jobs)
    joining: int = 0  # pilots on their way into the pool (pending, starting, submitted)


def cycle_due(now: float, probe: Probe, last: CycleMark | None, policy: PolicyConfig,
              previous: Probe | None = None) -> str:
    """The reason a full cycle is due now, or "" if not.

    Due when: there was no cycle yet; the interval has passed; jobs wait in a queue the
    last cycle saw empty (at once: the first jobs' wait is what users notice); or, at least
    `min_cycle_gap_s` after the last cycle, demand rose (more idle jobs), a pilot became
    idle that the last cycle or the `previous` probe did not see idle (a pilot idle at the
    last cycle that ran jobs since and is idle again), the queue emptied while the last
    cycle left pilots idle or on their way into the pool (kept or submitted for jobs that
    have started since: busy pilots that nothing else needs may retire), or - once
    `quick_check_s` has passed -
    flagged pilots await confirmation (hysteresis costs seconds, not a full interval) or
    the last cycle left demand unprovisioned because of caps. With a reserve, a pilot the
    last cycle saw idle that is no longer idle (a job took it) also makes a cycle due, so
    the reserve is topped up a cycle after it is drawn on, not when the queue grows.

    Checks run on a timer, and the cycle's time is read when its check began, a few
    milliseconds after the timer fired: the next check may come that much short of a period
    after the cycle it follows. Every period - the interval, `min_cycle_gap_s` and
    `quick_check_s` - counts as passed within `SLACK` of a quick check (a flag is confirmed
    by the next quick check, not the one after, also when `min_cycle_gap_s` equals
    `quick_check_s`).
    """
    if last is None:
        return "first cycle"
    since = now - last.at
    slack = SLACK * policy.quick_check_s
    if since >= policy.interval_s - slack:
        return "interval"
    if not last.idle_jobs and probe.idle_jobs:
        # jobs in a queue the last cycle saw empty: the first of them are not held back by
        # the gap (one such cycle per cycle that saw the queue empty: no storm)
        return "idle jobs rose"
    if since < policy.min_cycle_gap_s - slack:
        return ""
    if probe.idle_jobs > last.idle_jobs:
        return "idle jobs rose"
    if probe.idle_pilots - last.idle_pilots or (
            previous is not None and probe.idle_pilots - previous.idle_pilots):
        return "pilot became idle"
    if (last.idle_pilots or last.joining) and last.idle_jobs and not probe.idle_jobs:
        return "queue emptied"
    if last.reserve and last.idle_pilots - probe.idle_pilots:
        return "reserve drawn on"
    if last.flagged and since >= policy.quick_check_s - slack:
        return "confirm flagged pilots"
    if last.unplaced and since >= policy.quick_check_s - slack:
        return "demand left over by caps"
    return ""


def gap_holds(now: float, last: CycleMark | None, policy: PolicyConfig) -> bool:
    """Whether `min_cycle_gap_s` (less `SLACK`) still holds a cycle back at `now`: an early
    check that found none due then keeps its wake-up for the next timer tick."""
    return (last is not None
            and now - last.at < policy.min_cycle_gap_s - SLACK * policy.quick_check_s)
