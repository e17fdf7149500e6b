"""The budget arithmetic of one allocation: its period, what its pilots cost, what is
committed, what is left and what a new pilot may spend now. Pure: `now` is passed in.

Units are the allocation's own (core-, node- or GPU-hours). A pilot costs its *rate*
(cores, 1 node, or GPUs) per hour that SLURM holds it, busy or idle. The rule that keeps
an allocation from being overspent counts every pilot in flight at its worst case: a
pending pilot for its whole walltime, a running one for the rest of its walltime; a new
pilot is admitted only if its own worst case fits what is left after those
(`Budget.fits`). `even` pace lowers that to the ideal line (the grant spread evenly over
its period) at the time the new pilot could end at the latest, minus what is spent and
committed: hours not spent early stay available later in the period.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from provisioner.config import UNIT_SHORT, AllocationConfig, Config, utc_date
from provisioner.model import Pilot, PilotState, Snapshot

HOUR = 3600.0
DAY = 86400.0


class BudgetStatus(StrEnum):
    """Where an allocation stands this cycle; the value is what status shows."""

    OPEN = "open"  # a new pilot of the site's full shape fits
    PACED = "paced"  # even pace holds back what is left
    SPENT = "spent"  # nothing left once the pilots in flight are counted
    NOT_STARTED = "not started"  # a dated grant before its start
    ENDED = "ended"  # a dated grant after its end
    UNKNOWN = "unknown"  # the books could not be read: nothing may be committed
    STOPPED = "stopped"  # SLURM refused its account (until the service restarts)


def pilot_rate(unit: str, cpus: int, gpus: int) -> float:
    """Units per hour that a pilot of `cpus` cores and `gpus` GPUs costs (a pilot is one
    node)."""
    if unit == "core-hours":
        return float(cpus)
    if unit == "node-hours":
        return 1.0
    if unit == "gpu-hours":
        return float(gpus)
    raise ValueError(f"unknown allocation unit {unit!r}")


def pilot_commitment(unit: str, pilot: Pilot, walltime_s: int, now: float) -> float:
    """The most `pilot` can still cost: its whole walltime while pending, the rest of
    its walltime once running (its walltime end unknown: a whole walltime)."""
    rate = pilot_rate(unit, pilot.cpus, pilot.gpus)
    if pilot.state is PilotState.PENDING or pilot.walltime_end is None:
        return rate * walltime_s / HOUR
    return rate * max(0.0, pilot.walltime_end - now) / HOUR


@dataclass(frozen=True)
class Budget:
    """One allocation's numbers at one moment (units of `unit`)."""

    site: str
    name: str
    unit: str
    amount: float
    spent: float  # charged this period, running pilots' time so far included
    committed: float  # the worst case still to come of the pilots in flight
    pace: str  # asap | even
    start: float  # the period, [start, end)
    end: float
    now: float
    walltime_s: int  # a new pilot's walltime: its worst case, and how far even looks ahead
    known: bool = True
    stopped: str = ""  # why SLURM stopped it ("" = not stopped)

    @property
    def left(self) -> float:
        """What is left once the pilots in flight have run their whole walltime."""
        return self.amount - self.spent - self.committed

    def ideal(self, t: float) -> float:
        """The even line: what may have been spent by time `t`."""
        span = self.end - self.start
        return self.amount * min(1.0, max(0.0, (t - self.start) / span))

    @property
    def allowance(self) -> float:
        """What new pilots may commit now (never negative)."""
        if not self.known or self.stopped or not self.start <= self.now < self.end:
            return 0.0
        room = self.left
        if self.pace == "even":
            horizon = min(self.now + self.walltime_s, self.end)
            room = min(room, self.ideal(horizon) - self.spent - self.committed)
        return max(0.0, room)

    def cost(self, cpus: int, gpus: int, walltime_s: int | None = None) -> float:
        """A new pilot's worst case: its rate for its whole walltime."""
        wall = self.walltime_s if walltime_s is None else walltime_s
        return pilot_rate(self.unit, cpus, gpus) * wall / HOUR

    def fits(self, cpus: int, gpus: int, already: float = 0.0) -> bool:
        """A new pilot of this shape may be submitted, after `already` (the worst case of
        pilots chosen earlier in the same cycle) is taken from the allowance."""
        return self.cost(cpus, gpus) <= self.allowance - already + 1e-9

    @property
    def status(self) -> BudgetStatus:
        if self.stopped:
            return BudgetStatus.STOPPED
        if not self.known:
            return BudgetStatus.UNKNOWN
        if self.now < self.start:
            return BudgetStatus.NOT_STARTED
        if self.now >= self.end:
            return BudgetStatus.ENDED
        if self.left <= 1e-9:
            return BudgetStatus.SPENT
        if self.pace == "even" and self.allowance < self.left - 1e-9:
            return BudgetStatus.PACED
        return BudgetStatus.OPEN

    @property
    def per_day_left(self) -> float:
        """What is left per day of the period still to come: placement prefers the
        allocation with the most."""
        days = max(self.end - self.now, HOUR) / DAY
        return max(0.0, self.left) / days

    def line(self) -> str:
        """One line for status and logs: "gsi/alloc-a: paced, 310 of 1000 core-h left
        for 12 days"."""
        unit = UNIT_SHORT.get(self.unit, self.unit)
        head = f"{self.site}/{self.name}: {self.status.value}"
        amounts = f"{_num(max(0.0, self.left))} of {_num(self.amount)} {unit} left"
        if self.status is BudgetStatus.STOPPED:  # the reason may name the state itself
            if self.stopped.startswith(BudgetStatus.STOPPED.value):
                return f"{self.site}/{self.name}: {self.stopped}"
            return f"{head}: {self.stopped}"
        if self.status is BudgetStatus.UNKNOWN:
            return f"{head}: the books cannot be read, no new pilot"
        if self.status is BudgetStatus.NOT_STARTED:
            return f"{head} (starts {utc_date(self.start)}), no new pilot"
        if self.status is BudgetStatus.ENDED:
            were = amounts.replace("left", "were left")
            return f"{head} ({utc_date(self.end)}), no new pilot; {were}"
        return f"{head}, {amounts} for {_span(self.end - self.now)}"


