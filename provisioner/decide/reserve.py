"""The predictive reserve (pure): job slots kept free for jobs about to arrive.

See `provisioner.config.ReserveConfig` for the model. `reserve_rows()` turns the recent
arrivals of a `Snapshot` into `Row`s that `plan()` packs after all real demand.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from provisioner.config import Config, SiteBase
from provisioner.decide.matching import Row, ShapeMatches, fitting_sites, item_of
from provisioner.model import (
    Action,
    Cancel,
    CycleMemory,
    JobShape,
    Pilot,
    PilotState,
    Release,
    Retire,
    Snapshot,
)


def reserve_lead(memory: CycleMemory, config: Config) -> float:
    """The reserve's lead time: from a slot being taken to a new pilot taking jobs, at
    the quickest site that has learnt its queue: one quick check, its expected queue
    wait and boot time; ``reserve.lead_s`` while no site has learnt one."""
    learnt = [config.policy.quick_check_s + e.wait_s + e.boot_s
              for e in memory.estimates.values() if e.samples > 0]
    return min(learnt, default=config.policy.reserve.lead_s)


def reserve_size(matchable_arrivals: int, window_s: float, config: Config,
                 departures: int | None = None, quiet_s: float = 0.0,
                 lead_s: float | None = None) -> int:
    """Job slots to keep free for jobs about to arrive (see `ReserveConfig`).

    Over one lead time `lead_s` (None: ``reserve.lead_s``) ``A ~ Poisson(a)`` jobs arrive
    and ``D ~ Poisson(d)`` leave (freeing their slots), ``a`` and ``d`` scaled from the
    window's counts, departures counted at most up to the arrivals (unknown: ``d = a``).
    The queue's expected growth beyond the noise of its estimate, ``g = max(0, a - d -
    noise)``, is added as is. The rest serves two service levels at once, ``eps`` being
    the normal tail beyond ``factor`` standard deviations (2: 2.3 %): the slots run out
    within a lead time with probability about ``eps`` (``factor * sqrt(a + d)``, the
    normal approximation, right for many arrivals), and at most a share ``eps`` of the
    arriving jobs find no slot (the smallest ``R`` with ``E[(A - D - R)+] <= eps * a``,
    less the expected growth; exact for few arrivals, where the normal approximation
    keeps too few). Capped at ``max_jobs``; factor 0, no arrivals or no window: none. When nothing
    arrived for `quiet_s` seconds, longer than ``quiet_gaps`` mean gaps between arrivals,
    arrivals stopped: the reserve decays by e every lead time beyond that."""
    r = config.policy.reserve
    lead = r.lead_s if lead_s is None else lead_s
    # a factor too small for its tail to differ from one half in floating point is 0
    if (not r.enabled or window_s <= 0 or matchable_arrivals <= 0 or r.max_jobs <= 0
            or _tail(r.factor) >= 0.5):
        return 0
    arrived = matchable_arrivals
    left = arrived if departures is None else min(arrived, max(0.0, departures))
    scale = lead / window_s  # window counts -> one lead time
    a, d = arrived * scale, left * scale
    # growth counts only beyond its own sampling noise (one standard deviation of the
    # difference of two Poisson counts over the window): a steady queue adds nothing
    noise = math.sqrt(arrived + left) * scale
    # slots run out within a lead time with probability eps; at most eps of the jobs
    # find none (beyond the expected growth a - d, which the first term holds)
    service = max(r.factor * math.sqrt(a + d),
                  fill_rate_stock(a, d, _tail(r.factor), r.max_jobs) - (a - d))
    want = max(0.0, a - d - noise) + service
    stopped = quiet_s - r.quiet_gaps * window_s / arrived
    if stopped > 0:
        want *= math.exp(-stopped / lead) if lead > 0 else 0.0
    return max(0, min(r.max_jobs, math.ceil(want - 1e-9)))


def _tail(z: float) -> float:
    """P(N > z) for a standard normal N."""
    return 0.5 * math.erfc(z / math.sqrt(2))


def fill_rate_stock(a: float, d: float, eps: float, most: int) -> int:
    """Smallest R in [0, most] with E[(A - D - R)+] <= eps * a, A ~ Poisson(a) and
    D ~ Poisson(d) independent."""
    if a <= 0:
        return 0
    if a + d > 60:  # normal approximation of A - D
        mu, sigma = a - d, math.sqrt(a + d)
        for stock in range(most + 1):
            z = (stock - mu) / sigma
            loss = sigma * (math.exp(-z * z / 2) / math.sqrt(2 * math.pi) - z * _tail(z))
            if loss <= eps * a:
                return stock
        return most
    top = int(a + 10 * math.sqrt(a) + 10)
    p_a = _poisson(a, top)
    p_d = _poisson(d, top)
    # distribution of the net growth A - D, for the values above zero
    net = [0.0] * (top + 1)
    for i, pa in enumerate(p_a):
        for j, pd in enumerate(p_d[: i + 1]):
            net[i - j] += pa * pd
    for stock in range(most + 1):
        loss = sum((k - stock) * p for k, p in enumerate(net) if k > stock)
        if loss <= eps * a:
            return stock
    return most


def _poisson(mean: float, top: int) -> list[float]:
    out = [math.exp(-mean)]
    for k in range(1, top + 1):
        out.append(out[-1] * mean / k)
    return out


#: (cpus, gpus, DesiredSites, sites matching the Requirements: () = not evaluated, any,
#: accounting group: "" = none, or groups not in use)
_Key = tuple[int, int, tuple[str, ...], tuple[str, ...], str]


def reserve_rows(snapshot: Snapshot, memory: CycleMemory, config: Config,
                 sites: Sequence[SiteBase], now: float,
                 matches: ShapeMatches | None = None) -> tuple[list[Row], int]:
    """The reserve as rows (marked `reserve`), largest first, and the size the arrivals
    ask for (before `CycleMemory.reserve_hold`).

    Recently arrived matchable jobs are grouped by (cpus, gpus, DesiredSites, the sites
    whose pilot matches their Requirements, the accounting group where groups are in
    use: a reserve row carries its group, so that only pilots serving it hold it); a
    group's reserve slot takes the largest memory seen in it and no stated runtime, so one slot
    fits any recent job of that group. The reserve is split over the groups in proportion
    to the square root of their arrivals (largest remainder). Jobs that arrived at fewer
    than ``min_arrival_times`` distinct times are no rate: no reserve. The size is at least
    `CycleMemory.reserve_hold` while any arrival is in the window. `matches`: the
    cycle's matches so far, for the sites `sites`."""
    times = memory.arrival_times
    if times is not None and times < config.policy.reserve.min_arrival_times:
        return [], 0
    counts, largest_mb = _groups(snapshot, sites, matches)
    lead = reserve_lead(memory, config)
    counts, worth, spent = _worth_reserving(counts, memory, config, sites, lead)
    total = sum(counts.values())
    last = snapshot.last_arrival_at
    quiet = 0.0 if last is None else max(0.0, now - last)
    size = reserve_size(seen_arrivals(total, memory.arrivals_in_window),
                        memory.arrival_window_s, config, memory.recent_departures, quiet, lead)
    if total == 0:
        return [], 0
    quota = _split_within(max(size, min(memory.reserve_hold,
                                        config.policy.reserve.max_jobs)), counts, worth)
    r = config.policy.reserve
    for key, (left, mean) in spent.items():
        quota[key] = spent_slots(quota.get(key, 0), left, mean, r.min_use_chance,
                                 _tail(r.factor))
    rows: list[Row] = []
    for key, n in quota.items():
        if n <= 0:
            continue
        cpus, gpus, desired, matched, group = key
        shape = JobShape(cpus, largest_mb[key], gpus=gpus, desired_sites=desired,
                         group=group)
        item = item_of(shape)
        fits = [name for name in fitting_sites(shape, sites, item)
                if not matched or name in matched]
        if fits:  # the largest memory of a group may fit fewer sites than its jobs do
            rows.append(Row(item, shape, n, fits, reserve=True))
    rows.sort(key=Row.size_key, reverse=True)
    return rows, size


