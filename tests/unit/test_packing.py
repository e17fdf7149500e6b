"""The packing index, directly: one item into groups of identical bins (existing pilots)
and into new pilots; what is placed always fits, and nothing that fits is left out."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from provisioner.decide.packing import (
    INF,
    NO_SHARE,
    BinGroup,
    CapacityIndex,
    Failure,
    GpuShare,
    Item,
    NewPilots,
)


def group(cpus: int, mem: int, count: int = 1, untils: list[float] | None = None) -> BinGroup:
    untils = sorted(untils or [INF] * count, reverse=True)
    return BinGroup(cpus, mem, 0, untils[0], count, [], untils=untils)


def test_per_bin_is_the_tightest_resource() -> None:
    assert Item(2, 1000).per_bin(8, 3000, 0) == 3
    assert Item(2, 1000).per_bin(8, 9000, 0) == 4
    assert Item(1, 0, gpus=1).per_bin(8, 0, 2) == 2
    assert Item(4, 100).per_bin(3, 1000, 0) == 0


def test_split_detaches_the_latest_ending_bins() -> None:
    g = group(4, 4000, 3, untils=[300.0, 100.0, 200.0])
    assert g.usable(150.0) == 2 and g.usable(50.0) == 3 and g.usable(400.0) == 0
    head = g.split(2)
    assert head.untils == [300.0, 200.0] and head.count == 2
    assert g.untils == [100.0] and g.usable_until == 100.0 and g.count == 1


def test_fill_respects_walltime_ends() -> None:
    registry: list[BinGroup] = []
    index = CapacityIndex([group(4, 4000, 2, untils=[1000.0, 5000.0])], registry)
    # a job that needs until t=2000 fits only the bin ending at 5000
    assert index.fill(Item(1, 1000, runtime_s=1), 10, 2000.0) == 4
    assert sum(g.jobs * g.count for g in registry if g.members == [] and g.jobs) == 4
    assert index.fill(Item(1, 1000), 10, 0.0) == 4  # the other bin, for jobs without one


def test_a_failed_size_is_remembered_and_smaller_items_still_fit() -> None:
    index = CapacityIndex([group(2, 2000)], [])
    assert index.fill(Item(4, 100), 1, 0.0) == 0
    assert index.fill(Item(8, 100), 1, 0.0) == 0  # larger than a failure: no scan
    assert index.fill(Item(1, 1000), 5, 0.0) == 2


@settings(max_examples=150, deadline=None)
@given(
    bins=st.lists(st.tuples(st.integers(1, 16), st.integers(0, 8), st.integers(1, 4),
                            st.sampled_from([100.0, 1000.0, INF])), min_size=0, max_size=8),
    cpus=st.integers(1, 4), mem_units=st.integers(0, 4), n=st.integers(0, 60),
    deadline=st.sampled_from([0.0, 500.0, 5000.0]),
)
def test_fill_places_exactly_what_fits(bins: list[tuple[int, int, int, float]], cpus: int,
                                       mem_units: int, n: int, deadline: float) -> None:
    """For one item, first fit is optimal: it places min(n, what the usable bins hold),
    and no bin ends up over its free resources."""
    groups = [group(c, m * 1000, k, untils=[u] * k) for c, m, k, u in bins]
    item = Item(cpus, mem_units * 1000)
    capacity = sum(item.per_bin(c, m * 1000, 0) * k for c, m, k, u in bins if u >= deadline)
    registry: list[BinGroup] = []
    placed = CapacityIndex(groups, registry).fill(item, n, deadline)
    assert placed == min(n, capacity)
    assert sum(g.jobs * g.count for g in registry) == placed
    assert all(g.free_cpus >= 0 and g.free_mem >= 0 for g in registry)


def test_new_pilots_fill_open_ones_first_and_never_exceed_allowed() -> None:
    new = NewPilots(cpus=8, memory_mb=32000, gpus=0, allowed=2, pack_cpus=4)
    assert new.fill(Item(1, 1000), 3) == 3 and new.opened == 1  # one 4-core pilot, 1 free
    assert new.fill(Item(1, 1000), 1) == 1 and new.opened == 1  # into the open pilot
    assert new.fill(Item(2, 1000), 10) == 2 and new.opened == 2  # one more 4-core, 2 jobs
    assert new.fill(Item(1, 1000), 10) == 0  # allowed reached, nothing free


@settings(max_examples=100, deadline=None)
@given(allowed=st.integers(0, 5), pack=st.integers(1, 8),
       items=st.lists(st.tuples(st.integers(1, 8), st.integers(1, 30)), max_size=6))
def test_new_pilots_hold_what_they_say(allowed: int, pack: int,
                                       items: list[tuple[int, int]]) -> None:
    new = NewPilots(cpus=8, memory_mb=64000, gpus=0, allowed=allowed, pack_cpus=pack)
    placed = sum(new.fill(Item(c, 1000), n) for c, n in sorted(items, reverse=True))
    assert new.opened <= allowed
    assert sum(g.jobs * g.count for g in new.registry if g.count) == placed
    assert all(g.used_cpus <= 8 and g.free_cpus >= 0 for g in new.registry)


def position(pool: list[BinGroup], g: BinGroup) -> int:
    """Where group `g` itself is in `pool`. Not `pool.index(g)`: that compares by value, and
    two groups that took the same jobs are equal without being the same bins."""
    return next(i for i, other in enumerate(pool) if other is g)


def ref_fill(pool: list[BinGroup], registry: list[BinGroup], failed: list[Failure],
             item: Item, n: int, deadline: float) -> int:
    """`CapacityIndex.fill` written plainly, over `pool` (the groups in the order they came
    into the index): visit the groups by most free cpus, then most free memory (equal ones in
    pool order); a group whose bins end at different times splits off, just before it, the
    bins that end late enough (if it has the cores, memory and GPUs for one job); whole
    groups and the bins split off to take jobs go to the end of the pool. A job that asks
    for as much as one that found no room is refused, as the index does (a GPU job that
    takes a GPU frees its share for CPU-only jobs, so this may refuse a CPU-only job that
    would fit). No bucket, no floor."""
    if any(f.covers(item.cpus, item.memory_mb, item.gpus, deadline) for f in failed):
        return 0
    wanted = n
    placed = 0
    moved = []
    for g in sorted(pool, key=lambda g: (-g.free_cpus, -g.free_mem)):
        if n == 0:
            break
        if (g.free_cpus < item.cpus or g.free_mem < item.memory_mb
                or g.free_gpus < item.gpus):
            continue
        ok = sum(1 for u in g.untils if u >= deadline) if g.untils else (
            g.count if g.usable_until >= deadline else 0)
        if ok == 0:
            continue
        if ok < g.count:
            head = g.split(ok)
            registry.append(head)
            pool.insert(position(pool, g), head)
            g = head
        k = item.per_bin(g.free_cpus, g.free_mem, g.free_gpus, g.share)
        if k == 0:
            continue
        if n >= k * g.count:
            g.add(item, k)
            n -= k * g.count
            placed += k * g.count
            del pool[position(pool, g)]
            moved.append(g)
            continue
        for size, per in ((n // k, k), (1 if n % k else 0, n % k)):
            if size:
                head = g.split(size)
                head.add(item, per)
                registry.append(head)
                moved.append(head)
        if g.count == 0:
            del pool[position(pool, g)]
        placed += n
        n = 0
    pool.extend(moved)
    if placed < wanted:
        failed.append(Failure(item.cpus, item.memory_mb, item.gpus, deadline))
    return placed


def gpu_group(cpus: int, mem: int, gpus: int, count: int, untils: list[float],
              share: GpuShare) -> BinGroup:
    untils = sorted(untils, reverse=True)
    return BinGroup(cpus, mem, gpus, untils[0], count, [], untils=untils, share=share)


@settings(max_examples=300, deadline=None)
@example(  # two groups come to hold the same jobs: the reference must not mistake one for the other
    bins=[(0, 0, 0, [100.0], NO_SHARE), (4, 3, 0, [100.0, 100.0], NO_SHARE),
          (4, 4, 0, [100.0], NO_SHARE)],
    fills=[(1, 1, 0, 8, 0.0), (1, 1, 0, 2, 0.0), (1, 0, 0, 2, 0.0)],
)
@given(
    bins=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12), st.sampled_from((0, 0, 1, 2)),
                            st.lists(st.sampled_from((100.0, 1000.0, 5000.0, INF)),
                                     min_size=1, max_size=4),
                            st.sampled_from((NO_SHARE, GpuShare(2, 2000), GpuShare(4, 500)))),
                  max_size=10),
    fills=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 4), st.sampled_from((0, 0, 1)),
                             st.integers(0, 30), st.sampled_from((0.0, 500.0, 2000.0))),
                   min_size=1, max_size=8),
)
def test_fill_decides_as_the_plain_reference(
        bins: list[tuple[int, int, int, list[float], GpuShare]],
        fills: list[tuple[int, int, int, int, float]]) -> None:
    """The index places the same jobs into the same bins, in the same order, as the plain
    first fit above, fill after fill (with the floor plan() gives it: no job is smaller)."""
    def groups() -> list[BinGroup]:
        return [gpu_group(c, m * 1000, g, len(u), u, share) for c, m, g, u, share in bins]
    items = [(Item(c, m * 1000, gpus), n, deadline) for c, m, gpus, n, deadline in fills]
    floor = Item(min(i.cpus for i, _n, _d in items), min(i.memory_mb for i, _n, _d in items))
    registry: list[BinGroup] = []
    index = CapacityIndex(groups(), registry)
    pool = groups()
    ref_registry = list(pool)
    failed: list[Failure] = []
    for item, n, deadline in items:
        placed = index.fill(item, n, deadline, floor)
        assert placed == ref_fill(pool, ref_registry, failed, item, n, deadline)
    assert registry == ref_registry  # every group: its bins, their jobs and what is left


@settings(max_examples=200, deadline=None)
@given(
    bins=st.lists(st.tuples(st.integers(1, 12), st.integers(0, 12), st.sampled_from((0, 0, 1)),
                            st.lists(st.sampled_from((100.0, 1000.0, INF)), min_size=1,
                                     max_size=3)),
                  max_size=8),
    fills=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 4), st.sampled_from((0, 0, 1)),
                             st.integers(0, 30), st.sampled_from((0.0, 500.0, 2000.0))),
                   min_size=1, max_size=10),
)
def test_max_mem_is_exact_when_it_says_so(bins: list[tuple[int, int, int, list[float]]],
                                          fills: list[tuple[int, int, int, int, float]]) -> None:
    """`max_mem` bounds every group's free memory, and equals the largest while
    `max_mem_exact` (a failed fill refreshes it only if a group took jobs since)."""
    index = CapacityIndex([gpu_group(c, m * 1000, g, len(u), u, NO_SHARE)
                           for c, m, g, u in bins], [])
    for c, m, gpus, n, deadline in fills:
        index.fill(Item(c, m * 1000, gpus), n, deadline, Item(1, 0))
        largest = max((g.free_mem for bucket in index.buckets.values() for g in bucket),
                      default=0)
        assert index.max_mem >= largest
        if index.max_mem_exact:
            assert index.max_mem == largest
