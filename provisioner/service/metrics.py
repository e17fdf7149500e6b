"""Prometheus series of the provisioner (`provisioner run` serves them on `metrics.listen`).

Each `Metrics` owns a private `CollectorRegistry` (one per `Provisioner`; tests build
many). `SERIES` names every series with its type, labels and meaning; the Grafana
dashboard (deploy/grafana-dashboard.json) is checked against it. The service calls
`cycle()` once per full cycle with what it observed and decided, `pilot_events()` with
what the journal learnt from `squeue`, and `count()` for actions.
"""

from __future__ import annotations

import math
from collections import Counter as Tally
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from provisioner.config import MetricsConfig, SiteBase
from provisioner.decide.breaker import BreakerState
from provisioner.decide.budget import BudgetStatus
from provisioner.decide.limits import SiteLimits
from provisioner.decide.matching import item_of, site_rejects
from provisioner.decide.reasons import Reason
from provisioner.model import Demand, Pilot, PilotState, Unmatchable
from provisioner.service.accounting import HOUR_S, JobRun, PilotRecord
from provisioner.service.books import AllocationRow
from provisioner.service.spend import GroupSpend, group_totals

P = "provisioner_"

#: name -> (type, labels, help). Counters carry their `_total` here as exposed.
SERIES: dict[str, tuple[str, tuple[str, ...], str]] = {
    P + "idle_jobs": ("gauge", ("site",), "Idle jobs a site's pilots could run (a job that "
                      "fits several sites counts at each; site=\"none\": unmatchable)"),
    P + "unmatchable_jobs": ("gauge", (), "Idle jobs no configured site can run"),
    P + "unmatchable_groups": ("gauge", (), "Job shapes no configured site can run"),
    P + "waiting_jobs": ("gauge", ("reason",), "Idle jobs by why they wait, as `provisioner "
                         "why` says it (the codes of provisioner.decide.reasons; a shape's "
                         "jobs under its first reason)"),
    P + "pilots": ("gauge", ("site", "state"), "Pilots by site and state"),
    P + "allocated_cores": ("gauge", ("site",), "Cores of pilots running in SLURM now"),
    P + "claimed_cores": ("gauge", ("site",), "Cores claimed by jobs on pilots now"),
    P + "allocated_gpus": ("gauge", ("site",), "GPUs of pilots running in SLURM now"),
    P + "claimed_gpus": ("gauge", ("site",), "GPUs claimed by GPU jobs on pilots now"),
    P + "gpu_hours_allocated_total": ("counter", ("site",),
                                      "GPU-hours of the pilots that ended (GPUs x SLURM "
                                      "life), added when the journal records the end"),
    P + "gpu_hours_claimed_total": ("counter", ("site",),
                                    "GPU-hours claimed by GPU jobs on the provisioner's "
                                    "pilots (RequestGPUs x wall), added when the run is "
                                    "read from the schedd's history"),
    P + "pilots_submitted_total": ("counter", ("site",), "Pilots submitted"),
    P + "pilots_released_total": ("counter", ("site",), "Releases sent to idle pilots"),
    P + "pilots_cancelled_total": ("counter", ("site",), "Pilot jobs cancelled"),
    P + "pilots_retired_total": ("counter", ("site",),
                                 "Busy pilots told to leave when their jobs end"),
    P + "pilots_failed_to_join_total": ("counter", ("site",),
                                        "Pilots that started and ended without joining"),
    P + "cycle_phase_seconds": ("histogram", ("phase",),
                                "Duration of a cycle's phase (observe, plan, act)"),
    P + "cycles_total": ("counter", (), "Full cycles run"),
    P + "negotiations_requested_total": ("counter", (), "Negotiations asked of the schedd "
                                         "(condor_reschedule) because a pilot joined idle "
                                         "while jobs waited"),
    P + "cool_down_nudges_total": ("counter", (), "Schedds asked to offer again a job "
                                   "whose failed start's cool-down ended (HTCondor before "
                                   "24.10.2 waits up to 20 minutes otherwise)"),
    P + "journal_writable": ("gauge", (), "1 if the journal can be written, 0 if not "
                             "(full, not writable, corrupt: submissions wait; releases, "
                             "retirements and cancels go on)"),
    P + "last_cycle_timestamp_seconds": ("gauge", (), "When the last full cycle began"),
    P + "site_read_errors_total": ("counter", ("site",), "Failed squeue reads of a site"),
    P + "site_circuit_state": ("gauge", ("site",),
                               "Circuit breaker: 0 closed, 1 half-open, 2 open"),
    P + "sbatch_refused_total": ("counter", ("site", "kind"),
                                 "Failed sbatch by SLURM's reason: limit (a submit limit), "
                                 "config (account, partition, time limit refused), busy "
                                 "(busy, timed out, rate limited), other"),
    P + "site_sbatch_state": ("gauge", ("site",), "SLURM limits of a site: 0 none known, "
                              "1 at its submission or job limit, 2 sbatch backed off, "
                              "3 stopped (configuration refused)"),
    P + "site_limit_jobs": ("gauge", ("site",), "A site's learnt submission or job limit "
                            "(pilots it may hold; -1: none known)"),
    P + "pool_known": ("gauge", (), "1 if a schedd and the collector were read last cycle"),
    P + "schedds_unknown": ("gauge", (), "schedds not read last cycle while others were "
                            "(their demand unknown: no scale-down)"),
    P + "history_read_errors_total": ("counter", (), "Failed schedd history reads"),
    P + "pilot_end_records_total": ("counter", ("site",),
                                    "Pilot ends taken from the pilots' own end records"),
    P + "end_record_read_errors_total": ("counter", ("site",),
                                         "Failed reads of a site's pilot end records"),
    P + "pilot_queue_wait_seconds": ("histogram", ("site",),
                                     "Pilot lead time in SLURM: submit -> start"),
    P + "pilot_boot_seconds": ("histogram", ("site",),
                               "Pilot lead time booting: start -> first seen in the pool"),
    P + "pilot_tokens_live": ("gauge", (), "Pilot tokens the collector accepts now (minted, "
                              "their pilot not yet seen ending)"),
    P + "pilot_tokens_revoked_total": ("counter", (), "Pilot tokens revoked: the pilot left "
                                       "SLURM, was cancelled, never got its sbatch, expired"),
    P + "pilot_ads_foreign": ("gauge", (), "Pilot ads in the collector advertised by another "
                              "identity than the one minted for that pilot"),
    P + "collector_refusals_total": ("counter", ("kind",), "What the collector refused, from "
                                     "its log: ad (not the sender's own), revoked or "
                                     "expired (a token)"),
    **{P + f"allocation_{name}": ("gauge", ("site", "allocation", "unit"), text)
       for name, text in (
           ("amount", "An allocation's grant this period (unit-hours of `unit`)"),
           ("spent", "What the allocation spent this period as the books count it: SLURM's "
            "last reading plus the ledger since, or the ledger alone"),
           ("ledger_spent", "What the allocation's pilots held this period by the "
            "provisioner's own ledger"),
           ("committed", "The worst case still to come of the allocation's pilots in "
            "flight (pending: their walltime; running: the rest of it)"),
           ("left", "amount - spent - committed"),
           ("burn_rate", "Unit-hours spent per hour over the last day (for core-hours: the "
            "cores held on average)"),
           ("runout_timestamp_seconds", "When what is left runs out at the burn rate "
            "(+Inf: nothing spent lately)"),
           ("paced", "1 if even pace holds the allocation back now"),
           ("known", "1 if the books are known (0: the journal unreadable, no new pilot)"),
           ("slurm_spent", "SLURM's last reading of the account's charge this period "
            "(NaN: none)"),
           ("slurm_grant", "SLURM's grant of the account (GrpTRESMins; NaN: none, or not "
            "read)"),
           ("difference", "SLURM's reading minus the ledger's charge by the reading's "
            "time (NaN: no reading this period)"))},
    P + "group_spent": ("gauge", ("group", "unit"), "Unit-hours an accounting group's "
                        "finished jobs claimed of the allocations' pilots this period "
                        "(group \"-\": jobs of no group)"),
}

