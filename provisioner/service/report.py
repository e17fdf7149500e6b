"""`provisioner report`: what the allocation bought, per site and UTC day, from the journal.

Reads the journal's pilot records and job runs (never creates a journal), prints a
table, writes report.csv and, when matplotlib is installed, the plots: allocated vs
claimed cores over time per site, where the idle core-hours went and, where pilots
held GPUs, allocated GPUs vs GPUs claimed by GPU jobs over time per site. With a
configuration that has allocations, the allocations' and the groups' tables and files
too (`provisioner.service.report_allocations`).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from provisioner.config import Config
from provisioner.service.accounting import JobRun, PilotRecord, SiteDay, site_days, totals
from provisioner.service.journal import Journal
from provisioner.service.report_allocations import allocations_report

NOTHING = "nothing to report yet"
COLUMNS = ["site", "day", "pilots", "allocated_core_h", "claimed_core_h", "idle_startup_core_h",
           "idle_between_core_h", "idle_tail_core_h", "e1_job_start", "e2_cpu", "total_eff",
           "allocated_gpu_h", "claimed_gpu_h", "gpu_eff"]


class ReportError(Exception):
    """A bad argument; the message names it and its value."""


def parse_since(text: str) -> float:
    """"YYYY-MM-DD" (midnight UTC) or an ISO 8601 time (UTC unless it says) -> epoch s."""
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise ReportError(f"--since {text!r}: not a date (YYYY-MM-DD or ISO 8601, "
                          "e.g. 2026-01-31T12:00)") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.timestamp()


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _gpu_h(r: SiteDay, hours: float) -> str:
    """GPU-hours of a row whose pilots held GPUs; "-" where none did."""
    return f"{hours:.2f}" if r.allocated_gpu > 0 else "-"


def values(r: SiteDay) -> list[str]:
    return [r.site, r.day, str(len(r.pilots)), f"{r.allocated:.2f}", f"{r.claimed:.2f}",
            f"{r.startup:.2f}", f"{r.between:.2f}", f"{r.tail:.2f}", _pct(r.e1), _pct(r.e2),
            _pct(r.total), _gpu_h(r, r.allocated_gpu), _gpu_h(r, r.claimed_gpu),
            _pct(r.gpu_efficiency)]


def table(rows: Sequence[SiteDay]) -> str:
    head = ["site", "day", "pilots", "alloc core-h", "claimed core-h", "idle start-up",
            "idle between", "idle tail", "E1", "E2", "total", "alloc GPU-h",
            "GPU-h of GPU jobs", "GPU eff"]
    body = [values(r) for r in rows]
    for tot in totals(rows).values():
        body.append(values(tot))
    return aligned(head, body)


def aligned(head: list[str], body: list[list[str]]) -> str:
    """A text table: the first two columns left-aligned, the others right-aligned."""
    widths = [max(len(c[i]) for c in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in
                       enumerate(zip(row, widths, strict=True))) for row in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_csv(rows: Sequence[SiteDay], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow([r.site, r.day, len(r.pilots), f"{r.allocated:.4f}", f"{r.claimed:.4f}",
                        f"{r.startup:.4f}", f"{r.between:.4f}", f"{r.tail:.4f}",
                        "" if r.e1 is None else f"{r.e1:.4f}",
                        "" if r.e2 is None else f"{r.e2:.4f}",
                        "" if r.total is None else f"{r.total:.4f}",
                        f"{r.allocated_gpu:.4f}", f"{r.claimed_gpu:.4f}",
                        "" if r.gpu_efficiency is None else f"{r.gpu_efficiency:.4f}"])


#: How a pilot that left no end record ended, by what the journal saw.
NO_RECORD = "no end record (left squeue)"
NEVER_STARTED = "cancelled while pending"


def ends(pilots: Sequence[PilotRecord]) -> list[tuple[str, str, int, float]]:
    """PURE: the pilots that ended, per site and reason (the pilot's own end record,
    else what the journal saw): (site, reason, pilots, allocated core-hours)."""
    out: dict[tuple[str, str], list[float]] = {}
    for p in pilots:
        if p.end_at is None:
            continue
        reason = p.end_reason or (NEVER_STARTED if p.start_at is None else NO_RECORD)
        held = 0.0 if p.start_at is None else max(0.0, p.end_at - p.start_at) * p.cores / 3600
        row = out.setdefault((p.site, reason), [0, 0.0])
        row[0] += 1
        row[1] += held
    return [(site, reason, int(n), hours) for (site, reason), (n, hours) in sorted(out.items())]


def ends_table(rows: Sequence[tuple[str, str, int, float]]) -> str:
    return aligned(["site", "pilot end", "pilots", "alloc core-h"],
                   [[site, reason, str(n), f"{hours:.2f}"] for site, reason, n, hours in rows])


def compute(pilots: Sequence[PilotRecord], runs: Sequence[JobRun], now: float,
            since: float | None = None, site: str | None = None) -> list[SiteDay]:
    rows = site_days(pilots, runs, now)
    first = None if since is None else datetime.fromtimestamp(since, UTC).strftime("%Y-%m-%d")
    return [r for r in rows if (site is None or r.site == site)
            and (first is None or r.day >= first)]


def report(journal_path: str, now: float, since: float | None = None,
           site: str | None = None, out: Path | None = None,
           config: Config | None = None) -> tuple[str, list[Path]]:
    """The printed text and the files written (none when there is nothing yet). With
    `config`, its allocations this period (whatever `since` says) after the days."""
    journal = Journal.open_existing(journal_path)
    if journal is None:
        return NOTHING, []
    budget_text, budget_files = allocations_report(config, journal, now, site, out) \
        if config is not None else ("", [])
    days_text, written = _days(journal, now, since, site, out)
    text = "\n\n".join(t for t in (days_text, budget_text) if t) or NOTHING
    return text, written + budget_files


def _days(journal: Journal, now: float, since: float | None, site: str | None,
          out: Path | None) -> tuple[str, list[Path]]:
    """The site days' text ("" when there are none) and files."""
    pilots = journal.pilots(since=since, site=site)
    runs = journal.job_runs(since=since, site=site)
    rows = compute(pilots, runs, now, since, site)
    if not rows:
        return "", []
    ended = ends(pilots)  # the journal read them for `site` already
    written: list[Path] = []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_csv(rows, out / "report.csv")
        written.append(out / "report.csv")
        with (out / "ends.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["site", "end_reason", "pilots", "allocated_core_h"])
            w.writerows([site_, reason, n, f"{hours:.4f}"] for site_, reason, n, hours in ended)
        written.append(out / "ends.csv")
        try:
            from provisioner.service.plots import plot_cores, plot_gpus, plot_idle
        except ImportError:  # matplotlib is optional (the `bench` extra)
            pass
        else:
            written.append(plot_cores(pilots, runs, now, out / "cores.png"))
            written.append(plot_idle(rows, out / "idle.png"))
            if any(p.gpus > 0 and p.start_at is not None for p in pilots):
                written.append(plot_gpus(pilots, runs, now, out / "gpus.png"))
    text = table(rows)
    if ended:
        text += "\n\n" + ends_table(ended)
    return text, written
