"""PURE: the clients' per-second byte counts of one step -> aggregate throughput.

As the cache study did, the clients' bytes are summed by wall-clock second (integer
Unix seconds, as `benchread.py` records them) over ALL seconds from the first second
any client read to the last second any client read; a second in which no client read
counts as 0. So the series includes the ramp-up (clients starting one after another
on their pilots) and the tail (the last client finishing alone), and the mean is
total bytes over that whole span: the throughput the step delivered, not the peak
with every client reading (that is closer to the max and the p50). Whole seconds are
too coarse for reads of a few seconds (a 1.1 s read spans 2 of them: half the rate),
so where the clients recorded their reads' start and end (to the ms), the mean is
total bytes over the span from the first start to the last end instead.

No I/O here: `report` reads the CSVs and writes the results.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

#: bytes/s -> Gbit/s (decimal, as network rates are quoted).
GBIT = 1e9 / 8


def client_series(rows: Iterable[tuple[int, int]]) -> dict[int, int]:
    """One client's (second, bytes) rows (one per URL and second) -> bytes per second."""
    out: dict[int, int] = {}
    for second, nbytes in rows:
        out[second] = out.get(second, 0) + nbytes
    return out


def parse_client_csv(text: str) -> dict[int, int]:
    """A `benchread.py --csv` file (url,second,blocks,bytes[,start,end]) -> bytes per
    second."""
    reader = csv.DictReader(io.StringIO(text))
    return client_series((int(r["second"]), int(r["bytes"])) for r in reader)


def parse_client_span(text: str) -> tuple[float, float] | None:
    """The client's reads from the first start to the last end (Unix s), from the
    start and end columns; None if the file has none (an older reader)."""
    starts, ends = [], []
    for r in csv.DictReader(io.StringIO(text)):
        if not r.get("start") or not r.get("end"):
            return None
        starts.append(float(r["start"]))
        ends.append(float(r["end"]))
    return (min(starts), max(ends)) if starts else None


def step_span(spans: Sequence[tuple[float, float] | None]) -> float | None:
    """Seconds from the first client's start to the last one's end; None unless every
    client recorded its span."""
    known = [s for s in spans if s is not None]
    if not spans or len(known) != len(spans):
        return None
    return max(e for _, e in known) - min(b for b, _ in known)


def aggregate(clients: Sequence[Mapping[int, int]]) -> list[tuple[int, int]]:
    """Sum of the clients' bytes per wall-clock second, every second from the first
    to the last any client read (0 where none did); sorted; [] without data."""
    seconds = [s for c in clients for s in c]
    if not seconds:
        return []
    total: dict[int, int] = {}
    for c in clients:
        for second, nbytes in c.items():
            total[second] = total.get(second, 0) + nbytes
    return [(s, total.get(s, 0)) for s in range(min(seconds), max(seconds) + 1)]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation between order statistics."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class StepSummary:
    """One scenario at one client count."""

    scenario: str
    clients: int
    seconds: int
    total_bytes: int
    mean_gbit_s: float
    p50_gbit_s: float
    max_gbit_s: float
    clients_ok: int
    clients_failed: int
    hit_ratio: float | None = None
    error: str = ""
    #: fio campaigns: the bandwidth fio itself reported, summed over the clients.
    fio_gbit_s: float | None = None
    #: The clients' reads from the first start to the last end (None: not recorded).
    span_s: float | None = None
    #: fio campaigns: mean Gbit/s the nodes' network interfaces received meanwhile.
    net_gbit_s: float | None = None

    @property
    def ok(self) -> bool:
        return not self.error and self.clients_failed == 0


def summarize(scenario: str, clients: int, series: Sequence[tuple[int, int]],
              clients_ok: int, clients_failed: int, hit_ratio: float | None = None,
              error: str = "", fio_gbit_s: float | None = None,
              span_s: float | None = None, net_gbit_s: float | None = None) -> StepSummary:
    """Mean (total bytes over the read span if known, else over all seconds of the
    series), median and max Gbit/s (per whole second)."""
    rates = [b / GBIT for _, b in series]
    total = sum(b for _, b in series)
    over = span_s if span_s and span_s > 0 else len(series)
    return StepSummary(
        scenario=scenario, clients=clients, seconds=len(series), total_bytes=total,
        mean_gbit_s=total / GBIT / over if series else 0.0, span_s=span_s,
        p50_gbit_s=percentile(rates, 0.5), max_gbit_s=max(rates, default=0.0),
        clients_ok=clients_ok, clients_failed=clients_failed, hit_ratio=hit_ratio,
        error=error, fio_gbit_s=fio_gbit_s, net_gbit_s=net_gbit_s)


def fio_bandwidth(report: Mapping[str, object]) -> int:
    """Bytes/s a fio JSON report (--output-format=json) read and wrote, over its jobs."""
    total = 0
    jobs = report.get("jobs", [])
    for job in jobs if isinstance(jobs, list) else []:
        for direction in ("read", "write"):
            part = job.get(direction, {}) if isinstance(job, dict) else {}
            total += int(part.get("bw_bytes", 0)) if isinstance(part, dict) else 0
    return total


def netdev_series(rows: Iterable[tuple[int, str, int, int]]) -> dict[int, int]:
    """A node's /proc/net/dev samples (second, interface, rx_bytes, tx_bytes; counters
    since boot) -> bytes received per second over all interfaces but loopback: each
    sample's increase over the interface's previous sample, at the later second."""
    by_iface: dict[str, list[tuple[int, int]]] = {}
    for second, iface, rx, _tx in rows:
        if iface != "lo":
            by_iface.setdefault(iface, []).append((second, rx))
    out: dict[int, int] = {}
    for samples in by_iface.values():
        samples.sort()
        for (_, before), (second, after) in itertools.pairwise(samples):
            out[second] = out.get(second, 0) + max(after - before, 0)
    return out