PHASE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
LEAD_BUCKETS = (10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 43200, 86400)
#: A pilot running in SLURM holds its cores; one up in the pool can have claims.
_ALLOCATED = frozenset({PilotState.STARTING, PilotState.IDLE, PilotState.BUSY,
                        PilotState.DRAINING, PilotState.ENDING})
_UP = frozenset({PilotState.IDLE, PilotState.BUSY, PilotState.DRAINING})


class MetricsError(Exception):
    """The endpoint could not be started; the message names the address and the field."""


def exposed_names() -> set[str]:
    """Every series name a scrape can show (histograms' _bucket/_sum/_count included)."""
    out = set()
    for name, (kind, _labels, _help) in SERIES.items():
        out.add(name)
        if kind == "histogram":
            out |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return out


def demand_by_site(demand: Iterable[Demand], sites: Sequence[SiteBase]) -> dict[str, int]:
    """Idle jobs per site whose largest pilot could run them; "none" for no site."""
    out = {s.name: 0 for s in sites} | {"none": 0}
    for d in demand:
        item = item_of(d.shape)
        fits = [s.name for s in sites if not site_rejects(d.shape, s, item)]
        for name in fits or ["none"]:
            out[name] += d.idle
    return out


def circuit_codes(states: Mapping[str, BreakerState], now: float) -> dict[str, int]:
    """Each tripped site's breaker as a number: 0 closed, 1 half-open, 2 open."""
    out = {}
    for site, st in states.items():
        is_open = st.open_until is not None and now < st.open_until
        out[site] = 2 if is_open else 1 if st.probing or st.open_until is not None else 0
    return out


