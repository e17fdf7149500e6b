"""Fingerprints of plan()'s decisions, to check that a change meant to make the decision
code faster decides exactly as before.

Runs `ours` in the simulator on the given scenarios and seeds, and plan() on synthetic
snapshots of the timing benchmark's kind, and hashes every Plan that plan() returns (its
repr: actions, summary, reserve figures, ...) and every run's results. Run it on the code
before and after a change and compare what it prints (timings go to stderr): equal digests
mean the same Plan at every call, cycle after cycle.

    python bench/decisions.py                      # the bench's scenarios, 1 day, seed 1
    python bench/decisions.py --seeds 1,2,3 --days 2
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import provisioner.decide.controller as controller  # noqa: E402
from bench.sim import SCENARIOS, run_scenario  # noqa: E402
from bench.sim.synthetic import synthetic_snapshot  # noqa: E402
from provisioner.decide.plan import plan  # noqa: E402
from provisioner.model import Plan  # noqa: E402


class Recorder:
    """Wraps plan(): hashes each Plan it returns into one running digest."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()
        self.calls = 0

    def __call__(self, *args: object, **kwargs: object) -> Plan:
        result = plan(*args, **kwargs)  # type: ignore[arg-type]
        self.digest.update(repr(result).encode())
        self.calls += 1
        return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default=",".join(f"{t}@{s}" for t, s in SCENARIOS))
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--days", type=float, default=1.0)
    ap.add_argument("--snapshots", type=int, default=3,
                    help="synthetic snapshots (seeds 0..n-1) of the timing benchmark")
    args = ap.parse_args(argv)
    for seed in range(args.snapshots):
        snap, memory, config = synthetic_snapshot(seed=seed)
        digest = hashlib.sha256(repr(plan(snap, memory, config, 1_000_000.0)).encode()
                                ).hexdigest()
        print(f"synthetic/{seed}: {digest[:16]}", flush=True)
    for scenario in args.scenarios.split(","):
        trace, _, site_set = scenario.partition("@")
        for seed in (int(s) for s in args.seeds.split(",")):
            recorder = Recorder()
            controller.plan = recorder  # type: ignore[assignment]
            t0 = time.perf_counter()
            try:
                result = run_scenario("ours", trace, seed=seed, duration=args.days * 86400,
                                      sites=site_set or "default")
            finally:
                controller.plan = plan
            outcome = hashlib.sha256(repr(sorted(asdict(result).items())).encode()).hexdigest()
            print(f"{trace}@{site_set or 'default'}/{seed}: {recorder.calls} plans "
                  f"{recorder.digest.hexdigest()[:16]}, results {outcome[:16]}", flush=True)
            print(f"  ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
