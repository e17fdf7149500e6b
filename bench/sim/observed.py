"""What a policy sees of the simulated world: the pilots as the service reads them and
the `Snapshot` a full cycle observes (`World` is one of these)."""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace

from bench.sim.accounts import Accounts
from bench.sim.entities import SimJob, SimPilot, SiteModel
from provisioner.model import Demand, JobShape, Pilot, PilotState, SiteView, Snapshot


class Observed:
    """The service's view of a world: its fields are the world's."""

    now: float
    sites: dict[str, SiteModel]
    queue: list[SimJob]  # idle matchable jobs, submission order
    unmatchable: list[SimJob]
    jobs: list[SimJob]  # arrival order
    _submit_times: list[float]  # of jobs, ascending
    pilots: dict[int, SimPilot]  # not yet ended
    accounts: Accounts | None
    _groups: bool  # the service reads the jobs' accounting groups
    _ungrouped: dict[JobShape, JobShape]

    def pilot_state(self, p: SimPilot) -> PilotState:
        if p.started_at is None:
            return PilotState.PENDING
        if not p.booted:
            return PilotState.STARTING
        if p.draining:
            return PilotState.DRAINING
        return PilotState.BUSY if p.jobs else PilotState.IDLE

    def model_pilot(self, p: SimPilot) -> Pilot:
        """`p` as the service reads it (squeue and its ad); the same object while nothing
        it shows has changed."""
        state = self.pilot_state(p)
        seen = (state, p.used_cpus, p.used_mem, p.used_gpus, p.limit_reason)
        if p.view is not None and p.view[0] == seen:
            return p.view[1]
        full = state in (PilotState.PENDING, PilotState.STARTING)
        view = Pilot(
            site=p.site.name, job_id=str(p.id), state=state, cpus=p.cpus,
            memory_mb=p.memory_mb, submitted_at=p.submitted_at, started_at=p.started_at,
            walltime_end=p.walltime_end,
            free_cpus=p.cpus if full else p.cpus - p.used_cpus,
            free_memory_mb=p.memory_mb if full else p.memory_mb - p.used_mem,
            gpus=p.gpus, free_gpus=p.gpus if full else p.gpus - p.used_gpus,
            name=f"slot1@{p.key}" if p.booted else None,
            # Its startd's DaemonStartTime, as the service reads it from the ad.
            joined_at=p.started_at + p.site.boot_s if p.booted and p.started_at is not None
            else None,
            limit_reason=p.limit_reason if state is PilotState.PENDING else "",
            account=p.account,
        )
        p.view = (seen, view)
        return view

    def seen(self, shape: JobShape) -> JobShape:
        """`shape` as the service reads it: its accounting group only where groups are
        in use."""
        if self._groups or not shape.group:
            return shape
        out = self._ungrouped.get(shape)
        if out is None:
            out = self._ungrouped[shape] = replace(shape, group="")
        return out

    def _count(self, jobs: Iterable[SimJob]) -> Counter[JobShape]:
        """The jobs' shapes as the service reads them (`seen`), counted, in the order
        first seen; jobs that share a shape object are counted by its identity (cheap)."""
        shapes = [j.spec.shape for j in jobs]
        by_id = Counter(map(id, shapes))
        shape_of = dict(zip(map(id, shapes), shapes, strict=True))
        out: Counter[JobShape] = Counter()
        for key, n in by_id.items():
            out[self.seen(shape_of[key])] += n
        return out

    def idle_jobs(self) -> int:
        return len(self.queue) + len(self.unmatchable)

    def recent_arrivals(self, window_s: float) -> tuple[Demand, ...]:
        """What one schedd query gives the service: jobs with QDate >= now - window_s that
        are still in the queue (idle, running or unmatchable; finished jobs have left it),
        grouped by shape."""
        first = bisect_left(self._submit_times, self.now - window_s)
        shapes = self._count(j for j in self.jobs[first:] if j.end is None)
        return tuple(Demand(s, n) for s, n in shapes.items())

    def queue_size(self, since: float) -> tuple[int, int]:
        """(jobs in the queue, of which submitted before `since`): what the service counts
        in its schedd query (`provisioner.pool.condor.QueueView.total`/`older`)."""
        first = bisect_left(self._submit_times, since)
        older = sum(1 for j in self.jobs[:first] if j.end is None)
        return older + sum(1 for j in self.jobs[first:] if j.end is None), older

    def snapshot(self, arrivals_since: float | None = None) -> Snapshot:
        """What the service observes: idle demand, pilots, every site known, and the jobs
        submitted since `arrivals_since` still in the queue (None: not asked for)."""
        shapes = self._count(self.queue)
        shapes.update(self._count(self.unmatchable))
        return Snapshot(
            demand=tuple(Demand(s, n) for s, n in shapes.items()),
            pilots=tuple(self.model_pilot(p) for p in self.pilots.values()),
            sites=tuple(SiteView(name, True) for name in self.sites),
            recent_arrivals=(self.recent_arrivals(self.now - arrivals_since)
                             if arrivals_since is not None else ()),
            last_arrival_at=self._newest_queued(),
            books=self.accounts.books(self.now) if self.accounts is not None else (),
        )

    def _newest_queued(self) -> float | None:
        """The latest submission time of a job still in the queue (the service's newest
        QDate), None for an empty queue."""
        for job in reversed(self.jobs):
            if job.end is None:
                return job.spec.submit
        return None
