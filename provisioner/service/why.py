"""`provisioner why CLUSTER[.PROC] ...`: why a job waits, runs or is held, for any user.

Read-only, with the pool's READ alone and no service configuration: the job's own ad
from the schedd (its shape, state, hold reason, the pilot it runs on) and the service's
status ad from the collector (`provisioner.pool.status_ad`: per job shape, what the
provisioner does for it or why it cannot). The job's shape key is computed from its ad
as the service computes it from the schedd's groups (`provisioner.decide.explain`).

Another user's job is answered too (reasons are not secrets), but nothing of its
command, arguments, environment or paths is shown: only the attributes read here, and
paths in its error texts are replaced by "<path>".

Exit status: 0 every job answered; 2 a malformed job id (nothing asked); 3 some job id
names no job in the queue (the others answered); 4 the schedd or the collector could
not be read.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from provisioner.decide.explain import Report, shape_key
from provisioner.decide.failed_starts import START_ATTRS, cause, cooling
from provisioner.decide.reasons import Reason, Why, sentence, shape_words, stale
from provisioner.model import JobShape

OK, MALFORMED, NO_SUCH_JOB, UNREADABLE = 0, 2, 3, 4
JOB_ID = re.compile(r"^(\d+)(?:\.(\d+))?$")
#: Hold subcode of the pool's failed-start policy (condor_config/central-manager.conf).
FAILED_STARTS_SUBCODE = 1007
_PATH = re.compile(r"[a-z][a-z0-9+.-]*://[^\s;,'\")]+|(?<![\w<])/[^\s:;,'\")]+")
_STATES = {1: "idle", 2: "running", 3: "removed", 4: "completed", 5: "held",
           6: "transferring output", 7: "suspended"}


class WhyError(Exception):
    """A problem that ends the command: its message and exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def parse_ids(words: Sequence[str]) -> list[tuple[int, int | None]]:
    """CLUSTER or CLUSTER.PROC words as (cluster, proc or None); WhyError(2) names the
    first malformed one."""
    out = []
    for w in words:
        m = JOB_ID.match(w.strip())
        if m is None:
            raise WhyError(f"{w!r} is not a job id: give CLUSTER or CLUSTER.PROC, e.g. 123 "
                           "or 123.4", MALFORMED)
        out.append((int(m.group(1)), int(m.group(2)) if m.group(2) is not None else None))
    return out


def constraint(ids: Sequence[tuple[int, int | None]]) -> str:
    """The schedd query for `ids` (integers only: built from parsed numbers)."""
    parts = [f"(ClusterId == {c})" if p is None else f"(ClusterId == {c} && ProcId == {p})"
             for c, p in ids]
    return " || ".join(parts) or "false"


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

    @property
    def job_id(self) -> str:
        return f"{self.cluster}.{self.proc}"


def redact(text: str) -> str:
    """`text` with every path and URL replaced by "<path>"."""
    return _PATH.sub("<path>", text)


def _held(job: JobFacts, mine: bool) -> Why:
    text = job.hold_reason if mine else redact(job.hold_reason)
    if job.hold_subcode == FAILED_STARTS_SUBCODE:
        return Why(Reason.HELD_FAILED_STARTS, {"failed_starts": job.cool_downs, "cause": text})
    return Why(Reason.HELD, {"cause": text})


def from_job(job: JobFacts, mine: bool) -> Why | None:
    """What the job's own ad says, whatever the provisioner reports (None: ask it)."""
    if job.status in (2, 6, 7):
        return Why(Reason.RUNNING, {"site": job.site or "?", "pilot": job.pilot or "?",
                                    **({"since": job.started} if job.started else {})})
    if job.status == 5:
        return _held(job, mine)
    if job.status in (3, 4):
        return Why(Reason.DONE, {"state": _STATES[job.status]})
    if job.cooling and job.failed_starts:
        text = cause(job.failure)
        return Why(Reason.FAILED_STARTS, {"failed_starts": job.failed_starts,
                                          "cause": text if mine else redact(text)})
    return None


def pick(reports: Sequence[Report], key: str) -> tuple[Report | None, Any]:
    """The freshest report that has the shape `key` (and its entry), else the freshest."""
    ordered = sorted(reports, key=lambda r: -r.written_at)
    for r in ordered:
        e = r.entry(key)
        if e is not None:
            return r, e
    return (ordered[0] if ordered else None), None


