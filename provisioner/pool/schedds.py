"""Demand from every schedd: which schedds to read, and their queues as one (pure).

A pool has one or more submit hosts. Each cycle the provisioner reads the schedds the
collector lists (or the configured ones, `pool.schedds`), one query each. A schedd that
cannot be read is *unknown*, never empty: its demand and the startds its jobs run on are
missing from the merged view, so the view says which schedds it lacks
(`QueueView.unknown`) and the caller makes no scale-down decision on it.

A schedd that shuts down invalidates its ad in the collector: without memory it would
simply vanish, and its queue would read as empty. So a schedd seen once stays on the
roster, unknown while it is not listed, for `hold_s` (`pool.schedd_gone_s`; then it is
taken as decommissioned and forgotten). A configured schedd never is: while the collector
does not list it, it is unknown.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from provisioner.model import Demand, FailingStarts, JobShape


@dataclass(frozen=True)
class QueueView:
    """What the schedds say: idle demand by shape, and which startds run their jobs."""

    demand: tuple[Demand, ...]
    running_on: frozenset[str]  # startd names (after "slotN_M@") with a running job
    #: Jobs still queued (idle or running) submitted within the arrival window, by shape.
    recent_arrivals: tuple[Demand, ...] = ()
    total: int = 0  #: jobs in the queue (idle, running, transferring, suspended)
    older: int = 0  #: of those, submitted before the arrival window (QDate < since)
    newest: float | None = None  #: the latest QDate in the queue (None: empty)
    #: Idle jobs whose last start failed (`provisioner.decide.failed_starts`), by shape.
    failing: tuple[FailingStarts, ...] = ()
    #: Schedds on the roster that were not read, (name, why): their jobs are not in
    #: this view (unknown, not empty).
    unknown: tuple[tuple[str, str], ...] = ()
    #: Idle jobs per schedd read (where to ask for a negotiation).
    idle_by_schedd: Mapping[str, int] = field(default_factory=dict)
    #: One schedd's view: when the cool-downs of its failed starts end
    #: (`provisioner.pool.cooldowns`); not merged.
    cooling_ends: tuple[float, ...] = ()

    @property
    def whole(self) -> bool:
        """Every schedd on the roster was read."""
        return not self.unknown


@dataclass(frozen=True)
class Roster:
    """The schedds of one cycle: those to read (listed by the collector), those unknown
    without a read (name, why), and the memory for the next cycle (name -> last seen)."""

    read: tuple[str, ...]
    unknown: tuple[tuple[str, str], ...]
    seen: dict[str, float]


def roster(listed: Iterable[str], configured: Sequence[str], seen: Mapping[str, float],
           now: float, hold_s: float) -> Roster:
    """Which schedds to read at `now`. `listed`: the schedd names the collector has;
    `configured`: `pool.schedds` (empty: every listed schedd); `seen`: the last roster's
    memory. Pure."""
    names = sorted(set(listed))
    if configured:
        read = tuple(n for n in configured if n in names)
        unknown = tuple((n, "not in the collector") for n in configured if n not in names)
        return Roster(read, unknown, {n: now for n in read})
    kept = {n: t for n, t in seen.items() if now - t < hold_s}
    unknown = tuple((n, f"not in the collector since {now - t:.0f} s")
                    for n, t in sorted(kept.items()) if n not in names)
    kept.update({n: now for n in names})
    return Roster(tuple(names), unknown, kept)


def _sum(groups: Iterable[Iterable[Demand]]) -> tuple[Demand, ...]:
    counts: dict[JobShape, int] = {}
    for group in groups:
        for d in group:
            counts[d.shape] = counts.get(d.shape, 0) + d.idle
    return tuple(Demand(s, n) for s, n in counts.items())


def _failing(groups: Iterable[Iterable[FailingStarts]]) -> tuple[FailingStarts, ...]:
    out: dict[JobShape, FailingStarts] = {}
    for group in groups:
        for g in group:
            had = out.get(g.shape)
            out[g.shape] = g if had is None else FailingStarts(
                g.shape, had.jobs + g.jobs, max(had.failed_starts, g.failed_starts),
                had.reason if had.failed_starts >= g.failed_starts else g.reason,
                had.cooling + g.cooling)
    return tuple(out.values())


def merge_views(views: Mapping[str, QueueView],
                unknown: Iterable[tuple[str, str]] = ()) -> QueueView:
    """The schedds' views as one: demand and arrivals summed by shape, busy startds and
    counts added up, the newest submission the latest; `unknown` carried (with any
    the views themselves name). Pure."""
    parts = [views[n] for n in sorted(views)]
    newest = [v.newest for v in parts if v.newest is not None]
    lacking = list(unknown) + [u for v in parts for u in v.unknown]
    return QueueView(
        demand=_sum(v.demand for v in parts),
        running_on=frozenset().union(*(v.running_on for v in parts)),
        recent_arrivals=_sum(v.recent_arrivals for v in parts),
        total=sum(v.total for v in parts), older=sum(v.older for v in parts),
        newest=max(newest) if newest else None,
        failing=_failing(v.failing for v in parts),
        unknown=tuple(sorted(set(lacking))),
        idle_by_schedd={n: sum(d.idle for d in views[n].demand) for n in sorted(views)})


def negotiation_targets(idle_by_schedd: Mapping[str, int] | None,
                        listed: Sequence[str]) -> tuple[str, ...]:
    """The schedds to ask for a negotiation: the listed ones whose jobs wait by the last
    count, and those not counted; every listed one when there is no count. Pure."""
    if idle_by_schedd is None:
        return tuple(listed)
    return tuple(n for n in listed if idle_by_schedd.get(n, 1) > 0)
