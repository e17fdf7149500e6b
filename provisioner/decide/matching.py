"""Which sites can run a job shape (pure): the first stage of `plan()`.

A shape fits a site when the site's largest pilot has the cores, the memory (rounded like
the startd), the GPUs and, for a job that states its runtime, the usable walltime, the
job's DesiredSites (if any) names the site and, for a row whose Requirements were
evaluated while observing (`Demand.sites`, `provisioner.pool.prototype`), the site's pilot
matches them. A shape no site fits is reported with one readable reason and never causes
a pilot.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from provisioner.config import SiteBase
from provisioner.decide.packing import Item
from provisioner.model import Demand, JobShape, Unmatchable, round_memory


@dataclass(slots=True)
class Row:
    """One demand shape (or reserve slot group) through the stages of one cycle.

    `sites` are the names of the sites that fit it; `left` counts the jobs not yet given a
    slot (it starts at `jobs` and only goes down)."""

    item: Item
    shape: JobShape
    jobs: int
    sites: list[str]
    reserve: bool = False
    left: int = field(init=False)

    def __post_init__(self) -> None:
        self.left = self.jobs

    def size_key(self) -> tuple[int, int, int]:
        return self.item.cpus, self.item.memory_mb, self.item.gpus


#: An `Item`'s fields as plain values: (cpus, memory_mb, gpus, runtime_s).
_ItemKey = tuple[int, int, int, int | None]


def item_key(shape: JobShape) -> _ItemKey:
    """The fields of `item_of(shape)`, as a tuple (hashed in C, unlike an `Item`)."""
    return (max(1, shape.cpus), round_memory(shape.memory_mb), max(0, shape.gpus),
            shape.runtime_s)


def item_of(shape: JobShape) -> Item:
    """The packer's view of a shape: at least one cpu, memory rounded like the startd."""
    return Item(*item_key(shape))


def site_rejects(shape: JobShape, site: SiteBase, item: Item | None = None) -> str:
    """Why `site`'s largest pilot cannot run `shape`, or "" if it can."""
    if shape.desired_sites and site.name not in shape.desired_sites:
        return f"DesiredSites {','.join(shape.desired_sites)} excludes {site.name}"
    p = site.pilot
    item = item or item_of(shape)
    if item.cpus > p.cpus:
        return f"RequestCpus {item.cpus} > {site.name} pilot {p.cpus} cores"
    if item.memory_mb > p.memory_mb:
        return f"RequestMemory {shape.memory_mb} MB > {site.name} pilot {p.memory_mb} MB"
    if item.gpus > p.gpus:
        return f"RequestGPUs {item.gpus} > {site.name} pilot {p.gpus} GPUs"
    if shape.runtime_s is not None and shape.runtime_s > p.usable_s:
        return (
            f"runtime {shape.runtime_s} s > {site.name} usable pilot walltime {p.usable_s} s"
        )
    return ""


#: What `fitting_sites` checks of each site: (name, cores, memory MB, GPUs, usable walltime).
_Limits = tuple[str, int, int, int, int]


@dataclass(frozen=True, slots=True)
class SiteLimits:
    """What `fitting_sites` checks of a tuple of sites: each site's limits, in order, and
    the smallest of each limit over all of them (a shape within those fits every site)."""

    each: list[_Limits]
    names: list[str]
    cpus: int
    memory_mb: int
    gpus: int
    usable_s: int


def _limits_of(sites: Sequence[SiteBase]) -> SiteLimits:
    each = [(s.name, s.pilot.cpus, s.pilot.memory_mb, s.pilot.gpus, s.pilot.usable_s)
            for s in sites]
    if not each:
        return SiteLimits(each, [], 0, 0, 0, 0)
    return SiteLimits(each, [lim[0] for lim in each], min(lim[1] for lim in each),
                      min(lim[2] for lim in each), min(lim[3] for lim in each),
                      min(lim[4] for lim in each))


#: The sites last asked about (a tuple: immutable, so the same object has the same
#: content) and their limits: one cycle asks about the same sites for every shape.
_last_limits: tuple[tuple[SiteBase, ...], SiteLimits] = ((), _limits_of(()))


def site_limits(sites: Sequence[SiteBase]) -> SiteLimits:
    """What `fitting_sites` checks of `sites`, read from the configuration once per
    tuple of sites (reading a pydantic model's fields for every shape and site was a
    large part of a cycle)."""
    global _last_limits
    known, limits = _last_limits
    if sites is known:
        return limits
    limits = _limits_of(sites)
    if isinstance(sites, tuple):
        _last_limits = (sites, limits)
    return limits


def fitting_sites(shape: JobShape, sites: Sequence[SiteBase], item: Item) -> list[str]:
    """Names of the sites that can run `shape`, in the order of `sites`: those
    `site_rejects` has no reason against, by the same checks inlined (this runs per shape
    and site in every cycle). A shape without DesiredSites within every site's limits
    fits them all, without a look at each."""
    desired, runtime = shape.desired_sites, shape.runtime_s
    c, m, g = item.cpus, item.memory_mb, item.gpus
    limits = site_limits(sites)
    if (not desired and c <= limits.cpus and m <= limits.memory_mb and g <= limits.gpus
            and (runtime is None or runtime <= limits.usable_s)):
        return list(limits.names)
    return [name for name, cpus, memory, gpus, usable in limits.each
            if c <= cpus and m <= memory and g <= gpus
            and (runtime is None or runtime <= usable)
            and (not desired or name in desired)]


