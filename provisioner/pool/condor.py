"""The pool side: the schedds' idle demand and the pilot startd ads.

Everything goes through the HTCondor Python bindings (module `htcondor2`), as
the provisioner's own identity (its IDTOKEN; no other method). Reads are
batched: a few queries per schedd (the queue grouped by shape on the schedd's side,
the idle jobs that did not move kept from the last read: `provisioner.pool.settled`)
and one collector query per cycle. A read that fails raises `PoolUnreachable`: the caller
must treat the pool as unknown, never as empty; a schedd that fails while others
answer is named in `QueueView.unknown`.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from provisioner.config import PoolConfig
from provisioner.decide.failed_starts import (
    START_ATTRS,
    STARTER_ERROR,
    StartFailure,
    cooling,
    fold,
    start_failure,
)
from provisioner.model import Demand, JobShape
from provisioner.pool.cooldowns import Nudger
from provisioner.pool.schedds import QueueView, merge_views, negotiation_targets, roster
from provisioner.pool.settled import SettledReads
from provisioner.service.accounting import JobRun

log = logging.getLogger(__name__)

#: Job attributes a Requirements expression commonly reads besides the requests; their
#: values go with the shape, so a site's pilot is matched as the negotiator would
#: (`provisioner.pool.prototype`).
MATCH_JOB_ATTRS = ("FileSystemDomain", "UidDomain", "WantContainer", "ContainerImage",
                   "WantDocker", "DockerImage", "SingularityImage", "JobUniverse")
#: What `shape_of` reads.
SHAPE_ATTRS = ["RequestCpus", "RequestMemory", "RequestDisk", "RequestGPUs", "MaxRuntime",
               "DesiredSites", "Requirements", *MATCH_JOB_ATTRS]
#: A job's own ad, as `queue_view` reads it.
JOB_ATTRS = ["JobStatus", "RemoteHost", "QDate", *SHAPE_ATTRS, *START_ATTRS]
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
SLOT_ATTRS = ["Name", "Machine", "PilotSite", "PilotSlurmJobId",
              "PilotWalltimeEnd", "PartitionableSlot", "DynamicSlot", "State", "Activity",
              "Cpus", "Memory", "GPUs", "TotalSlotCpus", "TotalSlotMemory", "TotalSlotGPUs",
              "Draining", "HasContainer",
              "DaemonStartTime", "MyType", "CondorVersion", "Start", "AuthenticatedIdentity"]


#: What a finished job's history ad gives the accounting. MachineAttr*0 are the pilot's
#: attributes copied into the job ad when the schedd has
#: `SYSTEM_JOB_MACHINE_ATTRS = PilotSite PilotSlurmJobId` (condor_config/central-manager.conf).
HISTORY_ATTRS = ["ClusterId", "ProcId", "Owner", "JobStatus", "RequestCpus", "RequestGPUs",
                 "JobCurrentStartDate", "JobStartDate", "CompletionDate",
                 "EnteredCurrentStatus", "RemoteUserCpu", "RemoteSysCpu",
                 "MachineAttrPilotSite0", "MachineAttrPilotSlurmJobId0"]
#: Most history ads read per cycle (the schedd returns the newest first).
HISTORY_MATCH = 5000


#: Idle (1), running (2), transferring output (6) and suspended (7) jobs: the last
#: three hold a claim on a pilot.
QUEUE_CONSTRAINT = "JobStatus == 1 || JobStatus == 2 || JobStatus == 6 || JobStatus == 7"
HOLDS_CLAIM = (2, 6, 7)
#: Idle jobs whose last try ended with a starter error (`failure_of` reads them).
FAILED_IDLE = f"JobStatus == 1 && VacateReasonCode == {STARTER_ERROR}"


class PoolUnreachable(Exception):
    """The schedd or the collector could not be read; the pool state is unknown."""


@dataclass(frozen=True)
class PilotAd:
    """A pilot's startd as the collector sees it (partitionable slot + claimed dynamic slots)."""

    site: str
    job_id: str
    name: str  # the startd's name (the slot name after "slot1@")
    walltime_end: float | None
    cpus: int
    memory_mb: int
    free_cpus: int
    free_memory_mb: int
    claimed_slots: int
    draining: bool
    gpus: int = 0  # the partitionable slot's GPUs (TotalSlotGPUs); 0: none advertised
    free_gpus: int = 0  # of which not in a dynamic slot
    started_at: float | None = None  # the startd's DaemonStartTime
    containers: bool = False  # it advertises container support (HasContainer)
    #: Who advertised it, as the collector authenticated them (AuthenticatedIdentity of
    #: every partitionable slot that names this pilot: more than one is a forgery).
    identities: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.site}/{self.job_id}"


