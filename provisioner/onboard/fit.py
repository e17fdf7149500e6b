"""Does a site's configuration fit what its SLURM offers? (pure)

`slurm_checks` turns a site block and SLURM's own description of its partitions and
nodes (provisioner.onboard.slurminfo) into check rows, each naming the
configuration field at fault and the value SLURM reported. `differences` lists every
field of the block that differs from the live site (``check-config --live``).
"""

from __future__ import annotations

from collections.abc import Sequence

from provisioner.config import SlurmSiteBase
from provisioner.onboard.slurminfo import Node, Partition, pick_partition
from provisioner.onboard.table import Check, failed, passed, skipped

S = "slurm"


def _dur(seconds: int | None) -> str:
    if seconds is None:
        return "UNLIMITED"
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def partition_of(index: int, site: SlurmSiteBase, partitions: Sequence[Partition]
                 ) -> tuple[Partition | None, Check]:
    """The site's partition (or SLURM's default) and the row saying so."""
    field = f"sites[{index}].partition"
    part = pick_partition(list(partitions), site.partition)
    names = ", ".join(p.name + ("*" if p.default else "") for p in partitions) or "none"
    if part is None:
        what = f"no partition {site.partition!r}" if site.partition else "no default partition"
        return None, failed("partition exists", f"{what} (partitions: {names})",
                            f"set {field} to one of: {names}", S)
    if part.state.upper() != "UP":
        return part, failed("partition exists", f"{part.name} is {part.state}",
                            f"ask the site why partition {part.name} is {part.state}, "
                            f"or set {field} to another one ({names})", S)
    how = "given" if site.partition else "SLURM's default"
    return part, passed("partition exists", f"{part.name} ({how}), State=UP, "
                        f"nodes {part.nodes}", S)


def walltime_check(index: int, site: SlurmSiteBase, part: Partition) -> Check:
    limit = part.max_time_s
    want = site.pilot.walltime_s
    found = f"MaxTime={_dur(limit)} ({limit if limit is not None else 'no limit'} s), " \
            f"pilot.walltime_s {want}"
    if limit is not None and want > limit:
        return failed("MaxTime >= pilot walltime", found,
                      f"lower sites[{index}].pilot.walltime_s to at most {limit} (and "
                      f"sites[{index}].max_walltime_s to {limit}), or use a partition "
                      "with a longer MaxTime", S)
    if limit is not None and site.max_walltime_s > limit:
        return failed("MaxTime >= pilot walltime", found + f", max_walltime_s "
                      f"{site.max_walltime_s}", f"set sites[{index}].max_walltime_s to "
                      f"{limit} (partition {part.name}'s MaxTime)", S)
    return passed("MaxTime >= pilot walltime", found, S)


def account_check(index: int, site: SlurmSiteBase, part: Partition) -> Check:
    allowed = ",".join(part.allow_accounts)
    if part.allows_account(site.account):
        who = site.account or "the account's default"
        return passed("account allowed", f"{who} (AllowAccounts={allowed})", S)
    return failed("account allowed", f"account {site.account!r} not allowed in "
                  f"{part.name} (AllowAccounts={allowed}, "
                  f"DenyAccounts={','.join(part.deny_accounts) or 'none'})",
                  f"set sites[{index}].account to an allowed account", S)


def _biggest(nodes: Sequence[Node]) -> str:
    return ", ".join(f"{n.name}: {n.cpus} CPUs, {n.real_memory_mb} MB"
                     + (f", {n.gpus.count} GPUs" if n.gpus.count else "") for n in nodes[:4])


