"""Scale benchmark in the testbed (`make bench-scale`): one full cycle against a big queue.

alice queues JOBS idle jobs in SHAPES shapes (cores x memory x stated runtime);
each site gets PILOTS_PER_SITE held pilot jobs in SLURM (pending pilots), and as
many pilot startd ads are advertised with the pilot identity, keyed to those
jobs (so the merge of SLURM and collector runs at full size). Then the
provisioner runs dry-run cycles (observe + plan, nothing applied) as it runs in
the service: through SSH to the sites, with the provisioner's read-only token.

Printed: wall time per phase for the first cycle (new connections) and the
following ones (reused), each site's read on its own (SSH against REST), queries
per daemon per cycle (no per-job queries), and the provisioner's memory. Results go
to bench/results/scale.md.
Runs inside the testbed as root: `deploy/testbed/testbed exec -- python /src/bench/scale.py`.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import htcondor2 as htcondor

from provisioner.config import load_config
from provisioner.pool.condor import read_queue
from provisioner.service.loop import Provisioner

CONFIG = "/src/deploy/testbed/provisioner.yaml"
ROOT_TOKEN = "/root/.condor/tokens.d/provisioner"
ON = "/src/deploy/testbed/inside/on"
LOGIN = {"gsi": "gsi-login", "frankfurt": "fra-login"}
ALICE = Path("/home/alice/scale")
RESULTS = Path("/src/bench/results/scale.md")


def sh(argv: list[str], **kw: Any) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw).stdout


def progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def submit_jobs(jobs: int, shapes: int) -> None:
    ALICE.mkdir(parents=True, exist_ok=True)
    rows = []
    per = max(1, jobs // shapes)
    for i in range(shapes):
        cpus = 1 + i % 4
        memory = 256 * (1 + (i // 4) % 16)
        runtime = 600 * (1 + (i // 64) % 8)
        count = per if i < shapes - 1 else jobs - per * (shapes - 1)
        rows.extend(f"{cpus}, {memory}, {runtime}" for _ in range(count))
    (ALICE / "jobs.txt").write_text("\n".join(rows) + "\n")
    (ALICE / "scale.sub").write_text(
        "executable = /bin/true\nrequest_cpus = $(c)\nrequest_memory = $(m)\n"
        "+MaxRuntime = $(r)\n"
        # Nothing may run them: the benchmark measures the provisioner, not jobs. A
        # clause on the node's name only a real pilot can answer: the prototype match
        # (provisioner.pool.prototype) keeps them demand, so every stage runs at full size.
        "requirements = TARGET.Machine == \"no-such-node\"\n"
        f"queue c, m, r from {ALICE}/jobs.txt\n")
    sh(["chown", "-R", "alice:", str(ALICE)])
    t0 = time.time()
    sh(["runuser", "-u", "alice", "--", "condor_submit", "-terse", str(ALICE / "scale.sub")],
       cwd=str(ALICE), env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    progress(f"{jobs} jobs in {shapes} shapes queued in {time.time() - t0:.0f} s")


def slurm(site: str, argv: list[str]) -> str:
    return sh([ON, LOGIN[site], "-u", "pilot", "--", *argv],
              env={"SLURM_CONF": f"/etc/slurm-{site}/slurm.conf", "PATH": "/usr/bin:/bin"})


def advertise_as_pilot(command: str, ads: str) -> None:
    """condor_advertise of many fake pilots' startd ads at once, as the pool's own
    daemons (condor@, which the testbed lets advertise startd ads: a real pilot's token
    advertises only its own pilot, docs/security.md)."""
    with tempfile.TemporaryDirectory(prefix="scale-ads.") as directory:
        path = Path(directory) / "ads"
        path.write_text(ads)
        sh(["env", "_CONDOR_SEC_TOKEN_DIRECTORY=/etc/condor/tokens.d",
            "_CONDOR_SEC_CLIENT_AUTHENTICATION_METHODS=IDTOKENS", "condor_advertise",
            "-multiple", command, str(path)])


def fake_pilots(per_site: int, job_name: str, sites: list[str]) -> list[str]:
    """Held pilot jobs at each of `sites` plus a startd ad for each; returns the ad names."""
    names = []
    ads = []
    for site in sites:
        for i in range(per_site):
            job_id = slurm(site, ["sbatch", "--parsable", "--hold", f"--job-name={job_name}",
                                  "--output=/dev/null", "--wrap", "true"]).strip().split(";")[0]
            name = f"pilot-{site}-{job_id}@scale-{i}"
            names.append(name)
            ads.append(f'MyType = "Machine"\nName = "slot1@{name}"\nMachine = "scale-{i}"\n'
                       'MyAddress = "<127.0.0.1:1>"\nStartdIpAddr = "<127.0.0.1:1>"\n'
                       'PartitionableSlot = true\nState = "Unclaimed"\nActivity = "Idle"\n'
                       'Cpus = 2\nMemory = 4000\nTotalSlotCpus = 4\nTotalSlotMemory = 8000\n'
                       f'PilotSite = "{site}"\nPilotSlurmJobId = "{job_id}"\n'
                       'PilotProvisionerId = "testbed"\n'
                       f'PilotWalltimeEnd = {int(time.time()) + 3600}\n'
                       'ScaleBench = true\n')
        progress(f"{per_site} held pilot jobs at {site}")
    advertise_as_pilot("UPDATE_STARTD_AD", "\n".join(ads))
    progress(f"{len(names)} pilot startd ads advertised")
    return names


class Counting:
    """Counts calls of a bound method by wrapping the class attribute."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self._undo: list[tuple[Any, str, Any]] = []

    def wrap(self, cls: Any, method: str, label: str) -> None:
        original = getattr(cls, method)

        def counted(obj: Any, *a: Any, **kw: Any) -> Any:
            self.calls[label] += 1
            return original(obj, *a, **kw)

        setattr(cls, method, counted)
        self._undo.append((cls, method, original))

    def restore(self) -> None:
        for cls, method, original in self._undo:
            setattr(cls, method, original)


