"""How big a new pilot is (pure): the site's scarce resource decides.

Where cores are what a site runs out of, a new pilot is sized to the jobs it takes:
packed up to the site's `pilot.pack_cpus`, then sized down to what it holds (from
`min_cpus`), so that little idles when its last job runs on alone.

Where the *number* of pilots is the limit, small pilots waste what is scarce: each
allowed pilot should carry as much work as it can. A site is *pilot-bound* this cycle
when SLURM taught it a limit on its pilots (a submission or a job-count limit,
`CycleMemory.pilot_bound`), or when the waiting jobs it can run would need more pilots at
its packing size than its `caps.max_pilots` (or its learnt limit) leave. Its new pilots
are then packed up to the site's whole shape and ask for it whole (cores and memory;
GPUs only as its jobs use): jobs that arrive later fill the room instead of waiting for
a pilot the limit does not give.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from provisioner.config import SiteConfig
from provisioner.decide.matching import Row


def pilot_bound(rows: Iterable[Row], sites: Mapping[str, SiteConfig],
                room: Mapping[str, int], learnt: Iterable[str]) -> frozenset[str]:
    """The sites of `sites` whose pilots are the scarce resource this cycle: those in
    `learnt` (a SLURM limit on pilots), and those whose waiting work (the real jobs of
    `rows` not yet placed, at every site that fits them) would need more new pilots at
    the site's packing size than `room` (site -> new pilots its pilot-count caps allow;
    absent: no such cap) leaves."""
    cores: dict[str, int] = {}
    for row in rows:
        if row.reserve or row.left <= 0:
            continue
        for name in row.sites:
            cores[name] = cores.get(name, 0) + row.left * row.item.cpus
    out = {name for name in learnt if name in sites}
    for name, site in sites.items():
        left = room.get(name)
        if left is not None and left > 0 and cores.get(name, 0) > left * site.pilot.pack_cpus:
            out.add(name)
    return frozenset(out)


def pack_cpus(site: SiteConfig, bound: bool) -> int:
    """The cores a new pilot at `site` is packed up to: its whole shape where pilots
    are bound, its `pilot.pack_cpus` otherwise."""
    return site.pilot.cpus if bound else site.pilot.pack_cpus


def new_pilot_size(site: SiteConfig, used_cpus: int, used_mem: int, used_gpus: int = 0,
                   bound: bool = False) -> tuple[int, int, int]:
    """(cpus, memory_mb, gpus) of a new pilot holding the given jobs: sized down to them
    (from `min_cpus`, at least `memory_per_cpu_mb` per core), or the site's whole shape
    where pilots are bound; GPUs only as many as its jobs use (a GPU site's pilot for
    CPU-only jobs asks SLURM for none)."""
    p = site.pilot
    if bound:
        return p.cpus, p.memory_mb, min(p.gpus, used_gpus)
    cpus = min(p.cpus, max(p.min_cpus, used_cpus))
    memory = min(p.memory_mb, max(p.memory_per_cpu_mb * cpus, used_mem))
    return cpus, memory, min(p.gpus, used_gpus)
