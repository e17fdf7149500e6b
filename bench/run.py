"""Bench: every policy on every trace (fixed seeds), the targets, the reserve's
wait/efficiency frontier, plus plan() timing.

Run from the repository root: `python bench/run.py` (or `python -m bench.run`).
Prints markdown tables, writes bench/results/results.md and PNG plots of pilots and
queue over time (one per trace, one panel per policy) to bench/results/.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.sim import POLICIES, SCENARIOS, SITE_SETS, RunResult, run_scenario  # noqa: E402
from bench.sim.synthetic import synthetic_snapshot  # noqa: E402
from provisioner.config import ReserveConfig  # noqa: E402
from provisioner.decide.plan import plan  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SEEDS = "1,2,3"
DAYS = 2.0

COLUMNS = (
    "trace", "policy", "efficiency", "GPU efficiency", "wait p50 (s)", "wait p95 (s)",
    "wait max (min)",
    "allocated core-h", "claimed core-h", "killed core-h", "pilots submitted",
    "never used", "pending cancelled", "finished/jobs",
)


def pooled(runs: list[RunResult]) -> list[str]:
    """One table row for the runs of one scenario and policy (one per seed): core-hours
    summed, waits and counts averaged over the seeds."""
    def mean(values: list[float]) -> float:
        return statistics.fmean(values) if values else 0.0
    alloc = sum(r.allocated_core_h for r in runs)
    claimed = sum(r.claimed_core_h for r in runs)
    gpu_alloc = sum(r.allocated_gpu_h for r in runs)
    gpu = f"{100 * sum(r.claimed_gpu_h for r in runs) / gpu_alloc:.1f} %" if gpu_alloc else "-"
    r0 = runs[0]
    return [
        r0.trace, r0.policy, f"{100 * claimed / alloc if alloc else 0:.1f} %", gpu,
        f"{mean([r.wait_p50_s for r in runs]):.1f}", f"{mean([r.wait_p95_s for r in runs]):.1f}",
        f"{mean([r.wait_max_s for r in runs]) / 60:.0f}", f"{alloc / len(runs):.0f}",
        f"{claimed / len(runs):.0f}", f"{mean([r.killed_core_h for r in runs]):.0f}",
        f"{mean([r.pilots_submitted for r in runs]):.0f}",
        f"{mean([r.pilots_never_claimed for r in runs]):.0f}",
        f"{mean([r.pending_cancelled for r in runs]):.0f}",
        f"{sum(r.finished for r in runs)}/{sum(r.jobs - r.unmatchable_jobs for r in runs)}",
    ]


def grouped(results: list[RunResult]) -> dict[tuple[str, str], list[RunResult]]:
    out: dict[tuple[str, str], list[RunResult]] = {}
    for r in results:
        out.setdefault((r.trace, r.policy), []).append(r)
    return out


def table(results: list[RunResult]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(pooled(runs)) + " |" for runs in grouped(results).values()]
    return "\n".join(lines)


def targets(results: list[RunResult]) -> str:
    """Per trace and seed: is ours more efficient than every baseline at an equal or lower
    wait p95 than each (dominance)? One line per trace, the seeds listed."""
    lines = ["| trace | seed | ours efficiency | best baseline efficiency | ours wait p95 (s) "
             "| best baseline wait p95 (s) | dominates |", "|---|---|---|---|---|---|---|"]
    by_trace: dict[str, list[RunResult]] = {}
    for r in results:
        by_trace.setdefault(r.trace, []).append(r)
    for trace, runs in by_trace.items():
        for seed in sorted({r.seed for r in runs}):
            ours = [r for r in runs if r.seed == seed and r.policy == "ours"]
            others = [r for r in runs if r.seed == seed and r.policy != "ours"]
            if not ours or not others:
                continue
            o = ours[0]
            met = all(o.efficiency > b.efficiency and o.wait_p95_s <= b.wait_p95_s
                      for b in others)
            lines.append(
                f"| {trace} | {seed} | {100 * o.efficiency:.1f} % | "
                f"{100 * max(b.efficiency for b in others):.1f} % | {o.wait_p95_s:.1f} | "
                f"{min(b.wait_p95_s for b in others):.1f} | {'yes' if met else 'NO'} |")
    return "\n".join(lines)


def placement(results: list[RunResult]) -> str:
    """Pilots started and allocated core-h per site, summed over the seeds."""
    sites = sorted({s for r in results for s in r.placement})
    lines = ["| trace | policy | " + " | ".join(f"{s} pilots | {s} core-h" for s in sites)
             + " |", "|---|---|" + "---|---|" * len(sites)]
    for (trace, policy), runs in grouped(results).items():
        cells = []
        for s in sites:
            n = sum(r.placement.get(s, (0, 0.0))[0] for r in runs)
            h = sum(r.placement.get(s, (0, 0.0))[1] for r in runs)
            cells += [str(n), f"{h:.0f}"] if n else ["-", "-"]
        lines.append(f"| {trace} | {policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


FRONTIER_FACTORS = "0,1,1.5,2,3"  # plus the default (2.5), which the main table has
#: Where the reserve must pay for itself: ours with and without it, per seed.
RESERVE_TRACE = "mixed-rare,mixed,trickle"


def reserve_on_off(seeds: list[int], days: float, traces: str = RESERVE_TRACE) -> str:
    """Ours with the default reserve and with none, per trace and seed: efficiency, waits,
    idle core-hours (allocated - claimed: the reserve's cost is on's minus off's), pilots
    never used and ended by their no-claim shutdown; "not dominated": the reserve is not
    worse on both efficiency and wait p95."""
    lines = ["| trace | seed | reserve | efficiency | wait p50 (s) | wait p95 (s) "
             "| idle core-h | never used | no-claim ends | not dominated |", "|---" * 10 + "|"]
    for trace in traces.split(","):
        for seed in seeds:
            on, off = (run_scenario("ours", trace, seed=seed, duration=days * 86400,
                                    reserve=reserve)
                       for reserve in (None, ReserveConfig(enabled=False)))
            ok = on.efficiency >= off.efficiency or on.wait_p95_s < off.wait_p95_s
            for name, r in (("on", on), ("off", off)):
                lines.append(
                    f"| {trace} | {seed} | {name} | {100 * r.efficiency:.1f} % | "
                    f"{r.wait_p50_s:.1f} | {r.wait_p95_s:.1f} | "
                    f"{r.allocated_core_h - r.claimed_core_h:.0f} | {r.pilots_never_claimed} | "
                    f"{r.noclaim_ended} | {('yes' if ok else 'NO') if name == 'on' else ''} |")
            print(lines[-2], lines[-1], sep="\n", file=sys.stderr, flush=True)
    return "\n".join(lines)


def time_plan(runs: int = 15) -> tuple[float, list[float]]:
    snap, memory, config = synthetic_snapshot()
    now = 1_000_000.0
    plan(snap, memory, config, now)  # warm up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        plan(snap, memory, config, now)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def plot(results: list[RunResult]) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plots", file=sys.stderr)
        return []
    out = []
    by_trace: dict[str, list[RunResult]] = {}
    for r in results:
        by_trace.setdefault(r.trace, []).append(r)
    for trace, runs in by_trace.items():
        fig, axes = plt.subplots(len(runs), 1, figsize=(10, 2.6 * len(runs)), sharex=True)
        for ax, r in zip(axes, runs, strict=True):
            t = [s.t / 3600 for s in r.timeline]
            ax.plot(t, [s.allocated_cores for s in r.timeline], label="allocated cores")
            ax.plot(t, [s.claimed_cores for s in r.timeline], label="claimed cores")
            ax.plot(t, [s.idle_jobs for s in r.timeline], label="idle jobs", alpha=0.7)
            ax.plot(t, [s.pilots for s in r.timeline], label="running pilots", alpha=0.7)
            ax.set_title(f"{trace} / {r.policy}: efficiency {100 * r.efficiency:.1f} %, "
                         f"wait p95 {r.wait_p95_s / 60:.1f} min", fontsize=9)
            ax.set_ylabel("count")
            ax.legend(fontsize=7, loc="upper right")
        axes[-1].set_xlabel("hours")
        fig.tight_layout()
        path = RESULTS / f"{trace.replace(' @', '-')}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        out.append(path)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--scenarios", default=",".join(f"{t}@{s}" for t, s in SCENARIOS),
                    help="trace@siteset,... (site sets: " + ", ".join(SITE_SETS) + ")")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--seeds", default=SEEDS)
    ap.add_argument("--days", type=float, default=DAYS)
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--out", default=str(RESULTS / "results.md"), help="markdown table file")
    ap.add_argument("--frontier", default=FRONTIER_FACTORS,
                    help="reserve factors for the frontier table on steady ('' = skip)")
    ap.add_argument("--reserve-sweep", default="",
                    help="comma-separated reserve factors: run only `ours` with each one "
                         "(0 = no reserve) on --traces and print the trade-off table")
    ap.add_argument("--traces", default="steady", help="traces of --reserve-sweep")
    ap.add_argument("--reserve-trace", default=RESERVE_TRACE,
                    help="traces of the reserve on/off table ('' = skip)")
    args = ap.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.reserve_sweep:
        return sweep(args)

    t_start = time.perf_counter()
    median, times = time_plan()  # first, in a fresh process (no simulator garbage around)
    results = []
    seeds = [int(x) for x in args.seeds.split(",")]
    for scenario in args.scenarios.split(","):
        trace, _, site_set = scenario.partition("@")
        for seed in seeds:
            for policy in args.policies.split(","):
                t0 = time.perf_counter()
                r = run_scenario(policy, trace, seed=seed, duration=args.days * 86400,
                                 sites=site_set or "default")
                print(f"  {r.trace}/{policy}/{seed}: {time.perf_counter() - t0:.1f} s",
                      file=sys.stderr)
                results.append(r)
    md, dominance, where = table(results), targets(results), placement(results)
    print(md, "", dominance, "", where, sep="\n", flush=True)
    frontier = ""
    if args.frontier:
        args.reserve_sweep, args.seed = args.frontier, seeds[0]
        points = [(f"{r.policy} (default)" if r.policy == "ours" else r.policy,
                   r.wait_p95_s, r.efficiency) for r in results
                  if r.trace == "steady" and r.seed == seeds[0]]
        frontier = "\n".join(sweep_lines(args, points))
        if not args.no_plots and frontier_plot(points, RESULTS / "frontier.png"):
            print("wrote bench/results/frontier.png", file=sys.stderr)
    on_off = reserve_on_off(seeds, args.days, args.reserve_trace) if args.reserve_trace else ""
    print("", on_off, sep="\n")
    timing = (f"plan() on 100k idle jobs in 500 shapes, 5k pilots, 10 sites: median "
              f"{median * 1000:.1f} ms over {len(times)} runs "
              f"(min {min(times) * 1000:.1f}, max {max(times) * 1000:.1f})")
    print()
    print(timing)
    Path(args.out).write_text(
        f"# Bench results\n\nSeeds {args.seeds}, {args.days:g} simulated days per trace "
        f"(then drained), `python bench/run.py`. Core-hours per run (mean over the seeds), "
        f"efficiency over all seeds' core-hours, waits the mean of the seeds' "
        f"percentiles.\n\n{md}\n\n## Dominance per seed\n\n{dominance}\n\n"
        f"## Placement per site (summed over the seeds)\n\n{where}\n\n"
        f"## Reserve frontier (ours on steady, seed {seeds[0]}, other factors)\n\n"
        f"{frontier or '(not run)'}\n\n## Reserve on and off ({args.reserve_trace})\n\n"
        f"{on_off or '(not run)'}\n\n{timing}\n", encoding="utf-8")
    if not args.no_plots:
        for path in plot([r for r in results if r.seed == seeds[0]]):
            print(f"wrote {path.relative_to(ROOT)}", file=sys.stderr)
    print(f"bench took {time.perf_counter() - t_start:.0f} s", file=sys.stderr)
    return 0


def sweep(args: argparse.Namespace) -> int:
    """`ours` with each reserve factor on each trace: the wait / efficiency trade-off."""
    print("\n".join(sweep_lines(args)))
    return 0


def sweep_lines(args: argparse.Namespace,
                points: list[tuple[str, float, float]] | None = None) -> list[str]:
    """The frontier table's lines; each run's (label, wait p95, efficiency) is added to
    `points` if given (for `frontier_plot`)."""
    lines = ["| reserve factor | trace | wait p95 (s) | wait max (min) | efficiency "
             "| pilots never claimed | sbatch/h |", "|---|---|---|---|---|---|---|"]
    for factor in (float(f) for f in args.reserve_sweep.split(",")):
        reserve = ReserveConfig(enabled=factor > 0, factor=factor)
        for trace in args.traces.split(","):
            r = run_scenario("ours", trace, seed=getattr(args, "seed", 1),
                             duration=args.days * 86400, reserve=reserve)
            lines.append(f"| {factor:g} | {trace} | {r.wait_p95_s:.1f} | "
                         f"{r.wait_max_s / 60:.0f} | {100 * r.efficiency:.1f} % | "
                         f"{r.pilots_never_claimed} | {r.submissions_per_h:.1f} |")
            print(lines[-1], flush=True)
            if points is not None:
                points.append((f"ours, factor {factor:g}", r.wait_p95_s, r.efficiency))
    return lines


def frontier_plot(points: list[tuple[str, float, float]], path: Path) -> Path | None:
    """Wait p95 against efficiency, one point per run (`points`: label, p95, efficiency):
    the reserve's factors, the default and the baselines on one trace and seed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ours = sorted((p for p in points if p[0].startswith("ours, factor")), key=lambda p: p[2])
    ax.plot([p[2] * 100 for p in ours], [p[1] for p in ours], "o-", color="tab:blue",
            label="ours, reserve factors")
    for label, p95, eff in points:
        if not label.startswith("ours, factor"):
            ax.plot(eff * 100, p95, "s" if "ours" in label else "^", markersize=9,
                    label=label)
    for label, p95, eff in ours:
        ax.annotate(label.split()[-1], (eff * 100, p95), textcoords="offset points",
                    xytext=(4, 4), fontsize=8)
    ax.set_xlabel("efficiency (%)")
    ax.set_ylabel("job wait p95 (s)")
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


if __name__ == "__main__":
    raise SystemExit(main())
