"""The pool side: the schedds' queues and histories, and the pilot startd ads.

Everything goes through the HTCondor Python bindings (module `htcondor2`), as
the provisioner's own identity (its IDTOKEN; no other method). Reads are
batched: a few queries per schedd (the queue grouped by shape on the schedd's side,
the idle jobs that did not move kept from the last read: `provisioner.pool.settled`)
and one collector query per cycle; the ads are read into records by
`provisioner.pool.classads`. A read that fails raises `PoolUnreachable`: the caller
must treat the pool as unknown, never as empty; a schedd that fails while others
answer is named in `QueueView.unknown`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from provisioner.config import PoolConfig
from provisioner.decide.failed_starts import START_ATTRS, STARTER_ERROR
from provisioner.pool.classads import (
    GROUP_ATTR,
    MATCH_JOB_ATTRS,
    SHAPE_ATTRS,
    SLOT_ATTRS,
    PilotAd,
    _float,
    _int,
    _str,
    cooling_ends,
    job_attrs,
    pilot_ads_of,
    queue_view,
)
from provisioner.pool.cooldowns import Nudger
from provisioner.pool.schedds import QueueView, merge_views, negotiation_targets, roster
from provisioner.pool.settled import SettledReads
from provisioner.service.accounting import JobRun

log = logging.getLogger(__name__)

#: What the schedd groups the queue by (its GroupBy query, `read_queue`): jobs alike in
#: all of these, and in the job attributes their expressions name, come back as one ad
#: with their JobCount and those attributes. So MATCH_JOB_ATTRS need not be listed: the
#: ones a Requirements expression reads come with it (listed, they cost the schedd
#: 10 % more on a queue of 20,000 jobs). The attributes of the query's constraint must
#: be listed (the bindings test each returned ad against it again). A failed start's
#: own attributes are not among them: jobs whose last try ended with a starter error
#: are read one by one.
GROUP_ATTRS = ["JobStatus", "RemoteHost", "QDate", "VacateReasonCode",
               *(a for a in SHAPE_ATTRS if a not in MATCH_JOB_ATTRS)]


def group_attrs(groups: bool = False) -> list[str]:
    """What the queue is grouped by; with `groups` (`Config.groups_in_use`) also the
    jobs' accounting group, so that jobs alike but for their group come back apart."""
    return [*GROUP_ATTRS, GROUP_ATTR] if groups else GROUP_ATTRS

#: What a finished job's history ad gives the accounting. MachineAttr*0 are the pilot's
#: attributes copied into the job ad when the schedd has
#: `SYSTEM_JOB_MACHINE_ATTRS = PilotSite PilotSlurmJobId` (condor_config/central-manager.conf).
HISTORY_ATTRS = ["ClusterId", "ProcId", "Owner", "JobStatus", "RequestCpus", "RequestGPUs",
                 "JobCurrentStartDate", "JobStartDate", "CompletionDate",
                 "EnteredCurrentStatus", "RemoteUserCpu", "RemoteSysCpu",
                 "MachineAttrPilotSite0", "MachineAttrPilotSlurmJobId0", GROUP_ATTR]
#: Most history ads read per cycle (the schedd returns the newest first).
HISTORY_MATCH = 5000

#: Idle (1), running (2), transferring output (6) and suspended (7) jobs: the last
#: three hold a claim on a pilot.
QUEUE_CONSTRAINT = "JobStatus == 1 || JobStatus == 2 || JobStatus == 6 || JobStatus == 7"
#: Idle jobs whose last try ended with a starter error (`failure_of` reads them).
FAILED_IDLE = f"JobStatus == 1 && VacateReasonCode == {STARTER_ERROR}"


class PoolUnreachable(Exception):
    """The schedd or the collector could not be read; the pool state is unknown."""


