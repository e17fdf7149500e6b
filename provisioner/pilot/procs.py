"""The pilot's process watcher: what runs below a process, read from /proc.

The pilot's container shares the node's PID namespace, so the wrapper (the batch
shell) sees its master, startd and the jobs' starters in /proc: it counts running
jobs (a retiring pilot leaves when none runs) and ends what outlives the master
(the container watchdog), so that a batch job whose master is gone does not hold
its allocation until the walltime kill.
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("provisioner.pilot")

#: One per running job.
STARTER = "condor_starter"


@dataclass(frozen=True)
class Proc:
    """One process as /proc/PID/stat tells it."""

    name: str
    state: str  # R, S, D, Z (zombie), X (dead), ...
    ppid: int


def read_stat(stat: str) -> Proc | None:
    """A /proc/PID/stat line; None if it cannot be read."""
    close = stat.rfind(")")  # the command name may hold spaces and parentheses
    fields = stat[close + 2:].split()
    if close < 0 or len(fields) < 2 or not fields[1].isdigit():
        return None
    return Proc(stat[stat.find("(") + 1:close], fields[0], int(fields[1]))


def process_table(proc: Path = Path("/proc")) -> dict[int, Proc]:
    """Every process in /proc (the pilot's container shares the node's PID namespace)."""
    table: dict[int, Proc] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            found = read_stat((entry / "stat").read_text())
        except OSError:  # ended meanwhile
            continue
        if found is not None:
            table[int(entry.name)] = found
    return table


def is_below(pid: int, root: int, table: dict[int, Proc]) -> bool:
    """Whether process `pid` descends from `root` (not `root` itself)."""
    seen: set[int] = set()
    pid = table[pid].ppid if pid in table else 0
    while pid not in (0, 1, root) and pid not in seen:
        seen.add(pid)
        pid = table[pid].ppid if pid in table else 0
    return pid == root


def descendants(root: int, table: dict[int, Proc]) -> list[int]:
    """The processes below `root` (not `root` itself)."""
    return sorted(pid for pid in table if pid != root and is_below(pid, root, table))


def starters_below(root: int, proc: Path = Path("/proc")) -> int:
    """How many condor_starter processes (one per running job) descend from process
    `root`."""
    table = process_table(proc)
    return sum(1 for pid, p in table.items()
               if p.name == STARTER and is_below(pid, root, table))


def has_ended(pid: int, proc: Path = Path("/proc")) -> bool:
    """Whether process `pid` has ended: gone, or a zombie its parent has not reaped."""
    try:
        found = read_stat((proc / str(pid) / "stat").read_text())
    except OSError:
        return True
    return found is None or found.state in ("Z", "X")


def watchable(master: int, root: int, proc: Path = Path("/proc")) -> bool:
    """Whether the master is a process of this node's view below `root` (the batch
    shell). If not (a PID namespace?), watching it could end a live pilot."""
    table = process_table(proc)
    return master in table and is_below(master, root, table)


def end_all_below(root: int, why: str, cleared: list[int],
                  proc: Path = Path("/proc")) -> None:
    """SIGKILL every process below `root`, first logging `why` and what they are.
    Each pid signalled is appended to `cleared` at once (another thread reads it:
    the container's end is expected once the first one is)."""
    table = process_table(proc)
    left = descendants(root, table)
    log.warning("%s: ending what is left (%s)", why,
                ", ".join(f"{pid} {table[pid].name} {table[pid].state}" for pid in left)
                or "nothing below the batch shell")
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
            cleared.append(pid)
        except OSError as exc:
            log.info("process %d: %s", pid, exc)
