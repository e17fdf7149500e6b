"""What SLURM says about a site, parsed from its own command-line output (pure).

Input is the one-line-per-record form of ``scontrol show partition -o`` and
``scontrol show node -o`` (Slurm 24.11): ``Key=value`` words separated by spaces,
where a few values contain spaces themselves (``OS=Linux 6.1.0-18-amd64 #1 SMP ...``,
``Reason=Not responding [slurm@2025-01-01T00:00:00]``). A new key starts wherever a
space is followed by ``CamelCaseKey=``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: A key of an scontrol record: starts a record or follows a space.
_KEY = re.compile(r"(?:^|(?<=\s))([A-Z][A-Za-z0-9_:/.]*)=")
#: [days-]hours:minutes:seconds, minutes:seconds, minutes; UNLIMITED/INFINITE.
_DURATION = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)([KMGTP]?)$", re.IGNORECASE)
_MB_PER = {"": 1.0, "K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0**2, "P": 1024.0**3}
#: One GRES of a node: name[:type]:count[(S:0-1)], or name:count in a TRES string.
_GRES = re.compile(r"^([A-Za-z0-9_]+)(?::([A-Za-z0-9_.-]+))?:(\d+)(?:\(.*\))?$")
UNLIMITED = ("UNLIMITED", "INFINITE", "NONE")


class SlurmOutputError(ValueError):
    """scontrol printed something this parser does not understand; says what."""


def parse_record(line: str) -> dict[str, str]:
    """One ``scontrol show ... -o`` line -> {key: value} (values stripped)."""
    fields: dict[str, str] = {}
    matches = list(_KEY.finditer(line))
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        fields[match.group(1)] = line[match.end():end].strip()
    return fields


def parse_records(text: str, first_key: str) -> list[dict[str, str]]:
    """Every record of ``scontrol show ... -o`` output whose first key is `first_key`."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        record = parse_record(line.strip())
        if not record or next(iter(record)) != first_key:
            raise SlurmOutputError(f"not a {first_key} record: {line.strip()[:120]!r}")
        out.append(record)
    return out


def duration_s(text: str) -> int | None:
    """A SLURM time limit in seconds (``2-00:00:00``, ``08:00:00``, ``30``); None if
    unlimited. ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``."""
    text = text.strip()
    if text.upper() in UNLIMITED:
        return None
    m = _DURATION.match(text)
    if not m:
        raise SlurmOutputError(f"not a SLURM time limit: {text!r}")
    days, a, b, c = (int(g) if g is not None else None for g in m.groups())
    assert a is not None
    if days is not None:  # D-HH[:MM[:SS]]
        return days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    if c is not None:  # HH:MM:SS
        return a * 3600 + (b or 0) * 60 + c
    if b is not None:  # MM:SS
        return a * 60 + b
    return a * 60  # MM


def memory_mb(text: str) -> int | None:
    """A memory size in MB (``8000``, ``8000M``, ``7.81G``); None if unlimited or 0."""
    text = text.strip()
    if text.upper() in UNLIMITED or text in ("", "0"):
        return None
    m = _MEMORY.match(text)
    if not m:
        raise SlurmOutputError(f"not a SLURM memory size: {text!r}")
    return int(float(m.group(1)) * _MB_PER[m.group(2).upper()])


def _count(text: str) -> int | None:
    text = text.strip()
    if text.upper() in UNLIMITED or not text:
        return None
    if not text.isdigit():
        raise SlurmOutputError(f"not a count: {text!r}")
    return int(text)


@dataclass(frozen=True)
class Gpus:
    count: int
    types: tuple[str, ...] = ()