def seen_arrivals(counted: int, times: int) -> int:
    """The arrivals of a window: `counted` the jobs submitted within it still in the
    queue, `times` the distinct arrival times seen within it (each at least one job).
    A window longer than jobs run has lost the finished ones from `counted` (a trickle
    of hour-long jobs over a two-hour window: about half), never from `times`; neither
    counts a job that did not arrive, so the larger is the better count. Only arrivals
    some site can run are counted, so `times` counts only while `counted` does."""
    return max(counted, times) if counted > 0 else 0


def _groups(snapshot: Snapshot, sites: Sequence[SiteBase],
            matches: ShapeMatches | None = None) -> tuple[Counter[_Key], dict[_Key, int]]:
    """Recent matchable arrivals per reserve group, and each group's largest memory."""
    if matches is None:
        matches = ShapeMatches(sites)
    counts: Counter[_Key] = Counter()
    memory: dict[_Key, int] = {}
    for d in snapshot.recent_arrivals:
        if d.idle <= 0:
            continue
        shape = d.shape
        item, fits, _why = matches.of(d)
        if not fits:
            continue  # unmatchable arrivals never cause a reserve
        key = (item.cpus, item.gpus, shape.desired_sites,
               tuple(sorted(d.sites)) if d.sites is not None else (), shape.group)
        counts[key] += d.idle
        memory[key] = max(memory.get(key, 0), shape.memory_mb)
    return counts, memory


