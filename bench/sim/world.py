"""Discrete-event simulation of SLURM sites, pilots and an HTCondor negotiator.

Virtual clock, seeded randomness, no I/O. A `Policy` is ticked every `policy.tick_s`
seconds, sees the world through `World.snapshot()` (the same `Snapshot` the service builds)
and returns the same `Action`s the service applies.

Pilots behave like the real ones: SLURM queue wait (lognormal, per site), then the
allocation starts and is charged; the startd boots for `boot_s` and then offers one
partitionable slot. The negotiator runs every `negotiate_s`, and when asked
(`reschedule`, at most every `negotiate_min_s`): jobs in submission order, each
to the fitting pilot with the fewest free cores (depth first). A pilot starts a job that
states a runtime only if it ends before the walltime; one that states none only before the
shutdown margin. From the margin on the pilot takes no such jobs and ends when empty. A
released pilot drains and ends when empty; a pending one is cancelled. At walltime SLURM
kills whatever still runs: the job goes back to the queue (its job lease) and its core time
so far is waste, not claimed. A retired pilot still takes jobs and ends the moment it has
none (the real one looks every second); a withdrawn retirement makes it an ordinary pilot.
A `black_hole` site's pilots start and never join the pool
(they exit after `boot_s`), like a site with a broken image path. A pilot that runs nothing
for its site's `runtime.noclaim_shutdown_s` ends by itself (`STARTD_NOCLAIM_SHUTDOWN`).
GPUs: a site's nodes have `gpus_per_node`; a pilot holds the GPUs it asked for, a job
that asks for GPUs starts only where they are free, and one that asks for none only in
the cores and memory beyond the free GPUs' share (the pilot's START).
Allocations (`bench.sim.accounts`): a pilot submitted for an allocation is charged to its
account and starts only jobs of its groups; the snapshot carries every allocation's books
(SLURM's exact charge) and the jobs' accounting groups only where some site has
allocations (`Config.groups_in_use`), as the service reads them. Faults (a site's
`kill_per_h`, `refuse_share`) are drawn from a generator of their own, so a run without
them draws exactly what it drew before.
"""

from __future__ import annotations

import heapq
import math
import random
from bisect import insort
from collections.abc import Iterable
from typing import Protocol

from bench.sim.accounts import Accounts
from bench.sim.entities import SimJob, SimPilot, SiteModel
from bench.sim.observed import Observed
from bench.sim.results import RunResult, Sample, summarize
from bench.sim.traces import HOUR, JobSpec
from provisioner.config import Config
from provisioner.errors import BackendError
from provisioner.model import (
    Action,
    Cancel,
    JobShape,
    Release,
    Retire,
    Submit,
    Unretire,
    round_memory,
)
from provisioner.sites.slurm_refusals import classify_sbatch

#: What a busy SLURM controller answers sbatch (a fault's refusal).
BUSY = ("sbatch: error: Batch job submission failed: Socket timed out on send/recv "
        "operation")


class Policy(Protocol):
    """Decides pilots. `tick` is called every `tick_s` seconds of virtual time."""

    name: str

    @property
    def tick_s(self) -> float:
        """Seconds to the next tick (read again after every tick)."""
        ...

    def tick(self, world: World, now: float) -> list[Action]: ...