def node_check(index: int, site: SlurmSiteBase, part: Partition, nodes: Sequence[Node]
               ) -> Check:
    """Some node of the partition holds a whole pilot (cores, memory, GPUs, type)."""
    p, f = site.pilot, f"sites[{index}].pilot"
    if not nodes:
        return failed("a node fits the pilot", f"partition {part.name} lists no nodes",
                      f"ask the site, or set sites[{index}].partition to another one", S)
    cap_cpus = part.max_cpus_per_node
    cap_mem = part.max_mem_per_node_mb
    fits = [n for n in nodes
            if min(n.cpus, cap_cpus or n.cpus) >= p.cpus
            and min(n.real_memory_mb, cap_mem or n.real_memory_mb) >= p.memory_mb
            and n.gpus.count >= p.gpus
            and (site.gpu_type is None or site.gpu_type in n.gpus.types)]
    want = f"pilot {p.cpus} CPUs, {p.memory_mb} MB" + (f", {p.gpus} GPUs" if p.gpus else "")
    if fits:
        return passed("a node fits the pilot", f"{want}: {len(fits)} of {len(nodes)} "
                      f"node(s) ({_biggest(fits)})", S)
    most_cpus = max(min(n.cpus, cap_cpus or n.cpus) for n in nodes)
    most_mem = max(min(n.real_memory_mb, cap_mem or n.real_memory_mb) for n in nodes)
    most_gpus = max(n.gpus.count for n in nodes)
    fixes = []
    if p.cpus > most_cpus:
        fixes.append(f"{f}.cpus to at most {most_cpus}")
    if p.memory_mb > most_mem:
        fixes.append(f"{f}.memory_mb to at most {most_mem}")
    if p.gpus > most_gpus:
        fixes.append(f"{f}.gpus to at most {most_gpus}")
    types = sorted({t for n in nodes for t in n.gpus.types})
    if site.gpu_type is not None and site.gpu_type not in types:
        fixes.append(f"sites[{index}].gpu_type to one of {types or 'none (untyped)'}")
    fix = "lower " + " and ".join(fixes) if fixes else \
        f"no single node has all of it: lower {f}.cpus, memory_mb or gpus"
    return failed("a node fits the pilot", f"{want}; largest: {_biggest(nodes)}", fix, S)


def shape_check(index: int, site: SlurmSiteBase, part: Partition, nodes: Sequence[Node]
                ) -> Check:
    """A whole-node partition gives every pilot a whole node: pilots must be sized so."""
    f = f"sites[{index}].pilot"
    if not part.whole_node:
        return passed("pilot shape", f"shared nodes (OverSubscribe={part.oversubscribe}): "
                      f"pilots of {site.pilot.min_cpus}-{site.pilot.cpus} cores", S)
    node_cpus = min((n.cpus for n in nodes), default=0)
    if site.pilot.min_cpus < node_cpus or site.pilot.cpus < node_cpus:
        return failed("pilot shape", f"whole nodes only (OverSubscribe={part.oversubscribe}"
                      f", {node_cpus} CPUs each) but pilots of {site.pilot.min_cpus}-"
                      f"{site.pilot.cpus} cores", f"set {f}.cpus and {f}.min_cpus to "
                      f"{node_cpus}: SLURM allocates the whole node to every pilot", S)
    return passed("pilot shape", f"whole nodes (OverSubscribe={part.oversubscribe}), "
                  f"pilots of {site.pilot.cpus} cores", S)


def slurm_checks(index: int, site: SlurmSiteBase, partitions: Sequence[Partition],
                 nodes: Sequence[Node]) -> list[Check]:
    """Partition, time limit, account, node fit and shape, in that order."""
    part, exists = partition_of(index, site, partitions)
    names = ("MaxTime >= pilot walltime", "account allowed", "a node fits the pilot",
             "pilot shape")
    if part is None:
        return [exists, *(skipped(n, "no partition", S) for n in names)]
    in_part = [n for n in nodes if part.name in n.partitions] or list(nodes)
    return [exists, walltime_check(index, site, part), account_check(index, site, part),
            node_check(index, site, part, in_part), shape_check(index, site, part, in_part)]


def differences(index: int, site: SlurmSiteBase, partitions: Sequence[Partition],
                nodes: Sequence[Node]) -> list[str]:
    """Every way the block differs from the live site, one line each, naming the field
    and both values (``check-config --live``). Empty: the block matches."""
    out = [f"{c.name}: {c.found} -> {c.fix}"
           for c in slurm_checks(index, site, partitions, nodes) if c.ok is False]
    part = pick_partition(list(partitions), site.partition)
    if part is not None and part.max_time_s is not None \
            and site.max_walltime_s < part.max_time_s:
        out.append(f"sites[{index}].max_walltime_s: {site.max_walltime_s} in the "
                   f"configuration, {part.max_time_s} (MaxTime={_dur(part.max_time_s)}) "
                   f"at the site")
    return out
