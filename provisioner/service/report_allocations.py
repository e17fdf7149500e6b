"""`provisioner report`'s allocations, from the journal and the configuration: per
allocation and per accounting group this period, what is spent, committed (the pilots
in flight at their worst case) and left, the burn rate over the last day and the date
the grant runs out at that rate; allocations.csv, groups.csv and one
burndown-SITE-ALLOCATION.png per allocation.

An allocation's spent is the books' figure (`provisioner.service.books.reconcile`):
SLURM's last reading of the period kept in the journal plus the ledger since, or the
ledger alone. A group's spent is what its finished jobs claimed of the allocations'
pilots (`provisioner.service.spend`); what is committed and left belongs to the
allocations it may spend, shared with their other groups.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from provisioner.config import UNIT_SHORT, Config, utc_date
from provisioner.service.accounting import JobRun, PilotRecord
from provisioner.service.books import BookEntry, pilots_charge, reconcile
from provisioner.service.journal import Journal, Reading
from provisioner.service.spend import (
    BURN_WINDOW_S,
    committed,
    group_spend,
    group_totals,
    groups_of,
    of_allocation,
    runout,
)

HOUR_S = 3600.0


@dataclass(frozen=True)
class AllocationLine:
    """One allocation's row of the report."""

    entry: BookEntry
    committed: float
    pace: str
    pilots: tuple[PilotRecord, ...]  # the allocation's, for its burn-down
    readings: tuple[Reading, ...]  # SLURM's readings of the period kept in the journal

    @property
    def left(self) -> float:
        return self.entry.amount - self.entry.spent - self.committed

    def runout(self, now: float) -> float | None:
        return runout(self.entry.amount, self.entry.spent, self.entry.burn_rate, now)


@dataclass(frozen=True)
class GroupLine:
    """One accounting group's row: its own spend, beside the allocations it may spend."""

    group: str
    unit: str
    spent: float  # claimed by its finished jobs this period
    burn_rate: float  # the same, per hour over the last day
    allocations: tuple[str, ...]  # site/allocation of that unit it may spend
    committed: float  # of those allocations (shared with their other groups)
    left: float
    runout: float | None  # when those allocations' unspent hours go at their burn rate


def allocation_lines(config: Config, journal: Journal, now: float,
                     site: str | None = None) -> list[AllocationLine]:
    out = []
    for s in config.sites:
        if not s.allocations or (site is not None and s.name != site):
            continue
        since = min(min(a.period_bounds(now)[0] for a in s.allocations), now - BURN_WINDOW_S)
        records = journal.pilots(since=since, site=s.name)
        for a in s.allocations:
            start, end = a.period_bounds(now)
            readings = tuple(r for r in journal.readings(site=s.name, allocation=a.name,
                                                         since=start) if r.at < end)
            entry = reconcile(s.name, a, pilots_charge(records, s.name, a, now),
                              readings[-1] if readings else None, now)
            mine = tuple(of_allocation(records, s.name, a))
            out.append(AllocationLine(entry, committed(mine, a.unit, s.pilot.walltime_s, now),
                                      a.pace, mine, readings))
    return out


def group_lines(config: Config, lines: Sequence[AllocationLine], runs: Sequence[JobRun],
                now: float) -> list[GroupLine]:
    pilots = [p for line in lines for p in line.pilots]
    spent = group_totals(group_spend(config.sites, pilots, runs, now))
    burn = group_totals(group_spend(config.sites, pilots, runs, now,
                                    window=(now - BURN_WINDOW_S, now)))
    units = {(line.entry.site, line.entry.allocation): line.entry.unit for line in lines}
    by_alloc = {(line.entry.site, line.entry.allocation): line for line in lines}
    mapped = groups_of(config.sites)
    keys = sorted(set(spent) | {(g, units[k]) for g, ks in mapped.items() for k in ks
                                if k in units})
    out = []
    for group, unit in keys:
        mine = [by_alloc[k] for k in mapped.get(group, []) if k in by_alloc
                and by_alloc[k].entry.unit == unit]
        left = sum(max(0.0, m.left) for m in mine)
        unspent = sum(max(0.0, m.entry.amount - m.entry.spent) for m in mine)
        rate = sum(m.entry.burn_rate for m in mine)
        out.append(GroupLine(
            group, unit, spent.get((group, unit), 0.0),
            burn.get((group, unit), 0.0) / (BURN_WINDOW_S / HOUR_S),
            tuple(f"{m.entry.site}/{m.entry.allocation}" for m in mine),
            sum(m.committed for m in mine), left,
            runout(unspent, 0.0, rate, now) if mine else None))
    return out