def _worth_reserving(counts: Counter[_Key], memory: CycleMemory, config: Config,
                     sites: Sequence[SiteBase], lead: float
                     ) -> tuple[Counter[_Key], dict[_Key, int], dict[_Key, tuple[int, float]]]:
    """The groups a reserve slot pays for, how many slots of each pay at most (groups
    absent: no such limit), and for the groups of a spent shape (the room left, its
    jobs expected within a no-claim time) (`spent_slots`).

    A group is kept if its first slot pays for its idle time at the price of
    ``reserve.max_idle_leads`` lead times (`lead`: the wait a slot saves) per use
    (`slots_worth`), or no group kept for that price shares room with it (same GPUs, a
    common site: its jobs can take that room, which the reserve then replaces; a shape
    alone, as in a trickle of one-core jobs, keeps its own); its next
    job is likely (``reserve.min_use_chance``) to arrive within the no-claim time of a
    pilot where it would wait (the shortest among the group's sites). If a reserve
    pilot that served its shape ended unclaimed since the shape's last arrival
    (`CycleMemory.reserve_spent`), it holds what `spent_slots` keeps. A group kept for the price
    that shares room with another kept group holds at most the slots that each pay
    (`slots_worth`); one alone holds
    what the size gives it."""
    window = memory.arrival_window_s
    chance = config.policy.reserve.min_use_chance
    leads = config.policy.reserve.max_idle_leads
    noclaim = {s.name: s.runtime.noclaim_shutdown_s for s in sites}
    arrived = shape_arrivals(counts)
    out: Counter[_Key] = Counter()
    worth: dict[_Key, int] = {}
    room_of: dict[_Key, set[str]] = {}
    slow: dict[_Key, tuple[int, set[str]]] = {}
    kept: list[tuple[int, set[str]]] = []  # (gpus, sites) of the groups that keep room
    capped: dict[_Key, tuple[int, float]] = {}  # spent groups: (room left, jobs per hold)
    for key, n in counts.items():
        cpus, gpus, desired, matched, _group = key
        names = [s.name for s in sites if (not desired or s.name in desired)
                 and (not matched or s.name in matched)]
        hold = min((noclaim[name] for name in names), default=0)
        rate = memory.shape_rates.get((cpus, gpus))
        if rate is None:
            rate = n / window if window > 0 else 0.0
        else:  # the shape's long-run rate, shared among its groups by their arrivals
            rate *= n / arrived[(cpus, gpus)]
        if 1 - math.exp(-rate * hold) < chance:
            continue
        spent = memory.reserve_spent.get((cpus, gpus))
        if spent is not None:  # a slot idled out: (room left then, the likely slots)
            capped[key] = (spent, rate * hold)
        if leads > 0:
            worth[key] = slots_worth(rate, hold, leads * lead, config.policy.reserve.max_jobs)
            if worth[key] == 0:
                del worth[key]
                slow[key] = (n, set(names))
                continue
        out[key] = n
        room_of[key] = set(names)
        kept.append((gpus, room_of[key]))
    for key, (n, room) in slow.items():  # no room of another shape to share: its own
        if not any(g == key[1] and room & where for g, where in kept):
            out[key] = n
    # a shape alone keeps the slots the size gives it (as a trickle keeps its reserve)
    alone = [key for key in worth
             if sum(1 for g, where in kept if g == key[1] and where & room_of[key]) < 2]
    for key in alone:
        del worth[key]
    return out, worth, {key: c for key, c in capped.items() if key in out}


