"""SLURM's refusals, classified from its own words (and, over slurmrestd, its error
numbers) into the backends' error kinds: at a limit, misconfigured, unreachable,
busy (transient) or rejected. Both site backends classify through here.
"""

from __future__ import annotations

import re

from provisioner.errors import (
    AtLimit,
    BackendError,
    Misconfigured,
    Rejected,
    Transient,
    Unreachable,
)

_UNREACHABLE = re.compile(r"unable to contact slurm controller|connection refused|"
                          r"slurm_load_jobs error|cannot connect|zero bytes were transmitted",
                          re.IGNORECASE)
_TRANSIENT = re.compile(r"socket timed out|try again|temporarily|resource temporarily|"
                        r"slurmctld is busy|timed out|rate limit exceeded", re.IGNORECASE)
#: Submit limits (QOS or association MaxSubmitJobs/GrpSubmitJobs): sbatch is refused,
#: the limit's name on the first line, then "Job violates accounting/QOS policy (job
#: submit limit, ...)"; a job_submit plugin may print the name alone.
SUBMIT_LIMIT_REASONS = ("QOSMaxSubmitJobPerUserLimit", "QOSMaxSubmitJobPerAccountLimit",
                        "QOSGrpSubmitJobsLimit", "AssocMaxSubmitJobLimit",
                        "AssocGrpSubmitJobsLimit")
_SUBMIT_LIMIT = re.compile("|".join([*SUBMIT_LIMIT_REASONS,
                                     r"job violates accounting/QOS policy \(job submit limit"]),
                           re.IGNORECASE)
#: SLURM's words for a refused configuration -> the site's configuration field.
CONFIG_ERRORS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"invalid account or account/partition combination", re.I),
     "account (with partition)"),
    (re.compile(r"invalid partition name", re.I), "partition"),
    (re.compile(r"invalid qos specification|invalid qos", re.I), "qos"),
    (re.compile(r"requested time limit is invalid", re.I), "pilot.walltime_s"),
    (re.compile(r"requested node configuration is not available", re.I),
     "pilot (cpus, memory_mb, gpus)"),
    (re.compile(r"invalid generic resource \(gres\) specification|invalid gres", re.I),
     "gpu_request/gpu_type"),
)
_REASON_WORD = re.compile(r"\b(" + "|".join(SUBMIT_LIMIT_REASONS) + r")\b", re.IGNORECASE)
#: A cancel or signal of a job SLURM no longer knows, or that has ended: done already.
UNKNOWN_JOB = re.compile(r"invalid job id|job has already finished|already completing",
                         re.IGNORECASE)


def slurm_words(text: str) -> str:
    """SLURM's own message out of sbatch's stderr: its "error:" lines, prefixes dropped
    ("sbatch: error: Batch job submission failed: X" -> "X")."""
    words = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        line = re.sub(r"^sbatch: (error: )?", "", line)
        line = line.removeprefix("Batch job submission failed: ")
        words.append(line)
    return "; ".join(words)


def classify_failure(message: str, text: str) -> BackendError:
    """A failed command or request other than a submission, from SLURM's words in
    `text`: Unreachable, Transient (busy, timed out) or, for anything else, Rejected;
    `message` is the error's text."""
    if _UNREACHABLE.search(text):
        return Unreachable(message)
    if _TRANSIENT.search(text):
        return Transient(message)
    return Rejected(message)


def classify_sbatch(site: str, text: str, returncode: int = 1,
                    action: str = "sbatch") -> BackendError:
    """A failed submission (`action`: sbatch, or its REST request), from SLURM's own
    messages: AtLimit (an account's submit limit), Misconfigured (account, partition,
    QOS, time limit, shape refused), Unreachable, Transient (busy, timed out, rate
    limited) or, for anything else, Rejected."""
    said = slurm_words(text) or f"exit {returncode}, no message"
    if _SUBMIT_LIMIT.search(text):
        named = _REASON_WORD.search(text)
        reason = named.group(1) if named else "submit limit"
        return AtLimit(f"{action} at {site} refused: {said}", reason=reason)
    for pattern, name in CONFIG_ERRORS:
        if pattern.search(text):
            return Misconfigured(f"{action} at {site} refused its {name}: {said}",
                                 field=name, slurm_message=said)
    if _UNREACHABLE.search(text):
        return Unreachable(f"{action} at {site} failed: {said}")
    if _TRANSIENT.search(text):
        return Transient(f"{action} at {site} failed: {said}")
    return Rejected(f"{action} at {site} refused: {said}")