def measure(cycles: int, sites: list[str]) -> tuple[
        list[dict[str, float]], list[Counter[str]], float, float, dict[str, float]]:
    config = load_config(CONFIG)
    config = config.model_copy(update={"sites": tuple(s for s in config.sites
                                                      if s.name in sites)})
    # Root's copy of the token; a journal in memory (a root-owned journal file
    # would lock the service's own account out of it).
    config = config.model_copy(update={"journal": "", "pool": config.pool.model_copy(
        update={"token_file": ROOT_TOKEN})})
    prov = Provisioner(config)
    counting = Counting()
    counting.wrap(htcondor.Schedd, "query", "schedd queries")
    counting.wrap(htcondor.Collector, "query", "collector queries")
    for site, backend in prov.backends.items():
        # commands over SSH, or requests to slurmrestd
        way = getattr(backend, "executor", None) or backend.client  # type: ignore[attr-defined]
        attr, what = ("run", "commands") if hasattr(way, "run") else ("call", "requests")
        original = getattr(way, attr)

        def counted(*a: Any, _o: Any = original, _s: str = f"{what} at {site}",
                    **kw: Any) -> Any:
            counting.calls[_s] += 1
            return _o(*a, **kw)

        setattr(way, attr, counted)
        way.close()  # a connection left by an earlier run would make "first" a reused one
    timings, calls = [], []
    for i in range(cycles):
        counting.calls.clear()
        t0 = time.monotonic()
        cycle = prov.run_cycle(f"scale {i}", dry_run=True)
        total = time.monotonic() - t0
        snap = cycle.observation.snapshot
        timings.append({**cycle.timings, "total": total})
        calls.append(Counter(counting.calls))
        progress(f"cycle {i}: {total:.2f} s; demand {sum(d.idle for d in snap.demand)} jobs "
                 f"in {len(snap.demand)} shapes; {len(snap.pilots)} pilots")
    # The memory peak in a cycle of its own: tracing every allocation slows a cycle
    # about twofold, so the timed cycles above run without it.
    tracemalloc.start()
    prov.run_cycle("scale memory", dry_run=True)
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    counting.restore()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return timings, calls, peak, rss, parts(prov)


