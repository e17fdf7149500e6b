"""Counting bin packing of job shapes into pilot slots (pure).

Bins are kept in *groups* of identical bins (same free resources, same content), so
packing N jobs of one shape into M identical pilots costs O(1), not O(N*M). The bins of a
group may end at different times: `untils` lists them latest first, and a job that states
a runtime splits off the bins that can still finish it.
One index (`CapacityIndex`) serves both the capacity that exists (free resources of
running pilots, whole pending pilots) and the new pilots of one cycle (`NewPilots`): both
answer "can this job go here" and "put k jobs there" the same way. Callers pack shapes in
decreasing size order.

GPUs are kept for GPU jobs, as the pilot's START does (`condor_config/pilot.conf`): each
free GPU of a bin holds back its share of the bin's cores and memory (`GpuShare`: the
pilot's cores and memory per GPU), and a job that asks for no GPU fits only into what is
left beyond that. New pilots for GPU jobs and for CPU-only jobs are opened apart, so a
new GPU pilot holds GPU jobs only and is sized to them.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import NamedTuple, Protocol

from provisioner.model import Pilot

INF = math.inf


@dataclass(frozen=True, slots=True)
class Item:
    """One demand shape as the packer sees it (memory already rounded like the startd)."""

    cpus: int
    memory_mb: int
    gpus: int = 0
    runtime_s: int | None = None

    def per_bin(self, free_cpus: int, free_mem: int, free_gpus: int,
                share: GpuShare | None = None) -> int:
        """How many of these jobs fit into the given free resources; a job without GPUs
        only into the cores and memory beyond the free GPUs' `share`."""
        if self.gpus == 0 and free_gpus > 0 and share is not None:
            free_cpus -= free_gpus * share.cpus
            free_mem -= free_gpus * share.memory_mb
        k = free_cpus // self.cpus
        if self.memory_mb > 0:
            k = min(k, free_mem // self.memory_mb)
        if self.gpus > 0:
            k = min(k, free_gpus // self.gpus)
        return max(k, 0)


@dataclass(frozen=True, slots=True)
class GpuShare:
    """Cores and memory a pilot keeps per free GPU for jobs that ask for GPUs: its
    allocation divided by its GPUs (rounded down, as the startd's START computes it)."""

    cpus: int = 0
    memory_mb: int = 0


NO_SHARE = GpuShare()


def gpu_share(cpus: int, memory_mb: int, gpus: int) -> GpuShare:
    """The share per GPU of a pilot of `cpus` cores, `memory_mb` MB and `gpus` GPUs."""
    if gpus <= 0:
        return NO_SHARE
    return GpuShare(cpus // gpus, memory_mb // gpus)


def pilot_share(p: Pilot) -> GpuShare:
    """The share per GPU of pilot `p` (its whole allocation)."""
    return gpu_share(p.cpus, p.memory_mb, p.gpus)


def fits_cpu_only(cpus: int, memory_mb: int, free_cpus: int, free_mem: int, free_gpus: int,
                  share: GpuShare) -> bool:
    """Whether a job asking for no GPU may start in these free resources (the pilot's
    START clause for GPU pilots, evaluated the same way)."""
    return (cpus <= free_cpus - free_gpus * share.cpus
            and memory_mb <= free_mem - free_gpus * share.memory_mb)


@dataclass(slots=True)
class BinGroup:
    """`count` identical bins. `members` lists the existing pilots behind them (empty for
    bins that are new pilots to submit); `untils` their walltime ends, latest first (empty:
    every bin is usable until `usable_until`)."""

    free_cpus: int
    free_mem: int
    free_gpus: int
    usable_until: float  # latest walltime end: a job with runtime r needs now + r <= it
    count: int
    members: list[Pilot] = field(default_factory=list)
    used_cpus: int = 0  # per bin, by jobs packed this cycle
    used_mem: int = 0
    used_gpus: int = 0
    jobs: int = 0  # per bin
    untils: list[float] = field(default_factory=list)
    share: GpuShare = NO_SHARE  # kept per free GPU for GPU jobs

    def per_bin(self, item: Item) -> int:
        """How many jobs of `item` one bin of this group takes."""
        return item.per_bin(self.free_cpus, self.free_mem, self.free_gpus, self.share)

    def split(self, n: int) -> BinGroup:
        """Detach the first `n` bins (the latest-ending) into a new group (same state) and
        return it."""
        head = BinGroup(
            self.free_cpus, self.free_mem, self.free_gpus, self.usable_until, n,
            self.members[:n], self.used_cpus, self.used_mem, self.used_gpus, self.jobs,
            self.untils[:n], self.share,
        )
        self.members = self.members[n:]
        self.count -= n
        if self.untils:
            self.untils = self.untils[n:]
            self.usable_until = self.untils[0] if self.untils else -INF
        return head

    def usable(self, deadline: float) -> int:
        """How many of the bins are usable until `deadline` (they come first)."""
        if not self.untils or self.untils[-1] >= deadline:
            return self.count if self.usable_until >= deadline else 0
        return bisect_right(self.untils, -deadline, key=_neg)

    def add(self, item: Item, k: int) -> None:
        """Put `k` jobs of `item` into every bin of this group."""
        self.free_cpus -= k * item.cpus
        self.free_mem -= k * item.memory_mb
        self.free_gpus -= k * item.gpus
        self.used_cpus += k * item.cpus
        self.used_mem += k * item.memory_mb
        self.used_gpus += k * item.gpus
        self.jobs += k


class Failure(NamedTuple):
    """A job that found no room in an index. Capacity there only shrinks as jobs are packed
    (new pilots aside), so a job asking for as much or more fails there too (`covers`)."""

    cpus: int
    memory_mb: int
    gpus: int
    deadline: float

    def covers(self, cpus: int, memory_mb: int, gpus: int, deadline: float) -> bool:
        """Whether a job of (cpus, memory_mb, gpus) by `deadline` surely fails where this
        one did: it asks for at least as much, and of the same kind (a job without GPUs may
        not use the cores kept for GPU jobs, so its failure says nothing about GPU jobs, and
        the reverse)."""
        return (cpus >= self.cpus and memory_mb >= self.memory_mb and gpus >= self.gpus
                and deadline >= self.deadline and (gpus == 0) == (self.gpus == 0))


class CapacityIndex:
    """Bin groups of existing pilots indexed for fast first fit.

    Groups are bucketed by free cpus; inside a bucket they are ordered by free memory,
    largest first (equal memory: in the order they came). A job of (c cpus, m MB) visits
    only buckets with >= c free cpus and, in each, only the groups with >= m free memory, so
    the cost follows the groups that can take it, not all groups. A group that takes jobs
    moves to the bucket of what it has left, or leaves the index if that can no longer hold
    the smallest job (`floor`). Jobs that found no room are remembered (`failed`): one that
    asks for as much or more is refused without a look. `registry` receives every group
    ever created.
    """

    def __init__(self, groups: list[BinGroup], registry: list[BinGroup]) -> None:
        self.registry = registry
        registry.extend(groups)
        self.buckets: dict[int, list[BinGroup]] = {}
        for g in groups:
            self.buckets.setdefault(g.free_cpus, []).append(g)
        for bucket in self.buckets.values():
            bucket.sort(key=_neg_mem)  # stable: groups of equal memory keep their order
        self.keys: list[int] = []  # the buckets' free cpus, largest first
        self.max_cpus = 0  # the most free cpus of any group
        self._sort_keys()
        self.failed: list[Failure] = []
        self._refresh_max_mem()

    def _sort_keys(self) -> None:
        self.keys = sorted(self.buckets, reverse=True)
        self.max_cpus = self.keys[0] if self.keys else 0

    def _refresh_max_mem(self) -> None:
        #: An upper bound on any group's free memory (exact after a failed fill; buckets
        #: are sorted by it and never empty).
        self.max_mem = max(map(_FREE_MEM, map(_FIRST, self.buckets.values())), default=0)
        #: whether `max_mem` is exact: until a group takes jobs (`add` keeps it exact)
        self.max_mem_exact = True

    def may_fit(self, item: Item) -> bool:
        """False only if no group has the cpus and memory for one job of `item`."""
        return bool(self.keys) and self.max_cpus >= item.cpus and self.max_mem >= item.memory_mb

    def add(self, g: BinGroup) -> None:
        """A new group (e.g. pilots opened this cycle) joins the index."""
        self.registry.append(g)
        if g.free_cpus > 0:
            self._insert([g], 1, 0)
            self.max_mem = max(self.max_mem, g.free_mem)

    def _insert(self, groups: list[BinGroup], min_cpus: int, min_mem: int) -> None:
        """Put each group with at least `min_cpus` (> 0) free cpus and `min_mem` free memory
        into the bucket of its free cpus, after the groups with as much memory or more
        (`insort` by `_neg_mem`); the others leave the index."""
        buckets = self.buckets
        new_bucket = False
        for g in groups:
            cpus, mem = g.free_cpus, g.free_mem
            if cpus < min_cpus or mem < min_mem:
                continue
            bucket = buckets.get(cpus)
            if bucket is None:
                buckets[cpus] = [g]
                new_bucket = True
                continue
            i = len(bucket)  # a group that took jobs has little memory left: from the end
            while i and bucket[i - 1].free_mem < mem:
                i -= 1
            bucket.insert(i, g)
        if new_bucket:
            self._sort_keys()

    def fill(self, item: Item, n: int, deadline: float, floor: Item | None = None) -> int:
        """First-fit `n` jobs of `item`; return how many were placed. A bin takes the job
        only if its walltime end is >= `deadline` (now + stated runtime, or now)."""
        c, m, gp = item.cpus, item.memory_mb, item.gpus
        if n <= 0 or self.max_cpus < c or not self.keys:
            return 0
        for fc, fm, fg, fd in self.failed:  # `Failure.covers`, inlined: most calls end here
            if c >= fc and m >= fm and gp >= fg and deadline >= fd and (gp == 0) == (fg == 0):
                return 0
        buckets = self.buckets
        left = n
        moved: list[BinGroup] = []  # groups that took jobs: their free cpus changed
        resort = False
        for key in self.keys:
            if key < c:
                break
            bucket = buckets[key]
            if bucket[0].free_mem < m:
                continue  # not even the bucket's first group has the memory
            left = self._fill_bucket(bucket, item, left, deadline, moved)
            if not bucket:
                del buckets[key]
                resort = True
            if left == 0:
                break
        if resort:
            self._sort_keys()
        if moved:
            self.max_mem_exact = False
        if floor is None:
            self._insert(moved, 1, 0)
        else:
            self._insert(moved, max(1, floor.cpus), floor.memory_mb)
        if left > 0:
            # nothing as large as this item fits any more; keep only minimal failures
            failure = Failure(c, m, gp, deadline)
            self.failed = [f for f in self.failed if not failure.covers(*f)]
            self.failed.append(failure)
            if not self.max_mem_exact:  # (most failed fills took nothing: it still is)
                self._refresh_max_mem()
        return n - left

    def _fill_bucket(self, bucket: list[BinGroup], item: Item, n: int, deadline: float,
                     moved: list[BinGroup]) -> int:
        """First-fit up to `n` jobs of `item` into the groups of one bucket, in order, up to
        the first without the memory for one; return how many jobs are left. Groups that
        take jobs leave the bucket for `moved` (whole, or the bins split off that took them);
        bins that end too early for the job stay, split off behind the others."""
        c, m, gp = item.cpus, item.memory_mb, item.gpus
        j = 0
        while j < len(bucket):
            g = bucket[j]
            if g.free_mem < m:
                break
            if g.free_gpus < gp or g.usable_until < deadline:
                j += 1
                continue
            untils = g.untils  # empty, or all bins usable: the common case, checked inline
            if untils and untils[-1] < deadline:
                ok = g.usable(deadline)
                if ok < g.count:  # only the bins that end late enough take this job
                    g = g.split(ok)
                    self.registry.append(g)
                    bucket.insert(j, g)
            # jobs per bin (`Item.per_bin`, inlined)
            free_cpus, free_mem, free_gpus = g.free_cpus, g.free_mem, g.free_gpus
            if free_gpus and not gp:  # each free GPU keeps its share for GPU jobs
                free_cpus -= free_gpus * g.share.cpus
                free_mem -= free_gpus * g.share.memory_mb
            k = free_cpus // c
            if m and free_mem // m < k:
                k = free_mem // m
            if gp and free_gpus // gp < k:
                k = free_gpus // gp
            if k <= 0:  # the cores or memory left are kept for GPU jobs
                j += 1
                continue
            taken = k * g.count
            if n >= taken:  # every bin takes k: the whole group moves
                n -= taken
                # `g.add(item, k)`, inlined: this runs for most groups a job visits
                cpus, mem = k * c, k * m
                g.free_cpus -= cpus
                g.free_mem -= mem
                g.used_cpus += cpus
                g.used_mem += mem
                if gp:
                    g.free_gpus -= k * gp
                    g.used_gpus += k * gp
                g.jobs += k
                del bucket[j]
                moved.append(g)
                if n == 0:
                    return 0
                continue
            full, rest = divmod(n, k)  # `full` bins take k, one more takes the rest
            if full:
                head = g.split(full)
                head.add(item, k)
                self.registry.append(head)
                moved.append(head)
            if rest:
                head = g.split(1)
                head.add(item, rest)
                self.registry.append(head)
                moved.append(head)
            if g.count == 0:
                del bucket[j]
            return 0
        return n


_FIRST = itemgetter(0)
_FREE_MEM = attrgetter("free_mem")


def _neg_mem(g: BinGroup) -> int:
    return -g.free_mem


def _neg(x: float) -> float:
    return -x


class Admission(Protocol):
    """What an allocation lets new pilots commit (`provisioner.decide.groups`): a new
    bin is opened only when its worst case fits what is left after the bins opened
    before it."""

    def size(self, cpus: int, gpus: int, least: int) -> int:
        """`cpus` if a bin of `cpus` cores and `gpus` GPUs fits, else the most cores from
        `least` up that fit (0: none does)."""
        ...

    def count(self, cpus: int, gpus: int, most: int) -> int:
        """How many bins of this size fit one after another, at most `most`."""
        ...

    def take(self, cpus: int, gpus: int, n: int) -> None:
        """`n` bins of this size were opened."""
        ...


@dataclass
class NewPilots:
    """New pilots of one site, at most `allowed`. Each new bin has `pack_cpus` cores, or
    the cores of the first job put in it if more (at most `cpus`), and the largest memory.
    Pilots opened this cycle are filled first, through the same `CapacityIndex` as
    existing capacity. Jobs that ask for GPUs open bins with the site's GPUs and share
    them with GPU jobs only; CPU-only jobs open bins without GPUs (`open_gpu`, `open`).
    With an `admission` (an allocation's budget) each bin opens only if it fits, one
    after another, or smaller where fewer cores fit (`Admission.size`)."""

    cpus: int
    memory_mb: int
    gpus: int
    allowed: int
    pack_cpus: int = 0  # 0 = cpus
    registry: list[BinGroup] = field(default_factory=list)
    open: CapacityIndex = field(init=False)
    open_gpu: CapacityIndex = field(init=False)
    opened: int = 0
    admission: Admission | None = None

    def __post_init__(self) -> None:
        self.open = CapacityIndex([], self.registry)
        self.open_gpu = CapacityIndex([], self.registry)

    def may_fit(self, item: Item) -> bool:
        """False only if no pilot opened this cycle has the room for one job of `item`."""
        return (self.open_gpu if item.gpus > 0 else self.open).may_fit(item)

    def fill(self, item: Item, n: int) -> int:
        """Place up to `n` jobs: first into pilots opened this cycle, then into new ones;
        return how many were placed."""
        if n <= 0:
            return 0
        index, gpus = (self.open_gpu, self.gpus) if item.gpus > 0 else (self.open, 0)
        placed = index.fill(item, n, 0.0)
        n -= placed
        cpus = min(self.cpus, max(self.pack_cpus or self.cpus, item.cpus))
        if self.admission is not None:
            return placed + self._admit(item, n, cpus, gpus, index, self.admission)
        k = item.per_bin(cpus, self.memory_mb, gpus)
        left = self.allowed - self.opened
        if n <= 0 or k == 0 or left <= 0:
            return placed
        full = min(n // k, left)
        if full:
            g = BinGroup(cpus, self.memory_mb, gpus, INF, full)
            g.add(item, k)
            self.opened += full
            index.add(g)
            n -= full * k
            placed += full * k
        if n > 0 and self.opened < self.allowed:
            g = BinGroup(cpus, self.memory_mb, gpus, INF, 1)
            g.add(item, n)
            self.opened += 1
            index.add(g)
            placed += n
        return placed

    def _admit(self, item: Item, n: int, cpus: int, gpus: int, index: CapacityIndex,
               admission: Admission) -> int:
        """Up to `n` jobs of `item` into new bins of `cpus` cores, each bin admitted by
        `admission` before it opens (smaller where a whole one does not fit); returns
        how many were placed."""
        placed = 0
        while n > 0 and self.opened < self.allowed:
            size = admission.size(cpus, gpus, item.cpus)
            k = item.per_bin(size, self.memory_mb, gpus) if size > 0 else 0
            if k == 0:
                break
            bins = min(-(-n // k), self.allowed - self.opened,
                       admission.count(size, gpus, self.allowed - self.opened))
            if bins <= 0:
                break
            full = min(bins, n // k)
            if full:
                g = BinGroup(size, self.memory_mb, gpus, INF, full)
                g.add(item, k)
                index.add(g)
                n -= full * k
                placed += full * k
            if bins > full:  # the rest, fewer than k jobs, in one more bin
                g = BinGroup(size, self.memory_mb, gpus, INF, 1)
                g.add(item, n)
                index.add(g)
                placed += n
                n = 0
            self.opened += bins
            admission.take(size, gpus, bins)
        return placed