def _when(t: float | None, end: float | None = None) -> str:
    if t is None:
        return "not at this rate"
    if end is not None and t >= end:
        return f"{utc_date(t)} (after the period)"
    return utc_date(t)


def _table(head: list[str], body: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    rows = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                      for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            for r in [head, *body]]
    rows.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(rows)


def tables(lines: Sequence[AllocationLine], groups: Sequence[GroupLine], now: float) -> str:
    """The two tables as text."""
    body = []
    for line in lines:
        e = line.entry
        slurm = "-" if e.slurm_spent is None else f"{e.slurm_spent:.2f}"
        body.append([f"{e.site}/{e.allocation}", UNIT_SHORT[e.unit],
                     f"{utc_date(e.start)}..{utc_date(e.end)}", line.pace, f"{e.amount:g}",
                     f"{e.spent:.2f}", f"{e.ledger_spent:.2f}", slurm, f"{line.committed:.2f}",
                     f"{line.left:.2f}", f"{e.burn_rate:.3g}", _when(line.runout(now), e.end)])
    text = _table(["allocation", "unit", "period", "pace", "amount", "spent", "ledger",
                   "SLURM", "committed", "left", "burn/h", "runs out"], body)
    if groups:
        text += "\n\n" + _table(
            ["group", "unit", "spent", "burn/h", "allocations", "committed", "left",
             "runs out"],
            [[g.group, UNIT_SHORT[g.unit], f"{g.spent:.2f}", f"{g.burn_rate:.3g}",
              ",".join(g.allocations) or "(none)", f"{g.committed:.2f}", f"{g.left:.2f}",
              _when(g.runout)] for g in groups])
    return text


def write_csvs(lines: Sequence[AllocationLine], groups: Sequence[GroupLine], now: float,
               out: Path) -> list[Path]:
    with (out / "allocations.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["site", "allocation", "account", "unit", "period_start", "period_end",
                    "pace", "amount", "spent", "ledger_spent", "slurm_spent",
                    "slurm_read_at", "committed", "left", "burn_rate_per_h", "runout"])
        for line in lines:
            e = line.entry
            runs_out = line.runout(now)
            w.writerow([e.site, e.allocation, e.account, e.unit, utc_date(e.start),
                        utc_date(e.end), line.pace, f"{e.amount:g}", f"{e.spent:.4f}",
                        f"{e.ledger_spent:.4f}",
                        "" if e.slurm_spent is None else f"{e.slurm_spent:.4f}",
                        "" if e.reading_at is None else f"{e.reading_at:.0f}",
                        f"{line.committed:.4f}", f"{line.left:.4f}", f"{e.burn_rate:.4f}",
                        "" if runs_out is None else utc_date(runs_out)])
    with (out / "groups.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["group", "unit", "spent", "burn_rate_per_h", "allocations", "committed",
                    "left", "runout"])
        for g in groups:
            w.writerow([g.group, g.unit, f"{g.spent:.4f}", f"{g.burn_rate:.4f}",
                        " ".join(g.allocations), f"{g.committed:.4f}", f"{g.left:.4f}",
                        "" if g.runout is None else utc_date(g.runout)])
    return [out / "allocations.csv", out / "groups.csv"]


def allocations_report(config: Config, journal: Journal, now: float, site: str | None,
                       out: Path | None) -> tuple[str, list[Path]]:
    """The allocations' text ("" without allocations) and the files written."""
    lines = allocation_lines(config, journal, now, site)
    if not lines:
        return "", []
    since = min(line.entry.start for line in lines)
    runs = journal.job_runs(since=min(since, now - BURN_WINDOW_S), site=site)
    groups = group_lines(config, lines, runs, now)
    written: list[Path] = []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        written += write_csvs(lines, groups, now, out)
        try:
            from provisioner.service.plots import plot_burndown
        except ImportError:  # matplotlib is optional (the `bench` extra)
            pass
        else:
            for line in lines:
                e = line.entry
                written.append(plot_burndown(line, now,
                                             out / f"burndown-{e.site}-{e.allocation}.png"))
    return tables(lines, groups, now), written