def limit_codes(limits: SiteLimits, held: Mapping[str, int], sites: Iterable[str],
                now: float) -> dict[str, tuple[int, int]]:
    """Each site's SLURM limits as numbers: (state, learnt limit or -1); state 0 none
    known, 1 at its limit, 2 sbatch backed off, 3 stopped."""
    out = {}
    for site in sites:
        cap = limits.caps.get(site)
        jobs = cap.jobs if cap is not None else -1
        if site in limits.stopped:
            state = 3
        elif not limits.busy.due(site, now):
            state = 2
        else:
            state = 1 if cap is not None and held.get(site, 0) >= cap.jobs else 0
        out[site] = (state, jobs)
    return out


@dataclass(frozen=True)
class SiteCores:
    allocated: int
    claimed: int
    allocated_gpus: int = 0
    claimed_gpus: int = 0  # only GPU jobs claim GPUs


def cores_by_site(pilots: Iterable[Pilot], sites: Iterable[str]) -> dict[str, SiteCores]:
    """Allocated (running in SLURM) and claimed (by jobs) cores and GPUs per site now."""
    alloc: Tally[tuple[str, str]] = Tally()  # (site, "cores" or "gpus")
    claim: Tally[tuple[str, str]] = Tally()
    for p in pilots:
        if p.state in _ALLOCATED:
            alloc[p.site, "cores"] += p.cpus
            alloc[p.site, "gpus"] += p.gpus
        if p.state in _UP:
            claim[p.site, "cores"] += max(0, p.cpus - p.free_cpus)
            claim[p.site, "gpus"] += max(0, p.gpus - p.free_gpus)
    return {s: SiteCores(alloc[s, "cores"], claim[s, "cores"], alloc[s, "gpus"],
                         claim[s, "gpus"]) for s in sites}


def gpu_hours(ended: Iterable[PilotRecord], runs: Iterable[JobRun]) -> dict[str, list[float]]:
    """Per site, [GPU-hours allocated by the pilots that ended, GPU-hours claimed by
    the GPU jobs' runs]; sites with neither are left out (runs of an unknown site too)."""
    out: dict[str, list[float]] = {}
    for p in ended:
        if p.gpus > 0 and p.start_at is not None and p.end_at is not None:
            held = p.gpus * max(0.0, p.end_at - p.start_at) / HOUR_S
            out.setdefault(p.site, [0.0, 0.0])[0] += held
    for r in runs:
        if r.gpus > 0 and r.site:
            out.setdefault(r.site, [0.0, 0.0])[1] += r.gpus * r.wall_s / HOUR_S
    return out


