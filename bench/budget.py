"""Bench: allocations as budgets (issue 38), in the simulator.

The world (`bench.sim.budget_world`): two accounting groups, "analysis" (steady 4-core
work) and "campaign" (bursts of hundreds of 8-core jobs), each with a grant at a GSI-like
and a Frankfurt-like site, one `even` and one `asap` allocation per site, over one period
(30 simulated days). Variants: none, loose, tight, faults, spent, alone. For each run:

- spent past an allocation: checked after every accepted submission (spent + the worst
  case of every pilot in flight <= amount) and every 5 simulated minutes (spent <=
  amount), from the simulated SLURM's own exact charges; must be 0 in every run;
- the even pace's error: spent against the ideal even line at every hour (% of the
  amount), run-ahead and lag apart, and in the hours when the group's jobs waited
  throughout (its demand above the pace);
- the grants used by the period's end;
- efficiency and job waits, per group too.

Run from the repository root: `python bench/budget.py` (`make bench-budget`); it prints
markdown tables, writes bench/results/budget.md and the burn-downs budget-tight.png and
budget-faults.png. `--days 6 --out /tmp/budget.md` is a short variant for development.
`--broken-rule` runs with the worst-case rule off (the pilots in flight not counted
against the grant): the checks must then count runs past it.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.sim.budget_world import VARIANTS, BudgetRun, run_budget  # noqa: E402
from bench.sim.pacing import Pace, ideal, pace, used  # noqa: E402
from provisioner.decide import budget as decide_budget  # noqa: E402

RESULTS = ROOT / "bench" / "results"
PLOTTED = ("tight", "faults")
#: The variants whose grants bind: where pacing is measured.
BINDING = ("tight", "faults")


def worst_case_off() -> None:
    """The rule broken on purpose: a budget's allowance forgets the pilots in flight
    (what they may still cost), so only what is spent counts against the grant."""
    def allowance(self: decide_budget.Budget) -> float:
        if not self.known or self.stopped or not self.start <= self.now < self.end:
            return 0.0
        room = self.amount - self.spent
        if self.pace == "even":
            horizon = min(self.now + self.walltime_s, self.end)
            room = min(room, self.ideal(horizon) - self.spent)
        return max(0.0, room)
    decide_budget.Budget.allowance = property(allowance)  # type: ignore[method-assign,assignment]


def no_cycles_for_held_jobs() -> None:
    """`--no-caps-cycles`, for comparison: no full cycle for "demand left over by caps"
    between intervals. plan() leaves the jobs its allocations hold back (paced, spent)
    out of what caps hold back, so this now drops only the cycles real caps ask for
    (bench/results/2026-12-01-issue38.md compares the two)."""
    from provisioner.decide import cadence, controller

    due = cadence.cycle_due

    def cycle_due(*args: Any, **kwargs: Any) -> str:
        reason = due(*args, **kwargs)
        return "" if reason == "demand left over by caps" else reason
    setattr(controller, "cycle_due", cycle_due)  # noqa: B010 (the name it calls)


def _one(task: tuple[str, int, float, bool, bool]) -> BudgetRun:
    variant, seed, days, broken, no_caps = task
    logging.getLogger("provisioner").setLevel(logging.ERROR)  # the tables say it all
    if no_caps:
        no_cycles_for_held_jobs()
    run = run_budget(variant, seed, days, patch=worst_case_off if broken else None)
    print(f"  {variant}/{seed}: {run.wall_s:.0f} s", file=sys.stderr, flush=True)
    return run


def paces(run: BudgetRun) -> dict[tuple[str, str], Pace]:
    out = {}
    for key, points in run.series.items():
        grant = run.grants[key]
        group = grant.alloc.groups[0]
        idle = [(s.t, s.idle.get(group, 0)) for s in run.group_samples]
        out[key] = pace(points, grant.alloc.amount, idle)
    return out


def never_past(runs: list[BudgetRun]) -> str:
    lines = ["| variant | seed | submissions checked | past after a submission | "
             "5-minute checks | past at a check | pilots without an allocation | "
             "pilots killed | sbatch refused |", "|---" * 9 + "|"]
    for r in runs:
        c = r.checks
        lines.append(f"| {r.variant} | {r.seed} | {c.submissions} | {c.past_at_submit} | "
                     f"{c.samples} | {c.past_at_sample} | {c.unallocated} | "
                     f"{r.pilots_killed} | {r.result.sbatch_refused} |")
    return "\n".join(lines)


def pacing(runs: list[BudgetRun]) -> str:
    lines = ["| variant | seed | allocation | pace | amount (core-h) | used by the end | "
             "run-ahead | lag | hours with demand above the pace | lag in them | "
             "error in them (at hour) |", "|---" * 11 + "|"]
    for r in runs:
        for key, p in paces(r).items():
            a = r.grants[key].alloc
            even = a.pace == "even"
            measured = (f"{p.run_ahead:.2f} % | {p.lag:.2f} % | {p.demand_hours} of "
                        f"{p.hours} | {p.demand_lag:.2f} % | {p.error:.2f} % ({p.worst_hour}) |"
                        if even else "- | - | - | - | - |")  # asap follows no line
            lines.append(
                f"| {r.variant} | {r.seed} | {key[0]}/{key[1]} | {a.pace} | {a.amount:.0f} | "
                f"{used(r.series[key], a.amount):.1f} % | " + measured)
    return "\n".join(lines)


def waits(runs: list[BudgetRun]) -> str:
    lines = ["| variant | seed | efficiency | wait p50 (s) | wait p95 (s) | analysis p50 / "
             "p95 (s) | campaign p50 / p95 (s) | finished / jobs | pilots |",
             "|---" * 9 + "|"]
    for r in runs:
        res = r.result
        cells = []
        for g in ("analysis", "campaign"):
            w = r.groups.get(g)
            cells.append(f"{w.wait_p50_s:.0f} / {w.wait_p95_s:.0f}" if w else "-")
        lines.append(f"| {r.variant} | {r.seed} | {100 * res.efficiency:.1f} % | "
                     f"{res.wait_p50_s:.0f} | {res.wait_p95_s:.0f} | {cells[0]} | {cells[1]} | "
                     f"{res.finished} / {res.jobs} | {res.pilots_submitted} |")
    return "\n".join(lines)


def comparisons(runs: list[BudgetRun]) -> str:
    """loose against none per seed; analysis with campaign's grant spent against
    analysis alone."""
    by = {(r.variant, r.seed): r for r in runs}
    lines = ["| comparison | seed | efficiency | wait p50 (s) | wait p95 (s) |",
             "|---|---|---|---|---|"]
    for (variant, seed), r in sorted(by.items()):
        if variant == "loose" and ("none", seed) in by:
            n = by[("none", seed)].result
            lines.append(f"| loose vs none | {seed} | {100 * r.result.efficiency:.1f} vs "
                         f"{100 * n.efficiency:.1f} % | {r.result.wait_p50_s:.0f} vs "
                         f"{n.wait_p50_s:.0f} | {r.result.wait_p95_s:.0f} vs "
                         f"{n.wait_p95_s:.0f} |")
        if variant == "spent" and ("alone", seed) in by:
            a, s = by[("alone", seed)].groups["analysis"], r.groups["analysis"]
            lines.append(f"| analysis: campaign's grants spent vs analysis alone | {seed} | - "
                         f"| {s.wait_p50_s:.0f} vs {a.wait_p50_s:.0f} | {s.wait_p95_s:.0f} "
                         f"vs {a.wait_p95_s:.0f} |")
    return "\n".join(lines)


def burndown(run: BudgetRun, path: Path) -> Path | None:
    """One panel per allocation: spent, spent plus the worst case in flight, the ideal
    even line and the amount, over the period."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no burn-downs", file=sys.stderr)
        return None
    keys = list(run.series)
    fig, axes = plt.subplots((len(keys) + 1) // 2, 2, figsize=(11, 3.3 * ((len(keys) + 1) // 2)),
                             squeeze=False)
    measured = paces(run)
    for ax, key in zip(axes.flat, keys, strict=False):
        a = run.grants[key].alloc
        pts = [p for p in run.series[key] if p.t <= p.end]
        days = [p.t / 86400 for p in pts]
        ax.plot(days, [p.spent for p in pts], label="spent")
        ax.plot(days, [min(p.spent + p.committed, 1.5 * a.amount) for p in pts],
                label="spent + worst case in flight", alpha=0.5, linewidth=0.8)
        ax.plot(days, [ideal(p, a.amount) for p in pts], "--", label="ideal even line")
        ax.axhline(a.amount, color="tab:red", linewidth=1, label="amount")
        m = measured[key]
        title = f"{key[0]}/{key[1]} ({a.pace}): used {used(run.series[key], a.amount):.1f} %"
        if a.pace == "even":
            title += f", run-ahead {m.run_ahead:.1f} %, lag {m.lag:.1f} %"
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("day")
        ax.set_ylabel("core-h")
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"budget world, {run.variant} (seed {run.seed})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--days", type=int, default=30, help="the grants' period (whole days)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--noise-seeds", default="2",
                    help="more seeds for none and loose (their spread is the noise)")
    ap.add_argument("--jobs", type=int, default=2, help="runs at once (processes)")
    ap.add_argument("--broken-rule", action="store_true",
                    help="the worst-case rule off (a check that the bench catches it)")
    ap.add_argument("--no-caps-cycles", action="store_true",
                    help="a stand-in: no full cycle for demand left over by caps "
                         "(see no_cycles_for_held_jobs)")
    ap.add_argument("--out", default=str(RESULTS / "budget.md"))
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    variants = args.variants.split(",")
    extra = [int(s) for s in args.noise_seeds.split(",") if s]
    flags = (args.broken_rule, args.no_caps_cycles)
    tasks = [(v, args.seed, float(args.days), *flags) for v in variants]
    tasks += [(v, s, float(args.days), *flags) for s in extra
              for v in ("none", "loose") if v in variants]
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        runs = pool.map(_one, tasks, chunksize=1)
    order = {v: i for i, v in enumerate(VARIANTS)}
    runs.sort(key=lambda r: (order.get(r.variant, 99), r.seed))
    sections = [("Spent past an allocation (must be 0)", never_past(runs)),
                ("Pacing and use (% of each amount)", pacing([r for r in runs
                                                              if r.variant in BINDING])),
                ("Efficiency and job waits", waits(runs)),
                ("A budget that does not bind; one group's grant spent", comparisons(runs))]
    text = "\n\n".join(f"## {title}\n\n{body}" for title, body in sections)
    print(text)
    took = time.perf_counter() - t0
    rule = " with the worst-case rule off (`--broken-rule`)" if args.broken_rule else ""
    opts = "".join(f" --{name}" for name, on in (("broken-rule", args.broken_rule),
                                                  ("no-caps-cycles", args.no_caps_cycles))
                   if on)
    Path(args.out).write_text(
        f"# Allocations as budgets, in the simulator{rule}\n\n`python bench/budget.py "
        f"--days {args.days}{opts}`: {args.days} simulated days (the grants' period, then drained "
        f"for at most 12 h), seed {args.seed} (none and loose also seeds "
        f"{args.noise_seeds or '-'}); the bench took {took:.0f} s.\n\n{text}\n",
        encoding="utf-8")
    if not args.no_plots and not args.broken_rule:
        for r in runs:
            if r.variant in PLOTTED and r.seed == args.seed:
                path = burndown(r, Path(args.out).with_name(f"budget-{r.variant}.png"))
                if path is not None:
                    print(f"wrote {path}", file=sys.stderr)
    print(f"bench took {took:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