def budget_of(site: str, alloc: AllocationConfig, spent: float | None,
              pilots: Iterable[Pilot], walltime_s: int, now: float,
              stopped: str = "") -> Budget:
    """The budget of `alloc` at `site` now: `spent` from the books (None: unknown) and
    `pilots` the allocation's pilots in flight."""
    start, end = alloc.period_bounds(now)
    committed = sum(pilot_commitment(alloc.unit, p, walltime_s, now) for p in pilots)
    return Budget(site=site, name=alloc.name, unit=alloc.unit, amount=alloc.amount,
                  spent=spent or 0.0, committed=committed, pace=alloc.pace, start=start,
                  end=end, now=now, walltime_s=walltime_s, known=spent is not None,
                  stopped=stopped)


def _num(x: float) -> str:
    if x >= 100:
        return f"{x:.0f}"
    if x >= 1:
        return f"{x:.3g}"
    return f"{x:.2g}"


def _span(seconds: float) -> str:
    if seconds >= 2 * DAY:
        return f"{seconds / DAY:.0f} days"
    if seconds >= 2 * HOUR:
        return f"{seconds / HOUR:.0f} hours"
    return f"{max(0.0, seconds) / 60:.0f} minutes"


#: (site, allocation name) -> why SLURM stopped it (a refused account): the controller's.
Stopped = dict[tuple[str, str], str]


def budgets(config: Config, snapshot: Snapshot, now: float,
            stopped: Stopped | None = None) -> dict[tuple[str, str], Budget]:
    """Every configured allocation's budget now, by (site, allocation name): spent from
    `snapshot.books` (absent or not known: unknown), committed from the site's pilots
    charged to the allocation's account. The one place status, metrics and plan() get
    their numbers from."""
    books = {(b.site, b.allocation): b for b in snapshot.books}
    by_account: dict[tuple[str, str], list[Pilot]] = {}
    for p in snapshot.pilots:
        by_account.setdefault((p.site, p.account), []).append(p)
    out: dict[tuple[str, str], Budget] = {}
    for site in config.sites:
        for alloc in site.allocations:
            key = (site.name, alloc.name)
            book = books.get(key)
            spent = book.spent if book is not None and book.known else None
            out[key] = budget_of(site.name, alloc, spent,
                                 by_account.get((site.name, alloc.account), ()),
                                 site.pilot.walltime_s, now, (stopped or {}).get(key, ""))
    return out
