"""`provisioner why` at bench-scale's queue, in the testbed: how long an answer takes.

The queue and the pilots of `bench/scale.py` (JOBS idle jobs in SHAPES shapes, held
pilot jobs and their startd ads at every site), plus one job no site can run (1 TB) and
one ordinary job. One cycle of the provisioner (as `make bench-scale` runs it) and its
status ad advertised to the collector; then alice asks `provisioner why` (a new
process each time, as she would) about each, and about the whole big cluster. Printed
as a table, written to bench/results/why.md.
Runs inside the testbed as root (`make bench-why`):
`deploy/testbed/testbed exec -- python /src/bench/why.py`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path

import classad2
from scale import ALICE, CONFIG, ROOT_TOKEN, cleanup, fake_pilots, progress, sh, submit_jobs

from provisioner.config import load_config
from provisioner.pool.status_ad import to_ad
from provisioner.service.loop import Provisioner

RESULTS = Path("/src/bench/results/why.md")
ENV = {"PATH": "/opt/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/home/alice",
       "LANG": "C.UTF-8"}


def submit(name: str, body: str) -> str:
    sub = ALICE / f"{name}.sub"
    sub.write_text(f"executable = /bin/true\n{body}queue 1\n")
    sh(["chown", "-R", "alice:", str(ALICE)])
    out = sh(["runuser", "-u", "alice", "--", "condor_submit", "-terse", str(sub)],
             cwd=str(ALICE), env=ENV)
    return out.split(".")[0].strip()


def why(args: list[str]) -> tuple[float, str]:
    """One `provisioner why ARGS` as alice: (wall seconds, its output)."""
    t0 = time.monotonic()
    proc = subprocess.run(["runuser", "-u", "alice", "--", "/opt/venv/bin/provisioner", "why",
                           *args], capture_output=True, text=True, env=ENV, cwd=str(ALICE),
                          check=False)
    return time.monotonic() - t0, proc.stdout + proc.stderr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--shapes", type=int, default=300)
    ap.add_argument("--pilots-per-site", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    config = load_config(CONFIG)
    job_name = "htcpilot-" + config.pool.provisioner_id
    config = config.model_copy(update={"journal": "", "pool": config.pool.model_copy(
        update={"token_file": ROOT_TOKEN})})
    rows: list[tuple[str, float, float, str]] = []
    try:
        ALICE.mkdir(parents=True, exist_ok=True)
        submit_jobs(args.jobs, args.shapes)
        big = sh(["condor_q", "alice", "-af", "ClusterId"]).split()[0]
        tera = submit("why-tera", "request_memory = 1048576\n")
        plain = submit("why-plain", "request_memory = 500\n")
        fake_pilots(args.pilots_per_site, job_name)
        prov = Provisioner(config)
        cycle = prov.run_cycle("why bench", dry_run=True)
        t0 = time.monotonic()
        report = prov.publisher.publish(prov.controller, cycle.plan, time.time())
        publish_s = time.monotonic() - t0
        assert report is not None and not prov.publisher.failing, "status ad not advertised"
        ad_bytes = len(str(classad2.ClassAd(to_ad(report))))
        progress(f"status ad: {len(report.shapes)} shapes, {ad_bytes} bytes, built and "
                 f"advertised in {publish_s:.3f} s")
        for label, argv in (("one job of the big cluster", [f"{big}.0"]),
                            ("a 1 TB job", [tera]), ("an ordinary job", [plain]),
                            ("12x (malformed)", ["12x"]),
                            (f"the whole big cluster ({args.jobs} jobs), --json",
                             ["--json", big])):
            runs = [why(argv) for _ in range(args.repeats)]
            times = [t for t, _ in runs]
            text = runs[-1][1] if "--json" not in argv else f"{len(runs[-1][1])} bytes of JSON"
            rows.append((label, statistics.median(times), max(times), text.strip()))
            progress(f"why {' '.join(argv)}: median {statistics.median(times):.2f} s")
    finally:
        cleanup(job_name)
        subprocess.run(["runuser", "-u", "alice", "--", "condor_rm", "alice"],
                       capture_output=True, check=False)
    lines = [f"# `provisioner why` at a queue of {args.jobs} idle jobs in {args.shapes} shapes, "
             f"{2 * args.pilots_per_site} pilots",
             "",
             "Testbed (2 cores); each answer a new `provisioner why` process as alice "
             "(Python start-up, one schedd query, one collector query). "
             "`make bench-why` regenerates this file.",
             "",
             f"The status ad: {len(report.shapes)} shapes, {ad_bytes} bytes; built and "
             f"advertised after the cycle in {publish_s:.3f} s.",
             "",
             f"| asked | median s (of {args.repeats}) | slowest s |",
             "| --- | --- | --- |",
             *(f"| {label} | {med:.2f} | {top:.2f} |" for label, med, top, _ in rows),
             "",
             "The answers:",
             "",
             "```",
             *(f"$ provisioner why ...  # {label}\n{text}" for label, _m, _t, text in rows),
             "```",
             ""]
    RESULTS.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
