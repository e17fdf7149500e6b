"""The allocations of the simulated sites: the account each pilot is charged to, SLURM's
exact charge (every pilot's held time, start to end, times its rate), the books a
service would read (`Snapshot.books`), and the bench's own never-past checks.

The checks are independent of the decisions' arithmetic (`provisioner.decide.budget`):
they count what the simulated SLURM really charged and could still charge.

- After every accepted submission: what the allocation has spent this period plus the
  worst case of every pilot in flight (a pending one for its whole walltime, a running
  one for the rest of it, each within the period) must not exceed the amount.
- At every sample (5 simulated minutes): what it has spent must not exceed the amount.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from bench.sim.entities import SimPilot
from provisioner.config import AllocationConfig, SlurmSite
from provisioner.decide.budget import pilot_rate
from provisioner.model import AllocationBooks

HOUR = 3600.0
#: Rounding allowed in a comparison of units (the charges are sums of floats).
EPS = 1e-6

Key = tuple[str, str]  # (site, allocation name)


@dataclass(frozen=True)
class Grant:
    """One configured allocation at one site."""

    site: str
    alloc: AllocationConfig

    @property
    def key(self) -> Key:
        return self.site, self.alloc.name


@dataclass(frozen=True)
class Point:
    """One allocation at one sample: what it has spent, what its pilots in flight could
    still charge at worst (both this period), and the period's bounds."""

    t: float
    spent: float
    committed: float
    start: float
    end: float


@dataclass
class Checks:
    """What the never-past checks counted over a run."""

    submissions: int = 0  # accepted pilots charged to an allocation
    past_at_submit: int = 0  # spent + worst case in flight > amount right after one
    samples: int = 0  # allocation x sample checks
    past_at_sample: int = 0  # spent > amount at a sample
    #: Pilots submitted at a site with allocations without naming one (or naming an
    #: allocation the site does not have): nothing charged them to a grant.
    unallocated: int = 0
    #: Per allocation, the least (amount - spent - worst case) seen after a submission,
    #: as a share of the amount (negative: past it).
    headroom: dict[Key, float] = field(default_factory=dict)


def period_charge(rate: float, start: float, end: float, p_start: float,
                  p_end: float) -> float:
    """What a pilot held from `start` to `end` costs within the period [p_start, p_end)."""
    return rate * max(0.0, min(end, p_end) - max(start, p_start)) / HOUR


class Accounts:
    """The grants of every simulated site and what SLURM charged to each."""

    def __init__(self, sites: Iterable[SlurmSite],
                 precharged: Mapping[Key, float] | None = None) -> None:
        self.grants: dict[Key, Grant] = {}
        self.budgeted: set[str] = set()  # sites with allocations
        for site in sites:
            for alloc in site.allocations:
                self.grants[(site.name, alloc.name)] = Grant(site.name, alloc)
                self.budgeted.add(site.name)
        #: Charged before the run (outside the provisioner) in the period the run
        #: starts in (time 0): (site, allocation, period start) -> units.
        self.precharged = {
            (*key, self.grants[key].alloc.period_bounds(0.0)[0]): units
            for key, units in (precharged or {}).items()}
        #: Ended pilots' charges: (site, allocation, period start) -> units.
        self.closed: dict[tuple[str, str, float], float] = {}
        self.flying: dict[Key, dict[int, SimPilot]] = {k: {} for k in self.grants}
        self.series: dict[Key, list[Point]] = {k: [] for k in self.grants}
        self.checks = Checks()

    def grant_of(self, site: str, allocation: str) -> Grant | None:
        return self.grants.get((site, allocation))

    def rate(self, grant: Grant, p: SimPilot) -> float:
        return pilot_rate(grant.alloc.unit, p.cpus, p.gpus)

    def submitted(self, p: SimPilot, now: float) -> None:
        """`p` was accepted by sbatch: charge it to its allocation and check the line."""
        grant = self.grant_of(p.site.name, p.allocation)
        if grant is None:
            if p.site.name in self.budgeted:
                self.checks.unallocated += 1
            return
        self.flying[grant.key][p.id] = p
        self.checks.submissions += 1
        spent, committed = self.spent(grant, now), self.committed(grant, now)
        amount = grant.alloc.amount
        if spent + committed > amount + EPS:
            self.checks.past_at_submit += 1
        share = (amount - spent - committed) / amount
        old = self.checks.headroom.get(grant.key)
        self.checks.headroom[grant.key] = share if old is None else min(old, share)

    def ended(self, p: SimPilot, now: float) -> None:
        """`p` ended (or was cancelled while pending): its charge is closed."""
        grant = self.grant_of(p.site.name, p.allocation)
        if grant is None or self.flying[grant.key].pop(p.id, None) is None:
            return
        if p.started_at is None:
            return  # never started: SLURM charges nothing
        rate, t, last = self.rate(grant, p), p.started_at, None
        while t < now:
            start, end = grant.alloc.period_bounds(t)
            if start == last:
                break  # a dated grant has one period: nothing after its end
            key = (grant.site, grant.alloc.name, start)
            self.closed[key] = self.closed.get(key, 0.0) + period_charge(
                rate, p.started_at, now, start, end)
            t, last = end, start

    def spent(self, grant: Grant, now: float) -> float:
        """What the allocation has been charged this period up to `now`, running pilots
        included."""
        start, end = grant.alloc.period_bounds(now)
        total = self.closed.get((grant.site, grant.alloc.name, start), 0.0)
        total += self.precharged.get((grant.site, grant.alloc.name, start), 0.0)
        for p in self.flying[grant.key].values():
            if p.started_at is not None:
                total += period_charge(self.rate(grant, p), p.started_at, now, start, end)
        return total

    def committed(self, grant: Grant, now: float) -> float:
        """The most the allocation's pilots in flight can still be charged this period:
        a pending one its whole walltime from now, a running one up to its walltime."""
        start, end = grant.alloc.period_bounds(now)
        total = 0.0
        for p in self.flying[grant.key].values():
            until = now + p.walltime_s if p.walltime_end is None else p.walltime_end
            total += period_charge(self.rate(grant, p), now, until, start, end)
        return total

    def books(self, now: float) -> tuple[AllocationBooks, ...]:
        """What the service's books would hold now: every allocation's exact charge."""
        return tuple(AllocationBooks(g.site, g.alloc.name, self.spent(g, now))
                     for g in self.grants.values())

    def sample(self, now: float) -> None:
        """The 5-minute check, and one point of every allocation's burn-down."""
        for grant in self.grants.values():
            spent = self.spent(grant, now)
            self.checks.samples += 1
            if spent > grant.alloc.amount + EPS:
                self.checks.past_at_sample += 1
            start, end = grant.alloc.period_bounds(now)
            self.series[grant.key].append(
                Point(now, spent, self.committed(grant, now), start, end))