def unmatchable_reason(shape: JobShape, sites: Sequence[SiteBase]) -> str:
    """One readable reason naming the field and the numbers, for a shape no site can run."""
    if shape.desired_sites:
        known = [s for s in sites if s.name in shape.desired_sites]
        if not known:
            return f"DesiredSites {','.join(shape.desired_sites)} names no configured site"
        sites = known
    item = item_of(shape)
    checks = (
        ("RequestCpus", item.cpus, max(s.pilot.cpus for s in sites), "cores"),
        ("RequestMemory", shape.memory_mb, max(s.pilot.memory_mb for s in sites), "MB"),
        ("RequestGPUs", item.gpus, max(s.pilot.gpus for s in sites), "GPUs"),
    )
    for what, asked, largest, unit in checks:
        if (item.memory_mb if what == "RequestMemory" else asked) > largest:
            return f"{what} {asked} {unit} > largest pilot {largest} {unit}"
    if shape.runtime_s is not None:
        longest = max(s.pilot.usable_s for s in sites)
        if shape.runtime_s > longest:
            return f"runtime {shape.runtime_s} s > longest usable pilot walltime {longest} s"
    return "no single site fits: " + "; ".join(site_rejects(shape, s) for s in sites)


def matched_sites(d: Demand, sites: Sequence[SiteBase], item: Item) -> tuple[list[str], str]:
    """The sites that can run the jobs of row `d` (resources and, if evaluated, the
    Requirements), in the order of `sites`; if none, why."""
    fits = fitting_sites(d.shape, sites, item)
    if d.sites is None:
        return fits, "" if fits else unmatchable_reason(d.shape, sites)
    if not fits:
        return [], unmatchable_reason(d.shape, sites)
    if not d.sites:
        return [], d.mismatch or "Requirements not met by any site's pilot ad"
    both = [name for name in fits if name in d.sites]
    if both:
        return both, ""
    why = [site_rejects(d.shape, s, item) or f"Requirements not met by {s.name}'s pilot ad"
           for s in sites]
    return [], "no single site fits: " + "; ".join(why)


#: What decides a demand row's match: (shape, sites matching its Requirements, mismatch).
_MatchKey = tuple[JobShape, frozenset[str] | None, str]


class ShapeMatches:
    """Each demand row's packer item and its sites (`matched_sites`), worked out once per
    (shape, Requirements' sites, mismatch) in a cycle: the reserve asks again about the
    recent arrivals, mostly shapes the queue holds too.

    Shapes that differ only by what the packer does not see (memory within one rounding
    step, disk, Requirements evaluated to the same sites) share one `Item` and one list of
    sites: building a frozen dataclass and checking every site cost more than a look-up."""

    def __init__(self, sites: Sequence[SiteBase]) -> None:
        self.sites = sites
        self.known: dict[_MatchKey, tuple[Item, list[str], str]] = {}
        self.items: dict[_ItemKey, Item] = {}
        #: (item, DesiredSites, Requirements' sites) -> the sites that fit, if any do
        #: (none: the reason names the shape's own numbers, so it is not shared)
        self.fits: dict[tuple[_ItemKey, tuple[str, ...], frozenset[str] | None],
                        list[str]] = {}

    def of(self, d: Demand, key: _MatchKey | None = None) -> tuple[Item, list[str], str]:
        """(item, sites that fit, why none) of row `d`; `key`: its `_MatchKey`, if known
        (a shape hashes in Python)."""
        if key is None:
            key = (d.shape, d.sites, d.mismatch)
        known = self.known.get(key)
        if known is None:
            fields = item_key(d.shape)
            item = self.items.get(fields)
            if item is None:
                item = self.items[fields] = Item(*fields)
            shared = (fields, d.shape.desired_sites, d.sites)
            fits = self.fits.get(shared)
            if fits is None:
                fits, why = matched_sites(d, self.sites, item)
                if fits:
                    self.fits[shared] = fits
            else:
                fits, why = list(fits), ""  # (a copy: each row its own list)
            known = self.known[key] = (item, fits, why)
        return known


def match_demand(demand: Iterable[Demand], sites: Sequence[SiteBase],
                 matches: ShapeMatches | None = None) -> tuple[list[Row], list[Unmatchable]]:
    """Stage 1: equal shapes merged, each matched to its sites; rows largest first.
    `matches`: the cycle's matches so far, for the sites `sites`."""
    if matches is None:
        matches = ShapeMatches(sites)
    # (shape, sites, mismatch) -> [the first such row, the idle jobs of all]; one look-up
    # per row (a shape hashes in Python)
    merged: dict[_MatchKey, list[Any]] = {}
    for d in demand:
        if d.idle > 0:
            merged.setdefault((d.shape, d.sites, d.mismatch), [d, 0])[1] += d.idle
    rows: list[Row] = []
    unmatchable: list[Unmatchable] = []
    for key, (d, idle) in merged.items():
        item, fits, why = matches.of(d, key)
        if fits:
            rows.append(Row(item, d.shape, idle, fits))
        else:
            unmatchable.append(Unmatchable(d.shape, idle, why))
    rows.sort(key=Row.size_key, reverse=True)
    return rows, unmatchable


def demand_of(shapes: Iterable[tuple[JobShape, int]]) -> tuple[Demand, ...]:
    """Convenience: Demand rows from (shape, idle) pairs, merging equal shapes."""
    merged: Counter[JobShape] = Counter()
    for shape, n in shapes:
        merged[shape] += n
    return tuple(Demand(s, n) for s, n in merged.items() if n > 0)
