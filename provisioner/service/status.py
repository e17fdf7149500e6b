"""`provisioner status`: what a site admin reads at a glance, as data (`--json`) and text.

`gather()` builds a plain dict with stable keys from one observation, the journal and
the configuration; `render()` turns it into tables (bold and colour only for a tty).
Keys: ``at``, ``pool`` {collector, provisioner_id, known, schedds_unknown}, ``sites`` [{name, known,
error, circuit, limits (SLURM's limits in words, "" if none: "at its submission limit
(20 jobs, ...)", "stopped: ..."), pilots {state: {count, oldest_age_s}},
cores_allocated, cores_claimed,
lead_time_p50_s {queue_wait, boot}, learnt {queue_wait_s, boot_s, samples} (the
estimate placement uses, kept in the journal; the configured defaults while samples is
0), flagged}], ``demand`` [{cores, memory_mb,
runtime_s, idle, sites}], ``unmatchable`` [{cores, memory_mb, idle, reason, code}] (`code`:
the reason's code in `provisioner.decide.reasons`, as `provisioner why` and the metrics
name it),
``failing_starts`` [{cores, memory_mb, jobs, failed_starts, cooling, reason}] (idle jobs
whose last start failed: the starter's error, `provisioner.decide.failed_starts`),
``flagged`` [pilot keys], ``last_cycle`` {at, age_s, summary, duration_s, actions} or null,
``journal`` {path, writable, kind, error, since} (what the running service says of its
journal, `provisioner.service.journal_health`; not writable also when status cannot
open it), ``pilot_tokens`` {live, revoked_total, problem, foreign [text], refused [text],
collector_log} or null (the service's last cycle; docs/security.md),
``allocations`` [{site, allocation, account, unit, line, status, pace, amount, spent,
committed, left, allowance, period_start, period_end, known, error, ledger_spent,
slurm_spent, slurm_grant, reading_age_s, read_error, difference, tolerance, differs,
burn_rate_per_h, runout_at}] (`provisioner.service.books.AllocationRow.as_dict`; empty
without allocations), ``groups_in_use``. Demand and unmatchable rows carry the jobs'
accounting ``group`` ("" = none, or groups not in use).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from provisioner.config import UNIT_SHORT, Config, utc_date
from provisioner.decide.failed_starts import cause
from provisioner.decide.matching import match_demand
from provisioner.decide.reasons import unmatchable_reason
from provisioner.model import Pilot, PilotState, Snapshot
from provisioner.service.accounting import PilotRecord, percentile
from provisioner.service.books import AllocationRow
from provisioner.service.metrics import cores_by_site

DAY_S = 86400.0


def lead_p50(records: Sequence[PilotRecord], site: str, now: float) -> dict[str, float | None]:
    """Median queue wait (submit -> start) and boot (start -> join) of the site's pilots
    that started (joined) within the last day."""
    waits = [r.start_at - r.submit_at for r in records if r.site == site
             and r.start_at is not None and r.start_at >= now - DAY_S]
    boots = [r.join_at - r.start_at for r in records if r.site == site
             and r.join_at is not None and r.start_at is not None and r.join_at >= now - DAY_S]
    return {"queue_wait": percentile(waits, 50), "boot": percentile(boots, 50)}


def _learnt(config: Config, e: Mapping[str, float] | None) -> dict[str, float]:
    d = config.policy.placement
    try:
        return {"queue_wait_s": round(float(e["wait_s"]), 1),  # type: ignore[index]
                "boot_s": round(float(e["boot_s"]), 1),  # type: ignore[index]
                "samples": int(e["samples"])}  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return {"queue_wait_s": d.default_wait_s, "boot_s": d.default_boot_s, "samples": 0}


def _age(p: Pilot, now: float) -> float:
    since = p.started_at if p.started_at is not None else p.submitted_at
    return max(0.0, now - since)


def gather(config: Config, snap: Snapshot, now: float, breakers: Mapping[str, str],
           flagged: Mapping[str, float], records: Sequence[PilotRecord],
           last: Mapping[str, Any] | None,
           learnt: Mapping[str, Mapping[str, float]] | None = None,
           limits: Mapping[str, str] | None = None,
           journal_fault: Mapping[str, Any] | None = None,
           tokens: Mapping[str, Any] | None = None,
           allocations: Sequence[AllocationRow] = ()) -> dict[str, Any]:
    cores = cores_by_site(snap.pilots, config.site_names)
    sites = []
    for view in snap.sites:
        mine = [p for p in snap.pilots if p.site == view.name]
        states: dict[str, dict[str, float | int]] = {}
        for state in PilotState:
            these = [p for p in mine if p.state is state]
            if these:
                states[state.value] = {"count": len(these),
                                       "oldest_age_s": round(max(_age(p, now) for p in these)),
                                       "keys": sorted(p.key for p in these)}
        sites.append({
            "name": view.name, "known": view.known, "error": view.error,
            "circuit": breakers.get(view.name, "closed"), "pilots": states,
            "limits": str((limits or {}).get(view.name, "")),
            "cores_allocated": cores[view.name].allocated,
            "cores_claimed": cores[view.name].claimed,
            "lead_time_p50_s": lead_p50(records, view.name, now),
            "learnt": _learnt(config, (learnt or {}).get(view.name)),
            "flagged": sorted(p.key for p in mine if p.key in flagged)})
    rows, unmatchable = match_demand(snap.demand, config.sites) if snap.pool_known else ([], [])
    demand = sorted(({"cores": r.shape.cpus, "memory_mb": r.shape.memory_mb,
                      "runtime_s": r.shape.runtime_s, "idle": r.jobs, "sites": list(r.sites),
                      "group": r.shape.group}
                     for r in rows), key=lambda d: (-int(d["idle"]), d["cores"]))
    last_cycle = None
    if last:
        timings = last.get("timings") or {}
        last_cycle = {"at": last.get("at"), "age_s": round(now - float(last.get("at", now))),
                      "summary": last.get("summary", ""),
                      "duration_s": round(sum(float(v) for v in timings.values()), 3),
                      "actions": [list(a) for a in last.get("actions", [])]}
    return {
        "at": now,
        "pool": {"collector": config.pool.collector,
                 "provisioner_id": config.pool.provisioner_id, "known": snap.pool_known,
                 "schedds_unknown": list(snap.schedds_unknown)},
        "sites": sites, "demand": demand,
        "unmatchable": [{"cores": u.shape.cpus, "memory_mb": u.shape.memory_mb,
                         "idle": u.idle, "reason": u.reason, "group": u.shape.group,
                         "code": unmatchable_reason(u.reason).value} for u in unmatchable],
        "failing_starts": [{"cores": g.shape.cpus, "memory_mb": g.shape.memory_mb,
                            "jobs": g.jobs, "failed_starts": g.failed_starts,
                            "cooling": g.cooling, "reason": cause(g.reason)}
                           for g in snap.failing] if snap.pool_known else [],
        "flagged": sorted(flagged), "last_cycle": last_cycle,
        "journal": {"path": config.journal, "writable": not journal_fault,
                    "error": str((journal_fault or {}).get("error", "")),
                    "kind": str((journal_fault or {}).get("kind", "")),
                    "since": (journal_fault or {}).get("since")},
        "pilot_tokens": dict(tokens) if tokens else None,
        "groups_in_use": config.groups_in_use,
        "allocations": [r.as_dict() for r in allocations]}


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    fmt = lambda r: "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))  # noqa: E731
    return [fmt(header), fmt(["-" * w for w in widths]), *map(fmt, rows)]


def _dur(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def tokens_text(t: Mapping[str, Any] | None, bold: Any, red: Any) -> list[str]:
    """The pilot tokens as the service last saw them (provisioner.service.pilot_tokens)."""
    if not t:
        return []
    out = [bold(f"\nPilot tokens: {t['live']} live, {t['revoked_total']} revoked since "
                "the service started")]
    if t.get("problem"):
        out.append(red(f"  no pilot can be submitted: {t['problem']}"))
    out += [red(f"  foreign ad: {f}") for f in t.get("foreign", [])]
    if t.get("refused"):
        out.append("  refused by the collector lately:")
        out += [red(f"    {r}") for r in t["refused"]]
    if t.get("collector_log") and t["collector_log"] != "off":
        out.append(f"  (collector log not readable, refusals unknown: {t['collector_log']})")
    return out


def allocations_text(allocs: Sequence[Mapping[str, Any]], red: Any) -> list[str]:
    """Each allocation: its budget's line, then the books behind it."""
    out = []
    for a in allocs:
        u = UNIT_SHORT.get(a["unit"], a["unit"])
        bad = a["status"] in ("spent", "unknown", "stopped", "ended") or not a["known"]
        out.append("  " + (red(a["line"]) if bad else a["line"]))
        if not a["known"]:
            out.append(red(f"    books unknown: {a['error']}"))
            continue
        age = a["reading_age_s"]
        books = f"ledger alone {a['ledger_spent']:.4g}: SLURM not read this period" \
            if a["slurm_spent"] is None else (f"SLURM {a['slurm_spent']:.4g}, read "
                                              f"{_dur(age)} ago; ledger {a['ledger_spent']:.4g}")
        grant = "" if a["slurm_grant"] is None else f"; SLURM's grant {a['slurm_grant']:.4g}"
        runout = a["runout_at"]
        when = "does not run out at this rate" if runout is None else \
            f"runs out {utc_date(runout)}"
        out.append(f"    spent {a['spent']:.4g} {u} ({books}){grant}; committed "
                   f"{a['committed']:.4g}; burn {a['burn_rate_per_h']:.3g} {u}/h, {when}")
        if a["differs"]:
            out.append(red(f"    DIFFERENCE: SLURM charged {a['difference']:+.4g} {u} against "
                           f"the ledger by the reading (beyond {a['tolerance']:.3g}); "
                           "SLURM's figure counts"))
        if a["read_error"]:
            last = "no reading this period, the ledger counts" if age is None else \
                f"the reading of {_dur(age)} ago and the ledger since count"
            out.append(red(f"    {a['read_error']} ({last})"))
    return out