def job_run_of(ad: Any) -> JobRun | None:
    """The finished run of one history ad, or None if it never started (removed while
    idle) or names no end."""
    start = _int(ad, "JobCurrentStartDate") or _int(ad, "JobStartDate")
    end = _int(ad, "CompletionDate") or _int(ad, "EnteredCurrentStatus")
    if start <= 0 or end < start:
        return None
    cpu = _float(ad, "RemoteUserCpu") + _float(ad, "RemoteSysCpu")
    return JobRun(
        job_id=f"{_int(ad, 'ClusterId')}.{_int(ad, 'ProcId')}", owner=_str(ad, "Owner"),
        site=_str(ad, "MachineAttrPilotSite0"),
        pilot_job_id=_str(ad, "MachineAttrPilotSlurmJobId0")
        or str(_int(ad, "MachineAttrPilotSlurmJobId0") or ""),
        cores=max(1, _int(ad, "RequestCpus", 1)), start_at=float(start), end_at=float(end),
        cpu_s=cpu, gpus=max(0, _int(ad, "RequestGPUs", 0)), group=_str(ad, GROUP_ATTR))


def history_constraint(after: float) -> str:
    """Jobs that finished (or were removed after running) after `after` (epoch s)."""
    t = int(after)
    return (f"CompletionDate > {t} || "
            f"(JobStatus == 3 && JobCurrentStartDate > 0 && EnteredCurrentStatus > {t})")


def read_queue(schedd: Any, group_by: Any, since: float | None = None,
               now: float | None = None, settled: SettledReads | None = None,
               name: str = "", summary: Any = None, groups: bool = False) -> QueueView:
    """One schedd's queue as `queue_view` folds it, read in groups of jobs alike: the
    schedd's GroupBy query (`group_by`, the bindings' QueryOpt.GroupBy) returns one ad
    per distinct combination of GROUP_ATTRS, with its JobCount, so a queue of 20,000
    jobs in a few hundred shapes comes back as a few hundred ads. The grouping is the
    schedd's autocluster signature: attribute texts, and the job attributes their
    expressions name come with them (a RequestMemory that reads MemoryUsage is
    evaluated as in the job). With `settled` (the memory of earlier reads, kept under
    the schedd's `name`), idle jobs that have not moved since are not grouped again
    (`provisioner.pool.settled`; `summary`, the bindings' QueryOpt.SummaryOnly, asks
    the schedd's clock). The groups of idle jobs whose last try ended with a
    starter error are read again one job at a time (`failure_of` needs each job's
    dates); a job that changed between the two queries is read as it was in the first,
    or, if it left the failed state, not at all this cycle. A schedd that ignores the
    grouping returns plain job ads, each counted once. With `groups`, the jobs'
    accounting groups are read and grouped by too (`settled` then groups by them)."""
    if settled is None:
        read = list(schedd.query(constraint=QUEUE_CONSTRAINT,
                                 projection=group_attrs(groups), opts=group_by))
    else:
        def server_time() -> int | None:
            """The schedd's clock, None if it does not say (or the summary fails: the
            cut then falls back to ours)."""
            if summary is None:
                return None
            try:
                told = [_int(ad, "ServerTime") for ad in schedd.query(opts=summary)]
            except Exception as exc:  # the bindings raise HTCondorException and friends
                log.debug("schedd %s summary query failed: %s", name, exc)
                return None
            return told[0] if told and told[0] > 0 else None

        read = settled.read(name, lambda c, p: list(schedd.query(
            constraint=c, projection=p, opts=group_by)), time.time() if now is None else now,
            server_time)
    ads = [ad for ad in read if not (_int(ad, "JobStatus") == 1
                                     and _int(ad, "VacateReasonCode") == STARTER_ERROR)]
    if len(ads) < len(read):
        ads.extend(schedd.query(constraint=FAILED_IDLE, projection=job_attrs(groups)))
    return queue_view(ads, since, now, groups)


