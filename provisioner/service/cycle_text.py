"""The words of a cycle: an action as text, the cycle's one-line summary for the log and
the journal, and the circuit breakers as `provisioner status` shows them."""

from __future__ import annotations

from collections import Counter
from typing import Any

from provisioner.model import PilotState, Submit
from provisioner.service.cycle import CycleResult
from provisioner.service.journal import Journal


def describe(action: Any) -> str:
    if isinstance(action, Submit):
        return (f"submit {action.count} at {action.site} "
                f"({action.cpus} cores, {action.memory_mb} MB, {action.walltime_s} s)")
    kind = type(action).__name__.lower()
    return f"{kind} {action.pilot.key}"


def breakers_of(journal: Journal) -> dict[str, str]:
    """The circuit breakers the last cycle left, in words, as `provisioner status` shows
    them: site -> "closed", "open (...; retried in N s)", "half-open (...)"; sites never
    tripped are absent."""
    breakers = journal.get("breakers")
    return {str(k): str(v) for k, v in breakers.items()} if isinstance(breakers, dict) else {}


def action_target(text: str) -> tuple[str, str]:
    """(site, job id) of an action's text: "release gsi/12" or "submit 2 at gsi (...)"."""
    words = text.split()
    if len(words) >= 2 and "/" in words[1]:
        site, job_id = words[1].split("/", 1)
        return site, job_id
    if "at" in words:
        return words[words.index("at") + 1], ""
    return "", ""


def summary_line(cycle: CycleResult) -> str:
    snap = cycle.observation.snapshot
    demand = sum(d.idle for d in snap.demand)
    parts = [f"demand {demand} idle jobs in {len(snap.demand)} shapes"
             if snap.pool_known else "pool UNKNOWN"]
    if snap.pool_known and snap.schedds_unknown:
        parts.append(f"schedd {', '.join(snap.schedds_unknown)} UNKNOWN (no scale-down)")
    for view in snap.sites:
        if not view.known:
            parts.append(f"{view.name}: UNKNOWN")
            continue
        mine = [p for p in snap.pilots if p.site == view.name]
        states = Counter(p.state.value for p in mine)
        text = " ".join(f"{n} {s}" for s, n in sorted(states.items())) or "no pilots"
        # busy though the collector has no ad of theirs (e.g. a restarted collector
        # not yet updated): the schedd runs jobs there
        unseen = sum(1 for p in mine if p.state is PilotState.BUSY and p.name is None)
        if unseen:
            text += f" ({unseen} busy without a startd ad)"
        parts.append(f"{view.name}: {text}")
    if cycle.plan.reserve_jobs:
        memory = cycle.memory
        left = "?" if memory.recent_departures is None else memory.recent_departures
        parts.append(f"reserve {cycle.plan.reserve_held}/{cycle.plan.reserve_jobs} slots "
                     f"(arrived {sum(d.idle for d in snap.recent_arrivals)}, left {left} "
                     f"in {memory.arrival_window_s:.0f} s)")
    if cycle.plan.unmatchable:
        parts.append(f"unmatchable {sum(u.idle for u in cycle.plan.unmatchable)}")
    acts = [describe(a) for a in cycle.plan.actions]
    parts.append("actions: " + (", ".join(acts) if acts else "none"))
    t = cycle.timings
    parts.append(f"observe {t.get('observe', 0):.2f}s plan {t.get('plan', 0) * 1000:.1f}ms "
                 f"act {t.get('act', 0):.2f}s")
    return "; ".join(parts)
