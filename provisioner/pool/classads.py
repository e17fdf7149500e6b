"""What the pool's ClassAds say, read into the model's records (no I/O).

Attribute values as the schedd evaluates them (a literal as stored, an expression
evaluated in its ad; absent or of the wrong type: a default), a job's shape and its
failed start, the queue's job ads folded into a `QueueView` (demand by shape, the
startds running jobs, the recent arrivals, the failed starts) and the pilots' slot
ads into one `PilotAd` each. The queries that bring these ads are
`provisioner.pool.condor`'s.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from provisioner.decide.failed_starts import (
    START_ATTRS,
    STARTER_ERROR,
    StartFailure,
    cooling,
    fold,
    start_failure,
)
from provisioner.model import Demand, JobShape
from provisioner.pool.schedds import QueueView

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
#: The job's accounting group (condor_submit's `accounting_group`), read into its shape
#: only where groups are in use (`Config.groups_in_use`): elsewhere the queue is read
#: and grouped exactly as without it.
GROUP_ATTR = "AcctGroup"


def job_attrs(groups: bool = False) -> list[str]:
    """What `queue_view` reads of a job's own ad; with `groups`, its accounting group."""
    return [*JOB_ATTRS, GROUP_ATTR] if groups else JOB_ATTRS


SLOT_ATTRS = ["Name", "Machine", "PilotSite", "PilotSlurmJobId", "PilotWalltimeEnd",
              "PilotAllocation", "PartitionableSlot", "DynamicSlot", "State", "Activity",
              "Cpus", "Memory", "GPUs", "TotalSlotCpus", "TotalSlotMemory", "TotalSlotGPUs",
              "Draining", "HasContainer",
              "DaemonStartTime", "MyType", "CondorVersion", "Start", "AuthenticatedIdentity"]

#: Job statuses that hold a claim on a pilot: running (2), transferring output (6),
#: suspended (7).
HOLDS_CLAIM = (2, 6, 7)


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
    #: The allocation it says it is charged to (PilotAllocation); "" = none advertised.
    allocation: str = ""

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


def shape_of(ad: Any, groups: bool = False) -> JobShape:
    """The shape of one job ad (expressions evaluated as the schedd would), with its
    Requirements text and the values of the job attributes that text names; with
    `groups`, its accounting group (AcctGroup, "" if none or not a string)."""
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
        group=_str(ad, GROUP_ATTR) if groups else "",
    )


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


def cooling_ends(ads: Iterable[Any], now: float) -> list[float]:
    """The end of each cool-down that these idle jobs' ads (one per job) wait out at
    `now`: one per job that `queue_view` leaves out of demand."""
    failures = (failure_of(ad) for ad in ads)
    return [f.cooling_until for f in failures if f is not None and cooling(f, now)]


def queue_view(ads: Iterable[Any], since: float | None = None, now: float | None = None,
               groups: bool = False) -> QueueView:
    """Fold job ads (idle and running) into demand, busy startds and, when `since`
    is given, the jobs submitted since then (the recent arrivals). Idle jobs whose last
    start failed go into `failing`; with `now`, those in their cool-down at `now` are
    not demand. An ad with a JobCount (a group from the schedd's GroupBy query) stands
    for that many jobs alike; any other for one. With `groups`, shapes (of demand,
    arrivals and failed starts alike) are told apart by accounting group too."""
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
        shape = shape_of(ad, groups) if status == 1 or since is not None else None
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
            allocation=_str(ad, "PilotAllocation"),
        )
    return out
