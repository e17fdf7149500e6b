"""Jobs and ads as any user reads them, with the pool's own tools: `provisioner why`.

`condor_q -json` and `condor_status -json` run as the user who asks (argv lists, never
a shell line): their version is the daemons', where the bindings from PyPI may be newer,
and a newer client refuses an older daemon's FS authentication. A job is read for its
state, shape, group, pilot and hold reason only (`job_attrs`): never its command,
arguments, environment or directories. Its shape is read as the service reads the
schedd's groups (`provisioner.pool.classads.shape_of`), one ClassAd per distinct set of
shape values, so that a cluster of 20,000 alike jobs is evaluated once.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from provisioner.decide.failed_starts import START_ATTRS, cooling
from provisioner.model import JobShape
from provisioner.pool.classads import SHAPE_ATTRS, _int, _str, failure_of, shape_of, startd_of

#: The job attributes a shape's requests are read from (`shape_of`).
REQUEST_ATTRS = ("RequestCpus", "RequestMemory", "RequestDisk", "RequestGPUs", "MaxRuntime",
                 "DesiredSites")
#: What condor_submit's default requests read (RequestDisk = DiskUsage, RequestMemory
#: from MemoryUsage or ImageSize): asked for at once, not in a second query.
REQUEST_REFS = ("DiskUsage", "MemoryUsage", "ImageSize", "ExecutableSize",
                "TransferInputSizeMB")
#: How condor's JSON writes an expression: "/Expr(<ClassAd text>)/".
_EXPR = ("/Expr(", ")/")


class ToolFailed(Exception):
    """An HTCondor tool could not be run or failed; the message names what and why."""


@dataclass(frozen=True)
class JobFacts:
    """What `why` reads of one job's ad (no command, arguments, environment or paths)."""

    cluster: int
    proc: int
    owner: str
    status: int
    shape: JobShape
    group: str = ""
    qdate: float = 0.0
    site: str = ""  # the pilot it runs on (site and SLURM job id), if running
    pilot: str = ""
    started: float = 0.0
    hold_reason: str = ""
    hold_subcode: int = 0
    cool_downs: int = 0
    failed_starts: int = 0  # its last start failed (0: not)
    failure: str = ""
    cooling: bool = False
    acct_group: str = ""  # its AcctGroup itself ("" if none)

    @property
    def job_id(self) -> str:
        return f"{self.cluster}.{self.proc}"

    @property
    def shapes(self) -> tuple[JobShape, ...]:
        """The shapes the service may have read this job as: with its accounting group
        (where some site has allocations, `provisioner.pool.classads.shape_of`), then
        without; one if it names no group."""
        if not self.acct_group:
            return (self.shape,)
        return (replace(self.shape, group=self.acct_group), self.shape)


def job_attrs() -> list[str]:
    """What is read of a job: its state, shape, group, pilot and hold reason."""
    return ["ClusterId", "ProcId", "Owner", "JobStatus", "QDate", "AcctGroup",
            "AccountingGroup", "RemoteHost", "JobCurrentStartDate",
            "MachineAttrPilotSite0", "MachineAttrPilotSlurmJobId0", "HoldReason",
            "HoldReasonSubCode", *SHAPE_ATTRS, *START_ATTRS, *REQUEST_REFS]


def constraint(ids: Sequence[tuple[int, int | None]]) -> str:
    """The schedd query for `ids` (integers only: built from parsed numbers)."""
    parts = [f"(ClusterId == {c})" if p is None else f"(ClusterId == {c} && ProcId == {p})"
             for c, p in ids]
    return " || ".join(parts) or "false"


def queue_argv(ids: Sequence[tuple[int, int | None]], schedd: str | None,
               attrs: Sequence[str] | None = None) -> list[str]:
    """condor_q for `ids`, every user's, only `attrs` (default `job_attrs()`)."""
    argv = ["condor_q", "-allusers", "-json", "-constraint", constraint(ids),
            "-attributes", ",".join(attrs or job_attrs())]
    return argv + (["-name", schedd] if schedd else [])


