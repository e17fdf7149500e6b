"""The testbed's small-workload measurement (`make bench-small`), its pure part.

The workload: from zero pilots, 8 one-minute jobs, then 4 more six minutes later, with
the provisioner's production policy (every `policy` setting at its default). Per run:
efficiency = claimed / allocated core-seconds (pilots counted from SLURM start to end,
`provisioner.service.accounting`), job waits (submission to first start) and pilots that never
ran a job. The target (issue 26: efficiency >= 0.88 with wait p95 <= 10 s in every run;
for the first-jobs workload, 4 jobs, p95 <= 10 s) is reported, never asserted.
deploy/testbed/smallload.py runs it and feeds this module.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner.config import PilotRuntimeConfig, PolicyConfig
from provisioner.pilot import endrecord
from provisioner.service.accounting import JobRun, PilotRecord, percentile, site_days


@dataclass(frozen=True)
class Workload:
    """What alice submits: one-minute 1-core jobs in `batches`, `gap_s` apart; the
    target per run (efficiency None: not a target of this workload)."""

    name: str  # results file bench/results/<name>.md (and .png)
    batches: tuple[int, ...]
    gap_s: float
    text: str
    target_efficiency: float | None
    target_wait_p95_s: float


#: H2H-12 (issue 10's workload; issue 26's target: p95 <= 10 s with efficiency >= 0.88).
SMALL = Workload("testbed-small", (8, 4), 360, "8 one-minute jobs (1 core, 500 MB), six "
                 "minutes later 4 more", 0.88, 10.0)
#: The first jobs (issue 26): 4 one-minute jobs from zero pilots, p95 <= 10 s.
FIRST = Workload("testbed-first", (4,), 0, "4 one-minute jobs (1 core, 500 MB)", None, 10.0)
WORKLOADS = {w.name: w for w in (SMALL, FIRST)}


def _show(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _flat(data: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    for key, value in data.items():
        if isinstance(value, Mapping):
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def reset_policy(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A copy of a parsed configuration without its `policy` section (so every policy
    and cadence setting takes the provisioner's default) and without the sites' pilot
    no-claim timer (`runtime.noclaim_shutdown_s`, the backstop the default
    `policy.stuck_after_s` is checked against), and one line per setting dropped:
    "policy.interval_s: 10 -> 300". Everything else stays as it is."""
    out = copy.deepcopy(dict(data))
    policy = out.pop("policy", None) or {}
    defaults = dict(_flat(PolicyConfig().model_dump()))
    lines = []
    for key, value in _flat(policy):
        lines.append(_reset_line(f"policy.{key}", value, defaults.get(key, "(default)")))
    noclaim = PilotRuntimeConfig().noclaim_shutdown_s
    for i, site in enumerate(out.get("sites") or []):
        runtime = site.get("runtime") if isinstance(site, dict) else None
        if isinstance(runtime, dict) and "noclaim_shutdown_s" in runtime:
            lines.append(_reset_line(f"sites[{i}].runtime.noclaim_shutdown_s",
                                     runtime.pop("noclaim_shutdown_s"), noclaim))
    return out, lines


def _reset_line(key: str, value: Any, default: Any) -> str:
    same = " (the default already)" if _show(value) == _show(default) else ""
    return f"{key}: {_show(value)} -> {_show(default)}{same}"


def job_waits(ads: Iterable[Mapping[str, Any]]) -> list[float]:
    """Seconds from submission (QDate) to the first start (JobStartDate) of each job
    history ad; jobs that never started are left out."""
    out = []
    for ad in ads:
        start, queued = int(ad.get("JobStartDate") or 0), int(ad.get("QDate") or 0)
        if start > 0 and queued > 0:
            out.append(float(max(0, start - queued)))
    return out


@dataclass(frozen=True)
class RunResult:
    """One run; `error` says why it did not complete ("" = it did)."""

    run: int
    offset_s: float
    efficiency: float | None = None
    waits: tuple[float, ...] = ()
    pilots: int = 0  # submitted to SLURM
    started: int = 0  # of those, started
    never_claimed: int = 0  # started but ran no job
    unattributed: int = 0  # job runs whose pilot the journal does not know
    error: str = ""

    def wait(self, q: float) -> float | None:
        return percentile(list(self.waits), q)

    def met(self, workload: Workload = SMALL) -> bool:
        p95 = self.wait(95)
        if self.error or p95 is None or p95 > workload.target_wait_p95_s:
            return False
        want = workload.target_efficiency
        return want is None or (self.efficiency is not None and self.efficiency >= want)


def with_recorded_ends(pilots: Sequence[PilotRecord], provisioner_id: str,
                       end_dir: Path) -> list[PilotRecord]:
    """The journal's pilots, each that the service did not see end (it stopped first)
    ended when its own end record in `end_dir` says: otherwise it would count as
    allocated until the figures are taken. A bad record is reported and left out."""
    out = []
    for p in pilots:
        path = end_dir / endrecord.file_name(p.site, p.job_id)
        if p.end_at is None and p.start_at is not None and path.exists():
            try:
                rec = endrecord.parse(path.read_text(), p.site, p.job_id, provisioner_id)
            except endrecord.BadEndRecord as exc:
                print(f"   {path}: {exc}; the pilot counts as running until now")
            else:
                p = dataclasses.replace(p, end_at=rec.end_at, end_source="record",
                                        end_reason=rec.reason)
        out.append(p)
    return out


