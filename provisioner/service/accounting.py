"""What the allocation bought, per site and UTC day (pure: plain records in, rows out).

Inputs are the sources of truth the journal keeps: a `PilotRecord` per SLURM pilot job
(cores, submit/start from `squeue`, end from the pilot's own end record or else from the
cycle that saw it leave `squeue`) and a `JobRun` per finished job from the schedd's
history (which pilot ran it, its cores, start, end and CPU time).

Per site and day (intervals that cross midnight UTC are split):

- allocated core-h: cores x (end, or `now` for a live pilot, - start);
- claimed core-h: cores of the jobs running on the pilot over time, clipped to the
  pilot's life and to its cores (a pilot never claims more than it holds);
- idle core-h = allocated - claimed, split into *start-up* (pilot start -> first job
  start), *between* (first job start -> last job end: gaps between jobs and cores a
  partly filled pilot leaves free) and *tail* (last job end -> pilot end); a pilot that
  never ran a job is start-up idle throughout;
- E1, job-start efficiency as STAR defined it: 1 - (time before the first job
  start) / (pilot life), aggregated core-weighted: 1 - start-up / allocated;
- E2, CPU efficiency: CPU time / (wall x cores) of the jobs (the share within the day);
- total efficiency: claimed / allocated;
- GPU-hours: allocated = the pilot's GPUs x its life; claimed = GPUs of the GPU jobs
  running on it (RequestGPUs), clipped to its life and to its GPUs; GPU efficiency =
  claimed / allocated, None (shown "-") where no pilot held a GPU.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

DAY_S = 86400.0
HOUR_S = 3600.0


@dataclass(frozen=True)
class PilotRecord:
    """A pilot's SLURM job; `start_at` None: never started; `end_at` None: still alive."""

    site: str
    job_id: str
    cores: int
    submit_at: float
    start_at: float | None = None
    end_at: float | None = None
    memory_mb: int = 0
    join_at: float | None = None  # first seen in the pool
    end_source: str | None = None  # "record" (the pilot's end record), "squeue", ...
    end_reason: str | None = None  # why it ended, from its end record
    gpus: int = 0  # GPUs SLURM gave it (asked for, while pending)
    account: str = ""  # the SLURM account charged (squeue's); "" = not known
    allocation: str = ""  # the allocation of that account when recorded; "" = none

    @property
    def key(self) -> str:
        return f"{self.site}/{self.job_id}"


@dataclass(frozen=True)
class JobRun:
    """One finished run of a job, from the schedd's history."""

    job_id: str  # "cluster.proc"
    owner: str
    site: str  # the pilot's site ("" unknown)
    pilot_job_id: str  # the pilot's SLURM job id ("" unknown)
    cores: int
    start_at: float
    end_at: float
    cpu_s: float = 0.0  # RemoteUserCpu + RemoteSysCpu
    gpus: int = 0  # RequestGPUs
    group: str = ""  # the job's accounting group (AcctGroup); "" = none

    @property
    def pilot_key(self) -> str:
        return f"{self.site}/{self.pilot_job_id}"

    @property
    def wall_s(self) -> float:
        return max(0.0, self.end_at - self.start_at)


