"""What SLURM says about a site through slurmrestd (`/partitions`, `/nodes`, `/diag`,
and `/shares` for the grants), as the same records `scontrol` and `sshare` give
(provisioner.onboard.slurminfo, provisioner.sites.shares), so that
`site discover`, `site check` and `check-config --live` judge a REST site as any
other. The translation is pure; `read_live_rest` asks the server.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from provisioner.errors import BackendError
from provisioner.onboard.discover import Live, LiveError
from provisioner.onboard.grants import Grants, grants_from_shares
from provisioner.onboard.slurminfo import Node, Partition, node_gpus
from provisioner.sites.rest_client import RestClient


def _number(value: Any) -> int | None:
    """slurmrestd's numbers: plain, or {"set", "infinite", "number"}; None if unset
    or infinite."""
    if isinstance(value, dict):
        if not value.get("set", False) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _names(text: Any, default: str) -> tuple[str, ...]:
    text = str(text or "").strip()
    return tuple(t for t in (text or default).split(",") if t)


def _oversubscribe(doc: Mapping[str, Any]) -> str:
    """scontrol's OverSubscribe word from the partition's `maximums.oversubscribe`
    (jobs 0: EXCLUSIVE; FORCE among the flags; more than one job: YES)."""
    over = doc.get("maximums", {}).get("oversubscribe", {}) or {}
    jobs = over.get("jobs")
    flags = {str(f).upper() for f in over.get("flags") or []}
    if jobs == 0:
        return "EXCLUSIVE"
    if "FORCE" in flags:
        return f"FORCE:{jobs}"
    return f"YES:{jobs}" if isinstance(jobs, int) and jobs > 1 else "NO"


def partition(doc: Mapping[str, Any], default: bool = False) -> Partition:
    """One record of `/partitions` (v0.0.40-42); KeyError naming a missing field."""
    name = doc["name"]
    maxima, defaults = doc.get("maximums", {}), doc.get("defaults", {})
    minutes = _number(maxima.get("time"))
    state = doc.get("partition", {}).get("state") or ["UP"]
    per_cpu = _number(defaults.get("partition_memory_per_cpu"))
    if per_cpu is None:
        per_cpu = _number(defaults.get("memory_per_cpu"))
    return Partition(
        name=str(name), default=default,
        state=str(state[0] if isinstance(state, list) else state),
        nodes=str(doc.get("nodes", {}).get("configured", "")),
        max_time_s=minutes * 60 if minutes is not None else None,
        max_nodes=_number(maxima.get("nodes")),
        max_cpus_per_node=_number(maxima.get("cpus_per_node")),
        max_mem_per_node_mb=_number(maxima.get("partition_memory_per_node")) or None,
        def_mem_per_cpu_mb=per_cpu if per_cpu and per_cpu > 0 else None,
        oversubscribe=_oversubscribe(doc),
        allow_accounts=_names(doc.get("accounts", {}).get("allowed"), "ALL"),
        deny_accounts=_names(doc.get("accounts", {}).get("deny"), ""),
        allow_qos=_names(doc.get("qos", {}).get("allowed"), "ALL"),
    )


def node(doc: Mapping[str, Any]) -> Node:
    """One record of `/nodes`; KeyError naming a missing field."""
    state = doc.get("state") or [""]
    return Node(name=str(doc["name"]), cpus=int(doc["cpus"]),
                real_memory_mb=int(doc["real_memory"]),
                gpus=node_gpus(str(doc.get("gres") or "")),
                state=str(state[0] if isinstance(state, list) else state),
                partitions=tuple(str(p) for p in doc.get("partitions") or ()))


def _records(client: RestClient, what: str, where: str) -> list[Mapping[str, Any]]:
    reply = client.call("GET", what)
    if reply.text or reply.status != 200:
        raise LiveError(f"{where}: GET {what}: {reply.text or f'HTTP {reply.status}'}")
    records = reply.doc.get(what)
    if not isinstance(records, list):
        raise LiveError(f"{where}: GET {what} answered no '{what}' list")
    return [r for r in records if isinstance(r, dict)]


def read_live_rest(client: RestClient, where: str) -> Live:
    """Partitions and nodes through slurmrestd. slurmrestd does not say which
    partition is SLURM's default: a site with one partition has it as its default."""
    try:
        parts_raw = _records(client, "partitions", where)
        nodes_raw = _records(client, "nodes", where)
        only = len(parts_raw) == 1
        parts = tuple(partition(p, default=only) for p in parts_raw)
        nodes = tuple(node(n) for n in nodes_raw)
        cluster = next((str(n.get("cluster_name")) for n in nodes_raw
                        if n.get("cluster_name")), "")
    except KeyError as exc:
        raise LiveError(f"{where}: a record of slurmrestd lacks the field {exc}") from None
    except (TypeError, ValueError) as exc:
        raise LiveError(f"{where}: a record of slurmrestd is not as expected: {exc}") from None
    except BackendError as exc:
        raise LiveError(f"{where}: {exc}") from None
    return Live(cluster, parts, nodes)


def read_grants_rest(client: RestClient, user: str | None) -> Grants:
    """The accounts `user` may charge, their use and grants, from GET /shares; a site
    whose accounting cannot be read has none (the error says why)."""
    try:
        reply = client.call("GET", "shares")
    except BackendError as exc:
        return Grants(error=str(exc))
    if reply.text or reply.status != 200:
        return Grants(error=f"GET shares: {reply.text or f'HTTP {reply.status}'}")
    return grants_from_shares(reply.doc, user)
