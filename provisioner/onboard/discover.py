"""`provisioner site discover`: a site block for the YAML from what SLURM says.

`read_live` asks the site's SLURM (through an Executor: SSH to the login node, or
this host) for its partitions and nodes, and `read_grants` its accounting for the
grants on the accounts the pilots may charge; `site_block` (pure) turns the chosen
partition into a block of the configuration schema (provisioner.config.SiteConfig),
so limits are never copied by hand; `render_block` prints it with comments saying
where each limit came from, and the grants as allocations
(provisioner.onboard.grants).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from provisioner.config import SITE_NAME_PATTERN
from provisioner.errors import BackendError
from provisioner.onboard.grants import Grants, grants_from_shares, render_allocations
from provisioner.onboard.slurminfo import (
    Node,
    Partition,
    SlurmOutputError,
    parse_nodes,
    parse_partitions,
    pick_partition,
)
from provisioner.sites.executor import Executor
from provisioner.sites.shares import SSHARE_MINE

#: Pilots ask for this share of a node's RealMemory (the node's own daemons and the
#: page cache need some): 8000 MB -> 7800 MB.
MEMORY_SHARE = 0.975
#: A pilot's walltime when the partition allows more (or has no limit): a day.
DEFAULT_WALLTIME_S = 86400
_CLUSTER = re.compile(r"^ClusterName\s*=\s*(\S+)\s*$", re.MULTILINE)


class LiveError(Exception):
    """The live site could not be read; the message names the host and command."""


@dataclass(frozen=True)
class Live:
    cluster: str
    partitions: tuple[Partition, ...]
    nodes: tuple[Node, ...]
    #: SLURM's grants on the accounts the pilots may charge (None: not asked for).
    grants: Grants | None = None


def slurm_env(slurm_conf: str | None) -> dict[str, str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    return env


def _run(executor: Executor, argv: list[str], env: Mapping[str, str], where: str) -> str:
    try:
        result = executor.run(argv, env)
    except BackendError as exc:
        raise LiveError(f"{where}: {exc}") from exc
    if result.returncode != 0:
        text = (result.stderr or result.stdout).strip() or f"exit {result.returncode}"
        raise LiveError(f"{where}: {' '.join(argv)}: {text}")
    return result.stdout


def read_live(executor: Executor, slurm_conf: str | None, where: str) -> Live:
    """Partitions, nodes and the cluster's name, in three scontrol calls."""
    env = slurm_env(slurm_conf)
    config = _run(executor, ["scontrol", "show", "config"], env, where)
    m = _CLUSTER.search(config)
    try:
        parts = parse_partitions(_run(executor, ["scontrol", "show", "partition", "-o"],
                                      env, where))
        nodes = parse_nodes(_run(executor, ["scontrol", "show", "node", "-o"], env, where))
    except SlurmOutputError as exc:
        raise LiveError(f"{where}: {exc}") from exc
    return Live(m.group(1) if m else "", tuple(parts), tuple(nodes))


def read_grants(executor: Executor, slurm_conf: str | None, user: str | None) -> Grants:
    """`sshare --json` as the site's account: its own associations, their use and
    grants. A site whose accounting cannot be read has none (the error says why)."""
    try:
        result = executor.run(list(SSHARE_MINE), slurm_env(slurm_conf))
    except BackendError as exc:
        return Grants(error=str(exc))
    if result.returncode != 0:
        said = (result.stderr or result.stdout).strip().splitlines()
        return Grants(error=said[-1] if said else f"sshare exited {result.returncode}")
    try:
        doc = json.loads(result.stdout)
    except json.JSONDecodeError as exc:
        return Grants(error=f"sshare printed no JSON: {exc}")
    return grants_from_shares(doc, user)


@dataclass(frozen=True)
class Access:
    """How the provisioner reaches the site (the block's executor and SLURM_CONF)."""

    host: str | None  # None: commands run on this host (executor type local)
    user: str | None = None
    key_file: str = "/etc/provisioner/ssh/id_ed25519"
    known_hosts: str = "/etc/provisioner/ssh/known_hosts"
    port: int = 22
    slurm_conf: str | None = None
    #: A site without SSH: slurmrestd's URL, and the file of the account's JWT.
    rest_url: str | None = None
    token_file: str | None = None


def site_name(cluster: str, host: str | None) -> str:
    """A valid site name from the cluster's name, else the login host's first label."""
    for raw in (cluster, (host or "").split(".")[0].removesuffix("-login")):
        name = re.sub(r"[^a-z0-9_-]", "-", raw.lower()).strip("-")
        if re.match(SITE_NAME_PATTERN, name):
            return name
    return "site"