def spent_slots(held: int, left: int, mean: float, chance: float, eps: float) -> int:
    """The slots a group of a spent shape keeps (`NoClaimWatch`), of the `held` its size
    gives: `left` the room for it the idle pilots had when its slot idled out, `mean` its
    jobs expected within a pilot's no-claim time (N ~ Poisson(mean)). Its last slot
    idles out with probability ``P(N < held)``: no rarer than the reserve's own tail
    `eps`, the idle-out is what the forecast expects of a sparse stream, and the slots
    likely to be used (`likely_slots` at `chance`) stay; rarer, the forecast is wrong
    for this shape, and only the room left is held until its next job."""
    pmf, below = math.exp(-mean), 0.0
    for k in range(held):  # P(N < held)
        below += pmf
        pmf *= mean / (k + 1)
    if below < eps:
        return min(held, left)
    return min(held, max(left, likely_slots(mean, chance, held)))


def likely_slots(mean: float, chance: float, most: int) -> int:
    """The most slots k (at most `most`) whose job is at least `chance` likely to come:
    ``P(N >= k) >= chance`` for the jobs N ~ Poisson(`mean`) of a no-claim time."""
    pmf = math.exp(-mean)  # P(N = k - 1)
    below = 0.0  # P(N <= k - 2)
    for k in range(1, most + 1):
        below += pmf  # P(N <= k - 1)
        if 1.0 - below < chance:
            return k - 1
        pmf *= mean / k
    return most


def slots_worth(rate: float, hold: float, value_s: float, most: int) -> int:
    """How many reserve slots of one shape pay for themselves, at most `most`: slot k
    idles until the k-th job of the shape arrives (``T_k ~ Gamma(k, rate)``: at the
    earliest, as if no slot came back meanwhile) or its pilot's no-claim shutdown
    (`hold` s), and a use saves `value_s` seconds of idle cores (the price of the wait
    it saves). Slot k pays while ``E[min(T_k, hold)] <= value_s * P(T_k < hold)``; the
    idle time per use grows with k, so the first slot that does not pay ends the count.
    The first slot pays exactly when ``rate * value_s >= 1`` (the hold cancels)."""
    if rate <= 0 or hold <= 0:
        return 0
    mean = rate * hold  # jobs of the shape within one no-claim time, N ~ Poisson(mean)
    pmf = math.exp(-mean)  # P(N = k - 1)
    below = pmf  # P(N <= k - 1)
    idle = 0.0
    for k in range(1, most + 1):
        used = max(0.0, 1.0 - below)  # P(N >= k) = P(T_k < hold)
        idle += used / rate  # E[min(T_k, hold)] = sum over j <= k of P(N >= j) / rate
        if used <= 0.0 or idle > value_s * used * (1 + 1e-9):
            return k - 1
        pmf *= mean / k
        below += pmf
    return most


def shape_arrivals(counts: Mapping[_Key, int]) -> Counter[tuple[int, int]]:
    """Arrivals per (cpus, gpus)."""
    out: Counter[tuple[int, int]] = Counter()
    for (cpus, gpus, _d, _m, _g), n in counts.items():
        out[(cpus, gpus)] += n
    return out


@dataclass
class ShapeRates:
    """Arrival rate per shape (cpus, gpus) over ``reserve.evidence_s`` (pure).

    One window's count of a rare shape says little (seen once in 15 minutes, it looks
    like four an hour); the time-weighted mean of the windows' rates over the evidence
    span, zeros included, does not overstate it."""

    samples: list[tuple[float, Mapping[tuple[int, int], float], float]] = field(
        default_factory=list)  # (time, arrivals per shape, window)

    def observe(self, snapshot: Snapshot, window_s: float, config: Config,
                now: float, times: int = 0) -> None:
        """Learn the arrivals per shape of `snapshot`, which covers the last
        `window_s` seconds (0: none read), in which `times` distinct arrival times were
        seen: where they are more than the jobs counted (finished jobs left the queue,
        `seen_arrivals`), each shape's count is scaled up by the same share."""
        if window_s <= 0:
            return
        counts, _memory = _groups(snapshot, config.sites)
        shapes = shape_arrivals(counts)
        counted = sum(shapes.values())
        scale = times / counted if counted and times > counted else 1.0
        self.samples.append((now, {k: n * scale for k, n in shapes.items()}, window_s))
        span = config.policy.reserve.evidence_s
        self.samples = [s for s in self.samples if s[0] > now - span]

    def rates(self, now: float) -> dict[tuple[int, int], float]:
        """Jobs/s per shape: each sample weighted by the time to the next (the last by
        the time since it, at least one second)."""
        if not self.samples:
            return {}
        total: dict[tuple[int, int], float] = {}
        weight = 0.0
        for i, (t, counts, window) in enumerate(self.samples):
            following = self.samples[i + 1][0] if i + 1 < len(self.samples) else now
            w = max(1.0, following - t)
            weight += w
            for shape, n in counts.items():
                total[shape] = total.get(shape, 0.0) + w * n / window
        return {shape: v / weight for shape, v in total.items()}


