"""`provisioner why CLUSTER[.PROC] ...`: why a job waits, runs or is held, for any user.

Read-only, with the pool's READ alone and no service configuration: the job's own ad
from the schedd (its shape, state, hold reason, the pilot it runs on) and the service's
status ad from the collector (`provisioner.pool.status_ad`: per job shape, what the
provisioner does for it or why it cannot). The job's shape key is computed from its ad
as the service computes it from the schedd's groups (`provisioner.decide.explain`).

Another user's job is answered too (reasons are not secrets), but nothing of its
command, arguments, environment or paths is shown: only the attributes
`provisioner.pool.job_ads` reads, and paths in its error texts are replaced by "<path>".

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
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from provisioner.decide.explain import Report, shape_key
from provisioner.decide.failed_starts import start_error
from provisioner.decide.reasons import Reason, Why, sentence, shape_words, stale
from provisioner.pool.job_ads import JobFacts, ToolFailed, read_jobs, tool

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
    # its last try failed at start: so it stays until the next try, cooling down or not
    # (a schedd may retry it long after its cool-down; the service then counts it as
    # demand, and its report would tell only of the pilot waiting for it)
    if job.failed_starts:
        text = start_error(job.failure)
        return Why(Reason.FAILED_STARTS, {"failed_starts": job.failed_starts,
                                          "cause": text if mine else redact(text)})
    return None


def pick(reports: Sequence[Report], key: str | Sequence[str]) -> tuple[Report | None, Any]:
    """The freshest report that has the shape `key` (or the first of several keys that
    it has) and its entry, else the freshest."""
    keys = [key] if isinstance(key, str) else list(key)
    ordered = sorted(reports, key=lambda r: -r.written_at)
    for r in ordered:
        for k in keys:
            e = r.entry(k)
            if e is not None:
                return r, e
    return (ordered[0] if ordered else None), None


def shape_keys(job: JobFacts) -> list[str]:
    """The keys the service may have given the job's shape: with its accounting group
    (where sites have allocations, the service tells shapes apart by group) and
    without (where none has)."""
    grouped = replace(job.shape, group=job.group)
    plain = replace(job.shape, group="")
    return list(dict.fromkeys([shape_key(grouped), shape_key(plain)]))


def answer(job: JobFacts, reports: Sequence[Report], now: float, me: str,
           clock: Any = None) -> dict[str, Any]:
    """One job's answer, as data: the `--json` object; its "text" as printed."""
    mine = job.owner == me
    keys = shape_keys(job)
    key = keys[0]
    why, then, report = from_job(job, mine), None, None
    unplaced = 0
    if why is None:
        report, entry = pick(reports, keys)
        group = report.group(job.group) if report is not None else None
        if report is None:
            why = Why(Reason.NO_REPORT)
        elif entry is not None:
            why, then, unplaced = entry.why, entry.then, entry.unplaced
            key = entry.key
        elif not report.pool_known:
            why = Why(Reason.POOL_UNKNOWN)
        elif group is not None:  # a shape not seen yet, of a group that waits
            why = group.why
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
    # the pool's configuration read locally (no daemon asked)
    domain = str(htcondor2.param.get("UID_DOMAIN", ""))
    try:
        jobs = read_jobs(ids, args.name, now)
        reports = reports_of(tool(status_argv(domain), "the provisioner's status"))
    except ToolFailed as exc:
        raise WhyError(str(exc), UNREADABLE) from exc
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
