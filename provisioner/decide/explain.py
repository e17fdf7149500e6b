"""Why each shape of idle job waits, after one cycle (pure): the service's status report.

After each full cycle the service writes, per demand shape, one reason in the vocabulary
of `provisioner.decide.reasons` with its parameters: what the provisioner does for jobs
of that shape (a pilot in the pool with room, one starting, one pending at a site) or
why it cannot (no site fits, its Requirements, stuck, a site's limit, cap, breaker, the
per-cycle budget). The report is keyed by `shape_key`, which `provisioner why` computes
from a job's own ad: no job's id or owner is in it, and its size is bounded by
`MAX_SHAPES`, whatever the queue.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import astuple, dataclass, field
from functools import cached_property, lru_cache
from typing import Any

from provisioner.config import Config
from provisioner.decide.budget_why import unserved_why
from provisioner.decide.matching import Row, match_demand
from provisioner.decide.packing import Item
from provisioner.decide.reasons import Reason, Why, largest_offer, unmatchable_reason
from provisioner.model import Cap, JobShape, Pilot, PilotState, Plan, Snapshot

#: Most shapes one report holds (the most idle first); the rest are counted.
MAX_SHAPES = 500
#: Longest text parameter kept (a Requirements expression, an error).
MAX_TEXT = 300


@lru_cache(maxsize=4096)
def shape_key(shape: JobShape) -> str:
    """A short stable key of a job shape: equal for equal shapes, whoever computes it
    (the service from the schedd's groups, `provisioner why` from one job's ad)."""
    return hashlib.sha256(repr(astuple(shape)).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ShapeEntry:
    """One shape's idle jobs and why they wait; `then`: why the part of them the cycle
    found no capacity for waits longer (None: all are served)."""

    key: str
    idle: int
    why: Why
    then: Why | None = None
    unplaced: int = 0


@dataclass(frozen=True)
class GroupEntry:
    """Why the jobs of an accounting group wait for its allocations (where sites have
    allocations): what `provisioner why` says of a job of the group whose shape the
    report does not hold (it came after the cycle)."""

    group: str
    jobs: int
    why: Why


@dataclass(frozen=True)
class Report:
    """What the service says of the queue after one cycle."""

    provisioner_id: str
    written_at: float
    cycle_s: float
    pool_known: bool
    shapes: tuple[ShapeEntry, ...] = ()
    left_out: int = 0  # shapes beyond MAX_SHAPES, not reported
    groups: tuple[GroupEntry, ...] = ()

    def entry(self, key: str) -> ShapeEntry | None:
        return self._by_key.get(key)

    def group(self, name: str) -> GroupEntry | None:
        """Why jobs of group `name` wait for its allocations (None: they do not)."""
        return next((g for g in self.groups if g.group == name), None)

    @cached_property
    def _by_key(self) -> dict[str, ShapeEntry]:
        return {e.key: e for e in self.shapes}

    def waiting(self) -> dict[str, int]:
        """Idle jobs per reason code (each shape's first reason)."""
        out: Counter[str] = Counter()
        for e in self.shapes:
            out[e.why.reason.value] += e.idle
        return dict(out)


@dataclass(frozen=True)
class SiteWords:
    """What the service knows of each site beside the plan: SLURM limits and circuit
    breakers in words (site -> text; absent: none), the paused sites' breakers (site ->
    pilots in a row that never joined, the end of the pause or None while a pilot tests
    it), learnt lead times (site -> seconds from submission to a usable slot)."""

    limits: Mapping[str, str] = field(default_factory=dict)
    breakers: Mapping[str, str] = field(default_factory=dict)
    paused: Mapping[str, tuple[int, float | None]] = field(default_factory=dict)
    lead_s: Mapping[str, float] = field(default_factory=dict)


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "..."


def _fits(p: Pilot, item: Item, whole: bool) -> bool:
    if whole:
        return p.cpus >= item.cpus and p.memory_mb >= item.memory_mb and p.gpus >= item.gpus
    return (p.free_cpus >= item.cpus and p.free_memory_mb >= item.memory_mb
            and p.free_gpus >= item.gpus)


def on_its_way(item: Item, sites: Iterable[str], pilots: Sequence[Pilot],
               words: SiteWords) -> Why | None:
    """The capacity closest to running a job of `item` at one of `sites`: a pilot in
    the pool with room, then one starting, then the oldest pending one; None if none."""
    where = set(sites)
    mine = [p for p in pilots if p.site in where]
    ready = [p for p in mine if p.state in (PilotState.IDLE, PilotState.BUSY)
             and _fits(p, item, whole=False)]
    if ready:
        p = ready[0]
        return Why(Reason.PILOT_READY, {"site": p.site, "pilot": p.job_id})
    starting = [p for p in mine if p.state is PilotState.STARTING and _fits(p, item, True)]
    if starting:
        p = min(starting, key=lambda q: q.started_at or q.submitted_at)
        return Why(Reason.PILOT_STARTING, {"site": p.site, "pilot": p.job_id,
                                           "cores": p.cpus,
                                           "since": p.started_at or p.submitted_at})
    pending = [p for p in mine if p.state is PilotState.PENDING and not p.limit_reason
               and _fits(p, item, True)]
    if pending:
        p = min(pending, key=lambda q: q.submitted_at)
        params: dict[str, Any] = {"site": p.site, "pilot": p.job_id, "cores": p.cpus,
                                  "since": p.submitted_at}
        if p.site in words.lead_s:
            params["lead_s"] = round(words.lead_s[p.site])
        return Why(Reason.PILOT_PENDING, params)
    return None


def blocked(site: str, cap: Cap | None, words: SiteWords) -> Why:
    """Why a site took none of a shape's remaining jobs this cycle, from the cap the plan
    named for it."""
    if cap is Cap.SITE_UNKNOWN:
        return Why(Reason.SITE_UNKNOWN, {"site": site})
    if cap is Cap.BREAKER:
        params: dict[str, Any] = {"site": site,
                                  "breaker": _clip(words.breakers.get(site, ""))}
        failures, until = words.paused.get(site, (0, None))
        if failures:
            params["failures"] = failures
        if until is not None:
            params["until"] = round(until)
        return Why(Reason.SITE_PAUSED, params)
    if cap is Cap.SLURM_LIMITS:
        return Why(Reason.SITE_LIMIT, {"site": site, "limit": _clip(words.limits.get(site, ""))})
    if cap is Cap.POLICY_MAX_SUBMIT:
        return Why(Reason.NEXT_CYCLE, {"site": site})
    if cap is None:
        return Why(Reason.WAITING, {"site": site})
    if cap is Cap.ALLOCATIONS:
        return Why(Reason.SITE_CAP, {"site": site, "cap": _CAP_WORDS[cap]})
    return Why(Reason.SITE_CAP, {"site": site, "cap": cap.value})


def _stopped(sites: Sequence[str], capped: Mapping[str, Cap | None], words: SiteWords) -> Why:
    """Why none of a shape's `sites` took its remaining jobs: the first site's reason (the
    first one capped), the others' caps named beside it."""
    first = next((n for n in sites if capped.get(n) is not None), sites[0])
    why = blocked(first, capped.get(first), words)
    others = [f"{n} ({_cap_words(capped[n])})" for n in sites
              if n != first and capped.get(n) is not None]
    if others:
        why = Why(why.reason, {**why.params, "also": _clip(", ".join(others))})
    return why


#: A cap in the words a list of other sites gives it (the rest: its own name).
_CAP_WORDS = {Cap.SLURM_LIMITS: "its SLURM limits", Cap.BREAKER: "paused",
              Cap.SITE_UNKNOWN: "unreadable", Cap.POLICY_MAX_SUBMIT: "next cycle",
              Cap.ALLOCATIONS: "its allocations' budgets and max_pilots"}


def _cap_words(cap: Cap | None) -> str:
    if cap is None:
        return ""
    return _CAP_WORDS.get(cap, cap.value)


def _unmatchable(shape: JobShape, text: str, config: Config) -> Why:
    code = unmatchable_reason(text)
    if code is Reason.NO_SITE:
        offer = largest_offer(shape, config.sites)
        return Why(code, offer or {"detail": _clip(text)})
    return Why(code, {"detail": _clip(text)})


def explain(snapshot: Snapshot, plan: Plan, config: Config, now: float,
            words: SiteWords, sent: Sequence[Pilot] = (), cycle_s: float = 0.0) -> Report:
    """The report of one cycle: `snapshot` as the plan saw it (stuck shapes marked),
    its `plan`, the pilots `sent` this cycle (pending from now on). Where sites have
    allocations, a shape's jobs are told of the pilots that serve their group only, and
    those that wait for their group's allocations get the plan's group reason
    (`Plan.group_waits`)."""
    rid, cycle_s = config.pool.provisioner_id, cycle_s or config.policy.interval_s
    if not snapshot.pool_known:
        return Report(rid, now, cycle_s, False)
    rows, unmatchable = match_demand(snapshot.demand, config.sites)
    pilots = list(snapshot.pilots) + list(sent)
    unplaced: Counter[JobShape] = Counter()
    for shape, n in plan.unplaced:
        unplaced[shape] += n
    capped = {s.site: s.capped for s in plan.summary}
    groups = Groups(config, plan) if config.groups_in_use else None
    entries: dict[JobShape, ShapeEntry] = {}
    for u in unmatchable:
        entries[u.shape] = ShapeEntry(shape_key(u.shape), u.idle,
                                      _unmatchable(u.shape, u.reason, config))
    for r in rows:
        left = min(unplaced.get(r.shape, 0), r.jobs)
        unserved = groups.unserved(r) if groups is not None else None
        stop = None
        if left:
            budget = groups.waits.get(r.shape) if groups is not None else None
            stop = budget or _stopped(r.sites, capped, words)
        mine = groups.pilots(pilots, r.shape.group) if groups is not None else pilots
        way = on_its_way(r.item, r.sites, mine, words) if left < r.jobs else None
        if unserved is not None:
            way, stop = unserved, None
        elif way is None:
            way, stop = stop or Why(Reason.WAITING, {"site": r.sites[0]}), None
        old = entries.get(r.shape)
        idle = r.jobs + (old.idle if old is not None else 0)
        entries[r.shape] = ShapeEntry(shape_key(r.shape), idle, way, stop, left)
    ordered = sorted(entries.values(), key=lambda e: (-e.idle, e.key))
    waits = tuple(GroupEntry(w.group, w.jobs, w.why) for w in plan.group_waits)
    return Report(rid, now, cycle_s, True, tuple(ordered[:MAX_SHAPES]),
                  max(0, len(ordered) - MAX_SHAPES), waits)


class Groups:
    """What the report needs of the allocations: which sites serve a group, which
    pilots serve it, and the plan's reasons for groups that wait for their budgets."""

    def __init__(self, config: Config, plan: Plan) -> None:
        self.config = config
        self.budgeted = {s.name for s in config.sites if s.allocations}
        #: group -> (site, account) of the allocations that serve it
        self.accounts: dict[str, set[tuple[str, str]]] = {}
        for s in config.sites:
            for a in s.allocations:
                for g in a.groups:
                    self.accounts.setdefault(g, set()).add((s.name, a.account))
        #: shape -> why its jobs wait for their group's budgets
        self.waits = {shape: w.why for w in plan.group_waits
                      if w.why.reason is not Reason.GROUP_UNSERVED for shape in w.shapes}

    def unserved(self, row: Row) -> Why | None:
        """Why no pilot serves the row's group at the sites that fit it (None: some
        does)."""
        group = row.shape.group
        sites = {s for s, _account in self.accounts.get(group, ())}
        if any(n not in self.budgeted or n in sites for n in row.sites):
            return None
        return unserved_why(group, self.config)

    def pilots(self, pilots: Sequence[Pilot], group: str) -> list[Pilot]:
        """The pilots that may run a job of `group`: at a site without allocations, or
        charged to an allocation that serves the group."""
        mine = self.accounts.get(group, set())
        return [p for p in pilots if p.site not in self.budgeted or (p.site, p.account) in mine]