@dataclass
class SiteDay:
    """Core-hours of one site on one UTC day (`day` "YYYY-MM-DD")."""

    site: str
    day: str
    pilots: set[str] = field(default_factory=set)
    allocated: float = 0.0
    claimed: float = 0.0
    startup: float = 0.0
    between: float = 0.0
    tail: float = 0.0
    cpu: float = 0.0  # CPU core-h of the jobs
    job_wall: float = 0.0  # cores x wall of the same jobs, core-h
    allocated_gpu: float = 0.0  # GPU-h of the pilots
    claimed_gpu: float = 0.0  # GPU-h claimed by GPU jobs

    @property
    def idle(self) -> float:
        return self.allocated - self.claimed

    @property
    def e1(self) -> float | None:
        return 1.0 - self.startup / self.allocated if self.allocated > 0 else None

    @property
    def e2(self) -> float | None:
        return self.cpu / self.job_wall if self.job_wall > 0 else None

    @property
    def total(self) -> float | None:
        return self.claimed / self.allocated if self.allocated > 0 else None

    @property
    def gpu_efficiency(self) -> float | None:
        """GPU-hours claimed by GPU jobs / GPU-hours allocated; None without GPUs."""
        return self.claimed_gpu / self.allocated_gpu if self.allocated_gpu > 0 else None

    def add(self, other: SiteDay) -> None:
        self.pilots |= other.pilots
        for name in ("allocated", "claimed", "startup", "between", "tail", "cpu", "job_wall",
                     "allocated_gpu", "claimed_gpu"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


def day_of(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d")


def split_days(t0: float, t1: float) -> Iterator[tuple[str, float, float]]:
    """[t0, t1) cut at each midnight UTC: (day, start, end) pieces."""
    t = t0
    while t < t1:
        midnight = (t // DAY_S + 1) * DAY_S
        end = min(t1, midnight)
        yield day_of(t), t, end
        t = end


@dataclass(frozen=True)
class Segment:
    """A stretch of a pilot's life with a constant number of claimed cores."""

    t0: float
    t1: float
    used: int  # claimed cores (at most the pilot's)
    phase: str  # "startup", "between", "tail" (where its idle cores go)


def _life(pilot: PilotRecord, now: float) -> tuple[float, float] | None:
    """[start, end or now) of a pilot that started; None if it never did or lived 0 s."""
    if pilot.start_at is None:
        return None
    end = pilot.end_at if pilot.end_at is not None else max(now, pilot.start_at)
    return (pilot.start_at, end) if end > pilot.start_at else None


def segments(pilot: PilotRecord, runs: Iterable[JobRun], now: float) -> list[Segment]:
    """The pilot's life [start, end or now) cut where its claimed cores change."""
    life = _life(pilot, now)
    if life is None:
        return []
    start, end = life
    clipped = [(max(r.start_at, start), min(r.end_at, end), r.cores) for r in runs]
    clipped = [(a, b, c) for a, b, c in clipped if b > a and c > 0]
    if not clipped:
        return [Segment(start, end, 0, "startup")]
    first = min(a for a, _b, _c in clipped)
    last = max(b for _a, b, _c in clipped)
    deltas: dict[float, int] = {start: 0, end: 0, first: 0, last: 0}
    for a, b, c in clipped:
        deltas[a] = deltas.get(a, 0) + c
        deltas[b] = deltas.get(b, 0) - c
    out: list[Segment] = []
    used = 0
    times = sorted(deltas)
    for t0, t1 in itertools.pairwise(times):
        used += deltas[t0]
        phase = "startup" if t1 <= first else "tail" if t0 >= last else "between"
        out.append(Segment(t0, t1, min(used, pilot.cores), phase))
    return out


def gpu_segments(pilot: PilotRecord, runs: Iterable[JobRun],
                 now: float) -> list[tuple[float, float, int]]:
    """The life of a pilot with GPUs cut where the GPUs its GPU jobs claim change:
    (t0, t1, claimed GPUs, at most the pilot's); [] for a pilot without GPUs."""
    life = _life(pilot, now)
    if life is None or pilot.gpus <= 0:
        return []
    start, end = life
    deltas: dict[float, int] = {start: 0, end: 0}
    for r in runs:
        a, b = max(r.start_at, start), min(r.end_at, end)
        if b > a and r.gpus > 0:
            deltas[a] = deltas.get(a, 0) + r.gpus
            deltas[b] = deltas.get(b, 0) - r.gpus
    out = []
    used = 0
    for t0, t1 in itertools.pairwise(sorted(deltas)):
        used += deltas[t0]
        out.append((t0, t1, min(used, pilot.gpus)))
    return out


def _runs_by_pilot(runs: Iterable[JobRun]) -> dict[str, list[JobRun]]:
    out: dict[str, list[JobRun]] = {}
    for r in runs:
        out.setdefault(r.pilot_key, []).append(r)
    return out


def site_days(pilots: Iterable[PilotRecord], runs: Iterable[JobRun],
              now: float) -> list[SiteDay]:
    """One row per (site, day) that any pilot's life touches, sorted by site then day.
    Job runs whose pilot is not among `pilots` are left out."""
    by_pilot = _runs_by_pilot(runs)
    rows: dict[tuple[str, str], SiteDay] = {}

    def row(site: str, day: str) -> SiteDay:
        return rows.setdefault((site, day), SiteDay(site, day))

    for p in pilots:
        mine = by_pilot.get(p.key, [])
        for seg in segments(p, mine, now):
            for day, a, b in split_days(seg.t0, seg.t1):
                r = row(p.site, day)
                r.pilots.add(p.key)
                alloc = p.cores * (b - a) / HOUR_S
                claim = seg.used * (b - a) / HOUR_S
                r.allocated += alloc
                r.claimed += claim
                setattr(r, seg.phase, getattr(r, seg.phase) + alloc - claim)
        for t0, t1, used in gpu_segments(p, mine, now):
            for day, a, b in split_days(t0, t1):
                r = row(p.site, day)
                r.allocated_gpu += p.gpus * (b - a) / HOUR_S
                r.claimed_gpu += used * (b - a) / HOUR_S
        if p.start_at is None:
            continue
        life_end = p.end_at if p.end_at is not None else max(now, p.start_at)
        for job in mine:
            a, b = max(job.start_at, p.start_at), min(job.end_at, life_end)
            if b <= a or job.wall_s <= 0:
                continue
            for day, d0, d1 in split_days(a, b):
                share = (d1 - d0) / job.wall_s
                r = row(p.site, day)
                r.cpu += job.cpu_s * share / HOUR_S
                r.job_wall += job.cores * (d1 - d0) / HOUR_S
    return [rows[k] for k in sorted(rows)]


def totals(rows: Iterable[SiteDay]) -> dict[str, SiteDay]:
    """Per site, all its days added up (`day` "total")."""
    out: dict[str, SiteDay] = {}
    for r in rows:
        out.setdefault(r.site, SiteDay(r.site, "total")).add(r)
    return out


def core_timeline(pilots: Iterable[PilotRecord], runs: Iterable[JobRun], now: float,
                  step_s: float) -> dict[str, list[tuple[float, int, int]]]:
    """Per site, (time, allocated cores, claimed cores) sampled every `step_s` (for plots)."""
    by_pilot = _runs_by_pilot(runs)
    pieces: dict[str, list[tuple[float, float, int, int]]] = {}
    for p in pilots:
        for s in segments(p, by_pilot.get(p.key, []), now):
            pieces.setdefault(p.site, []).append((s.t0, s.t1, p.cores, s.used))
    return {site: _sample(items, step_s) for site, items in sorted(pieces.items())}


def gpu_timeline(pilots: Iterable[PilotRecord], runs: Iterable[JobRun], now: float,
                 step_s: float) -> dict[str, list[tuple[float, int, int]]]:
    """Per site whose pilots held GPUs, (time, allocated GPUs, GPUs claimed by GPU jobs)
    sampled every `step_s` (for plots)."""
    by_pilot = _runs_by_pilot(runs)
    pieces: dict[str, list[tuple[float, float, int, int]]] = {}
    for p in pilots:
        for t0, t1, used in gpu_segments(p, by_pilot.get(p.key, []), now):
            pieces.setdefault(p.site, []).append((t0, t1, p.gpus, used))
    return {site: _sample(items, step_s) for site, items in sorted(pieces.items())}


def _sample(items: list[tuple[float, float, int, int]],
            step_s: float) -> list[tuple[float, int, int]]:
    """(t0, t1, allocated, claimed) pieces summed at every `step_s` from the first start."""
    t0 = min(i[0] for i in items)
    t1 = max(i[1] for i in items)
    n = int((t1 - t0) // step_s) + 1
    alloc = [0] * (n + 1)
    claim = [0] * (n + 1)
    for a, b, held, used in items:
        for i in range(int((a - t0) // step_s), n + 1):
            t = t0 + i * step_s
            if t >= b:
                break
            if t >= a:
                alloc[i] += held
                claim[i] += used
    return [(t0 + i * step_s, alloc[i], claim[i]) for i in range(n + 1)]


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]