def tool(argv: Sequence[str], what: str) -> list[dict[str, Any]]:
    """The ads an HTCondor tool prints with -json; ToolFailed names `what` and the
    tool's last line of error."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=60,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolFailed(f"cannot read {what}: {argv[0]}: {exc}") from exc
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise ToolFailed(f"cannot read {what}: {last}")
    try:
        ads = json.loads(proc.stdout) if proc.stdout.strip() else []
    except ValueError as exc:
        raise ToolFailed(f"cannot read {what}: {argv[0]} printed no JSON: {exc}") from exc
    return [ad for ad in ads if isinstance(ad, dict)]


def _value(v: Any) -> Any:
    """A JSON value as the ClassAd holds it: "/Expr(...)/" an expression."""
    import classad2

    if isinstance(v, str) and v.startswith(_EXPR[0]) and v.endswith(_EXPR[1]):
        return classad2.ExprTree(v[len(_EXPR[0]):-len(_EXPR[1])])
    return v


class Shapes:
    """Job shapes from JSON job ads: one ClassAd and one `shape_of` per distinct set of
    the values a shape is read from."""

    def __init__(self, attrs: Sequence[str]) -> None:
        self.attrs = tuple(a for a in attrs if a not in _NOT_SHAPE)
        self.ads: dict[Any, Any] = {}  # signature -> the ClassAd
        self.shapes: dict[Any, JobShape] = {}

    def ad(self, job: dict[str, Any]) -> tuple[Any, Any]:
        """The job's shape signature and the ClassAd of its shape values."""
        import classad2

        sig: Any = tuple(job.get(a) for a in self.attrs)
        try:
            ad = self.ads.get(sig)
        except TypeError:  # a list or nested ad among the values
            sig = json.dumps(sig)
            ad = self.ads.get(sig)
        if ad is None:
            ad = self.ads[sig] = classad2.ClassAd()
            for a in self.attrs:
                if a in job:
                    ad[a] = _value(job[a])
        return sig, ad

    def of(self, job: dict[str, Any]) -> JobShape:
        sig, ad = self.ad(job)
        shape = self.shapes.get(sig)
        if shape is None:
            shape = self.shapes[sig] = shape_of(ad)
        return shape

    def unread(self) -> set[str]:
        """The job attributes the requests' expressions read that the ads lack (the
        schedd's grouping, which the service's shapes come from, evaluates them with
        those)."""
        out: set[str] = set()
        for ad in self.ads.values():
            for attr in REQUEST_ATTRS:
                if attr in ad and type(ad[attr]) not in (bool, int, float, str):
                    out.update(str(r) for r in ad.externalRefs(ad.lookup(attr)) if r)
        return out


#: Job attributes that are no part of a shape (each job's own).
_NOT_SHAPE = frozenset({"ClusterId", "ProcId", "Owner", "JobStatus", "QDate", "AcctGroup",
                        "AccountingGroup", "RemoteHost", "JobCurrentStartDate",
                        "MachineAttrPilotSite0", "MachineAttrPilotSlurmJobId0", "HoldReason",
                        "HoldReasonSubCode", *START_ATTRS})


def facts_of(job: dict[str, Any], shape: JobShape, now: float) -> JobFacts:
    """A job's facts from its JSON ad (read with `job_attrs()`) and its shape."""
    # literals only (an expression or an undefined value reads as absent)
    job = {k: v for k, v in job.items() if type(v) in (bool, int, float, str)
           and not (type(v) is str and v.startswith(_EXPR[0]))}
    failure = failure_of(job)
    site = _str(job, "MachineAttrPilotSite0")
    pilot = _str(job, "MachineAttrPilotSlurmJobId0") or str(
        _int(job, "MachineAttrPilotSlurmJobId0") or "")
    if not site and _str(job, "RemoteHost"):
        site, pilot = "", startd_of(_str(job, "RemoteHost"))
    return JobFacts(
        cluster=_int(job, "ClusterId"), proc=_int(job, "ProcId"), owner=_str(job, "Owner"),
        status=_int(job, "JobStatus"), shape=shape,
        group=_str(job, "AcctGroup") or _str(job, "AccountingGroup"),
        qdate=float(_int(job, "QDate")), site=site, pilot=pilot,
        started=float(_int(job, "JobCurrentStartDate")), hold_reason=_str(job, "HoldReason"),
        hold_subcode=_int(job, "HoldReasonSubCode"), cool_downs=_int(job, "NumJobCoolDowns"),
        failed_starts=failure.failed_starts if failure else 0,
        failure=failure.reason if failure else "", cooling=cooling(failure, now),
        acct_group=_str(job, "AcctGroup"))


def read_jobs(ids: Sequence[tuple[int, int | None]], schedd: str | None,
              now: float) -> list[JobFacts]:
    """The jobs `ids` name, by cluster and process. A request that reads an attribute
    not asked for is read again with it (once). ToolFailed if condor_q fails."""
    attrs = job_attrs()
    jobs = tool(queue_argv(ids, schedd, attrs), "the schedd's queue")
    shapes = Shapes(attrs)
    each = [shapes.of(job) for job in jobs]
    known = {a.lower() for a in attrs}
    more = sorted(a for a in shapes.unread() if a.lower() not in known)
    if more:
        attrs += more
        jobs = tool(queue_argv(ids, schedd, attrs), "the schedd's queue")
        shapes = Shapes(attrs)
        each = [shapes.of(job) for job in jobs]
    out = [facts_of(job, shape, now) for job, shape in zip(jobs, each, strict=True)]
    return sorted(out, key=lambda j: (j.cluster, j.proc))