def answer(job: JobFacts, reports: Sequence[Report], now: float, me: str,
           clock: Any = None) -> dict[str, Any]:
    """One job's answer, as data: the `--json` object; its "text" as printed."""
    mine = job.owner == me
    key = shape_key(job.shape)
    why, then, report = from_job(job, mine), None, None
    unplaced = 0
    if why is None:
        report, entry = pick(reports, key)
        if report is None:
            why = Why(Reason.NO_REPORT)
        elif entry is not None:
            why, then, unplaced = entry.why, entry.then, entry.unplaced
        elif not report.pool_known:
            why = Why(Reason.POOL_UNKNOWN)
        else:
            why = Why(Reason.NOT_SEEN, {"newer": job.qdate >= report.written_at,
                                        "cycle_at": report.written_at})
    kw = {"clock": clock} if clock is not None else {}
    text = sentence(why, now, **kw)
    if then is not None:
        text += f". {unplaced} job(s) of this shape wait longer: {sentence(then, now, **kw)}"
    age = now - report.written_at if report is not None else None
    late = report is not None and age is not None and age > 2 * max(report.cycle_s, 1.0)
    if late and age is not None:
        text = stale(age) + text
    s = job.shape
    return {"job": job.job_id, "owner": job.owner, "status": _STATES.get(job.status, "?"),
            "shape": {"cores": s.cpus, "memory_mb": s.memory_mb, "gpus": s.gpus,
                      "group": job.group or None, "key": key},
            "reason": why.reason.value, "params": dict(why.params),
            "then": None if then is None else {"reason": then.reason.value,
                                               "params": dict(then.params)},
            "text": _capital(text, str(why.get("site", ""))),
            "report": None if report is None else {
                "provisioner_id": report.provisioner_id, "written_at": report.written_at,
                "age_s": round(age or 0.0), "stale": late}}


def _capital(text: str, site: str) -> str:
    """A sentence: its first letter capital (unless it starts with a site's name, which
    is written as configured), a full stop at the end."""
    if not (site and text.startswith(site)):
        text = text[:1].upper() + text[1:]
    return text if text.endswith(".") else text + "."


def render(a: dict[str, Any]) -> str:
    """An answer as two lines: the job and its shape, then the sentences."""
    s = a["shape"]
    head = f"{a['job']} ({a['owner']}, {a['status']}): " + shape_words(
        s["cores"], s["memory_mb"], s["gpus"], s["group"] or "")
    return f"{head}\n  {a['text']}"


# --- reading the pool -------------------------------------------------------------


#: The job attributes a shape's requests are read from (`shape_of`).
REQUEST_ATTRS = ("RequestCpus", "RequestMemory", "RequestDisk", "RequestGPUs", "MaxRuntime",
                 "DesiredSites")
#: What condor_submit's default requests read (RequestDisk = DiskUsage, RequestMemory
#: from MemoryUsage or ImageSize): asked for at once, not in a second query.
REQUEST_REFS = ("DiskUsage", "MemoryUsage", "ImageSize", "ExecutableSize",
                "TransferInputSizeMB")


def job_attrs() -> list[str]:
    """What `why` reads of a job: its state, shape, group, pilot and hold reason (never
    its command, arguments, environment or directories)."""
    from provisioner.pool.condor import SHAPE_ATTRS

    return ["ClusterId", "ProcId", "Owner", "JobStatus", "QDate", "AcctGroup",
            "AccountingGroup", "RemoteHost", "JobCurrentStartDate",
            "MachineAttrPilotSite0", "MachineAttrPilotSlurmJobId0", "HoldReason",
            "HoldReasonSubCode", *SHAPE_ATTRS, *START_ATTRS, *REQUEST_REFS]


def facts_of(ad: Any, now: float) -> JobFacts:
    """A job's facts from its ad (read with `job_attrs()`)."""
    from provisioner.pool.condor import _int, _str, failure_of, shape_of, startd_of

    failure = failure_of(ad)
    site = _str(ad, "MachineAttrPilotSite0")
    pilot = _str(ad, "MachineAttrPilotSlurmJobId0") or str(
        _int(ad, "MachineAttrPilotSlurmJobId0") or "")
    if not site and _str(ad, "RemoteHost"):
        site, pilot = "", startd_of(_str(ad, "RemoteHost"))
    return JobFacts(
        cluster=_int(ad, "ClusterId"), proc=_int(ad, "ProcId"), owner=_str(ad, "Owner"),
        status=_int(ad, "JobStatus"), shape=shape_of(ad),
        group=_str(ad, "AcctGroup") or _str(ad, "AccountingGroup"),
        qdate=float(_int(ad, "QDate")), site=site, pilot=pilot,
        started=float(_int(ad, "JobCurrentStartDate")), hold_reason=_str(ad, "HoldReason"),
        hold_subcode=_int(ad, "HoldReasonSubCode"), cool_downs=_int(ad, "NumJobCoolDowns"),
        failed_starts=failure.failed_starts if failure else 0,
        failure=failure.reason if failure else "", cooling=cooling(failure, now))