def render(st: Mapping[str, Any], tty: bool = False) -> str:
    bold = (lambda t: f"\033[1m{t}\033[0m") if tty else (lambda t: t)
    red = (lambda t: f"\033[31m{t}\033[0m") if tty else (lambda t: t)
    pool = st["pool"]
    out = [bold(f"Pool {pool['collector']} (provisioner id {pool['provisioner_id']})")]
    if not pool["known"]:
        out.append(red("  pool: UNKNOWN (no schedd or the collector readable)"))
    elif pool.get("schedds_unknown"):
        out.append(red(f"  schedd {', '.join(pool['schedds_unknown'])}: UNKNOWN (unreadable; "
                       "no scale-down, the other schedds' demand is provisioned for)"))
    journal = st.get("journal") or {}
    if journal and not journal["writable"]:
        since = journal.get("since")
        when = f" for {_dur(float(st['at']) - float(since))}" if since else ""
        out.append(red(f"  journal {journal['path']}: CANNOT BE WRITTEN{when} "
                       f"({journal['kind']}: {journal['error']}): submissions wait; "
                       "releases, retirements and cancels go on"))
    for s in st["sites"]:
        head = f"\nSite {s['name']}: " + ("ok" if s["known"] else red(f"UNKNOWN ({s['error']})"))
        circuit = s["circuit"]
        head += "; circuit " + (circuit if circuit.startswith("closed") else red(circuit))
        if s.get("limits"):
            head += f"; {s['name']}: " + (red(s["limits"]) if s["limits"].startswith(
                ("at ", "stopped")) else s["limits"])
        out.append(bold(head) if s["known"] else head)
        lead = s["lead_time_p50_s"]
        out.append(f"  cores allocated {s['cores_allocated']}, claimed {s['cores_claimed']}; "
                   f"lead time p50 (last day): queue wait {_dur(lead['queue_wait'])}, "
                   f"boot {_dur(lead['boot'])}")
        est = s["learnt"]
        out.append(f"  placement estimate: queue wait {_dur(est['queue_wait_s'])}, boot "
                   f"{_dur(est['boot_s'])}, " + (f"learnt from {est['samples']} pilot(s)"
                                                 if est["samples"] else "configured defaults"))
        rows = [[state, str(v["count"]), _dur(v["oldest_age_s"])]
                for state, v in s["pilots"].items()]
        out += _table(rows, ["state", "pilots", "oldest"]) if rows else ["  no pilots"]
        if s["flagged"]:
            out.append("  flagged (released next cycle if still idle): " + ", ".join(s["flagged"]))
    if st.get("allocations"):
        out.append(bold("\nAllocations (this period):"))
        out += allocations_text(st["allocations"], red)
    groups = bool(st.get("groups_in_use"))
    out.append(bold("\nIdle demand by job shape:"))
    rows = [[str(d["cores"]), str(d["memory_mb"]), str(d["runtime_s"] or "-"), str(d["idle"]),
             ",".join(d["sites"])] + ([d.get("group") or "(none)"] if groups else [])
            for d in st["demand"]]
    out += _table(rows, ["cores", "memory MB", "runtime s", "idle jobs", "fits sites"]
                  + (["group"] if groups else [])) if rows else ["  no matchable idle jobs"]
    if st["unmatchable"]:
        out.append(bold("\nUnmatchable (no pilot would run them; no pilot is started for them):"))
        out += [red(f"  {u['idle']} job(s) {u['cores']} cores/{u['memory_mb']} MB"
                    + (f", group {u.get('group') or '(none)'}" if groups else "")
                    + f": {u['reason']}") for u in st["unmatchable"]]
    if st.get("failing_starts"):
        out.append(bold("\nFailed to start (held by the pool after the third failed start, "
                        "then no pilot serves them):"))
        out += [red(f"  {f['jobs']} job(s) {f['cores']} cores/{f['memory_mb']} MB, up to "
                    f"{f['failed_starts']} failed start(s)"
                    + (f", {f['cooling']} waiting for the hold" if f["cooling"] else "")
                    + f": {f['reason']}") for f in st["failing_starts"]]
    out += tokens_text(st.get("pilot_tokens"), bold, red)
    last = st["last_cycle"]
    if last:
        out.append(bold(f"\nLast cycle {_dur(last['age_s'])} ago, took "
                        f"{last['duration_s']:.2f} s:"))
        out += [f"  {text}: {outcome}" for text, outcome in last["actions"]] or \
            ["  no actions"]
    return "\n".join(out)