def _value(ad: Any, attr: str) -> Any:
    """`attr`'s value in `ad`: a literal as stored, anything else (an expression)
    evaluated in the ad. KeyError (and the bindings' errors) when it cannot be read.
    Reading a literal is ten times cheaper than evaluating it, and a queue of 20,000
    jobs is read attribute by attribute."""
    value = ad[attr]
    if type(value) in (bool, int, float, str):
        return value
    return ad.eval(attr)


def _int(ad: Any, attr: str, default: int = 0) -> int:
    try:
        value = _value(ad, attr)
    except (KeyError, ValueError, TypeError, RuntimeError):
        return default
    # strictly a number: not a bool, nor classad2's UNDEFINED and ERROR (an IntEnum)
    if type(value) is not int and type(value) is not float:
        return default
    return int(value)


def _float(ad: Any, attr: str) -> float:
    try:
        value = _value(ad, attr)
    except (KeyError, ValueError, TypeError, RuntimeError):
        return 0.0
    if type(value) is not int and type(value) is not float:
        return 0.0
    return float(value)


def _str(ad: Any, attr: str) -> str:
    try:
        value = _value(ad, attr)
    except (KeyError, ValueError, TypeError, RuntimeError):
        return ""
    return value if isinstance(value, str) else ""


def _text(ad: Any, attr: str) -> str:
    """The expression of `attr` as ClassAd text ("" if absent)."""
    try:
        value = ad[attr]
    except (KeyError, ValueError, TypeError, RuntimeError):
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return "" if value is None else str(value)


#: Requirements text -> the MATCH_JOB_ATTRS it names (cleared when it grows large).
_READS: dict[str, tuple[str, ...]] = {}


def _reads(requirements: str) -> tuple[str, ...]:
    reads = _READS.get(requirements)
    if reads is None:
        low = requirements.lower()
        reads = tuple(a for a in MATCH_JOB_ATTRS if a.lower() in low)
        if len(_READS) > 10_000:
            _READS.clear()
        _READS[requirements] = reads
    return reads


def shape_of(ad: Any) -> JobShape:
    """The shape of one job ad (expressions evaluated as the schedd would), with its
    Requirements text and the values of the job attributes that text names."""
    runtime = _int(ad, "MaxRuntime", 0)
    sites = tuple(s.strip() for s in _str(ad, "DesiredSites").split(",") if s.strip())
    requirements = _text(ad, "Requirements")
    attrs = tuple((a, _text(ad, a)) for a in _reads(requirements)) if requirements else ()
    return JobShape(
        cpus=max(1, _int(ad, "RequestCpus", 1)),
        memory_mb=max(0, _int(ad, "RequestMemory", 0)),
        disk_kb=max(0, _int(ad, "RequestDisk", 0)),
        gpus=max(0, _int(ad, "RequestGPUs", 0)),
        runtime_s=runtime if runtime > 0 else None,
        desired_sites=tuple(sorted(sites)),
        requirements=requirements,
        match_attrs=tuple((a, v) for a, v in attrs if v),
    )


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
        cpu_s=cpu, gpus=max(0, _int(ad, "RequestGPUs", 0)))