def measure(run: int, offset_s: float, pilots: Sequence[PilotRecord],
            runs: Sequence[JobRun], waits: Sequence[float], now: float) -> RunResult:
    """A completed run's figures from its pilot records and job runs."""
    rows = site_days(pilots, runs, now)
    allocated = sum(r.allocated for r in rows)
    claimed = sum(r.claimed for r in rows)
    ran = {r.pilot_key for r in runs}
    started = [p for p in pilots if p.start_at is not None]
    keys = {p.key for p in pilots}
    return RunResult(run=run, offset_s=offset_s,
                     efficiency=claimed / allocated if allocated > 0 else None,
                     waits=tuple(waits), pilots=len(pilots), started=len(started),
                     never_claimed=sum(1 for p in started if p.key not in ran),
                     unattributed=sum(1 for r in runs if r.pilot_key not in keys))


def progress(elapsed: float, jobs: Mapping[int, int] | None, total: int,
             pilots: Mapping[str, Sequence[str]] | None, cycles: int) -> str:
    """One progress line from the jobs still queued (JobStatus -> count; None: unknown)
    and each site's pilot job states (None: unknown)."""
    if jobs is None:
        j = "jobs ?"
    else:
        j = (f"jobs {jobs.get(1, 0)} idle, {jobs.get(2, 0)} running, "
             f"{total - sum(jobs.values())}/{total} done")
        if jobs.get(5):
            j += f", {jobs[5]} held"
    if pilots is None:
        p = "pilots ?"
    else:
        p = "pilots " + ", ".join(
            f"{site} " + (" ".join(f"{n} {state}" for state, n in sorted(Counter(states).items()))
                          or "0") for site, states in pilots.items())
    return f"  [{elapsed:5.0f} s] {j} | {p} | {cycles} cycles"


def _num(x: float | None, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x, fmt)


def _mean(values: Iterable[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.fmean(got) if got else None


def table(results: Sequence[RunResult]) -> str:
    """Markdown: one row per run, then the mean of the completed runs."""
    head = ["run", "offset s", "efficiency", "wait p50 s", "wait p95 s", "wait max s",
            "pilots", "started", "never claimed"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in results:
        if r.error:
            cells = [str(r.run), _num(r.offset_s), f"failed: {r.error}"] + [""] * 6
        else:
            cells = [str(r.run), _num(r.offset_s), _num(r.efficiency, ".3f"),
                     _num(r.wait(50)), _num(r.wait(95)), _num(r.wait(100)),
                     str(r.pilots), str(r.started), str(r.never_claimed)]
        lines.append("| " + " | ".join(cells) + " |")
    done = [r for r in results if not r.error]
    if done:
        cells = ["mean", "", _num(_mean(r.efficiency for r in done), ".3f")]
        cells += [_num(_mean(r.wait(q) for r in done)) for q in (50, 95, 100)]
        cells += [_num(_mean(float(getattr(r, a)) for r in done))
                  for a in ("pilots", "started", "never_claimed")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def document(results: Sequence[RunResult], date: str, reset: Sequence[str],
             plot: tuple[str, int] | None = None, workload: Workload = SMALL) -> str:
    """The results file: what ran, the table, the target met in how many runs."""
    met = sum(1 for r in results if r.met(workload))
    target = (f"efficiency >= {workload.target_efficiency:.2f} with "
              if workload.target_efficiency is not None else "") + \
        f"wait p95 <= {workload.target_wait_p95_s:.0f} s"
    out = [
        f"# Testbed: {workload.text} on the production defaults",
        "",
        f"{date}. From zero pilots, alice submits {workload.text}; the provisioner "
        "service runs with the testbed's sites "
        "(deploy/testbed/provisioner.yaml) and every `policy` setting at its default. "
        "Each run starts the service, then submits at a random offset within one quick "
        "check, so the submission's phase in the cycle varies. `make bench-small` "
        f"(`WORKLOAD={workload.name}`) regenerates this file.",
        "",
        "Reset to the defaults: " + ("; ".join(f"`{line}`" for line in reset) or "nothing"),
        "",
        "Efficiency: claimed / allocated core-seconds over both sites, every pilot from "
        "its SLURM start to its end. Wait: submission to first start (QDate -> "
        "JobStartDate). Never claimed: pilots that started and ran no job.",
        "",
        table(results),
        "",
        f"Target ({target}): met in {met} of {len(results)} runs.",
    ]
    if any(r.unattributed for r in results):
        out.append("Some job runs name a pilot the journal does not know (their claimed "
                   "time is missing from the efficiency): "
                   + ", ".join(f"run {r.run}: {r.unattributed}"
                               for r in results if r.unattributed) + ".")
    if plot:
        out += ["", f"![allocated vs claimed cores per site, run {plot[1]}]({plot[0]})"]
    return "\n".join(out) + "\n"