@dataclass
class NoClaimWatch:
    """The controller's memory of reserve pilots that ended unclaimed (pure).

    A pilot that a cycle left idle (not released, cancelled or retired) and that is gone
    at the next cycle, well before its walltime margin, ended by itself: its startd's
    no-claim shutdown (`STARTD_NOCLAIM_SHUTDOWN`). While a reserve is held, its shape
    (cpus, gpus) (a pilot that held several slots: the largest arriving shape it fits)
    is *spent*, with the room for the shape the idle pilots left then have, until a job
    of the shape arrives again, or for ``reserve.evidence_s`` at most (`spent_slots`:
    what its reserve keeps meanwhile). An arrival is seen as the shape's count of recent
    arrivals rising from one cycle to the next (the count itself falls and rises as jobs
    finish and the window slides, so no fixed count marks "more")."""

    left_idle: dict[str, Pilot] = field(default_factory=dict)  # key -> as last seen
    #: shape -> (when it was spent, its count of recent arrivals at the last cycle, the
    #: room for it the idle pilots left then had)
    spent: dict[tuple[int, int], tuple[float, int, int]] = field(default_factory=dict)

    def observe(self, snapshot: Snapshot, config: Config, now: float) -> None:
        """Learn from `snapshot` (a committed cycle's) which idle pilots ended by
        themselves; forget what new arrivals or time made stale."""
        known = {v.name for v in snapshot.sites if v.known}
        present = {p.key for p in snapshot.pilots}
        margin = {s.name: s.pilot.shutdown_margin_s for s in config.sites}
        counts, _memory = _groups(snapshot, config.sites)
        arrived = shape_arrivals(counts)
        keep = config.policy.reserve.evidence_s
        self.spent = {shape: (t, arrived[shape], left)
                      for shape, (t, n, left) in self.spent.items()
                      if now - t < keep and arrived[shape] <= n}
        for key, p in self.left_idle.items():
            if key in present or p.site not in known or p.site not in margin:
                continue
            end = p.walltime_end
            if end is not None and now >= end - margin[p.site]:
                continue
            # its shape; a pilot that held several slots: the largest arriving shape in it
            fits = [a for a in arrived if a[0] <= p.cpus and a[1] <= p.gpus]
            shape = (p.cpus, p.gpus) if (p.cpus, p.gpus) in arrived else max(
                fits, default=(p.cpus, p.gpus))
            left = _idle_slots(snapshot.pilots, shape)
            before = self.spent.get(shape)
            self.spent[shape] = (now, arrived[shape],
                                 left if before is None else min(before[2], left))

    def after(self, snapshot: Snapshot, actions: Iterable[Action], reserve: int) -> None:
        """The pilots this cycle leaves idle, while it holds a reserve (`reserve` slots)."""
        told = {a.pilot.key for a in actions if isinstance(a, (Release, Cancel, Retire))}
        self.left_idle = {p.key: p for p in snapshot.pilots if reserve > 0
                          and p.state is PilotState.IDLE and p.key not in told}

    def limits(self) -> dict[tuple[int, int], int]:
        """For `CycleMemory.reserve_spent`."""
        return {shape: left for shape, (_t, _n, left) in self.spent.items()}


def _idle_slots(pilots: Iterable[Pilot], shape: tuple[int, int]) -> int:
    """Jobs of `shape` (cpus, gpus) the idle pilots of `pilots` have the cores and GPUs
    for."""
    cpus, gpus = shape
    return sum(min(p.free_cpus // max(1, cpus), p.free_gpus // gpus if gpus else p.free_cpus)
               for p in pilots if p.state is PilotState.IDLE)


def _split_within(size: int, counts: Counter[_Key], most: Mapping[_Key, int]
                  ) -> dict[_Key, int]:
    """`_split`, each group at most `most` slots (absent: no limit); slots beyond that
    are not kept."""
    return {key: min(n, most.get(key, n)) for key, n in _split(size, counts).items()}


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
