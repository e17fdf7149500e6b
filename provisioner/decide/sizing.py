"""How big a new pilot is (pure): the site's scarce resource decides.

Where cores are what a site runs out of, a new pilot is sized to the jobs it takes:
packed up to the site's `pilot.pack_cpus`, then sized down to what it holds (from
`min_cpus`), so that little idles when its last job runs on alone.

Where the *number* of pilots is the limit, small pilots waste what is scarce: each
allowed pilot should carry its share of the work. A site is *pilot-bound* while SLURM
has taught it a limit on its pilots (a submission or a job-count limit,
`CycleMemory.pilot_limits`). Its new pilots then take the work's share per allowed pilot
(the learnt limit, or `caps.max_pilots` if lower): the cores its pilots run plus those
of the waiting jobs it fits, over the pilots it may hold, between its `pack_cpus` and
its whole shape. Jobs are packed into them up to that, and the pilot asks for at least
that: jobs arriving later fill the room instead of waiting for a pilot the limit does
not give. A limit that allows more pilots than the work needs gives pilots of the
work's size, so no more cores idle there than where cores are the limit.

A configured `caps.max_pilots` alone does not make a site pilot-bound: work beyond it
is most often a burst, and pilots sized up for a burst run part-empty once it drains
(in the bench's bursty world on the heterogeneous sites that cost 1.5-2 points of
efficiency, below the plain policy on one seed), where its overflow to the other site
fills whole pilots.

The reserve's slots are packed into as few new pilots as each site's shape allows
where, alone, they would wait longer than a pilot waits unclaimed (`pack_reserve`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Protocol

from provisioner.config import SiteBase
from provisioner.decide.matching import Row
from provisioner.decide.packing import NewPilots


class SiteRowLike(Protocol):
    """What sizing reads of a site's row (`provisioner.decide.capacity.SiteRow`)."""

    config: SiteBase
    new: NewPilots | None


def bound_sizes(rows: Iterable[Row], sites: Mapping[str, SiteBase],
                limits: Mapping[str, int], running: Mapping[str, int]) -> dict[str, int]:
    """Per pilot-bound site of `sites`, the cores its new pilots take (absent: sized to
    their jobs). `rows`: the real jobs not placed yet, at every site that fits them;
    `limits`: the pilots a learnt SLURM limit lets it hold; `running`: the cores its
    pilots' jobs use."""
    cores: dict[str, int] = {}
    for row in rows:
        if row.reserve or row.left <= 0:
            continue
        for name in row.sites:
            cores[name] = cores.get(name, 0) + row.left * row.item.cpus
    out = {}
    for name, site in sites.items():
        pack = site.pilot.pack_cpus
        if name not in limits:
            continue
        allowed = min(limits.get(name, site.caps.max_pilots), site.caps.max_pilots)
        share = math.ceil((running.get(name, 0) + cores.get(name, 0)) / max(1, allowed))
        size = min(site.pilot.cpus, max(pack, share))
        if size > pack:
            out[name] = size
    return out


def new_pilot_size(site: SiteBase, used_cpus: int, used_mem: int, used_gpus: int = 0,
                   at_least: int = 0) -> tuple[int, int, int]:
    """(cpus, memory_mb, gpus) of a new pilot holding the given jobs: sized down to them
    (from `min_cpus`, or from `at_least` cores at a pilot-bound site; at least
    `memory_per_cpu_mb` per core); GPUs only as many as its jobs use (a GPU site's pilot
    for CPU-only jobs asks SLURM for none)."""
    p = site.pilot
    cpus = min(p.cpus, max(p.min_cpus, at_least, used_cpus))
    memory = min(p.memory_mb, max(p.memory_per_cpu_mb * cpus, used_mem))
    return cpus, memory, min(p.gpus, used_gpus)


def pack_reserve(sites: Iterable[SiteRowLike], slots: int, rate: float | None) -> bool:
    """Before the reserve's `slots` go into new pilots: where they would wait for their
    jobs longer than a pilot waits unclaimed (no fewer slots than the jobs expected,
    at `rate` jobs/s, within the shortest `runtime.noclaim_shutdown_s` of `sites`: the
    last ones are as likely as not to idle out alone), pack them up to each site's whole
    shape (then sized down to what they hold), and return True. A pilot that runs one
    of its slots' jobs is not idle, so its no-claim shutdown does not end the slots
    left, and slots kept together serve a rarer, larger job too. Otherwise each slot
    keeps the site's packing size (also while no rate is learnt, `rate` None): no
    pilot's last job runs on alone for them."""
    sites = list(sites)
    hold = min((s.config.runtime.noclaim_shutdown_s for s in sites), default=0)
    if rate is None or slots <= 0 or slots < rate * hold:
        return False
    for s in sites:
        if s.new is not None:
            s.new.pack_cpus = s.config.pilot.cpus
    return True
