"""Allocations as lanes (pure): how `plan()` sees a site with allocations.

Only where some site has allocations (`Config.groups_in_use`); otherwise none of this
runs. A site with allocations becomes one *lane* per allocation, keyed "site/name" (a
site's name has no "/"), each a `SiteRow` of its own: its own existing capacity (the
site's pilots charged to the allocation's account, `Pilot.account`), its own new pilots,
admitted by the allocation's budget (`LaneBudget`), and the site's room (caps, circuit
breaker, SLURM limits) shared with the site's other lanes (`SiteRoom`). A site without
allocations stays one row under its own name and takes any job, as without groups.

A job of accounting group G (`JobShape.group`) is offered only to the lanes whose
allocation lists G, and to the sites without allocations (`Lanes.serving`). A pilot at a
site with allocations whose account matches none of them serves nobody new: it is no
capacity for any job (scale-down still treats it as any pilot: it is never killed busy).

Placement among the lanes that serve a row keeps the lead-time rule
(`provisioner.decide.placement`) and prefers the lane with the most left per day: a
lane's cost is its site's weighted lead times ``1 + 1/S``, S being the pilots of the
site's full shape that what the allocation has left per day would keep running for the
rest of its period (`Budget.per_day_left` over a full pilot's cost per day). A lane that
can keep many full pilots running costs what its site costs (a budget that does not
bind changes nothing), one that can keep a single one costs twice as much, and one with
nothing left is never preferred. The measure has no unit, so core-, node- and GPU-hour
allocations compare; among lanes of equal cost (within `tie_share`) the split follows
what each can still open, which the budget bounds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from provisioner.config import AllocationConfig, SiteBase
from provisioner.decide.budget import HOUR, Budget, pilot_rate
from provisioner.decide.capacity import SiteRow
from provisioner.decide.matching import Row
from provisioner.decide.packing import NewPilots
from provisioner.decide.sizing import bound_sizes
from provisioner.model import Cap, Pilot

#: Floating-point slack of the budget's comparisons (`Budget.fits` uses the same).
EPS = 1e-9


def lane_key(site: str, allocation: str) -> str:
    """The key of an allocation's lane among the cycle's rows ("gsi/alloc-a")."""
    return f"{site}/{allocation}"


@dataclass
class LaneBudget:
    """What one allocation lets this cycle's new pilots commit (a `packing.Admission`):
    each new pilot's worst case (its cores, node or GPUs for the whole walltime) is
    admitted only while `Budget.fits` holds after the pilots admitted before it
    (`already`). Where a pilot of the asked size does not fit, a smaller one does if the
    unit counts cores (core-hours), from `min_cpus` up."""

    budget: Budget
    min_cpus: int
    already: float = 0.0  # the worst case of the new pilots admitted this cycle
    opened: int = 0  # new pilots admitted this cycle
    #: `budget.allowance`, worked out once (the budget does not change in a cycle)
    allowance: float = field(init=False)

    def __post_init__(self) -> None:
        self.allowance = self.budget.allowance

    def room(self) -> float:
        """What new pilots may still commit this cycle."""
        return self.allowance - self.already

    def fits(self, cpus: int, gpus: int) -> bool:
        """`Budget.fits` after `already`."""
        return self.budget.cost(cpus, gpus) <= self.allowance - self.already + EPS

    def size(self, cpus: int, gpus: int, least: int) -> int:
        if self.allowance <= EPS:
            return 0  # spent, paced to nothing, ended, not started, unknown or stopped
        if self.fits(cpus, gpus):
            return cpus
        if self.budget.unit != "core-hours":
            return 0  # a node or a GPU costs the same whatever the cores
        least = max(least, self.min_cpus, 1)
        hours = self.budget.walltime_s / HOUR
        most = min(cpus, math.floor((self.room() + EPS) / hours)) if hours > 0 else cpus
        while most >= least and not self.fits(most, gpus):
            most -= 1  # (floating point at the boundary)
        return most if most >= least else 0

    def count(self, cpus: int, gpus: int, most: int) -> int:
        cost = self.budget.cost(cpus, gpus)
        if self.allowance <= EPS:
            return 0
        if cost <= 0:  # e.g. a pilot without GPUs, of a GPU-hours allocation
            return most
        n = min(most, max(0, math.floor((self.room() + EPS) / cost)))
        while n > 0 and n * cost > self.room() + EPS:
            n -= 1
        return n

    def take(self, cpus: int, gpus: int, n: int) -> None:
        self.already += n * self.budget.cost(cpus, gpus)
        self.opened += n

    def smallest_cost(self, cpus: int, gpus: int) -> float:
        """The worst case of the smallest pilot that holds one job of `cpus` cores and
        `gpus` GPUs here (core-hours: `min_cpus` at least)."""
        if self.budget.unit == "core-hours":
            cpus = max(cpus, self.min_cpus)
        return self.budget.cost(cpus, gpus)


@dataclass
class Lane:
    """One allocation at one site, through one cycle."""

    key: str
    site: SiteBase
    alloc: AllocationConfig
    budget: LaneBudget
    held: int  # pilots SLURM holds charged to the allocation (what max_pilots counts)
    row: SiteRow = field(repr=False)

    def pilot_room(self) -> int | None:
        """New pilots its max_pilots still allows (None: no such cap)."""
        if self.alloc.max_pilots is None:
            return None
        return max(0, self.alloc.max_pilots - self.held - self.budget.opened)

    def at_max_pilots(self) -> bool:
        room = self.pilot_room()
        return room is not None and room <= 0

    def affordable(self) -> int:
        """About how many new pilots the budget still admits (of the site's packing
        size, and one smaller): what placement shares a row by."""
        p = self.site.pilot
        size = min(p.cpus, p.pack_cpus or p.cpus)
        whole = self.budget.count(size, 0, 10**6)
        if self.budget.room() - whole * self.budget.budget.cost(size, 0) + EPS >= \
                self.budget.smallest_cost(1, 0):
            whole += 1
        return whole


@dataclass
class SiteRoom:
    """A site's room for new pilots this cycle (the least of its caps, breaker and
    limits), shared by its lanes: each lane may open what is left of it, within its
    allocation's max_pilots and budget (`refresh` after each placement)."""

    allowed: int
    lanes: list[Lane] = field(default_factory=list)

    def left(self) -> int:
        return max(0, self.allowed - sum(lane.budget.opened for lane in self.lanes))

    def refresh(self) -> None:
        left = self.left()
        for lane in self.lanes:
            new = lane.row.new
            assert new is not None
            room = min(left, lane.affordable())
            cap = lane.pilot_room()
            if cap is not None:
                room = min(room, cap)
            new.allowed = new.opened + max(0, room)


