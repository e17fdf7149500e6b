"""The report's PNG plots (matplotlib; imported only by `provisioner report`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates
import matplotlib.pyplot as plt

from provisioner.config import UNIT_SHORT
from provisioner.service.accounting import JobRun, PilotRecord, SiteDay, core_timeline, gpu_timeline
from provisioner.service.report_allocations import AllocationLine
from provisioner.service.spend import spent_series


def plot_step(pilots: Sequence[PilotRecord], now: float, points: int = 400) -> float:
    """Sampling step for the cores plot: about `points` samples over the pilots' span,
    between 1 s (a minute-long run still shows its jobs) and 300 s (days stay light)."""
    starts = [p.start_at for p in pilots if p.start_at is not None]
    if not starts:
        return 300.0
    ends = [p.end_at if p.end_at is not None else now for p in pilots]
    return min(300.0, max(1.0, (max(ends) - min(starts)) / points))


def plot_cores(pilots: Sequence[PilotRecord], runs: Sequence[JobRun], now: float,
               path: Path) -> Path:
    """Allocated vs claimed cores over time, one panel per site."""
    step = plot_step(pilots, now)
    return _plot_lines(core_timeline(pilots, runs, now, step_s=step), step, "cores",
                       "claimed", path)


def plot_gpus(pilots: Sequence[PilotRecord], runs: Sequence[JobRun], now: float,
              path: Path) -> Path:
    """Allocated GPUs vs GPUs claimed by GPU jobs over time, one panel per site whose
    pilots held GPUs."""
    step = plot_step(pilots, now)
    return _plot_lines(gpu_timeline(pilots, runs, now, step_s=step), step, "GPUs",
                       "claimed by GPU jobs", path)


def _plot_lines(lines: dict[str, list[tuple[float, int, int]]], step: float, unit: str,
                claimed: str, path: Path) -> Path:
    fmt = "%m-%d %H:%M" if step >= 10 else "%H:%M:%S"  # a short run shows its seconds
    fig, axes = plt.subplots(max(1, len(lines)), 1, figsize=(10, 3 * max(1, len(lines))),
                             sharex=True, squeeze=False)
    for ax, (site, points) in zip(axes[:, 0], lines.items(), strict=False):
        t = [datetime.fromtimestamp(p[0], UTC) for p in points]
        ax.fill_between(t, [p[1] for p in points], step="post", alpha=0.3,
                        label="allocated", color="tab:blue")
        ax.step(t, [p[2] for p in points], where="post", label=claimed, color="tab:green")
        ax.set_title(f"{site}: allocated vs claimed {unit}")
        ax.set_ylabel(unit)
        ax.legend(loc="upper right")
        ax.xaxis.set_major_formatter(mdates.DateFormatter(fmt))
    axes[-1, 0].set_xlabel("time (UTC)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_idle(rows: Sequence[SiteDay], path: Path) -> Path:
    """Where the idle core-hours went, per site and day (stacked)."""
    labels = [f"{r.site}\n{r.day}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows)), 4.5))
    bottom = [0.0] * len(rows)
    for name, colour, label in (("startup", "tab:orange", "start-up (start -> first job)"),
                                ("between", "tab:purple", "between jobs / partly filled"),
                                ("tail", "tab:red", "tail (last job -> end)")):
        vals = [getattr(r, name) for r in rows]
        ax.bar(labels, vals, bottom=bottom, color=colour, label=label)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    for i, r in enumerate(rows):
        share = 0 if r.allocated <= 0 else r.idle / r.allocated
        ax.text(i, bottom[i], f"{100 * share:.0f}% idle", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("idle core-hours")
    ax.set_title("Where the idle core-hours went")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_burndown(line: AllocationLine, now: float, path: Path) -> Path:
    """One allocation this period: spent over time by the ledger, SLURM's readings, the
    ideal even line, the amount, and at `now` the books' spent with what is committed
    on top of it."""
    e = line.entry
    unit = UNIT_SHORT[e.unit]
    when = lambda t: datetime.fromtimestamp(t, UTC)  # noqa: E731
    fig, ax = plt.subplots(figsize=(10, 4.5))
    series = spent_series(line.pilots, e.unit, e.start, e.end, now)
    ax.plot([when(t) for t, _v in series], [v for _t, v in series], color="tab:blue",
            label="spent (ledger)")
    if line.readings:
        ax.plot([when(r.at) for r in line.readings], [r.used for r in line.readings], ".",
                color="tab:purple", label="spent (SLURM's readings)")
    ax.plot([when(e.start), when(e.end)], [0, e.amount], "--", color="tab:gray",
            label="ideal even pace")
    ax.axhline(e.amount, color="tab:red", label=f"amount {e.amount:g} {unit}")
    if e.start <= now < e.end:
        ax.vlines([when(now)], [e.spent], [e.spent + line.committed], linewidth=6,
                  color="tab:orange", alpha=0.7, label="committed (in flight, worst case)")
        ax.plot([when(now)], [e.spent], "o", color="tab:blue", label="spent (books, now)")
    ax.set_title(f"{e.site}/{e.allocation} ({line.pace}): {max(0.0, line.left):.1f} of "
                 f"{e.amount:g} {unit} left")
    ax.set_ylabel(unit)
    ax.set_xlabel("time (UTC)")
    ax.set_xlim(when(e.start), when(e.end))
    ax.legend(loc="best", fontsize=8)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d"))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
