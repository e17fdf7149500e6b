"""SLURM's jobs as both site backends see them: the state table, the signals the
pilots answer to, and a job list (``squeue --json``, or slurmrestd's ``/jobs``, one
data_parser format) turned into `SiteJob` records.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from provisioner.config.allocations import SLURM_ACCOUNT_PATTERN
from provisioner.decide.limits import JOB_LIMIT_REASONS
from provisioner.errors import Rejected
from provisioner.sites.base import PilotRequest, SiteJob, SiteJobState

log = logging.getLogger(__name__)

#: SLURM job states -> what the provisioner sees; a finished job is not a pilot.
STATE_TABLE: dict[str, SiteJobState | None] = {
    "PENDING": SiteJobState.PENDING,
    "REQUEUED": SiteJobState.PENDING,
    "REQUEUE_HOLD": SiteJobState.PENDING,
    "REQUEUE_FED": SiteJobState.PENDING,
    "RESV_DEL_HOLD": SiteJobState.PENDING,
    "CONFIGURING": SiteJobState.RUNNING,
    "RUNNING": SiteJobState.RUNNING,
    "RESIZING": SiteJobState.RUNNING,
    "SUSPENDED": SiteJobState.RUNNING,
    "SIGNALING": SiteJobState.RUNNING,
    "STAGE_OUT": SiteJobState.ENDING,
    "COMPLETING": SiteJobState.ENDING,
    "STOPPED": SiteJobState.ENDING,
    "COMPLETED": None,
    "CANCELLED": None,
    "FAILED": None,
    "TIMEOUT": None,
    "NODE_FAIL": None,
    "PREEMPTED": None,
    "BOOT_FAIL": None,
    "DEADLINE": None,
    "OUT_OF_MEMORY": None,
    "SPECIAL_EXIT": None,
    "REVOKED": None,
}

#: The signal that asks a pilot to leave if idle (see provisioner.pilot.wrapper).
RELEASE_SIGNAL = "USR1"
#: Leave when the running jobs end; and its withdrawal: a signal scancel knows by name
#: whose default action (on a process that is not stopped) is to be ignored, so one that
#: reaches a process without a handler does no harm. (SLURM also sends CONT when it
#: resumes a suspended job: then the pilot merely stays until it is released.)
RETIRE_SIGNAL = "USR2"
UNRETIRE_SIGNAL = "CONT"


#: A pending job's reason that is SLURM's ordinary wait: the job starts once the cluster
#: has room (or its own hold, dependency, begin time is met): capacity on its way.
WAIT_REASONS = frozenset({
    "None", "Priority", "Resources", "Dependency", "Prolog", "BeginTime", "Licenses",
    "Reservation", "ReqNodeNotAvail", "PartitionNodeLimit", "PartitionTimeLimit",
    "PartitionDown", "PartitionInactive", "PartitionConfig", "JobHeldAdmin", "JobHeldUser",
    "NodeDown", "FrontEndDown", "BadConstraints", "Cleaning", "DependencyNeverSatisfied",
    "JobArrayTaskLimit", "AssociationResourceLimit", "AssociationTimeLimit",
    "QOSResourceLimit", "QOSTimeLimit", "QOSUsageThreshold", "QOSNotAllowed",
    "AccountNotAllowed", "InvalidAccount", "InvalidQOS", "PriorityResources",
    "PowerNotAvail", "PowerReserved", "BurstBufferResources", "BurstBufferStageIn",
    "BurstBufferOperation", "NodeNotAvail", "Configuring", "SchedDefer"})
#: Resource limits of an association or QOS (cores, memory, nodes, GPUs, billing,
#: minutes, walltime): the job waits until the account's other jobs free them.
_RESOURCE_LIMIT = re.compile(
    r"^(QOS|Assoc)\w*(Cpu|CPU|Mem|Node|Wall|Billing|Energy|GRES|Gres|TRES|License|VMem|"
    r"Pages|FS|Fs|BB|Unk)\w*$")


def unusual_reason(reason: str) -> str:
    """A pending job's reason for `plan()`: "" for SLURM's ordinary wait (`WAIT_REASONS`,
    a resource limit), the reason itself otherwise: a job-count limit
    (`provisioner.decide.limits.JOB_LIMIT_REASONS`) or a reason this provisioner does not
    know (another SLURM version's words), which is then no capacity on its way."""
    reason = reason.strip()
    # "ReqNodeNotAvail, UnavailableNodes:n1" and the like: the name is the first word
    name = re.split(r"[,:( ]", reason, maxsplit=1)[0]
    if not name or name in WAIT_REASONS or (
            _RESOURCE_LIMIT.match(name) and name not in JOB_LIMIT_REASONS):
        return ""
    return name


def _number(value: Any) -> float | None:
    """squeue JSON numbers are plain or {"set": bool, "infinite": bool, "number": n}."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, int | float):
        return float(value)
    return None


def _state(job: Mapping[str, Any]) -> str:
    state = job.get("job_state")
    if isinstance(state, list):
        return str(state[0]) if state else ""
    return str(state or "")


#: The untyped GPU count in a TRES string: cpu=4,mem=8G,node=1,gres/gpu=2,gres/gpu:a100=2.
_TRES_GPUS = re.compile(r"(?:^|,)gres/gpu=([0-9]+)")
#: A GPU request in tres_per_node / tres_per_job: "gres/gpu:2", "gres:gpu:a100:2", "gpu:2".
_PER_GPUS = re.compile(r"(?:^|,)(?:gres[/:])?gpu(?::[^:,=]+)?:([0-9]+)")


def _gpus(job: Mapping[str, Any]) -> int:
    """The job's GPUs: allocated (running) or asked for (pending); 0 if none.

    A TRES string counts the GPUs once untyped (and again per type, not summed
    here); the per-node/per-job request strings are the fallback."""
    for key, pattern in (("tres_alloc_str", _TRES_GPUS), ("tres_req_str", _TRES_GPUS),
                         ("tres_per_node", _PER_GPUS), ("tres_per_job", _PER_GPUS)):
        text = job.get(key)
        if isinstance(text, str) and (found := pattern.findall(text)):
            return sum(int(n) for n in found)
    return 0


def parse_squeue(doc: Mapping[str, Any], job_name: str) -> list[SiteJob]:
    """Pilot jobs (by job name) out of `squeue --json` output; finished ones dropped."""
    jobs = []
    for job in doc.get("jobs", []):
        if job.get("name") != job_name:
            continue
        raw = _state(job)
        if raw in STATE_TABLE:
            state = STATE_TABLE[raw]
        else:
            # Never guess "gone": count it as capacity that has not started.
            log.error("unknown SLURM job state %r of job %s: counted as pending", raw,
                      job.get("job_id"))
            state = SiteJobState.PENDING
        if state is None:
            continue
        reason = str(job.get("state_reason") or "")
        limited = unusual_reason(reason) if state is SiteJobState.PENDING else ""
        cpus = int(_number(job.get("cpus")) or 0)
        mem = _number(job.get("memory_per_node"))
        if mem is None:
            per_cpu = _number(job.get("memory_per_cpu")) or 0
            mem = per_cpu * max(cpus, 1)
        started = _number(job.get("start_time")) if state != SiteJobState.PENDING else None
        ends = _number(job.get("end_time")) if state != SiteJobState.PENDING else None
        jobs.append(SiteJob(
            job_id=str(job.get("job_id")),
            state=state,
            cpus=cpus,
            memory_mb=int(mem),
            submitted_at=_number(job.get("submit_time")) or 0.0,
            started_at=started or None,
            ends_at=ends or None,
            gpus=_gpus(job),
            limit_reason=limited,
            account=str(job.get("account") or ""),
        ))
    return jobs


_ACCOUNT = re.compile(SLURM_ACCOUNT_PATTERN)


def charged_account(request: PilotRequest, site_account: str | None) -> str | None:
    """The SLURM account a pilot is charged to: its allocation's (`request.account`)
    over the site's `account`; None: the pilot account's default. An account that is no
    SLURM account name (the configuration's pattern) is refused here too, before it
    reaches an argument list or a job description."""
    account = request.account or site_account
    if account is not None and not _ACCOUNT.fullmatch(account):
        raise Rejected(f"not a SLURM account name: {account!r}")
    return account


@dataclass
class SlurmSiteFields:
    """What both SLURM backends are built with (`provisioner.sites.pilot_settings`):
    the site, this provisioner's pilots' job name, and the options every pilot asks for."""

    name: str
    provisioner_id: str
    _: KW_ONLY
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    output_dir: str | None = None
    #: "gres": --gres=gpu[:type]:N; "gpus": --gpus=[type:]N (config `gpu_request`).
    gpu_request: str = "gres"
    gpu_type: str | None = None
    clock: Callable[[], float] = field(default=time.time, repr=False)
    _warned: set[str] = field(default_factory=set, init=False, repr=False)

    @property
    def job_name(self) -> str:
        return f"htcpilot-{self.provisioner_id}"
