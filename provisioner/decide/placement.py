"""Where demand goes (pure): each site's expected time to a usable slot, and how a row's
jobs are shared among sites that are equally good.

A site's *lead* is its expected SLURM queue wait plus boot time (`SiteEstimate`, learnt by
the controller; defaults from `policy.placement` for a site without history), raised
when its pending pilots have all waited longer (`site_leads`). The lead is divided by
the site's weight: a weight scales, it does not order. A row that could not fill a
site's smallest pilot is charged the cores that pilot would leave unused. Sites within
`tie_share` of the best *share* a row; no site wins a tie by its name, and the share is
moved so that no site gets a remainder it would need a whole node for (`whole_pilots`).
Pending pilots count as capacity only while no new pilot elsewhere would beat them
(`slow_pending`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from provisioner.config import Config, PlacementConfig
from provisioner.decide.matching import Row
from provisioner.model import CycleMemory, Pilot, PilotState, SiteEstimate, Snapshot

#: A module constant: on Python 3.11 reading an enum member off its class
#: (`PilotState.PENDING`) costs a descriptor call, and these loops run once per pilot.
_PENDING = PilotState.PENDING


def estimate_of(site: str, estimates: Mapping[str, SiteEstimate],
                placement: PlacementConfig) -> SiteEstimate:
    """The site's learnt estimate; without history, as quick as the quickest learnt site
    (at most the configured default), so that it gets demand and is learnt."""
    known = estimates.get(site)
    if known is not None and known.samples > 0:
        return known
    learnt = [e.wait_s for e in estimates.values() if e.samples > 0]
    wait = min([placement.default_wait_s, *learnt])
    return SiteEstimate(wait, known.boot_s if known else placement.default_boot_s, 0)


def site_leads(snapshot: Snapshot, memory: CycleMemory, config: Config,
               now: float, pending: Sequence[Pilot] | None = None) -> dict[str, float]:
    """Per site: expected seconds from a submission now to a usable slot: the expected
    queue wait plus boot. Pending pilots are censored observations: when even the
    youngest pending pilot has waited longer than the estimate, the wait is raised toward
    its age, fully for a site without history and less the more starts it has seen (one
    straggler in a heavy-tailed queue does not make a busy site slow). `pending`: the
    snapshot's PENDING pilots, if already sorted out (`by_state`)."""
    placement = config.policy.placement
    youngest: dict[str, float] = {}
    for p in _pending(snapshot, pending):
        age = max(0.0, now - p.submitted_at)
        youngest[p.site] = min(youngest.get(p.site, age), age)
    out = {}
    for s in config.sites:
        est = estimate_of(s.name, memory.estimates, placement)
        beyond = max(0.0, youngest.get(s.name, 0.0) - est.wait_s)
        out[s.name] = est.wait_s + beyond / (1 + min(est.samples, 10)) + est.boot_s
    return out


def costs_of(leads: Mapping[str, float], config: Config) -> dict[str, float]:
    """Leads scaled by weight (an admin's preference): lead / weight, inf for weight 0."""
    return {s.name: (leads[s.name] + 1.0) / s.weight if s.weight > 0 else math.inf
            for s in config.sites}


def _pending(snapshot: Snapshot, pending: Sequence[Pilot] | None) -> Sequence[Pilot]:
    """The snapshot's PENDING pilots: `pending` if given (already sorted out)."""
    if pending is not None:
        return pending
    return [p for p in snapshot.pilots if p.state is _PENDING]


def slow_pending(snapshot: Snapshot, memory: CycleMemory, config: Config, now: float,
                 leads: Mapping[str, float], open_sites: Iterable[str],
                 pending: Sequence[Pilot] | None = None) -> dict[str, str]:
    """Pending pilots that no longer count as capacity (key -> site): expected to be
    usable later than a new pilot at the quickest site that can take one now, plus
    ``hedge_margin_s``. A pilot's remaining wait is its site's expected wait less its age,
    or its age if longer (queue waits have heavy tails: the longer a pilot waited, the
    longer it is likely to wait). Pilots at sites not read this cycle always count.
    `pending`: the snapshot's PENDING pilots, if already sorted out (`by_state`)."""
    known = {v.name for v in snapshot.sites if v.known}
    best = min((leads[name] for name in open_sites), default=math.inf)
    if best == math.inf:
        return {}
    placement = config.policy.placement
    estimates = {name: estimate_of(name, memory.estimates, placement) for name in known}
    out = {}
    too_late = best + placement.hedge_margin_s
    for p in _pending(snapshot, pending):
        if p.site not in known:
            continue
        est = estimates[p.site]
        age = max(0.0, now - p.submitted_at)
        ready = max(est.wait_s - age, age) + est.boot_s
        if ready > too_late:
            out[p.key] = p.site
    return out