def history_constraint(after: float) -> str:
    """Jobs that finished (or were removed after running) after `after` (epoch s)."""
    t = int(after)
    return (f"CompletionDate > {t} || "
            f"(JobStatus == 3 && JobCurrentStartDate > 0 && EnteredCurrentStatus > {t})")


def startd_of(remote_host: str) -> str:
    """'slot1_2@pilot-gsi-8@node' -> 'pilot-gsi-8@node'."""
    return remote_host.split("@", 1)[1] if remote_host.startswith("slot") and \
        "@" in remote_host else remote_host


def failure_of(ad: Any) -> StartFailure | None:
    """An idle job's failed start, from its ad (`provisioner.decide.failed_starts`)."""
    code = _int(ad, "VacateReasonCode")
    if code != STARTER_ERROR:  # the usual idle job: the rest need not be read
        return None
    return start_failure(
        code, _str(ad, "VacateReason"), _int(ad, "JobCurrentStartDate"),
        _int(ad, "JobCurrentStartExecutingDate"), _int(ad, "LastVacateTime"),
        _int(ad, "NumJobCoolDowns"), _int(ad, "JobCoolDownExpiration"))


def queue_view(ads: Iterable[Any], since: float | None = None, now: float | None = None
               ) -> QueueView:
    """Fold job ads (idle and running) into demand, busy startds and, when `since`
    is given, the jobs submitted since then (the recent arrivals). Idle jobs whose last
    start failed go into `failing`; with `now`, those in their cool-down at `now` are
    not demand. An ad with a JobCount (a group from the schedd's GroupBy query) stands
    for that many jobs alike; any other for one."""
    counts: Counter[JobShape] = Counter()
    failed: list[tuple[JobShape, StartFailure]] = []
    ends: set[float] = set()
    arrivals: Counter[JobShape] = Counter()
    running: set[str] = set()
    total = older = 0
    newest: float | None = None
    for ad in ads:
        jobs = _int(ad, "JobCount", 1)
        if jobs <= 0:
            continue
        total += jobs
        qdate = _int(ad, "QDate")
        if qdate and (newest is None or qdate > newest):
            newest = float(qdate)
        status = _int(ad, "JobStatus")
        shape = shape_of(ad) if status == 1 or since is not None else None
        if status == 1 and shape is not None:
            failure = failure_of(ad)
            if failure is not None:
                failed.extend([(shape, failure)] * jobs)
            if not cooling(failure, now):
                counts[shape] += jobs
            elif failure is not None:
                ends.add(failure.cooling_until)
        elif status in HOLDS_CLAIM and _str(ad, "RemoteHost"):
            running.add(startd_of(_str(ad, "RemoteHost")))
        if since is not None and shape is not None:
            if qdate >= since:
                arrivals[shape] += jobs
            else:
                older += jobs
    return QueueView(tuple(Demand(s, n) for s, n in counts.items()), frozenset(running),
                     tuple(Demand(s, n) for s, n in arrivals.items()), total, older, newest,
                     fold(failed, now), cooling_ends=tuple(sorted(ends)))


