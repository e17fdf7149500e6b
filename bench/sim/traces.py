"""Seeded job arrival traces for the simulator.

Runtimes follow a clipped gaussian (mean 1 h, sd 15 min) like STAR reconstruction tasks; a
share of the jobs state their runtime (as +MaxRuntime), rounded up with some headroom.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from provisioner.model import JobShape

HOUR = 3600.0
DAY = 86400.0


@dataclass(frozen=True)
class JobSpec:
    """One job of a trace: when it is submitted, what it asks for, how long it really runs."""

    id: int
    submit: float
    shape: JobShape
    runtime: float  # true runtime (s); the job states shape.runtime_s (an upper bound) or not


@dataclass(frozen=True)
class RuntimeModel:
    mean_s: float = HOUR
    sd_s: float = 15 * 60
    min_s: float = 10 * 60
    max_s: float = 2 * HOUR
    stated_share: float = 0.3  # share of jobs that state a runtime
    stated_headroom: float = 1.25  # stated = true * headroom, rounded up to 5 min

    def draw(self, rng: random.Random) -> tuple[float, int | None]:
        true = min(self.max_s, max(self.min_s, rng.gauss(self.mean_s, self.sd_s)))
        stated = None
        if rng.random() < self.stated_share:
            stated = int(math.ceil(min(true * self.stated_headroom, self.max_s) / 300) * 300)
        return true, stated


ShapeDraw = Callable[[random.Random], tuple[int, int]]


def one_core(rng: random.Random) -> tuple[int, int]:
    return 1, rng.choice((1500, 2000, 2000, 3000))


def mixed_shapes(rng: random.Random) -> tuple[int, int]:
    """1/2/4/8-core jobs with various memory; about 5 % ask for 2 TB (unmatchable)."""
    if rng.random() < 0.05:
        return 1, 2_000_000
    cpus = rng.choices((1, 2, 4, 8), weights=(50, 25, 15, 10))[0]
    return cpus, cpus * rng.choice((1000, 1800, 2500, 3500))


def rare_multicore(rng: random.Random) -> tuple[int, int]:
    """Mostly 1-core jobs; 2-, 4- and 8-core ones are rare (7, 3 and 2 %)."""
    cpus = rng.choices((1, 2, 4, 8), weights=(88, 7, 3, 2))[0]
    return cpus, cpus * rng.choice((1000, 1800, 2500, 3500))


def interned(shape: JobShape, seen: dict[JobShape, JobShape]) -> JobShape:
    """One object per distinct shape (the simulator counts shapes by identity)."""
    return seen.setdefault(shape, shape)


def _jobs(
    times: list[float], rng: random.Random, shapes: ShapeDraw, runtimes: RuntimeModel,
    group: str = "",
) -> list[JobSpec]:
    out, seen = [], dict[JobShape, JobShape]()
    for i, t in enumerate(sorted(times)):
        cpus, mem = shapes(rng)
        true, stated = runtimes.draw(rng)
        shape = interned(JobShape(cpus, mem, runtime_s=stated, group=group), seen)
        out.append(JobSpec(i, t, shape, true))
    return out


def _gpu_jobs(times: list[float], rng: random.Random, gpu_share: float,
              runtimes: RuntimeModel) -> list[JobSpec]:
    """1-core CPU jobs, and a share `gpu_share` of GPU jobs: 1 GPU with 2 or 4 cores or 2
    GPUs with 8 cores, 4 GB per core."""
    out, seen = [], dict[JobShape, JobShape]()
    for i, t in enumerate(sorted(times)):
        true, stated = runtimes.draw(rng)
        if rng.random() < gpu_share:
            cpus, gpus = rng.choices(((2, 1), (4, 1), (8, 2)), weights=(40, 40, 20))[0]
            shape = JobShape(cpus, 4000 * cpus, gpus=gpus, runtime_s=stated)
        else:
            shape = JobShape(1, rng.choice((1500, 2000, 2000, 3000)), runtime_s=stated)
        out.append(JobSpec(i, t, interned(shape, seen), true))
    return out


def steady(seed: int, duration: float = 2 * DAY, rate_per_h: float = 240,
           shapes: ShapeDraw = one_core, runtimes: RuntimeModel = RuntimeModel()) -> list[JobSpec]:
    """Poisson arrivals at a constant rate."""
    rng = random.Random(seed)
    times, t = [], rng.expovariate(rate_per_h / HOUR)
    while t < duration:
        times.append(t)
        t += rng.expovariate(rate_per_h / HOUR)
    return _jobs(times, rng, shapes, runtimes)


def bursty(seed: int, duration: float = 2 * DAY, every: float = 8 * HOUR,
           burst_jobs: int = 1200, burst_span: float = 600.0,
           shapes: ShapeDraw = one_core, runtimes: RuntimeModel = RuntimeModel()) -> list[JobSpec]:
    """Campaigns: `burst_jobs` submitted within `burst_span` seconds every `every`, then quiet."""
    rng = random.Random(seed)
    times: list[float] = []
    start = 600.0
    while start < duration:
        n = int(burst_jobs * rng.uniform(0.6, 1.4))
        times.extend(start + rng.uniform(0, burst_span) for _ in range(n))
        start += every * rng.uniform(0.8, 1.2)
    return _jobs([t for t in times if t < duration], rng, shapes, runtimes)


def diurnal(seed: int, duration: float = 2 * DAY, mean_per_h: float = 240,
            amplitude: float = 0.8, shapes: ShapeDraw = one_core,
            runtimes: RuntimeModel = RuntimeModel()) -> list[JobSpec]:
    """Poisson arrivals with a sinusoidal daily rate (thinning)."""
    rng = random.Random(seed)
    peak = mean_per_h * (1 + amplitude) / HOUR
    times: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= duration:
            break
        rate = mean_per_h * (1 + amplitude * math.sin(2 * math.pi * t / DAY)) / HOUR
        if rng.random() < rate / peak:
            times.append(t)
    return _jobs(times, rng, shapes, runtimes)


def mixed(seed: int, duration: float = 2 * DAY, rate_per_h: float = 120) -> list[JobSpec]:
    """Steady arrivals of mixed 1/2/4/8-core shapes, ~5 % unmatchable (2 TB memory)."""
    return steady(seed, duration, rate_per_h, shapes=mixed_shapes)


def steady_4x(seed: int, duration: float = 2 * DAY) -> list[JobSpec]:
    """The steady trace at four times the rate (960 jobs/h, ~1000 busy cores): the reserve
    grows with the square root of the rate, so its share of the allocation halves."""
    return steady(seed, duration, rate_per_h=960)


def gpu_mix(seed: int, duration: float = 2 * DAY, rate_per_h: float = 240,
            gpu_share: float = 0.15) -> list[JobSpec]:
    """Poisson arrivals, 85 % 1-core CPU jobs and 15 % GPU jobs (`_gpu_jobs`)."""
    rng = random.Random(seed)
    times, t = [], rng.expovariate(rate_per_h / HOUR)
    while t < duration:
        times.append(t)
        t += rng.expovariate(rate_per_h / HOUR)
    return _gpu_jobs(times, rng, gpu_share, RuntimeModel())


def mixed_rare(seed: int, duration: float = 2 * DAY, rate_per_h: float = 90) -> list[JobSpec]:
    """Steady arrivals of 1-8 core jobs where the multi-core shapes are rare
    (`rare_multicore`): a reserve for them would mostly wait."""
    return steady(seed, duration, rate_per_h, shapes=rare_multicore)


def trickle(seed: int, duration: float = 2 * DAY) -> list[JobSpec]:
    """Sparse work: Poisson arrivals of one-core jobs, one every ~10 minutes on average."""
    return steady(seed, duration, rate_per_h=6)


TRACES: dict[str, Callable[[int], list[JobSpec]]] = {
    "steady": steady,
    "bursty": bursty,
    "diurnal": diurnal,
    "mixed": mixed,
    "steady-4x": steady_4x,
    "trickle": trickle,
    "gpu-mix": gpu_mix,
    "mixed-rare": mixed_rare,
}