class Metrics:
    """The series of one provisioner, in its own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self._m: dict[str, Any] = {}
        for name, (kind, labels, text) in SERIES.items():
            if kind == "gauge":
                self._m[name] = Gauge(name, text, labels, registry=self.registry)
            elif kind == "counter":
                self._m[name] = Counter(name.removesuffix("_total"), text, labels,
                                        registry=self.registry)
            else:
                buckets = PHASE_BUCKETS if name.endswith("phase_seconds") else LEAD_BUCKETS
                self._m[name] = Histogram(name, text, labels, buckets=buckets,
                                          registry=self.registry)
        self.server: object | None = None
        self._groups: set[tuple[str, str]] = set()  # (group, unit) exported so far

    def _metric(self, name: str, **labels: str) -> Any:
        m = self._m[P + name]
        return m.labels(**labels) if labels else m

    def gauge(self, name: str) -> Any:
        """The unlabelled gauge `name` (without prefix), for a part that sets it."""
        return self._metric(name)

    # --- updates ---------------------------------------------------------
    def cycle(self, *, now: float, timings: Mapping[str, float], sites: Sequence[SiteBase],
              pool_known: bool, demand: Iterable[Demand], unmatchable: Iterable[Unmatchable],
              pilots: Sequence[Pilot], circuit: Mapping[str, int],
              known_sites: Iterable[str],
              limits: Mapping[str, tuple[int, int]] | None = None,
              schedds_unknown: int = 0) -> None:
        """One full cycle's view; gauges of unknown parts keep their last value.
        `limits`: site -> (state, learnt limit) as `limit_codes` gives them."""
        self._metric("cycles_total").inc()
        self._metric("last_cycle_timestamp_seconds").set(now)
        for phase, seconds in timings.items():
            self._metric("cycle_phase_seconds", phase=phase).observe(seconds)
        self._metric("pool_known").set(1 if pool_known else 0)
        self._metric("schedds_unknown").set(schedds_unknown if pool_known else 0)
        names = [s.name for s in sites]
        for site in names:
            self._metric("site_circuit_state", site=site).set(circuit.get(site, 0))
            code, jobs = (limits or {}).get(site, (0, -1))
            self._metric("site_sbatch_state", site=site).set(code)
            self._metric("site_limit_jobs", site=site).set(jobs)
        if not pool_known:
            return
        for site, n in demand_by_site(demand, sites).items():
            self._metric("idle_jobs", site=site).set(n)
        groups = list(unmatchable)
        self._metric("unmatchable_jobs").set(sum(u.idle for u in groups))
        self._metric("unmatchable_groups").set(len(groups))
        known = set(known_sites)
        states = Tally((p.site, p.state.value) for p in pilots)
        cores = cores_by_site(pilots, names)
        for site in names:
            if site not in known:
                continue
            for state in PilotState:
                self._metric("pilots", site=site, state=state.value).set(
                    states[(site, state.value)])
            self._metric("allocated_cores", site=site).set(cores[site].allocated)
            self._metric("claimed_cores", site=site).set(cores[site].claimed)
            self._metric("allocated_gpus", site=site).set(cores[site].allocated_gpus)
            self._metric("claimed_gpus", site=site).set(cores[site].claimed_gpus)

    def allocations(self, rows: Iterable[AllocationRow], groups: Iterable[GroupSpend]
                    ) -> None:
        """Every allocation's budget and books after a cycle, and the groups' spend."""
        nan = math.nan
        for row in rows:
            b, e = row.budget, row.entry
            labels = {"site": b.site, "allocation": b.name, "unit": b.unit}
            runout = row.runout
            for name, value in (
                    ("amount", b.amount), ("spent", b.spent), ("ledger_spent", e.ledger_spent),
                    ("committed", b.committed), ("left", b.left), ("burn_rate", e.burn_rate),
                    ("runout_timestamp_seconds", math.inf if runout is None else runout),
                    ("paced", 1 if b.status is BudgetStatus.PACED else 0),
                    ("known", 1 if e.known else 0),
                    ("slurm_spent", nan if e.slurm_spent is None else e.slurm_spent),
                    ("slurm_grant", nan if e.slurm_grant is None else e.slurm_grant),
                    ("difference", nan if e.difference is None else e.difference)):
                self._metric(f"allocation_{name}", **labels).set(value)
        totals = group_totals(groups)
        for group, unit in self._groups - set(totals):  # a new period: none yet
            self._metric("group_spent", group=group, unit=unit).set(0)
        for (group, unit), spent in totals.items():
            self._metric("group_spent", group=group, unit=unit).set(spent)
        self._groups |= set(totals)

    def waiting(self, counts: Mapping[str, int]) -> None:
        """Idle jobs per reason code (`provisioner.decide.explain.Report.waiting`); every
        code of the vocabulary is set, 0 when no job waits for it."""
        for reason in Reason:
            self._metric("waiting_jobs", reason=reason.value).set(counts.get(reason.value, 0))

    def pilot_events(self, started: Iterable[tuple[str, float]],
                     joined: Iterable[tuple[str, float]],
                     ended_without_join: Iterable[str]) -> None:
        for site, wait in started:
            self._metric("pilot_queue_wait_seconds", site=site).observe(wait)
        for site, boot in joined:
            self._metric("pilot_boot_seconds", site=site).observe(boot)
        for site in ended_without_join:
            self._metric("pilots_failed_to_join_total", site=site).inc()

    def gpu_hours(self, ended: Iterable[PilotRecord], runs: Iterable[JobRun]) -> None:
        """Add the GPU-hours of pilots that ended and of new finished runs (`gpu_hours`)."""
        for site, (allocated, claimed) in gpu_hours(ended, runs).items():
            self._metric("gpu_hours_allocated_total", site=site).inc(allocated)
            self._metric("gpu_hours_claimed_total", site=site).inc(claimed)

    def tokens(self, *, live: int, revoked: int, refused: Iterable[str], foreign: int
               ) -> None:
        """The pilot tokens after a cycle: `refused` holds one kind per refusal."""
        self._metric("pilot_tokens_live").set(live)
        if revoked:
            self._metric("pilot_tokens_revoked_total").inc(revoked)
        for kind in refused:
            self._metric("collector_refusals_total", kind=kind).inc()
        self._metric("pilot_ads_foreign").set(foreign)

    def refused(self, site: str, kind: str) -> None:
        """One failed sbatch at `site` of `kind` (limit, config, busy, other)."""
        self._metric("sbatch_refused_total", site=site, kind=kind).inc()

    def count(self, name: str, site: str | None = None, n: int = 1) -> None:
        """Add `n` to counter `name` (without prefix and `_total`), labelled by site."""
        if n:
            metric = self._metric(f"{name}_total", **({"site": site} if site else {}))
            metric.inc(n)

    # --- the endpoint ----------------------------------------------------
    def serve(self, cfg: MetricsConfig) -> None:
        """Serve the registry on `cfg.listen` (nothing when None); MetricsError if the
        address cannot be bound (in use, not local, no permission)."""
        address = cfg.address
        if address is None:
            return
        host, port = address
        try:
            self.server, _thread = start_http_server(port, addr=host or "0.0.0.0",
                                                     registry=self.registry)
        except OSError as exc:
            raise MetricsError(
                f"metrics.listen {cfg.listen!r}: cannot serve metrics there: "
                f"{exc.strerror or exc}") from exc

    def stop(self) -> None:
        server = self.server
        if server is not None:
            server.shutdown()  # type: ignore[attr-defined]
            server.server_close()  # type: ignore[attr-defined]
            self.server = None
