"""The pilot's boot, step by step: when each step of the wrapper ended (recorded on the
node, published in the startd's ad as ``PilotBoot*`` epoch times) and, from those and
what the pool saw, how long each step took from SLURM's start to the first claim.

Pure: the wrapper records, the demo and benchmarks read (no HTCondor bindings here:
the pilot has none).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from provisioner.pilot.containers import RUNNING

#: The wrapper's marks, in order: ad attribute -> what ended there.
MARKS = {
    "PilotBootSlurmStart": "SLURM started the batch script",
    "PilotBootWrapperStart": "the wrapper runs",
    "PilotBootDelayEnd": "start delay over",
    "PilotBootPrepared": "work directory and configuration written",
    "PilotBootTested": "nested-container self-test done (or its cached pass read); after "
                       "the master's start where the test ran beside it",
    "PilotBootMasterStart": "condor_master started in the container",
}


def start_delay(max_s: float, slot: int, slots: int, rng: random.Random) -> float:
    """How long a pilot waits before it starts. Pilots submitted together (`slots` of
    them to one site in one cycle) spread their starts over `max_s`, so that a burst
    does not start hundreds of daemons at the same second: the k-th waits k/n of it,
    plus up to one step of jitter. A lone pilot, or the first of a burst, starts at
    once: it is the one a waiting job needs first. `slots` 0 (a batch script that does
    not say): uniformly random within `max_s`, as before."""
    if max_s <= 0:
        return 0.0
    if slots <= 0:
        return rng.uniform(0, max_s)
    if slot <= 0 or slots == 1:
        return 0.0
    step = max_s / slots
    return min(max_s, slot * step + rng.uniform(0, step))


def config_lines(marks: Mapping[str, float]) -> str:
    """The marks as the startd's configuration: attributes of its ad."""
    known = [k for k in MARKS if k in marks]
    lines = [f"{k} = {marks[k]:.3f}\n" for k in known]
    return "".join(lines) + f"STARTD_ATTRS = $(STARTD_ATTRS) {' '.join(known)}\n"


def _num(ad: Mapping[str, Any], key: str) -> float | None:
    value = ad.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


def steps(ad: Mapping[str, Any], first_seen: float | None = None,
          first_claim: float | None = None) -> list[tuple[str, float | None]]:
    """(step, seconds) from SLURM's start to the first claim; None where a time is not
    known. `ad` is the pilot's startd ad (its ``PilotBoot*`` marks, ``DaemonStartTime``
    of the startd); `first_seen` when its ad was first in the collector (the ad's
    ``LastHeardFrom`` when first seen); `first_claim` when its first job started."""
    t = {k: _num(ad, k) for k in MARKS}
    startd = _num(ad, "DaemonStartTime")

    def gap(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else max(0.0, b - a)

    return [
        ("SLURM start -> wrapper (batch script, Python)",
         gap(t["PilotBootSlurmStart"], t["PilotBootWrapperStart"])),
        ("start delay", gap(t["PilotBootWrapperStart"], t["PilotBootDelayEnd"])),
        ("prepare (work directory, configuration)",
         gap(t["PilotBootDelayEnd"], t["PilotBootPrepared"])),
        ("nested-container self-test (before the master)",
         gap(t["PilotBootPrepared"], t["PilotBootMasterStart"])),
        ("Apptainer + condor_master -> startd", gap(t["PilotBootMasterStart"], startd)),
        ("startd -> ad in the collector (CCB)", gap(startd, first_seen)),
        ("negotiation -> first job starts", gap(first_seen, first_claim)),
    ]


def tested_beside(ad: Mapping[str, Any]) -> float | None:
    """Seconds after the master's start that the self-test ended where it ran beside
    the master (container jobs match from a reconfig of the startd just after); None
    where it ran before the master, or has not ended yet."""
    tested, master = _num(ad, "PilotBootTested"), _num(ad, "PilotBootMasterStart")
    if master is None or str(ad.get("PilotContainerTest", "")).startswith(RUNNING):
        return None
    if tested is None or tested <= master:
        return None
    return tested - master


def table(rows: list[tuple[str, float | None]], indent: str = "     ") -> str:
    """The steps as aligned lines, with their sum over the known ones."""
    width = max(len(name) for name, _ in rows)
    out = [f"{indent}{name:<{width}}  {'?' if s is None else f'{s:5.1f} s'}"
           for name, s in rows]
    total = sum(s for _, s in rows if s is not None)
    out.append(f"{indent}{'total':<{width}}  {total:5.1f} s")
    return "\n".join(out)