@dataclass
class Lanes:
    """The cycle's rows with allocations as lanes: `rows` by key (a site without
    allocations under its own name), the lanes, and which rows serve a group."""

    rows: dict[str, SiteRow]
    lanes: dict[str, Lane]
    #: site -> its row as `site_rows` built it (the site's counts and room)
    sites: dict[str, SiteRow]
    #: (site, account) -> the key of the allocation's lane
    by_account: dict[tuple[str, str], str]
    budgeted: frozenset[str]
    _serving: dict[tuple[tuple[str, ...], str], list[str]] = field(default_factory=dict)

    def lane_of(self, p: Pilot) -> str | None:
        """The key of the row whose capacity pilot `p` is: its site's, or its
        allocation's lane (None: an account no allocation of its site has)."""
        if p.site not in self.budgeted:
            return p.site
        return self.by_account.get((p.site, p.account))

    def serving(self, sites: Sequence[str], group: str) -> list[str]:
        """The rows that may take a job of `group` among `sites` (in their order): a site
        without allocations, or the lanes whose allocation lists the group (the one
        with the most left per day first)."""
        key = (tuple(sites), group)
        known = self._serving.get(key)
        if known is None:
            known = []
            for name in sites:
                if name not in self.budgeted:
                    known.append(name)
                    continue
                here = [lane for lane in self.lanes.values()
                        if lane.site.name == name and group in lane.alloc.groups]
                here.sort(key=lambda lane: -lane.budget.budget.per_day_left)
                known.extend(lane.key for lane in here)
            self._serving[key] = known
        return list(known)

    def site_of(self, key: str) -> str:
        """The site of the row `key` (a lane's, or a site's own)."""
        lane = self.lanes.get(key)
        return key if lane is None else lane.site.name

    def of_site(self, site: str) -> list[Lane]:
        return [lane for lane in self.lanes.values() if lane.site.name == site]


