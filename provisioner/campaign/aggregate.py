"""PURE: the clients' per-second byte counts of one step -> aggregate throughput.

As the cache study did, the clients' bytes are summed by wall-clock second (integer
Unix seconds, as `benchread.py` records them) over ALL seconds from the first second
any client read to the last second any client read; a second in which no client read
counts as 0. So the series includes the ramp-up (clients starting one after another
on their pilots) and the tail (the last client finishing alone), and the mean is
total bytes over that whole span: the throughput the step delivered, not the peak
with every client reading (that is closer to the max and the p50).

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
    """A `benchread.py --csv` file (url,second,blocks,bytes) -> bytes per second."""
    reader = csv.DictReader(io.StringIO(text))
    return client_series((int(r["second"]), int(r["bytes"])) for r in reader)


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

    @property
    def ok(self) -> bool:
        return not self.error and self.clients_failed == 0


def summarize(scenario: str, clients: int, series: Sequence[tuple[int, int]],
              clients_ok: int, clients_failed: int, hit_ratio: float | None = None,
              error: str = "", fio_gbit_s: float | None = None) -> StepSummary:
    """Mean (total bytes over all seconds of the series), median and max Gbit/s."""
    rates = [b / GBIT for _, b in series]
    total = sum(b for _, b in series)
    return StepSummary(
        scenario=scenario, clients=clients, seconds=len(series), total_bytes=total,
        mean_gbit_s=total / GBIT / len(series) if series else 0.0,
        p50_gbit_s=percentile(rates, 0.5), max_gbit_s=max(rates, default=0.0),
        clients_ok=clients_ok, clients_failed=clients_failed, hit_ratio=hit_ratio,
        error=error, fio_gbit_s=fio_gbit_s)


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
