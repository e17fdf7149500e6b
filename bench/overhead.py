"""What the bookkeeping costs per cycle (`make bench-overhead`).

One cycle at 20,000 idle jobs in 300 shapes and 200 pilots over two sites, timed as:
the decision only (`Controller.cycle`: plan and carried state); plus the journal's audit trail as
the service wrote it before (the cycle, its actions, the state keys); plus the
accounting records (the pilot records from both sites' `squeue`, 50 new job runs from
the schedd's history); plus the metrics update. The journal is a file on disk (each
write is committed, as in the service). And, apart from the cycle, the accounting
`provisioner report` runs over one day of those records. Median milliseconds over the
repeats, printed as a table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.sim.synthetic import synthetic_snapshot  # noqa: E402
from provisioner.decide.controller import Controller  # noqa: E402
from provisioner.model import Plan, Snapshot  # noqa: E402
from provisioner.service.accounting import JobRun, site_days  # noqa: E402
from provisioner.service.journal import Journal, SeenPilot  # noqa: E402
from provisioner.service.ledger import Ledger  # noqa: E402
from provisioner.service.loop import describe  # noqa: E402
from provisioner.service.metrics import Metrics  # noqa: E402

NOW = 1_000_000.0


class History:
    """The schedd's history: `per_cycle` new runs on the snapshot's pilots each read."""

    def __init__(self, snap: Snapshot, per_cycle: int) -> None:
        self.snap, self.per_cycle, self.n = snap, per_cycle, 0

    def history(self, after: float) -> list[JobRun]:
        runs = []
        started = [p for p in self.snap.pilots if p.started_at is not None]
        for _ in range(self.per_cycle):
            p = started[self.n % len(started)]
            self.n += 1
            end = after + 1 + self.n * 1e-3
            runs.append(JobRun(f"{self.n}.0", "alice", p.site, p.job_id, 1, end - 3000, end,
                               2500.0))
        return runs


def audit_work(journal: Journal, result: Plan, now: float) -> None:
    with journal.batch():  # as the service does: one commit for the cycle's records
        _audit_work(journal, result, now)


def _audit_work(journal: Journal, result: Plan, now: float) -> None:
    """What `Provisioner.run_cycle` wrote before the accounting: the audit trail."""
    cid = journal.cycle("bench", "summary line", {"observe": 0.1, "plan": 0.01, "act": 0.1})
    for action in result.actions:
        journal.action(cid, type(action).__name__.lower(), "", "", describe(action), "ok")
    for key in ("flagged", "controller", "breakers", "last_cycle"):
        journal.put(key, {"at": now, "n": len(result.actions)})


def accounting_work(journal: Journal, ledger: Ledger, snap: Snapshot, now: float) -> None:
    with journal.batch():
        _accounting_work(journal, ledger, snap, now)


def _accounting_work(journal: Journal, ledger: Ledger, snap: Snapshot, now: float) -> None:
    """The accounting records of a cycle: pilot records from both sites' squeue, then
    the new job runs from the schedd's history."""
    for site in {v.name for v in snap.sites}:
        seen = [SeenPilot(p.job_id, p.cpus, p.memory_mb, p.submitted_at, p.started_at,
                          p.name is not None) for p in snap.pilots if p.site == site]
        journal.record_pilots(site, seen, now)
    ledger.read_history(now)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--shapes", type=int, default=300)
    ap.add_argument("--pilots", type=int, default=200)
    args = ap.parse_args()
    snap, _memory, config = synthetic_snapshot(seed=1, n_jobs=args.jobs, n_shapes=args.shapes,
                                               n_pilots=args.pilots, n_sites=2, now=NOW)
    tmp = tempfile.TemporaryDirectory()
    journal = Journal(str(Path(tmp.name) / "journal.sqlite"))
    metrics = Metrics()
    ledger = Ledger(journal, metrics, History(snap, 50))
    times: dict[str, list[float]] = {"plan": [], "audit": [], "accounting": [], "metrics": []}

    def timed(fn: Callable[[], object]) -> tuple[float, object]:
        t0 = time.perf_counter()
        out = fn()
        return (time.perf_counter() - t0) * 1000, out

    for i in range(args.repeats):
        now = NOW + 300 * i
        controller = Controller(config)
        t_plan, result = timed(lambda: controller.cycle(snap, now))  # noqa: B023
        assert isinstance(result, Plan)
        t_audit, _ = timed(lambda: audit_work(journal, result, now))  # noqa: B023
        t_acct, _ = timed(lambda: accounting_work(journal, ledger, snap, now))  # noqa: B023
        t_metrics, _ = timed(lambda: metrics.cycle(
            now=now, timings={"observe": 0.1, "plan": t_plan / 1000, "act": 0.1},  # noqa: B023
            sites=config.sites, pool_known=True, demand=snap.demand,
            unmatchable=result.unmatchable, pilots=snap.pilots, circuit={},  # noqa: B023
            known_sites=[v.name for v in snap.sites if v.known]))
        times["plan"].append(t_plan)
        times["audit"].append(t_audit)
        times["accounting"].append(t_acct)
        times["metrics"].append(t_metrics)
    pilots = journal.pilots(since=NOW - 86400)
    runs = journal.job_runs()
    t_acc = [timed(lambda: site_days(pilots, runs, NOW + 86400))[0] for _ in range(5)]
    med = {k: statistics.median(v) for k, v in times.items()}
    a = med["plan"] + med["audit"]
    rows = [
        ("plan only (Controller.cycle)", med["plan"]),
        (f"+ journal audit trail (cycle, {len(result.actions)} actions, state; one commit)", a),
        ("+ accounting records (pilot records of 2 sites, 50 history runs)",
         a + med["accounting"]),
        ("+ metrics update", a + med["accounting"] + med["metrics"]),
    ]
    print(f"Cycle overhead: {args.jobs} idle jobs in {len(snap.demand)} shapes, "
          f"{len(snap.pilots)} pilots, 2 sites; median of {args.repeats} repeats\n")
    print("| configuration (cumulative) | median ms | this step ms |")
    print("|---|---:|---:|")
    prev = 0.0
    for name, ms in rows:
        print(f"| {name} | {ms:.2f} | {ms - prev:+.2f} |")
        prev = ms
    print(f"\nApart from the cycle: accounting over {len(pilots)} pilot records and "
          f"{len(runs)} job runs (`provisioner report`): {statistics.median(t_acc):.1f} ms")
    journal.db.close()
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
