"""Why an accounting group's jobs wait for its allocations (pure): the reasons `plan()`
gives beside its actions where some site has allocations (`GroupPlan.group_waits`).

A group's jobs that no row serves (no allocation lists the group at a site that fits
them, and no site without allocations fits them) wait for good: `GROUP_UNSERVED`. A
group's jobs that found no capacity this cycle wait for its allocations when every lane
that serves them could not admit even the smallest pilot for them: paced (with the time
even pace lets that pilot in), at the allocation's max_pilots, spent, or closed (ended,
not started, books unknown, stopped). Where a site without allocations, or a lane that
could still pay for a pilot, serves them, they wait for the site's caps as any job does,
and no group reason is given. These jobs are never `Unmatchable`: their resources fit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from provisioner.config import UNIT_SHORT, Config
from provisioner.decide.budget import Budget, BudgetStatus
from provisioner.decide.groups import EPS, Lane, Lanes
from provisioner.decide.matching import Row
from provisioner.decide.reasons import Reason, Why
from provisioner.model import JobShape

#: The budget states in which an allocation takes no pilot whatever it has left.
CLOSED = (BudgetStatus.STOPPED, BudgetStatus.UNKNOWN, BudgetStatus.NOT_STARTED,
          BudgetStatus.ENDED)
#: Which reason wins where a group's lanes are stopped for different reasons: the one
#: that ends first.
_ORDER = ("paced", "max_pilots", "closed", "spent")
#: Longest list of budgets kept in a reason (as `provisioner.decide.explain` clips).
MAX_TEXT = 300


@dataclass(frozen=True)
class GroupWait:
    """The jobs of accounting group `group` (`jobs` of them, over all their shapes) that
    wait for its allocations, and why."""

    group: str
    jobs: int
    why: Why
    #: the job shapes it covers (those of its jobs that wait for this reason)
    shapes: tuple[JobShape, ...] = ()


def paced_until(b: Budget, already: float, cost: float) -> float | None:
    """When `b`'s even pace lets in a new pilot of worst case `cost`, after `already`
    (this cycle's new pilots): the first time the ideal line at that pilot's latest end
    covers what is spent and committed and it. What is spent and committed is taken as
    it is now (a running pilot's time moves from committed to spent); pilots that end
    early bring it sooner. None: not within the period."""
    need = b.spent + b.committed + already + cost
    if need > b.amount + EPS or b.amount <= 0:
        return None
    at = b.start + (b.end - b.start) * need / b.amount  # where the ideal line is `need`
    return max(b.now, at - b.walltime_s)


def after(lane: Lane) -> Budget:
    """The lane's budget with this cycle's new pilots committed."""
    b = lane.budget.budget
    return replace(b, committed=b.committed + lane.budget.already)


def stop_of(lane: Lane, cpus: int, gpus: int) -> str:
    """Why `lane` admits no pilot for a job of `cpus` cores and `gpus` GPUs after this
    cycle's ("" if it could): "max_pilots", "closed", "paced" or "spent"."""
    if lane.at_max_pilots():
        return "max_pilots"
    b, lb = lane.budget.budget, lane.budget
    cost = lb.smallest_cost(cpus, gpus)
    if lb.allowance > EPS and lb.room() + EPS >= cost:
        return ""
    if b.status in CLOSED:
        return "closed"
    if b.pace == "even" and b.left - lb.already + EPS >= cost and b.left > EPS:
        return "paced"
    return "spent"


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "..."


def _lines(lanes: Iterable[Lane]) -> str:
    return _clip("; ".join(after(lane).line() for lane in lanes))


def _budget_why(group: str, stops: dict[str, str], lanes: Lanes,
                needs: dict[str, float]) -> Why:
    """The reason for a group whose lanes (key -> why it stops) all admit nothing."""
    mine = [lanes.lanes[key] for key in stops]
    kinds = set(stops.values())
    if "paced" in kinds:
        best: tuple[float, Lane] | None = None
        for lane in mine:
            if stops[lane.key] != "paced":
                continue
            until = paced_until(lane.budget.budget, lane.budget.already, needs[lane.key])
            if until is not None and (best is None or until < best[0]):
                best = (until, lane)
        if best is not None:
            until, lane = best
            unit = UNIT_SHORT.get(lane.alloc.unit, lane.alloc.unit)
            return Why(Reason.GROUP_PACED, {
                "group": group, "allocation": lane.key, "unit": unit,
                "allows": round(max(0.0, lane.budget.room()), 3),
                "needs": round(needs[lane.key], 3), "until": round(until)})
    if "max_pilots" in kinds:
        lane = next(lane for lane in mine if stops[lane.key] == "max_pilots")
        return Why(Reason.GROUP_MAX_PILOTS, {"group": group, "allocation": lane.key,
                                             "max_pilots": lane.alloc.max_pilots or 0})
    code = Reason.GROUP_SPENT if kinds <= {"spent", "paced"} else Reason.GROUP_CLOSED
    return Why(code, {"group": group, "budgets": _lines(mine)})


def unserved_why(group: str, config: Config) -> Why:
    """Why jobs of `group` get no pilot anywhere they fit: no allocation serves it there."""
    configured = sorted({g for s in config.sites for a in s.allocations for g in a.groups})
    where = sorted({s.name for s in config.sites
                    if any(group in a.groups for a in s.allocations)})
    return Why(Reason.GROUP_UNSERVED, {"group": group,
                                       "groups": _clip(", ".join(configured)),
                                       "sites": ", ".join(where)})


def group_waits(rows: Iterable[Row], unserved: Iterable[Row], lanes: Lanes,
                config: Config) -> tuple[GroupWait, ...]:
    """Every group whose jobs wait for its allocations after this cycle (see the
    module's docstring), by group name; a group with jobs of both kinds has an entry
    for those no allocation serves and one for those its budgets hold back."""
    out: list[GroupWait] = []
    jobs: dict[str, int] = {}
    shapes: dict[str, list[JobShape]] = {}
    for row in unserved:
        jobs[row.shape.group] = jobs.get(row.shape.group, 0) + row.jobs
        shapes.setdefault(row.shape.group, []).append(row.shape)
    out += [GroupWait(g, n, unserved_why(g, config), tuple(shapes[g]))
            for g, n in jobs.items()]
    jobs, shapes = {}, {}
    stops: dict[str, dict[str, str]] = {}
    needs: dict[str, dict[str, float]] = {}
    for row in rows:
        if row.reserve or row.left <= 0 or any(k not in lanes.lanes for k in row.sites):
            continue
        here = {k: stop_of(lanes.lanes[k], row.item.cpus, row.item.gpus) for k in row.sites}
        if not all(here.values()):
            continue  # some lane could pay for a pilot: the site's caps stopped it
        group = row.shape.group
        jobs[group] = jobs.get(group, 0) + row.left
        shapes.setdefault(group, []).append(row.shape)
        stops.setdefault(group, {}).update(here)
        need = needs.setdefault(group, {})
        for k in row.sites:
            cost = lanes.lanes[k].budget.smallest_cost(row.item.cpus, row.item.gpus)
            need[k] = min(need.get(k, cost), cost)
    for group, here in stops.items():
        ordered = dict(sorted(here.items(), key=lambda kv: _ORDER.index(kv[1])))
        out.append(GroupWait(group, jobs[group],
                             _budget_why(group, ordered, lanes, needs[group]),
                             tuple(shapes[group])))
    return tuple(sorted(out, key=lambda w: (w.group, w.why.reason.value)))