def node_gpus(gres: str) -> Gpus:
    """The GPUs in a node's ``Gres=`` (``gpu:2``, ``gpu:a100:4(S:0-1)``, ``(null)``)."""
    count, types = 0, []
    if gres.strip() in ("", "(null)"):
        return Gpus(0)
    # commas separate GRES, except inside a socket list "(S:0-1)"
    for item in re.split(r",(?![^(]*\))", gres):
        m = _GRES.match(item.strip())
        if m and m.group(1) == "gpu":
            count += int(m.group(3))
            if m.group(2):
                types.append(m.group(2))
    return Gpus(count, tuple(sorted(set(types))))


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    state: str
    nodes: str  # hostlist expression, e.g. gsi-n[1-2]
    max_time_s: int | None  # None: unlimited
    max_nodes: int | None
    max_cpus_per_node: int | None
    max_mem_per_node_mb: int | None
    def_mem_per_cpu_mb: int | None
    #: EXCLUSIVE: whole nodes only; NO/YES/FORCE: jobs share nodes.
    oversubscribe: str
    allow_accounts: tuple[str, ...]  # ("ALL",) when open to every account
    deny_accounts: tuple[str, ...]
    allow_qos: tuple[str, ...]

    @property
    def whole_node(self) -> bool:
        return self.oversubscribe.upper().startswith("EXCLUSIVE")

    def allows_account(self, account: str | None) -> bool:
        """Whether jobs of `account` may use it (None: the account's default)."""
        if account is None:
            return True
        if account in self.deny_accounts:
            return False
        return "ALL" in self.allow_accounts or account in self.allow_accounts


def _names(text: str | None, default: str) -> tuple[str, ...]:
    text = (text or "").strip()
    if not text or text == "(null)":
        text = default
    return tuple(t for t in text.split(",") if t)


def _def_mem_per_cpu(record: dict[str, str]) -> int | None:
    """DefMemPerCPU=2000, or the older DefMemPerNode/JobDefaults forms."""
    raw = record.get("DefMemPerCPU")
    return memory_mb(raw) if raw is not None else None


def parse_partitions(text: str) -> list[Partition]:
    """``scontrol show partition -o`` output -> partitions."""
    out = []
    for r in parse_records(text, "PartitionName"):
        out.append(Partition(
            name=r["PartitionName"],
            default=r.get("Default", "NO").upper() == "YES",
            state=r.get("State", "UP"),
            nodes=r.get("Nodes", ""),
            max_time_s=duration_s(r.get("MaxTime", "UNLIMITED")),
            max_nodes=_count(r.get("MaxNodes", "UNLIMITED")),
            max_cpus_per_node=_count(r.get("MaxCPUsPerNode", "UNLIMITED")),
            max_mem_per_node_mb=memory_mb(r.get("MaxMemPerNode", "UNLIMITED")),
            def_mem_per_cpu_mb=_def_mem_per_cpu(r),
            oversubscribe=r.get("OverSubscribe", "NO"),
            allow_accounts=_names(r.get("AllowAccounts"), "ALL"),
            deny_accounts=_names(r.get("DenyAccounts"), ""),
            allow_qos=_names(r.get("AllowQos"), "ALL"),
        ))
    return out


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    real_memory_mb: int
    gpus: Gpus
    state: str
    partitions: tuple[str, ...]


def parse_nodes(text: str) -> list[Node]:
    """``scontrol show node -o`` output -> nodes (CPUTot is the configured count)."""
    out = []
    for r in parse_records(text, "NodeName"):
        try:
            cpus = int(r.get("CPUTot") or r.get("CPUEfctv") or "0")
            mem = int(r.get("RealMemory", "0"))
        except ValueError as exc:
            raise SlurmOutputError(f"node {r['NodeName']}: {exc}") from exc
        out.append(Node(name=r["NodeName"], cpus=cpus, real_memory_mb=mem,
                        gpus=node_gpus(r.get("Gres", "")), state=r.get("State", ""),
                        partitions=_names(r.get("Partitions"), "")))
    return out


def pick_partition(partitions: list[Partition], name: str | None) -> Partition | None:
    """The partition called `name`, or SLURM's default one when `name` is None."""
    for p in partitions:
        if (name is None and p.default) or p.name == name:
            return p
    return None