def parts(prov: Provisioner, repeats: int = 3) -> dict[str, float]:
    """Each read of a cycle on its own, one after the other (in a cycle the sites'
    commands run beside the pool's queries): median seconds of `repeats`."""
    def timed(call: Any) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.monotonic()
            call()
            times.append(time.monotonic() - t0)
        return statistics.median(times)

    group_by = htcondor.QueryOpt.GroupBy
    out = {"schedd queue read in full (the first, then every 5 min)":
           timed(lambda: read_queue(htcondor.Schedd(), group_by)),
           "schedd queue read, settled idle jobs kept (the usual cycle)": timed(prov.pool.queue),
           "collector: the pilots' startd ads": timed(prov.pool.pilot_ads)}
    for site, backend in prov.backends.items():
        how = "squeue over SSH" if hasattr(backend, "executor") else \
            "GET /jobs through slurmrestd"
        out[f"{site}: {how}, parsed"] = timed(backend.list_pilots)
    return out


def cleanup(job_name: str) -> None:
    subprocess.run(["runuser", "-u", "alice", "--", "condor_rm", "alice"],
                   capture_output=True, check=False)
    for site in LOGIN:
        subprocess.run([ON, LOGIN[site], "-u", "pilot", "--", "scancel", f"--name={job_name}"],
                       env={"SLURM_CONF": f"/etc/slurm-{site}/slurm.conf",
                            "PATH": "/usr/bin:/bin"}, capture_output=True, check=False)
    advertise_as_pilot("INVALIDATE_STARTD_ADS", 'MyType = "Query"\nTargetType = "Machine"\n'
                       "Requirements = ScaleBench =?= true\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--shapes", type=int, default=300)
    ap.add_argument("--pilots-per-site", type=int, default=100)
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--only", choices=sorted(LOGIN),
                    help="one site alone (its backend's cycle), with all the pilots")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    sites = [args.only] if args.only else list(LOGIN)
    per_site = 2 * args.pilots_per_site // len(sites)
    job_name = "htcpilot-" + load_config(CONFIG).pool.provisioner_id
    try:
        submit_jobs(args.jobs, args.shapes)
        fake_pilots(per_site, job_name, sites)
        timings, calls, peak, rss, split = measure(args.cycles, sites)
    finally:
        cleanup(job_name)
    later = timings[1:] or timings
    med = {k: statistics.median(t[k] for t in later) for k in later[0]}
    lines = [
        f"# Scale: one cycle against {args.jobs} idle jobs in {args.shapes} shapes, "
        f"{per_site * len(sites)} pilots" + (f", {args.only} alone" if args.only else ""),
        "",
        "Testbed (2 cores); gsi reached through SSH (one multiplexed connection), "
        "frankfurt through slurmrestd (HTTP, one connection pool, JWT); dry-run cycles "
        "(observe + plan; the sites are read beside the pool, in threads). "
        "`make bench-scale` regenerates this file.",
        "",
        "| cycle | observe s | plan s | total s |",
        "| --- | --- | --- | --- |",
        f"| first (new connections) | {timings[0]['observe']:.2f} | "
        f"{timings[0]['plan']:.3f} | {timings[0]['total']:.2f} |",
        f"| later, median of {len(later)} (connections reused) | {med['observe']:.2f} | "
        f"{med['plan']:.3f} | {med['total']:.2f} |",
        "",
        "| queries per cycle | count |",
        "| --- | --- |",
        *(f"| {k} | {v} |" for k, v in sorted(calls[-1].items())),
        "",
        "| each read on its own (median of 3) | s |",
        "| --- | --- |",
        *(f"| {k} | {v:.3f} |" for k, v in split.items()),
        "",
        f"Memory: peak Python allocations during a cycle {peak:.0f} MiB; "
        f"process maximum resident size {rss:.0f} MiB.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