def ranked(row: Row, site_costs: Mapping[str, float], min_cpus: Mapping[str, int],
           tie_share: float) -> list[list[str]]:
    """The row's sites in tiers of equal cost, best first. Cost is the weighted lead,
    times the share of a smallest pilot the row's jobs would leave unused."""
    need = max(1, row.item.cpus * row.left)
    costs = {s: site_costs[s] * max(1.0, min_cpus[s] / need) for s in row.sites}
    tiers: list[list[str]] = []
    for s in sorted(row.sites, key=lambda name: costs[name]):
        if tiers and costs[s] <= costs[tiers[-1][0]] * (1 + tie_share):
            tiers[-1].append(s)
        else:
            tiers.append([s])
    return tiers


def shares(n: int, capacity: Sequence[int], load: Sequence[float]) -> list[int]:
    """`n` jobs over sites in proportion to `capacity` (jobs each can still take), never
    more than a site's capacity; remainders go to the least loaded sites first (ties by
    position). Sums to min(n, sum(capacity))."""
    total = sum(capacity)
    if total <= 0 or n <= 0:
        return [0] * len(capacity)
    n = min(n, total)
    exact = [n * c / total for c in capacity]
    out = [min(c, int(e)) for c, e in zip(capacity, exact, strict=True)]
    rest = n - sum(out)
    order = sorted(range(len(capacity)), key=lambda i: (-(exact[i] - out[i]), load[i], i))
    while rest > 0:
        for i in order:
            if rest and out[i] < capacity[i]:
                out[i] += 1
                rest -= 1
    return out


def _waste(k: int, per_pilot: int, fill: int) -> int:
    """Job slots left empty when `k` jobs go to new pilots of `per_pilot` jobs each, the
    smallest of which the site makes hold `fill` jobs' worth (whole nodes)."""
    if k <= 0 or per_pilot <= 0:
        return 0
    rest = k % per_pilot
    return max(0, min(fill, per_pilot) - rest) if rest else 0


def whole_pilots(split: Sequence[int], capacity: Sequence[int], per_pilot: Sequence[int],
                 fill: Sequence[int], prefer: Sequence[tuple[float, ...]] | None = None
                 ) -> list[int]:
    """`split` (from `shares`) moved until no new pilot is left part-empty that a move
    could fill: a site whose smallest pilot is a whole node (`fill` jobs' worth) would
    otherwise get a remainder of a few jobs and a node for them. A move either takes a
    site's remainder elsewhere or fills a site's last pilot from another site, within
    `capacity`; the move that saves the most empty slots goes first, then the one
    towards the site `prefer` ranks first (lower is better: the weighted lead, then the
    load), then the smaller move (the split stays as even as it can). Sums to
    sum(split)."""
    out = list(split)
    n = len(out)
    rank = list(prefer) if prefer is not None else [()] * n

    def total() -> int:
        return sum(_waste(out[i], per_pilot[i], fill[i]) for i in range(n))

    for _ in range(4 * n * n):
        now = total()
        if now == 0:
            break
        best: tuple[int, tuple[float, ...], int, int, int] | None = None
        for i in range(n):
            for j in range(n):
                if i == j or out[i] == 0:
                    continue
                rest_i = out[i] % per_pilot[i] if per_pilot[i] else 0
                empty_j = _waste(out[j], per_pilot[j], fill[j]) if out[j] else 0
                for d in {rest_i, empty_j}:
                    d = min(d, out[i], capacity[j] - out[j])
                    if d <= 0:
                        continue
                    out[i] -= d
                    out[j] += d
                    saved = now - total()
                    out[i] += d
                    out[j] -= d
                    key = (-saved, rank[j], d, i, j)
                    if saved > 0 and (best is None or key < best):
                        best = key
        if best is None:
            break
        _s, _r, d, i, j = best
        out[i] -= d
        out[j] += d
    return out