def read_queue(schedd: Any, group_by: Any, since: float | None = None,
               now: float | None = None, settled: SettledReads | None = None,
               name: str = "", summary: Any = None) -> QueueView:
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
    grouping returns plain job ads, each counted once."""
    if settled is None:
        groups = list(schedd.query(constraint=QUEUE_CONSTRAINT, projection=GROUP_ATTRS,
                                   opts=group_by))
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

        groups = settled.read(name, lambda c, p: list(schedd.query(
            constraint=c, projection=p, opts=group_by)), time.time() if now is None else now,
            server_time)
    ads = [ad for ad in groups if not (_int(ad, "JobStatus") == 1
                                       and _int(ad, "VacateReasonCode") == STARTER_ERROR)]
    if len(ads) < len(groups):
        ads.extend(schedd.query(constraint=FAILED_IDLE, projection=JOB_ATTRS))
    return queue_view(ads, since, now)


def pilot_ads_of(slot_ads: Iterable[Any]) -> dict[str, PilotAd]:
    """Fold slot ads into one PilotAd per pilot (site + SLURM job id).

    A pilot's GPUs are its partitionable slot's (TotalSlotGPUs, else GPUs; absent: none).
    Free GPUs are what the partitionable slot says is left, but never more than its total
    less the GPUs its dynamic slots advertise: the two kinds of ad are updated apart, and
    a stale partitionable slot must not offer a GPU a job already holds."""
    pslots: dict[str, Any] = {}
    claimed: Counter[str] = Counter()
    dslot_gpus: Counter[str] = Counter()
    idents: dict[str, set[str]] = {}
    for ad in slot_ads:
        site, job = _str(ad, "PilotSite"), _str(ad, "PilotSlurmJobId")
        if not site or not job:
            continue
        key = f"{site}/{job}"
        if ad.get("PartitionableSlot") is True:
            pslots[key] = ad
            idents.setdefault(key, set()).add(_str(ad, "AuthenticatedIdentity"))
            continue
        if _str(ad, "State") == "Claimed":
            claimed[key] += 1
        if ad.get("DynamicSlot") is True:
            dslot_gpus[key] += max(0, _int(ad, "GPUs"))
    out = {}
    for key, ad in pslots.items():
        name = _str(ad, "Name")
        wall = _int(ad, "PilotWalltimeEnd", 0)
        gpus = max(0, _int(ad, "TotalSlotGPUs", _int(ad, "GPUs")))
        daemon_start = _int(ad, "DaemonStartTime", 0)
        free_gpus = max(0, min(_int(ad, "GPUs"), gpus - dslot_gpus[key]))
        out[key] = PilotAd(
            site=_str(ad, "PilotSite"),
            job_id=_str(ad, "PilotSlurmJobId"),
            name=startd_of(name),
            walltime_end=float(wall) if wall > 0 else None,
            cpus=_int(ad, "TotalSlotCpus", _int(ad, "Cpus")),
            memory_mb=_int(ad, "TotalSlotMemory", _int(ad, "Memory")),
            free_cpus=_int(ad, "Cpus"),
            free_memory_mb=_int(ad, "Memory"),
            claimed_slots=claimed[key],
            draining=ad.get("Draining") is True,
            gpus=gpus,
            free_gpus=free_gpus,
            started_at=float(daemon_start) if daemon_start > 0 else None,
            containers=ad.get("HasContainer") is True,
            identities=tuple(sorted(idents[key])),
        )
    return out


class Pool:
    """Reads the pool as the provisioner identity: every schedd (`provisioner.pool.schedds`)
    and the collector.

    Pilots are not drained from here: a pilot's startd cannot verify IDTOKENS
    (it must not hold the pool's signing key), so releases go through the
    site (SiteBackend.release) and the pilot drains itself.
    """

    def __init__(self, cfg: PoolConfig, htcondor: Any = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
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
        self.settled = SettledReads(GROUP_ATTRS, QUEUE_CONSTRAINT)
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
            s, opts.GroupBy, arrivals_since, now, self.settled, n, opts.SummaryOnly))
        self.settled.keep_only(set(views) | {name for name, _ in unknown})
        for name, view in views.items():
            self.nudger.ends.seen(name, view.cooling_ends)
        merged = merge_views(views, unknown)
        self.idle_by_schedd = dict(merged.idle_by_schedd)
        return merged

    def idle_count(self) -> int:
        """The cheap probe: idle jobs from every readable schedd's summary ad. A schedd
        that cannot be read (restarting, not yet back in the collector) counts what it
        had at its last read: read as none, the probe would see the queue empty and a
        cycle would run for nothing, before the jobs submitted meanwhile can be seen."""
        counts, unknown = self._each("summary query", lambda _n, s: sum(
            _int(ad, "AllusersIdle", _int(ad, "Idle"))
            for ad in s.query(opts=self.htcondor.QueryOpt.SummaryOnly)))
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
