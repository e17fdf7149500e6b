"""The predictive reserve (pure): job slots kept free for jobs about to arrive.

See `provisioner.config.ReserveConfig` for the model. `reserve_rows()` turns the recent
arrivals of a `Snapshot` into `Row`s that `plan()` packs after all real demand.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from provisioner.config import Config, SiteConfig
from provisioner.matching import Row, fitting_sites, item_of
from provisioner.model import JobShape, Snapshot


def reserve_size(matchable_arrivals: int, window_s: float, config: Config,
                 departures: int | None = None, quiet_s: float = 0.0) -> int:
    """Job slots to keep free for jobs about to arrive (see `ReserveConfig`): base-stock
    sizing over one lead time, ``growth + factor * sqrt(a + d)`` with ``a`` and ``d`` the
    arrivals and departures expected in one lead time, departures counted at most up to
    the arrivals (unknown: ``d = a``), and ``growth = max(0, a - d - noise)`` where
    ``noise`` is one standard deviation of the estimate ``a - d``; capped at
    ``max_jobs``. When
    nothing arrived for `quiet_s` seconds, longer than ``quiet_gaps`` mean gaps between
    arrivals, arrivals stopped: the reserve decays by e every ``lead_s`` beyond that."""
    r = config.policy.reserve
    if not r.enabled or window_s <= 0 or matchable_arrivals <= 0 or r.max_jobs <= 0:
        return 0
    arrived = matchable_arrivals
    left = arrived if departures is None else min(arrived, max(0.0, departures))
    scale = r.lead_s / window_s  # window counts -> one lead time
    a, d = arrived * scale, left * scale
    # growth counts only beyond its own sampling noise (one standard deviation of the
    # difference of two Poisson counts over the window): a steady queue adds nothing
    noise = math.sqrt(arrived + left) * scale
    want = max(0.0, a - d - noise) + r.factor * math.sqrt(a + d)
    stopped = quiet_s - r.quiet_gaps * window_s / arrived
    if stopped > 0:
        want *= math.exp(-stopped / r.lead_s) if r.lead_s > 0 else 0.0
    return max(0, min(r.max_jobs, math.ceil(want - 1e-9)))


_Key = tuple[int, int, tuple[str, ...]]


def reserve_rows(snapshot: Snapshot, config: Config, sites: Sequence[SiteConfig],
                 now: float) -> list[Row]:
    """The reserve as rows (marked `reserve`), largest first.

    Recently arrived matchable jobs are grouped by (cpus, gpus, DesiredSites); a group's
    reserve slot takes the largest memory seen in it and no stated runtime, so one slot
    fits any recent job of that group. The reserve is split over the groups in proportion
    to the square root of their arrivals (largest remainder). Jobs that arrived at fewer
    than ``min_arrival_times`` distinct times are no rate: no reserve."""
    times = snapshot.arrival_times
    if times is not None and times < config.policy.reserve.min_arrival_times:
        return []
    counts: Counter[_Key] = Counter()
    memory: dict[_Key, int] = {}
    for d in snapshot.recent_arrivals:
        if d.idle <= 0:
            continue
        shape = d.shape
        item = item_of(shape)
        if not fitting_sites(shape, sites, item):
            continue  # unmatchable arrivals never cause a reserve
        key = (item.cpus, item.gpus, shape.desired_sites)
        counts[key] += d.idle
        memory[key] = max(memory.get(key, 0), shape.memory_mb)
    total = sum(counts.values())
    last = snapshot.last_arrival_at
    quiet = 0.0 if last is None else max(0.0, now - last)
    size = reserve_size(total, snapshot.arrival_window_s, config, snapshot.recent_departures,
                        quiet)
    if size == 0:
        return []
    quota = _split(size, counts)
    rows: list[Row] = []
    for key, n in quota.items():
        if n <= 0:
            continue
        cpus, gpus, desired = key
        shape = JobShape(cpus, memory[key], gpus=gpus, desired_sites=desired)
        item = item_of(shape)
        fits = fitting_sites(shape, sites, item)
        if fits:  # the largest memory of a group may fit fewer sites than its jobs do
            rows.append(Row(item, shape, n, fits, reserve=True))
    rows.sort(key=Row.size_key, reverse=True)
    return rows


def _split(size: int, counts: Counter[_Key]) -> dict[_Key, int]:
    """`size` slots over the groups in proportion to the square root of their counts: a
    rare shape's arrivals vary relatively more, so it gets more than its count (largest
    remainder rounding; ties by count, then key)."""
    order = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    roots = {key: math.sqrt(n) for key, n in order}
    norm = sum(roots.values())
    exact = {key: size * roots[key] / norm for key, _n in order}
    quota = {key: int(exact[key]) for key, _n in order}
    rest = size - sum(quota.values())
    by_remainder = sorted(order, key=lambda kv: (-(exact[kv[0]] - quota[kv[0]]), -kv[1], kv[0]))
    for key, _n in by_remainder[:rest]:
        quota[key] += 1
    return quota
