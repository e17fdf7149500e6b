"""`make bench-report`: a simulated two-day run fed through `provisioner report`.

Runs our policy on the steady trace (default sites, seed 1), writes what the journal
would hold (pilot records, job runs) into bench/results/sim-report/journal.sqlite, and
writes the report there (table in report.txt, report.csv, cores.png, idle.png).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.sim.ledger import BASE, job_runs, pilot_records  # noqa: E402
from bench.sim.scenarios import SITE_SETS, default_config, make_policy  # noqa: E402
from bench.sim.traces import TRACES  # noqa: E402
from bench.sim.world import World  # noqa: E402
from provisioner.service.journal import Journal  # noqa: E402
from provisioner.service.report import report  # noqa: E402

OUT = ROOT / "bench" / "results" / "sim-report"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trace", default="steady")
    ap.add_argument("--sites", default="default", choices=sorted(SITE_SETS))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--days", type=float, default=2.0)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    sites = SITE_SETS[args.sites]()
    config = default_config(sites)
    duration = args.days * 86400
    jobs = [j for j in TRACES[args.trace](args.seed) if j.submit < duration]
    world = World(sites, config, seed=args.seed + 1000)
    world.run(make_policy("ours", config), jobs, trace_name=args.trace, duration=duration)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "journal.sqlite"
    path.unlink(missing_ok=True)
    journal = Journal(str(path))
    journal.add_pilot_records(pilot_records(world), "simulated")
    journal.add_job_runs(job_runs(world, args.seed))
    journal.db.close()
    end = BASE + world.now
    text, written = report(str(path), end, out=args.out)
    head = (f"Simulated: trace {args.trace}, sites {args.sites}, seed {args.seed}, "
            f"{args.days:g} days (E2 is the simulator's drawn payload CPU efficiency)\n")
    (args.out / "report.txt").write_text(head + text + "\n")
    print(head + text)
    for p in written:
        print(f"wrote {p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}")
    print(f"simulator's own totals: allocated {world.allocated_core_s / 3600:.1f} core-h, "
          f"claimed {world.claimed_core_s / 3600:.1f} core-h")
    return 0


if __name__ == "__main__":
    sys.exit(main())
