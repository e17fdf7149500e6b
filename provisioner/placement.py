"""Where demand goes (pure): each site's expected time to a usable slot, and how a row's
jobs are shared among sites that are equally good.

A site's *lead* is its expected SLURM queue wait plus boot time (`SiteEstimate`, learnt by
the controller; defaults from `policy.placement` for a site without history), or, if
longer, the age of its oldest pilot still pending now (a queue that got slow shows there
first). The lead is divided by the site's weight: a weight scales, it does not order. A
row that could not fill a site's smallest pilot is charged the cores that pilot would
leave unused. Sites within `tie_share` of the best *share* a row; no site wins a tie by
its name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from provisioner.config import Config, PlacementConfig
from provisioner.matching import Row
from provisioner.model import PilotState, SiteEstimate, Snapshot


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


def site_leads(snapshot: Snapshot, config: Config, now: float) -> dict[str, float]:
    """Per site: expected seconds from a submission now to a usable slot, over weight
    (inf for weight 0)."""
    placement = config.policy.placement
    oldest: dict[str, float] = {}
    for p in snapshot.pilots:
        if p.state is PilotState.PENDING:
            oldest[p.site] = max(oldest.get(p.site, 0.0), now - p.submitted_at)
    out = {}
    for s in config.sites:
        est = estimate_of(s.name, snapshot.estimates, placement)
        lead = max(est.wait_s, oldest.get(s.name, 0.0)) + est.boot_s
        out[s.name] = (lead + 1.0) / s.weight if s.weight > 0 else math.inf
    return out


def ranked(row: Row, leads: Mapping[str, float], min_cpus: Mapping[str, int],
           tie_share: float) -> list[list[str]]:
    """The row's sites in tiers of equal cost, best first. Cost is the lead, times the
    share of a smallest pilot the row's jobs would leave unused."""
    need = max(1, row.item.cpus * row.left)
    costs = {s: leads[s] * max(1.0, min_cpus[s] / need) for s in row.sites}
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