def site_block(name: str, part: Partition, nodes: Sequence[Node], access: Access,
               image: str, account: str | None = None) -> dict[str, Any]:
    """The configuration block of a site whose pilots use partition `part`: the
    smallest node's CPUs, memory and GPUs; whole nodes or shared; MaxTime."""
    mine = [n for n in nodes if part.name in n.partitions] or list(nodes)
    if not mine:
        raise LiveError(f"partition {part.name} has no nodes")
    cpus = min(n.cpus for n in mine)
    if part.max_cpus_per_node:
        cpus = min(cpus, part.max_cpus_per_node)
    mem = min(n.real_memory_mb for n in mine)
    if part.max_mem_per_node_mb:
        mem = min(mem, part.max_mem_per_node_mb)
    memory_mb = int(mem * MEMORY_SHARE) // 100 * 100 or mem
    gpus = min(n.gpus.count for n in mine)
    max_time = part.max_time_s or DEFAULT_WALLTIME_S
    block, reach = _access_block(name, access)
    block["partition"] = part.name
    if account:
        block["account"] = account
    block.update({
        "max_walltime_s": max_time,
        **reach,
        "template": "frankfurt.sh.j2" if part.whole_node else "gsi.sh.j2",
        "image": image,
        "pilot": {
            "cpus": cpus,
            "min_cpus": cpus if part.whole_node else 1,
            "memory_mb": memory_mb,
            "memory_per_cpu_mb": max(1, memory_mb // cpus),
            "walltime_s": min(max_time, DEFAULT_WALLTIME_S),
            **({"gpus": gpus} if gpus else {}),
        },
    })
    return block


def _access_block(name: str, access: Access) -> tuple[dict[str, Any], dict[str, Any]]:
    """The block's head (name, backend and its settings) and how its commands are
    run (the executor, which goes after the walltime; none for slurm-rest)."""
    if access.rest_url:
        return {"name": name, "backend": "slurm-rest",
                "rest": {"url": access.rest_url, "user": access.user,
                         "token_file": access.token_file}}, {}
    executor: dict[str, Any]
    if access.host is None:
        executor = {"type": "local"}
    else:
        executor = {"type": "ssh", "host": access.host, "user": access.user,
                    "key_file": access.key_file, "known_hosts": access.known_hosts}
        if access.port != 22:
            executor["port"] = access.port
    block: dict[str, Any] = {"name": name, "backend": "slurm-cli"}
    if access.slurm_conf:
        block["slurm_conf"] = access.slurm_conf
    return block, {"executor": executor}


def describe(part: Partition, nodes: Sequence[Node]) -> str:
    mine = [n for n in nodes if part.name in n.partitions] or list(nodes)
    shapes = sorted({(n.cpus, n.real_memory_mb, n.gpus.count) for n in mine})
    kinds = "; ".join(f"{c} CPUs, {m} MB" + (f", {g} GPUs" if g else "") for c, m, g in shapes)
    mode = "whole nodes (OverSubscribe=EXCLUSIVE)" if part.whole_node else \
        f"shared nodes (OverSubscribe={part.oversubscribe})"
    limit = f"{part.max_time_s} s" if part.max_time_s else "none"
    return (f"partition {part.name}: MaxTime {limit}, {len(mine)} node(s) of {kinds}; "
            f"{mode}; AllowAccounts={','.join(part.allow_accounts)}")


def render_block(block: Mapping[str, Any], part: Partition, nodes: Sequence[Node],
                 others: Sequence[Partition], where: str, grants: Grants | None = None
                 ) -> str:
    """The block as YAML under `sites:`, with comments saying what SLURM reported, and
    the grants as its `allocations:`."""
    body = yaml.safe_dump([dict(block)], sort_keys=False, default_flow_style=False)
    indented = "".join(f"  {line}" for line in body.splitlines(keepends=True))
    other = ", ".join(p.name for p in others if p.name != part.name)
    lines = [f"# Site block from SLURM at {where}: {describe(part, nodes)}.",
             "# pilot.* is the smallest node of the partition (memory: "
             f"{MEMORY_SHARE:.1%} of RealMemory); walltime_s at most a day.",
             "# Check the image path, then: provisioner site check " + str(block["name"])]
    if other:
        lines.append(f"# Other partitions: {other} (--partition NAME for another block).")
    return "\n".join(lines) + "\nsites:\n" + indented + render_allocations(grants)


def discover(live: Live, partition: str | None, access: Access, image: str,
             account: str | None, name: str | None, where: str) -> str:
    part = pick_partition(list(live.partitions), partition)
    if part is None:
        names = ", ".join(p.name for p in live.partitions) or "none"
        what = f"no partition {partition!r}" if partition else "no default partition"
        raise LiveError(f"{where}: {what} (partitions: {names}); use --partition")
    block = site_block(name or site_name(live.cluster, access.host), part, live.nodes,
                       access, image, account)
    return render_block(block, part, live.nodes, live.partitions, where, live.grants)