def tool(argv: Sequence[str], what: str) -> list[Any]:
    """The ads an HTCondor tool prints with -long (argv a list, never a shell line);
    WhyError(4) names `what` and the tool's last line of error when it fails."""
    import classad2

    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=60,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WhyError(f"cannot read {what}: {argv[0]}: {exc}", UNREADABLE) from exc
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise WhyError(f"cannot read {what}: {last}", UNREADABLE)
    return list(classad2.parseAds(proc.stdout)) if proc.stdout.strip() else []


def queue_argv(ids: Sequence[tuple[int, int | None]], schedd: str | None,
               attrs: Sequence[str] | None = None) -> list[str]:
    """condor_q for `ids`, every user's, only the attributes `why` reads (`attrs`, by
    default `job_attrs()`)."""
    argv = ["condor_q", "-allusers", "-long", "-constraint", constraint(ids),
            "-attributes", ",".join(attrs or job_attrs())]
    return argv + (["-name", schedd] if schedd else [])


def unread(ads: Sequence[Any]) -> set[str]:
    """The job attributes the requests' expressions read that `ads` lack (the schedd's
    grouping, which the service's shapes come from, evaluates them with those)."""
    out: set[str] = set()
    seen: set[str] = set()
    for ad in ads:
        for attr in REQUEST_ATTRS:
            expr = ad.lookup(attr) if attr in ad else None
            if expr is None or type(ad[attr]) in (bool, int, float, str):
                continue
            text = f"{attr}={expr}"
            if text not in seen:
                seen.add(text)
                out.update(str(ref) for ref in ad.externalRefs(expr) if ref)
    return out


def read_jobs(ids: Sequence[tuple[int, int | None]], schedd: str | None,
              now: float) -> list[JobFacts]:
    """The jobs `ids` name, read with the pool's own condor_q as the user who asks: its
    version is the daemons' (the bindings from PyPI may be newer, and a newer client
    refuses an older daemon's FS authentication). A request that reads an attribute not
    asked for is read again with it (once)."""
    attrs = job_attrs()
    ads = tool(queue_argv(ids, schedd, attrs), "the schedd's queue")
    known = {a.lower() for a in attrs}
    more = sorted(a for a in unread(ads) if a.lower() not in known)
    if more:
        ads = tool(queue_argv(ids, schedd, attrs + more), "the schedd's queue")
    return sorted((facts_of(ad, now) for ad in ads), key=lambda j: (j.cluster, j.proc))


def missing(ids: Sequence[tuple[int, int | None]], jobs: Sequence[JobFacts]) -> list[str]:
    """The ids that name no job read."""
    have = {(j.cluster, j.proc) for j in jobs}
    clusters = {j.cluster for j in jobs}
    return [f"{c}" if p is None else f"{c}.{p}" for c, p in ids
            if (c not in clusters if p is None else (c, p) not in have)]


def _local_clock(epoch: float) -> str:
    t = time.localtime(epoch)
    day = "%H:%M" if t[:3] == time.localtime()[:3] else "%Y-%m-%d %H:%M"
    return time.strftime(day, t)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="provisioner why", description="Why a job waits, runs or is held: what the "
        "provisioner does for it, or why it cannot (no configuration needed).",
        epilog="Exit status: 0 answered; 2 a malformed job id; 3 a job id names no job in "
        "the queue (the others answered); 4 the schedd or the collector unreadable.")
    parser.add_argument("jobs", nargs="+", metavar="CLUSTER[.PROC]")
    parser.add_argument("--json", action="store_true", help="one JSON list, stable keys")
    parser.add_argument("-n", "--name", help="the schedd to ask (default: this host's)")
    args = parser.parse_args(list(argv))
    try:
        return _run(args)
    except WhyError as exc:
        print(f"provisioner why: {exc}", file=sys.stderr)
        return exc.status


def _run(args: argparse.Namespace) -> int:
    import htcondor2

    from provisioner.pool.status_ad import reports_of, status_argv

    ids = parse_ids(args.jobs)
    now = time.time()
    jobs = read_jobs(ids, args.name, now)
    # the pool's configuration read locally (no daemon asked)
    domain = str(htcondor2.param.get("UID_DOMAIN", ""))
    reports = reports_of(tool(status_argv(domain), "the provisioner's status"))
    me = pwd.getpwuid(os.getuid()).pw_name
    answers = [answer(j, reports, now, me, _local_clock) for j in jobs]
    gone = missing(ids, jobs)
    if args.json:
        print(json.dumps({"answers": answers, "missing": gone}, indent=2, sort_keys=True))
    else:
        print("\n".join(render(a) for a in answers))
    for job_id in gone:
        print(f"provisioner why: no job {job_id} in the queue (finished, removed or never "
              f"submitted: condor_history {job_id})", file=sys.stderr)
    return NO_SUCH_JOB if gone else OK