class World(Observed):
    """The simulated sites and pool. Build one per run."""

    def __init__(self, sites: Iterable[SiteModel], config: Config, seed: int,
                 negotiate_s: float = 30.0, sample_s: float = 300.0,
                 negotiate_min_s: float = 5.0, accounts: Accounts | None = None) -> None:
        self.sites = {s.name: s for s in sites}
        self.config = config
        self.rng = random.Random(seed)
        self.faults = random.Random(seed + 7919)
        self.pilots_killed = 0
        #: The sites' allocations and their charges (None: no site has any).
        self.accounts = accounts if accounts is not None else (
            Accounts(config.sites) if config.groups_in_use else None)
        self._groups = config.groups_in_use
        self._ungrouped: dict[JobShape, JobShape] = {}
        self.negotiate_s = negotiate_s
        self.negotiate_min_s = negotiate_min_s  # NEGOTIATOR_MIN_INTERVAL
        self._negotiated_at = -math.inf
        self._asked = False  # a reschedule waits for the minimum interval
        self.sample_s = sample_s
        self.now = 0.0
        self._events: list[tuple[float, int, str, object]] = []
        self._seq = 0
        self.queue: list[SimJob] = []  # idle matchable jobs, submission order
        self.unmatchable: list[SimJob] = []
        self.jobs: list[SimJob] = []  # arrival order
        self._submit_times: list[float] = []  # of self.jobs, ascending
        self.pilots: dict[int, SimPilot] = {}  # not yet ended
        self.all_pilots: list[SimPilot] = []
        self.pending: dict[str, list[SimPilot]] = {name: [] for name in self.sites}
        self.node_free: dict[str, list[list[int]]] = {
            s.name: [[s.cores_per_node, s.mem_per_node_mb, s.gpus_per_node]
                     for _ in range(s.nodes)]
            for s in self.sites.values()
        }
        self.allocated_core_s = 0.0
        self.claimed_core_s = 0.0
        self.allocated_gpu_s = 0.0
        self.claimed_gpu_s = 0.0  # GPU time of GPU jobs' finished runs
        self.killed_core_s = 0.0  # core time of runs killed at walltime (waste)
        self.timeline: list[Sample] = []
        self._next_pilot = 1
        self.queue_changed = False
        self.sbatch_calls = 0
        self.sbatch_refused = 0
        self._sbatch_times: dict[str, list[float]] = {name: [] for name in self.sites}

    # -- event plumbing -------------------------------------------------------------------
    def _at(self, t: float, kind: str, payload: object = None) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, payload))

    def _fits_somewhere(self, shape: JobShape) -> bool:
        return any(
            shape.cpus <= s.cores_per_node and round_memory(shape.memory_mb) <= s.mem_per_node_mb
            and shape.gpus <= min(s.gpus_per_node, s.config.pilot.gpus)
            and (not shape.desired_sites or s.name in shape.desired_sites)
            for s in self.sites.values()
        )

    # -- actions ------------------------------------------------------------------------------
    def sbatch(self, a: Submit) -> tuple[list[str], BackendError | None]:
        """Submit `a.count` pilots as sbatch would, stopping at the first refusal, which
        is SLURM's own words classified as the service's backend does."""
        site, ids = self.sites[a.site], list[str]()
        for _ in range(a.count):
            self.sbatch_calls += 1
            recent = [t for t in self._sbatch_times[a.site] if t > self.now - 60]
            self._sbatch_times[a.site] = recent
            held = sum(1 for p in self.pilots.values() if p.site is site)
            text = ""
            if site.sbatch_per_min is not None and len(recent) >= site.sbatch_per_min:
                text = ("sbatch: error: Batch job submission failed: Rate limit exceeded, "
                        "please retry momentarily")
            elif (limit := site.submit_limit_at(self.now)) is not None and held >= limit:
                text = ("sbatch: error: QOSMaxSubmitJobPerUserLimit\nsbatch: error: Batch "
                        "job submission failed: Job violates accounting/QOS policy (job "
                        "submit limit, user's size and/or time limits)")
            elif site.refuse_share and self.faults.random() < site.refuse_share:
                text = BUSY
            recent.append(self.now)
            if text:
                self.sbatch_refused += 1
                return ids, classify_sbatch(a.site, text)
            ids.append(str(self.submit(a.site, a.cpus, a.memory_mb, a.walltime_s, a.gpus,
                                       a.allocation).id))
        return ids, None

    def apply(self, actions: Iterable[Action]) -> None:
        for a in actions:
            if isinstance(a, Submit):
                self.sbatch(a)
            elif isinstance(a, (Cancel, Release)):
                p = self.pilots.get(int(a.pilot.job_id))
                if p is not None:
                    self.release(p)
            elif isinstance(a, (Retire, Unretire)):
                p = self.pilots.get(int(a.pilot.job_id))
                if p is not None and p.started_at is not None:
                    p.retiring = isinstance(a, Retire)
                    if p.retiring and p.booted and not p.jobs:
                        self._end_pilot(p)

    def submit(self, site_name: str, cpus: int, memory_mb: int, walltime_s: float,
               gpus: int = 0, allocation: str = "") -> SimPilot:
        site = self.sites[site_name]
        p = SimPilot(self._next_pilot, site, cpus, memory_mb, walltime_s, self.now, gpus=gpus)
        self._next_pilot += 1
        if self.accounts is not None:
            grant = self.accounts.grant_of(site_name, allocation)
            if grant is not None:
                p.allocation, p.account = allocation, grant.alloc.account
                p.groups = frozenset(grant.alloc.groups)
            self.accounts.submitted(p, self.now)
        self.pilots[p.id] = p
        self.all_pilots.append(p)
        self.pending[site_name].append(p)
        wait = self.rng.lognormvariate(math.log(site.wait_median_s), site.wait_sigma)
        self._at(self.now + wait, "eligible", p)
        return p

    def release(self, p: SimPilot) -> None:
        """Cancel if pending, else drain: no new jobs, end when empty."""
        if p.ended_at is not None:
            return
        if p.started_at is None:
            p.cancelled = True
            p.ended_at = self.now
            self.pending[p.site.name].remove(p)
            del self.pilots[p.id]
            if self.accounts is not None:
                self.accounts.ended(p, self.now)
            return
        p.draining = True
        if not p.jobs:
            self._end_pilot(p)

    # -- SLURM side -------------------------------------------------------------------------
    def _try_start(self, site_name: str) -> None:
        free = self.node_free[site_name]
        still: list[SimPilot] = []
        limit = self.sites[site_name].job_limit
        running = (sum(1 for p in self.pilots.values()
                       if p.site.name == site_name and p.started_at is not None)
                   if limit is not None else 0)
        for p in self.pending[site_name]:
            if not p.eligible:
                still.append(p)
                continue
            if limit is not None and running >= limit:
                p.limit_reason = "AssocMaxJobsLimit"  # SLURM's reason while it pends
                still.append(p)
                continue
            for i, node in enumerate(free):
                if node[0] >= p.cpus and node[1] >= p.memory_mb and node[2] >= p.gpus:
                    node[0] -= p.cpus
                    node[1] -= p.memory_mb
                    node[2] -= p.gpus
                    p.node = i
                    p.started_at = self.now
                    p.limit_reason = ""
                    running += 1
                    self._at(self.now + p.site.boot_s,
                             "crashed" if p.site.black_hole else "booted", p)
                    self._at(self.now + p.walltime_s, "walltime", p)
                    self._at(p.margin_at, "margin", p)
                    if p.site.kill_per_h:
                        dies = self.faults.expovariate(p.site.kill_per_h / HOUR)
                        if dies < p.walltime_s:
                            self._at(self.now + dies, "killed", p)
                    break
            else:
                still.append(p)
        self.pending[site_name] = still

    def _end_pilot(self, p: SimPilot) -> None:
        if p.ended_at is not None:
            return
        for job in list(p.jobs):  # walltime kill
            self._finish_job(job, killed=True)
        p.ended_at = self.now
        assert p.started_at is not None and p.node is not None
        self.allocated_core_s += p.cpus * (self.now - p.started_at)
        self.allocated_gpu_s += p.gpus * (self.now - p.started_at)
        node = self.node_free[p.site.name][p.node]
        node[0] += p.cpus
        node[1] += p.memory_mb
        node[2] += p.gpus
        del self.pilots[p.id]
        if self.accounts is not None:
            self.accounts.ended(p, self.now)
        self._try_start(p.site.name)

    def _noclaim_s(self, p: SimPilot) -> float:
        """The pilot's STARTD_NOCLAIM_SHUTDOWN (its site's `runtime.noclaim_shutdown_s`)."""
        return float(p.site.config.runtime.noclaim_shutdown_s)

    def _idle(self, p: SimPilot) -> None:
        """`p` runs nothing from now: its no-claim timer starts."""
        p.idle_since = self.now
        self._at(self.now + self._noclaim_s(p), "noclaim", p)

    # -- pool side ----------------------------------------------------------------------------
    def _finish_job(self, job: SimJob, killed: bool = False) -> None:
        """The job's run ends; a killed run's core time is waste and the job is idle
        again (in submission order)."""
        p = job.pilot
        assert p is not None and job.start is not None
        core_s = job.shape.cpus * (self.now - job.start)
        p.jobs.discard(job)
        p.used_cpus -= job.shape.cpus
        p.used_mem -= round_memory(job.shape.memory_mb)
        p.used_gpus -= job.shape.gpus
        if not p.jobs:
            self._idle(p)
        if killed:
            self.killed_core_s += core_s
            job.kills += 1
            job.start = job.pilot = None
            insort(self.queue, job, key=_submitted)
            return
        job.end = self.now
        self.claimed_core_s += core_s
        self.claimed_gpu_s += job.shape.gpus * (self.now - job.start)

    def reschedule(self) -> None:
        """condor_reschedule: a negotiation now, or once the minimum interval since the
        last one has passed (the periodic cycle goes on as before)."""
        if not self._asked:
            self._asked = True
            self._at(max(self.now, self._negotiated_at + self.negotiate_min_s), "rescheduled")

    def negotiate(self) -> None:
        self._negotiated_at = self.now
        avail = [p for p in self.pilots.values()
                 if p.booted and not p.draining and p.used_cpus < p.cpus]
        if not avail or not self.queue:
            return
        avail.sort(key=lambda p: (p.cpus - p.used_cpus, -(p.walltime_end or 0), p.id))
        failed: set[tuple[int, int, int | None, int, str]] = set()
        left: list[SimJob] = []
        for job in self.queue:
            if job.sig in failed:  # a job like it found no pilot this cycle
                left.append(job)
                continue
            s = job.spec.shape
            for p in avail:
                if p.can_start(job, self.now):
                    job.start = self.now
                    job.pilot = p
                    p.jobs.add(job)
                    p.claimed = True
                    p.used_cpus += s.cpus
                    p.used_mem += round_memory(s.memory_mb)
                    p.used_gpus += s.gpus
                    p.idle_since = None
                    self._at(self.now + job.spec.runtime, "job_end", job)
                    break
            else:
                failed.add(job.sig)
                left.append(job)
        self.queue = left

    # -- main loop ----------------------------------------------------------------------------
    def run(self, policy: Policy, trace: list[JobSpec], trace_name: str = "",
            duration: float | None = None, drain_s: float = 12 * HOUR) -> RunResult:
        """Run `trace` under `policy` until every matchable job is done and every pilot
        ended after the trace (or `duration + drain_s` at the latest)."""
        end_of_trace = duration if duration is not None else max(
            (j.submit for j in trace), default=0.0)
        hard_stop = end_of_trace + drain_s
        for spec in trace:
            self._at(spec.submit, "arrive", SimJob(spec))
        self._at(0.0, "negotiate")
        self._at(0.0, "tick")
        self._at(0.0, "sample")
        arrivals_left = len(trace)
        while self._events:
            t, _seq, kind, payload = heapq.heappop(self._events)
            if t > hard_stop:
                break
            self.now = t
            if kind == "arrive":
                assert isinstance(payload, SimJob)
                arrivals_left -= 1
                self.jobs.append(payload)
                self._submit_times.append(payload.spec.submit)
                if self._fits_somewhere(payload.shape):
                    self.queue.append(payload)
                else:
                    self.unmatchable.append(payload)
            elif kind == "job_end":
                assert isinstance(payload, SimJob)
                start = payload.start
                if payload.end is None and start is not None and \
                        start + payload.spec.runtime == t:  # not a killed earlier run
                    p = payload.pilot
                    self._finish_job(payload)
                    assert p is not None
                    if not p.jobs and (p.draining or p.retiring or self.now >= p.margin_at):
                        self._end_pilot(p)
            elif kind == "eligible":
                assert isinstance(payload, SimPilot)
                if payload.ended_at is None:
                    payload.eligible = True
                    self._try_start(payload.site.name)
            elif kind == "booted":
                assert isinstance(payload, SimPilot)
                if payload.ended_at is None:
                    payload.booted = True
                    if payload.draining:
                        self._end_pilot(payload)
                    else:
                        self._idle(payload)
            elif kind == "noclaim":
                assert isinstance(payload, SimPilot)
                if payload.ended_at is None and not payload.jobs and \
                        payload.idle_since is not None and \
                        t >= payload.idle_since + self._noclaim_s(payload):
                    payload.noclaim_ended = True
                    self._end_pilot(payload)
            elif kind == "crashed":
                assert isinstance(payload, SimPilot)
                self._end_pilot(payload)
            elif kind == "margin":
                assert isinstance(payload, SimPilot)
                if payload.ended_at is None and payload.booted and not payload.jobs:
                    self._end_pilot(payload)
            elif kind == "walltime":
                assert isinstance(payload, SimPilot)
                self._end_pilot(payload)
            elif kind == "killed":
                assert isinstance(payload, SimPilot)
                if payload.ended_at is None:
                    payload.killed = True
                    self.pilots_killed += 1
                    self._end_pilot(payload)
            elif kind == "negotiate":
                self.negotiate()
                self._at(t + self.negotiate_s, "negotiate")
            elif kind == "rescheduled":
                self._asked = False
                self.negotiate()
            elif kind == "tick":
                self.apply(policy.tick(self, t))
                if t < end_of_trace or self.queue or self.pilots:
                    self._at(t + policy.tick_s, "tick")
            elif kind == "sample":
                self._sample()
                if t < end_of_trace or self.queue or self.pilots:
                    self._at(t + self.sample_s, "sample")
            if t >= end_of_trace and not arrivals_left and not self.queue and not self.pilots:
                break
        return summarize(self, policy.name, trace_name)

    def _sample(self) -> None:
        if self.accounts is not None:
            self.accounts.sample(self.now)
        running = [p for p in self.pilots.values() if p.started_at is not None]
        self.timeline.append(Sample(
            t=self.now, idle_jobs=len(self.queue),
            running_jobs=sum(len(p.jobs) for p in running),
            pilots=len(running), pending_pilots=len(self.pilots) - len(running),
            allocated_cores=sum(p.cpus for p in running),
            claimed_cores=sum(p.used_cpus for p in running),
        ))


def _submitted(job: SimJob) -> float:
    return job.spec.submit
