"""Existing capacity and the per-site rows of one cycle (pure): stage 2 of `plan()`.

`site_rows` gives each configured site its `SiteRow` (pilot counts, the room its caps,
breaker and SLURM limits leave for new pilots); `add_capacity` indexes the pilots that
exist (running ones by their free room, starting and pending ones whole); `fill_existing`
puts each demand row into that capacity, running pilots first; `mark_bound` marks the
sites whose pilots, not cores, are scarce (`provisioner.decide.sizing`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Protocol

from provisioner.config import Config, SiteBase
from provisioner.decide.matching import Row
from provisioner.decide.packing import (
    INF,
    NO_SHARE,
    BinGroup,
    CapacityIndex,
    GpuShare,
    Item,
    NewPilots,
)
from provisioner.decide.placement import costs_of, site_leads
from provisioner.decide.sizing import bound_sizes
from provisioner.model import (
    Cap,
    CycleMemory,
    Pilot,
    PilotState,
    Snapshot,
    by_state,
)

# Existing capacity is used in this order: fill pilots already working first, so idle ones
# can be released and pending ones cancelled.
_TIERS: tuple[PilotState, ...] = (
    PilotState.BUSY,
    PilotState.IDLE,
    PilotState.STARTING,
    PilotState.PENDING,
)
_WHOLE = _TIERS.index(PilotState.STARTING)  # from this tier on a pilot counts whole
_PENDING_TIER = _TIERS.index(PilotState.PENDING)


class SharedRoom(Protocol):
    """The room for new pilots that the rows of one site's allocations share
    (`provisioner.decide.groups`)."""

    def refresh(self) -> None:
        """Set each row's `NewPilots.allowed` to what is left of the site's room."""
        ...


@dataclass
class SiteRow:
    """Everything one cycle knows and decides about one site (or, at a site with
    allocations, about one allocation there: `shared` then holds the site's room)."""

    config: SiteBase
    known: bool  # squeue answered this cycle
    held: int = 0  # pilots SLURM holds, ENDING ones too (what max_pilots counts)
    pending: int = 0
    existing: dict[int, CapacityIndex] = field(default_factory=dict)  # tier -> index
    room: dict[Cap, int] = field(default_factory=dict)  # cap -> new pilots it allows
    new: NewPilots | None = None
    absorbed: int = 0  # real jobs given to existing capacity
    absorbed_reserve: int = 0
    offered_jobs: int = 0  # real jobs offered to new pilots here
    offered_cpus: int = 0
    new_jobs: int = 0  # real jobs placed on new pilots
    new_reserve: int = 0
    #: its pilots, not its cores, are scarce: the cores a new pilot takes (0: sized to
    #: its jobs; `provisioner.decide.sizing`)
    bound: int = 0
    shared: SharedRoom | None = None

    @property
    def name(self) -> str:
        return self.config.name

    def load(self) -> float:
        """Share of the site's pilot cap in use, new pilots of this cycle included."""
        opened = self.new.opened if self.new is not None else 0
        return (self.held + opened) / max(1, self.config.caps.max_pilots)




def site_rows(snapshot: Snapshot, memory: CycleMemory, config: Config,
              pending: Sequence[Pilot] | None = None) -> dict[str, SiteRow]:
    """One `SiteRow` per configured site with its pilot counts, its room for new pilots
    (the tightest of its caps, its circuit breaker and its SLURM limits; none at a site
    not read this cycle) and an empty `NewPilots`. `pending`: the snapshot's PENDING
    pilots, if already sorted out (`by_state`)."""
    known = {v.name: v.known for v in snapshot.sites}
    rows = {s.name: SiteRow(s, known.get(s.name, False)) for s in config.sites}
    # An ENDING pilot is no capacity, but its batch job still holds the allocation until
    # it leaves SLURM: the cap counts it. (Counted in C; the pending ones apart: a
    # (site, state) key per pilot cost more than a second pass.)
    for site, n in Counter(map(_SITE, snapshot.pilots)).items():
        row = rows.get(site)
        if row is not None:
            row.held += n
    if pending is None:
        pending = by_state(snapshot.pilots)[PilotState.PENDING]
    for site, n in Counter(map(_SITE, pending)).items():
        row = rows.get(site)
        if row is not None:
            row.pending += n
    for s in rows.values():
        caps = s.config.caps
        s.room = {
            Cap.MAX_PILOTS: caps.max_pilots - s.held,
            Cap.MAX_PENDING: caps.max_pending - s.pending,
            Cap.SITE_MAX_SUBMIT: caps.max_submit_per_cycle,
        }
        limit = memory.submit_limit.get(s.name)
        if limit is not None:
            s.room[Cap.BREAKER] = limit
        limit = memory.limit_room.get(s.name)
        if limit is not None:
            s.room[Cap.SLURM_LIMITS] = limit
        allowed = max(0, min(s.room.values())) if s.known else 0
        shape = s.config.pilot
        s.new = NewPilots(shape.cpus, shape.memory_mb, shape.gpus, allowed, shape.pack_cpus)
    return rows


def add_capacity(sites: dict[str, SiteRow], snapshot: Snapshot, now: float,
                 registry: list[BinGroup], skip: Iterable[str] = (),
                 states: Mapping[PilotState, Sequence[Pilot]] | None = None,
                 lane_of: Callable[[Pilot], str | None] | None = None) -> None:
    """Existing capacity as identical-bin groups, one index per site and tier; pilots in
    `skip` are no capacity. `states`: the snapshot's pilots by state, if already sorted
    out (`by_state`). `lane_of`: the key in `sites` of a pilot's row (None: no row takes
    it, it is no capacity); without it, its site's name."""
    skip = frozenset(skip)
    if states is None:
        states = by_state(snapshot.pilots)
    # (site, tier, free cpus, memory and GPUs, GPU share's cpus and memory) -> pilots
    # (its pilots' ends, the pilots): two lists, not a tuple per pilot
    raw: dict[tuple[str, int, int, int, int, int, int], tuple[list[float], list[Pilot]]] = {}
    # per site: (walltime of a fresh pilot, shutdown margin), looked up once
    times = {name: (s.config.pilot.walltime_s, s.config.pilot.shutdown_margin_s)
             for name, s in sites.items()}
    # the groups with an end not read off a pilot's `walltime_end` (see below)
    derived: set[tuple[str, int, int, int, int, int, int]] = set()
    # tier by tier: the pilots of each (site, tier) keep the snapshot's order
    for tier, state in enumerate(_TIERS):
        whole, pending = tier >= _WHOLE, tier == _PENDING_TIER
        for p in states[state]:
            if whole:
                c, m, g = p.cpus, p.memory_mb, p.gpus
            else:
                c = p.free_cpus
                if c <= 0:
                    continue
                m, g = p.free_memory_mb, p.free_gpus
            name = p.site if lane_of is None else (lane_of(p) or "")  # "": no row
            site_times = times.get(name)
            if site_times is None or p.limit_reason or (skip and p.key in skip):
                continue  # a pilot pending at a job-count limit is no capacity on its way
            # when SLURM ends the pilot: a pending pilot gets a full walltime when it starts
            # (its runtime fit was checked per site), so it has no end yet; a pilot whose end
            # is not known ends a walltime after its start. Within the shutdown margin of its
            # end a pilot starts no jobs: no capacity. (Inline: this runs per pilot.)
            if pending:
                end, read = INF, False
            else:
                known_end = p.walltime_end
                read = known_end is not None
                if known_end is None:
                    start = p.started_at if p.started_at is not None else now
                    end = start + site_times[0]
                else:
                    end = known_end
                if end - site_times[1] <= now:
                    continue
            # the GPU share (`gpu_share`) as plain numbers; a `GpuShare` per group
            gpus = p.gpus
            if gpus > 0:
                key = (name, tier, c, m, g, p.cpus // gpus, p.memory_mb // gpus)
            else:
                key = (name, tier, c, m, g, 0, 0)
            if not read:
                derived.add(key)
            members = raw.get(key)
            if members is None:
                raw[key] = ([end], [p])
            else:
                members[0].append(end)
                members[1].append(p)
    by_index: dict[tuple[str, int], list[BinGroup]] = {}
    for key, (untils, pilots) in raw.items():
        site_name, tier, c, m, g, share_c, share_m = key
        if len(pilots) > 1:  # a pilot alone in its group (common): nothing to sort
            # latest end first; stable (also reversed): equal ends keep snapshot order
            if key in derived:
                order = sorted(range(len(untils)), key=untils.__getitem__, reverse=True)
                untils, pilots = [untils[i] for i in order], [pilots[i] for i in order]
            else:  # every end is its pilot's own: two sorts in C, not a permutation
                untils.sort(reverse=True)
                pilots.sort(key=_WALLTIME_END, reverse=True)
        by_index.setdefault((site_name, tier), []).append(
            BinGroup(c, m, g, untils[0], len(pilots), pilots, untils=untils,
                     share=GpuShare(share_c, share_m) if share_c or share_m else NO_SHARE))
    for site_name, tier in sorted(by_index):
        sites[site_name].existing[tier] = CapacityIndex(by_index[site_name, tier], registry)


def mark_bound(sites: dict[str, SiteRow], rows: Iterable[Row], snapshot: Snapshot,
               memory: CycleMemory) -> None:
    """Sites whose pilots are scarce (`provisioner.decide.sizing.bound_sizes`) pack
    their new pilots up to the work's share per allowed pilot, and size them to it."""
    running: dict[str, int] = {}
    for p in snapshot.pilots:
        if p.state in (PilotState.BUSY, PilotState.IDLE):
            running[p.site] = running.get(p.site, 0) + max(0, p.cpus - p.free_cpus)
    sizes = bound_sizes(rows, {n: s.config for n, s in sites.items()}, memory.pilot_limits,
                        running)
    for name, size in sizes.items():
        s = sites[name]
        s.bound = size
        if s.new is not None:
            s.new.pack_cpus = size


def fill_existing(rows: Iterable[Row], sites: dict[str, SiteRow], now: float,
                  floor: Item) -> None:
    """Stage 2: each row's jobs into existing capacity, tier by tier (running pilots
    first, pending last), at its sites in the row's order."""
    tiers = range(len(_TIERS))
    # per tier: site name -> its index, looked up once, not per row
    indexes = [{name: s.existing[tier] for name, s in sites.items() if tier in s.existing}
               for tier in tiers]
    # per tier: the most cores and memory any site's index may still have free (upper
    # bounds: fills only lower them; `fresh` says whether they are exact again): a row
    # larger than that skips the tier
    bounds = [_tier_bound(at_tier.values()) for at_tier in indexes]
    fresh = [True for _tier in tiers]
    for row in rows:
        deadline = now + (row.item.runtime_s or 0)
        c, m = row.item.cpus, row.item.memory_mb
        for tier in tiers:
            if c <= bounds[tier][0] and m <= bounds[tier][1] and not fresh[tier]:
                bounds[tier], fresh[tier] = _tier_bound(indexes[tier].values()), True
            if c > bounds[tier][0] or m > bounds[tier][1]:
                continue  # no site's index can hold this job (cheap pre-check)
            at_tier = indexes[tier]
            for site_name in row.sites:
                bins = at_tier.get(site_name)
                # `bins.may_fit(row.item)`, inlined (this runs per row, tier and site):
                # nothing there can hold this job (cheap pre-check)
                if bins is None or not bins.keys or bins.max_cpus < c or bins.max_mem < m:
                    continue
                got = bins.fill(row.item, row.left, deadline, floor)
                fresh[tier] = False
                if row.reserve:
                    sites[site_name].absorbed_reserve += got
                else:
                    sites[site_name].absorbed += got
                row.left -= got
                if row.left == 0:
                    break
            if row.left == 0:
                break


def _tier_bound(indexes: Iterable[CapacityIndex]) -> tuple[int, int]:
    """The most free cores and the most free memory of any of the `indexes` (one tier's)."""
    indexes = list(indexes)
    return (max(map(_MAX_CPUS, indexes), default=0),
            max(map(_MAX_MEM, indexes), default=0))


_SITE = attrgetter("site")
_WALLTIME_END = attrgetter("walltime_end")
_MAX_CPUS = attrgetter("max_cpus")
_MAX_MEM = attrgetter("max_mem")


@dataclass(frozen=True)
class Ordered:
    """The sites of a cycle in placement order: each one's lead time and cost, and its
    `SiteRow`, cheapest first (ties in configuration order)."""

    leads: dict[str, float]
    costs: dict[str, float]
    order: tuple[SiteBase, ...]
    rows: dict[str, SiteRow]


def ordered_sites(snapshot: Snapshot, memory: CycleMemory, config: Config, now: float,
                  pending: Sequence[Pilot]) -> Ordered:
    """Every site's lead, cost and row, in placement order (what plan() and the
    allocations' plan both start from)."""
    leads = site_leads(snapshot, memory, config, now, pending)
    costs = costs_of(leads, config)
    # stable: config order; a tuple, so that matching reads the sites' limits once
    order = tuple(sorted(config.sites, key=lambda s: costs[s.name]))
    rows = site_rows(snapshot, memory, config, pending)
    return Ordered(leads, costs, order, {s.name: rows[s.name] for s in order})
