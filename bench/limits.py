"""Bench: a site at its submission limit (issue 23). The cheaper site (gsi) lets the
account hold 20 jobs and take 4 sbatch per minute; SLURM refuses beyond, in its own words.
`ours` learns from the refusals (at most one refused sbatch per site and cycle, the rest
placed at frankfurt in the same cycle); `ours-blind` is the same controller hearing
nothing of them (as before); the baselines as in bench/run.py.

Run from the repository root: `python bench/limits.py` (prints a markdown table, writes
bench/results/limits.md).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.sim.scenarios import BLIND, POLICIES, run_scenario  # noqa: E402

HEADER = ("| trace | policy | sbatch | refused sbatch | refused per h | wait p50 (s) "
          "| wait p95 (s) | efficiency | gsi pilots | frankfurt pilots |")


def rows(traces: list[str], seeds: list[int], hours: float) -> list[str]:
    lines = [HEADER, "|---|---|---|---|---|---|---|---|---|---|"]
    for trace in traces:
        for policy in (*POLICIES, BLIND):
            runs = [run_scenario(policy, trace, seed=seed, duration=hours * 3600,
                                 sites="limited") for seed in seeds]
            mean = lambda xs: statistics.fmean(xs)  # noqa: E731
            alloc = sum(r.allocated_core_h for r in runs)
            claimed = sum(r.claimed_core_h for r in runs)
            per_h = mean([r.sbatch_refused / r.sim_hours for r in runs])
            lines.append(
                f"| {trace} | {policy} | {mean([r.sbatch_calls for r in runs]):.0f} | "
                f"{mean([r.sbatch_refused for r in runs]):.0f} | {per_h:.1f} | "
                f"{mean([r.wait_p50_s for r in runs]):.0f} | "
                f"{mean([r.wait_p95_s for r in runs]):.0f} | "
                f"{100 * claimed / alloc if alloc else 0:.1f} % | "
                f"{mean([r.placement.get('gsi', (0, 0.0))[0] for r in runs]):.0f} | "
                f"{mean([r.placement.get('frankfurt', (0, 0.0))[0] for r in runs]):.0f} |")
            print(lines[-1], flush=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--traces", default="steady,bursty")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--hours", type=float, default=12.0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "limits.md"))
    args = ap.parse_args(argv)
    logging.getLogger("provisioner").setLevel(logging.ERROR)  # the table says it all
    lines = rows(args.traces.split(","), [int(s) for s in args.seeds.split(",")],
                 args.hours)
    Path(args.out).write_text(
        "# A site at its submission limit\n\ngsi: at most 20 jobs held and 4 sbatch/min "
        f"(refused beyond, SLURM's words); frankfurt unlimited. {args.hours:g} h per trace "
        f"(then drained), seeds {args.seeds}, means over the seeds; "
        "`python bench/limits.py`.\n\n" + "\n".join(lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