def build_lanes(sites: dict[str, SiteRow], budgets: Mapping[tuple[str, str], Budget],
                pilots: Iterable[Pilot]) -> Lanes:
    """The cycle's rows from `site_rows`' (in their order): each site with allocations
    replaced by one lane per allocation (its budget from `budgets`), sharing the site's
    room."""
    held: dict[tuple[str, str], int] = {}
    for p in pilots:
        held[(p.site, p.account)] = held.get((p.site, p.account), 0) + 1
    rows: dict[str, SiteRow] = {}
    lanes: dict[str, Lane] = {}
    by_account: dict[tuple[str, str], str] = {}
    for name, s in sites.items():
        if not s.config.allocations:
            rows[name] = s
            continue
        assert s.new is not None
        room = SiteRoom(s.new.allowed)
        for alloc in s.config.allocations:
            key = lane_key(name, alloc.name)
            shape = s.config.pilot
            row = SiteRow(s.config, s.known, held=s.held, pending=s.pending,
                          room=dict(s.room), shared=room)
            budget = LaneBudget(budgets[(name, alloc.name)], shape.min_cpus)
            row.new = NewPilots(shape.cpus, shape.memory_mb, shape.gpus, 0, shape.pack_cpus,
                                admission=budget)
            lane = Lane(key, s.config, alloc, budget, held.get((name, alloc.account), 0), row)
            room.lanes.append(lane)
            rows[key] = row
            lanes[key] = lane
            by_account[(name, alloc.account)] = key
        room.refresh()
    budgeted = frozenset(s.name for s in sites.values() if s.config.allocations)
    return Lanes(rows, lanes, sites, by_account, budgeted)


def into_lanes(rows: Iterable[Row], lanes: Lanes) -> tuple[list[Row], list[Row]]:
    """Each row's sites replaced by the rows that serve its group; returns the rows some
    row serves and those none does (their group has no allocation where they fit)."""
    served: list[Row] = []
    unserved: list[Row] = []
    for row in rows:
        row.sites = lanes.serving(row.sites, row.shape.group)  # a new list: see ShapeMatches
        (served if row.sites else unserved).append(row)
    return served, unserved


def lane_costs(costs: Mapping[str, float], lanes: Lanes) -> dict[str, float]:
    """Every row's placement cost: a site's as `costs_of` gives it, a lane's its site's
    times ``1 + 1/S`` (S: full pilots its left per day keeps running, see the module's
    docstring)."""
    out = {name: costs[name] for name in lanes.rows if name in costs}
    for key, lane in lanes.lanes.items():
        p = lane.site.pilot
        b = lane.budget.budget
        per_day = pilot_rate(b.unit, p.cpus, p.gpus) * 24
        sustained = b.per_day_left / per_day if per_day > 0 else math.inf
        if lane.budget.allowance <= EPS:
            sustained = 0.0  # takes nothing now (spent, paced, ended, ...): never first
        factor = 1.0 + 1.0 / sustained if sustained > 0 else math.inf
        out[key] = costs[lane.site.name] * factor
    return out


def mark_bound_lanes(lanes: Lanes, rows: Iterable[Row], running: Mapping[str, int],
                     limits: Mapping[str, int]) -> None:
    """`capacity.mark_bound` for lanes: a site whose pilots are scarce is so for all its
    lanes, sized from the site's work (each row counted once per site)."""
    site_of = {key: lane.site.name for key, lane in lanes.lanes.items()}
    per_site = []
    for r in rows:
        if r.reserve or r.left <= 0:
            continue
        names = list(dict.fromkeys(site_of.get(n, n) for n in r.sites))
        view = Row(r.item, r.shape, r.left, names)
        per_site.append(view)
    sizes = bound_sizes(per_site, {n: s.config for n, s in lanes.sites.items()}, limits,
                        running)
    for name, size in sizes.items():
        keys = [lane.key for lane in lanes.of_site(name)] or [name]
        for key in keys:
            s = lanes.rows[key]
            s.bound = size
            if s.new is not None:
                s.new.pack_cpus = size


def site_caps(lanes: Lanes, site: str, opened: int, global_room: int) -> Cap:
    """What stopped a site with allocations from taking all the demand it fits: its own
    tightest cap if that left it no room, else its allocations."""
    s = lanes.sites[site]
    room = {**s.room, Cap.POLICY_MAX_SUBMIT: global_room}
    if not s.known:
        return Cap.SITE_UNKNOWN
    tightest = min(room, key=lambda k: room[k])
    return tightest if room[tightest] <= opened else Cap.ALLOCATIONS