class Pool:
    """Reads the pool as the provisioner identity: every schedd (`provisioner.pool.schedds`)
    and the collector.

    Pilots are not drained from here: a pilot's startd cannot verify IDTOKENS
    (it must not hold the pool's signing key), so releases go through the
    site (SiteBackend.release) and the pilot drains itself.
    """

    def __init__(self, cfg: PoolConfig, htcondor: Any = None,
                 clock: Callable[[], float] = time.time, groups: bool = False) -> None:
        self.cfg = cfg
        #: jobs told apart by accounting group (`Config.groups_in_use`)
        self.groups = groups
        if htcondor is None:
            import htcondor2 as htcondor
        self.htcondor = htcondor
        self.clock = clock
        if cfg.token_file:
            # The bindings read every token in the directory: it must hold only ours.
            htcondor.param["SEC_TOKEN_DIRECTORY"] = os.path.dirname(cfg.token_file)
            htcondor.param["SEC_CLIENT_AUTHENTICATION_METHODS"] = "IDTOKENS"
        self.constraint = f'PilotProvisionerId == "{cfg.provisioner_id}"'
        self.seen: dict[str, float] = {}  # schedd name -> last listed (the roster's memory)
        #: idle jobs per schedd at the last read (None: not read yet)
        self.idle_by_schedd: dict[str, int] | None = None
        #: each schedd's settled idle jobs, kept between queue reads
        self.settled = SettledReads(group_attrs(groups), QUEUE_CONSTRAINT)
        #: failed starts' cool-downs: each schedd offers the job again when one ends
        self.nudger = Nudger(htcondor, cfg.provisioner_id)
        self.versions: dict[str, str] = {}  # schedd name -> its CondorVersion

    def _collector(self) -> Any:
        return self.htcondor.Collector(self.cfg.collector)

    def _schedds(self) -> tuple[dict[str, Any], tuple[tuple[str, str], ...]]:
        """The schedds to read (name -> Schedd) and those unknown without a read: one
        collector query. PoolUnreachable if the collector cannot be read or the roster
        is empty (a pool without a schedd is not read as one without demand)."""
        try:
            ads = list(self._collector().locateAll(self.htcondor.DaemonType.Schedd))
        except Exception as exc:
            raise PoolUnreachable(f"collector query for schedds failed: {exc}") from exc
        by_name = {_str(ad, "Name"): ad for ad in ads if _str(ad, "Name")}
        now = self.clock()
        r = roster(by_name, self.cfg.schedds, self.seen, now, self.cfg.schedd_gone_s)
        self.seen = r.seen
        if not r.read and not r.unknown:
            raise PoolUnreachable("the collector lists no schedd")
        self.versions = {n: _str(by_name[n], "CondorVersion") for n in r.read}
        return {n: self.htcondor.Schedd(by_name[n]) for n in r.read}, r.unknown

    def _each(self, what: str, call: Callable[[str, Any], Any]
              ) -> tuple[dict[str, Any], tuple[tuple[str, str], ...]]:
        """`call(name, schedd)` on every schedd: (name -> result, unknown). PoolUnreachable
        when none could be read."""
        schedds, unknown = self._schedds()
        out: dict[str, Any] = {}
        failed = list(unknown)
        for name, schedd in schedds.items():
            try:
                out[name] = call(name, schedd)
            except Exception as exc:  # the bindings raise HTCondorException and friends
                failed.append((name, f"{what} failed: {exc}"))
        if not out:
            raise PoolUnreachable("no schedd readable: " + "; ".join(
                f"{n}: {why}" for n, why in failed))
        return out, tuple(failed)

    def queue(self, arrivals_since: float | None = None) -> QueueView:
        """Idle jobs grouped by shape, the startds running jobs and the recent
        arrivals: each schedd read in groups (`read_queue`), merged; schedds not read are named in
        `QueueView.unknown`.

        The schedd knows a pilot is busy the moment a job starts; the pilot's
        own ad in the collector may lag by an update interval.
        """
        now = time.time()
        opts = self.htcondor.QueryOpt
        views, unknown = self._each("queue query", lambda n, s: read_queue(
            s, opts.GroupBy, arrivals_since, now, self.settled, n, opts.SummaryOnly,
            self.groups))
        self.settled.keep_only(set(views) | {name for name, _ in unknown})
        for name, view in views.items():
            self.nudger.ends.seen(name, view.cooling_ends)
        merged = merge_views(views, unknown)
        self.idle_by_schedd = dict(merged.idle_by_schedd)
        return merged

    def idle_count(self) -> int:
        """The cheap probe: the idle jobs that are demand, as a full read counts them
        (`queue_view`), from every readable schedd: its summary ad's idle jobs less those
        waiting out a failed start's cool-down (no pilot can start them; counted, such a
        job would look like new demand at every probe until its hold). The jobs whose
        last try ended with a starter error are read one by one, only where jobs are
        idle; the ends of their cool-downs go to the nudger as a full read's do (a
        cool-down may begin and end between two full reads). A schedd that cannot be
        read (restarting, not yet back in the collector) counts what it had at its last
        read: read as none, the probe would see the queue empty and a cycle would run
        for nothing, before the jobs submitted meanwhile can be seen."""
        now = self.clock()

        def demand(name: str, schedd: Any) -> int:
            idle = sum(_int(ad, "AllusersIdle", _int(ad, "Idle"))
                       for ad in schedd.query(opts=self.htcondor.QueryOpt.SummaryOnly))
            if idle > 0:
                ends = cooling_ends(schedd.query(constraint=FAILED_IDLE,
                                                 projection=list(START_ATTRS)), now)
                self.nudger.ends.seen(name, ends)
                idle -= len(ends)
            return max(0, idle)

        counts, unknown = self._each("summary query", demand)
        for name, _why in unknown:
            if name in self.idle_by_schedd:
                counts[name] = self.idle_by_schedd[name]
        self.idle_by_schedd = dict(counts)
        return sum(counts.values())

    def reschedule(self) -> None:
        """Ask every schedd whose jobs wait (by the last count; every schedd before the
        first) to ask the negotiator for a cycle now (condor_reschedule). PoolUnreachable
        if any of them could not be asked (the others were)."""
        schedds, _unknown = self._schedds()
        failed = []
        for name in negotiation_targets(self.idle_by_schedd, sorted(schedds)):
            try:
                schedds[name].reschedule()
            except Exception as exc:
                failed.append(f"{name}: {exc}")
        if failed:
            raise PoolUnreachable("schedd reschedule failed: " + "; ".join(failed))

    def offer_cooled(self, now: float) -> list[str]:
        """Have each schedd where a failed start's cool-down ended by `now` offer the
        job again (`provisioner.pool.cooldowns`); the schedds asked. Nothing is read
        while no cool-down is known."""
        if not self.nudger.ends.ends and not self.nudger.own:
            return []
        try:
            schedds, _unknown = self._schedds()
        except PoolUnreachable as exc:
            log.debug("cool-downs not passed on: %s", exc)
            return []
        return self.nudger.nudge({n: (s, self.versions.get(n, "")) for n, s in
                                  schedds.items()}, now)

    def pilot_ads(self) -> dict[str, PilotAd]:
        """This provisioner's pilot startds: one collector query."""
        try:
            ads = self._collector().query(self.htcondor.AdType.Startd,
                                          constraint=self.constraint, projection=SLOT_ATTRS)
        except Exception as exc:
            raise PoolUnreachable(f"collector query failed: {exc}") from exc
        return pilot_ads_of(ads)

    def history(self, after: float, match: int = HISTORY_MATCH) -> list[JobRun]:
        """Runs that ended after `after` from every schedd's history, at most `match`
        per schedd (the newest first: a backlog larger than that is cut, the oldest part
        lost for the accounting). One history query per schedd; PoolUnreachable if any
        schedd on the roster cannot be read (the accounting waits for all, so no run
        is skipped)."""
        runs, unknown = self._each("history query", lambda _n, s: [
            job_run_of(ad) for ad in s.history(constraint=history_constraint(after),
                                               projection=HISTORY_ATTRS, match=match)])
        if unknown:
            raise PoolUnreachable("schedd history unreadable: " + "; ".join(
                f"{n}: {why}" for n, why in unknown))
        return [r for name in sorted(runs) for r in runs[name] if r is not None]
