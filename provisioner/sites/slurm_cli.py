"""SLURM through its command-line tools: sbatch, squeue --json, scancel; and the
pilots' end records read with head (and pruned with find) on the login node.

Commands run through an `Executor` (provisioner.sites.executor: on this host, or
on the site's login node over SSH). Every command is an argv list; configuration
values are validated by the config models and never pass through a local shell
(the SSH executor quotes each word for the remote one).
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from provisioner.errors import (
    AtLimit,
    BackendError,
    Misconfigured,
    Rejected,
    Transient,
    Unreachable,
)
from provisioner.pilot import endrecord
from provisioner.pilot.endrecord import BadEndRecord, EndRecord
from provisioner.sites.base import MAX_END_RECORDS, PilotRequest, SiteJob, SiteJobState
from provisioner.sites.executor import CommandResult, Executor

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
#: Job-count limits (MaxJobs, GrpJobs): sbatch accepts, the job pends with this reason.
JOB_LIMIT_REASONS = frozenset({"QOSMaxJobsPerUserLimit", "QOSMaxJobsPerAccountLimit",
                               "QOSGrpJobsLimit", "AssocMaxJobsLimit", "AssocGrpJobsLimit",
                               "AssociationJobLimit"})
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
_UNKNOWN_JOB = re.compile(r"invalid job id|job has already finished|already completing",
                          re.IGNORECASE)
_HEAD_HEADER = re.compile(r"^==> (.*) <==$")

#: End records are kept this long at the site (an admin may look at them; the
#: provisioner reads each within the hour after its pilot left squeue), then pruned,
#: by the provisioner, at most once per RECORD_PRUNE_EVERY_S.
RECORD_KEEP_S = 7 * 86400
RECORD_PRUNE_EVERY_S = 86400


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
        limited = reason if (state is SiteJobState.PENDING
                             and reason in JOB_LIMIT_REASONS) else ""
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
        ))
    return jobs


def split_head_output(stdout: str, paths: Sequence[str]) -> dict[str, str]:
    """`head -v` output of several files -> {path: its text}, for the `paths` it shows."""
    wanted = set(paths)
    out: dict[str, str] = {}
    current: str | None = None
    lines: list[str] = []
    for line in stdout.splitlines(keepends=True):
        header = _HEAD_HEADER.match(line.rstrip("\n"))
        if header and header.group(1) in wanted:
            if current is not None:
                out[current] = "".join(lines)
            current, lines = header.group(1), []
        elif current is not None:
            lines.append(line)
    if current is not None:
        out[current] = "".join(lines)
    return out


def _classify(action: str, result: CommandResult) -> Exception:
    text = (result.stderr or result.stdout).strip()
    message = f"{action} failed (exit {result.returncode}): {text}"
    if _UNREACHABLE.search(text):
        return Unreachable(message)
    if _TRANSIENT.search(text):
        return Transient(message)
    return Rejected(message)


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


def classify_sbatch(site: str, text: str, returncode: int = 1) -> BackendError:
    """A failed sbatch, from SLURM's own messages: AtLimit (an account's submit limit),
    Misconfigured (account, partition, QOS, time limit, shape refused), Unreachable,
    Transient (busy, timed out, rate limited) or, for anything else, Rejected."""
    said = slurm_words(text) or f"exit {returncode}, no message"
    if _SUBMIT_LIMIT.search(text):
        named = _REASON_WORD.search(text)
        reason = named.group(1) if named else "submit limit"
        return AtLimit(f"sbatch at {site} refused: {said}", reason=reason)
    for pattern, name in CONFIG_ERRORS:
        if pattern.search(text):
            return Misconfigured(f"sbatch at {site} refused its {name}: {said}",
                                 field=name, slurm_message=said)
    if _UNREACHABLE.search(text):
        return Unreachable(f"sbatch at {site} failed: {said}")
    if _TRANSIENT.search(text):
        return Transient(f"sbatch at {site} failed: {said}")
    return Rejected(f"sbatch at {site} refused: {said}")


@dataclass
class SlurmCliBackend:
    """A SLURM site reached through sbatch/squeue/scancel."""

    name: str
    provisioner_id: str
    executor: Executor
    slurm_conf: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    output_dir: str | None = None
    #: "gres": --gres=gpu[:type]:N; "gpus": --gpus=[type:]N (config `gpu_request`).
    gpu_request: str = "gres"
    gpu_type: str | None = None
    #: The pilots' log directory on the site's shared file system (None: they keep
    #: none, so they leave no end records).
    log_dir: str | None = None
    clock: Callable[[], float] = field(default=time.time, repr=False)
    _pruned_at: float | None = field(default=None, init=False, repr=False)
    _warned: set[str] = field(default_factory=set, init=False, repr=False)

    @property
    def job_name(self) -> str:
        return f"htcpilot-{self.provisioner_id}"

    def _env(self) -> dict[str, str]:
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        return env

    def sbatch_argv(self, request: PilotRequest) -> list[str]:
        argv = [
            "sbatch", "--parsable",
            f"--job-name={self.job_name}",
            f"--comment=htcondor-pilot provisioner={self.provisioner_id}",
            f"--cpus-per-task={request.cpus}",
            f"--mem={request.memory_mb}M",
            f"--time={max(1, math.ceil(request.walltime_s / 60))}",
            f"--signal=B:TERM@{request.shutdown_margin_s}",
            # A pilot whose node failed is gone; SLURM must not start it again
            # elsewhere under the same job id (the provisioner decides).
            "--no-requeue",
            # Wherever the command runs (an SSH session starts in the account's
            # home), the pilot starts in /, never in a directory it would expose.
            "--chdir=/",
            f"--output={self.output_dir}/%x-{self.name}-%j.out" if self.output_dir
            else "--output=/dev/null",
        ]
        if self.partition:
            argv.append(f"--partition={self.partition}")
        if self.account:
            argv.append(f"--account={self.account}")
        if self.qos:
            argv.append(f"--qos={self.qos}")
        if request.gpus > 0:
            argv.append(self.gpu_option(request.gpus))
        if request.deadline_s > 0:
            argv.append(f"--deadline=now+{request.deadline_s}seconds")
        return argv

    def gpu_option(self, gpus: int) -> str:
        """The sbatch option asking for `gpus` GPUs, in the site's form."""
        typed = f"{self.gpu_type}:" if self.gpu_type else ""
        if self.gpu_request == "gpus":
            return f"--gpus={typed}{gpus}"
        return f"--gres=gpu:{typed}{gpus}"

    def submit(self, request: PilotRequest) -> str:
        result = self.executor.run(self.sbatch_argv(request), self._env(), stdin=request.script)
        if result.returncode != 0:
            raise classify_sbatch(self.name, result.stderr or result.stdout,
                                  result.returncode)
        job_id = result.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise Transient(f"sbatch at {self.name} printed no job id: {result.stdout!r}")
        return job_id

    def list_pilots(self) -> list[SiteJob]:
        result = self.executor.run(["squeue", "--json", f"--name={self.job_name}"], self._env())
        if result.returncode != 0:
            err = _classify(f"squeue at {self.name}", result)
            raise err if isinstance(err, Unreachable | Transient) else Unreachable(str(err))
        try:
            doc = json.loads(result.stdout)
        except json.JSONDecodeError as exc:
            raise Unreachable(f"squeue at {self.name} printed invalid JSON: {exc}") from exc
        return parse_squeue(doc, self.job_name)

    def _scancel(self, job_id: str, *options: str) -> None:
        if not job_id.isdigit():
            raise Rejected(f"not a SLURM job id: {job_id!r}")
        result = self.executor.run(["scancel", *options, job_id], self._env())
        text = result.stderr + result.stdout
        if _UNKNOWN_JOB.search(text):
            log.info("scancel %s at %s: already gone", job_id, self.name)
        elif result.returncode != 0:
            raise _classify(f"scancel {job_id} at {self.name}", result)

    def release(self, job_id: str) -> None:
        # SIGUSR1 to the batch shell, which is the pilot wrapper itself.
        self._scancel(job_id, "--batch", f"--signal={RELEASE_SIGNAL}")

    def retire(self, job_id: str, retire: bool = True) -> None:
        """scancel --batch --signal=USR2 (retire) or CONT (withdraw): to the batch shell,
        which is the pilot wrapper (provisioner.pilot.wrapper, which names the same
        signals)."""
        signal = RETIRE_SIGNAL if retire else UNRETIRE_SIGNAL
        self._scancel(job_id, "--batch", f"--signal={signal}")

    def cancel(self, job_id: str, only_pending: bool = False) -> None:
        self._scancel(job_id, *(["--state=PENDING"] if only_pending else []))

    @property
    def end_dir(self) -> str | None:
        return f"{self.log_dir.rstrip('/')}/{endrecord.END_DIR}" if self.log_dir else None

    def _warn_once(self, path: str, message: str) -> None:
        if path not in self._warned:
            if len(self._warned) > 1000:
                self._warned.clear()
            self._warned.add(path)
            log.warning("end record %s at %s ignored: %s", path, self.name, message)

    def end_records(self, job_ids: Sequence[str]) -> dict[str, EndRecord]:
        end_dir = self.end_dir
        if end_dir is None:
            return {}
        paths: dict[str, str] = {}  # path -> job id
        for job_id in job_ids:
            if len(paths) >= MAX_END_RECORDS:
                break
            try:
                paths[f"{end_dir}/{endrecord.file_name(self.name, job_id)}"] = job_id
            except ValueError:
                log.warning("no end record to read for job %r at %s", job_id, self.name)
        records: dict[str, EndRecord] = {}
        if paths:
            records = self._read_records(paths)
        self._prune(end_dir)
        return records

    def _read_records(self, paths: Mapping[str, str]) -> dict[str, EndRecord]:
        """One `head -v` over the record files: each file's first MAX_BYTES, each
        under a header with its name; a missing file is only a line on stderr."""
        argv = ["head", "-v", "-c", str(endrecord.MAX_BYTES), "--", *paths]
        result = self.executor.run(argv, self._env())
        if result.returncode not in (0, 1):
            raise _classify(f"reading end records at {self.name}", result)
        for line in result.stderr.splitlines():
            if line.strip() and "No such file or directory" not in line:
                log.warning("reading end records at %s: %s", self.name, line.strip())
        records: dict[str, EndRecord] = {}
        for path, text in split_head_output(result.stdout, list(paths)).items():
            job_id = paths[path]
            try:
                records[job_id] = endrecord.parse(text, self.name, job_id,
                                                  self.provisioner_id)
            except BadEndRecord as exc:
                self._warn_once(path, str(exc))
        return records

    def _prune(self, end_dir: str) -> None:
        """Remove records (and left-over temporary files) older than RECORD_KEEP_S,
        at most once per RECORD_PRUNE_EVERY_S; a failure is only logged."""
        now = self.clock()
        if self._pruned_at is not None and now - self._pruned_at < RECORD_PRUNE_EVERY_S:
            return
        self._pruned_at = now
        argv = ["find", end_dir, "-maxdepth", "1", "-type", "f",
                "(", "-name", "*.json", "-o", "-name", ".*.tmp", ")",
                "-mmin", f"+{RECORD_KEEP_S // 60}", "-delete"]
        try:
            result = self.executor.run(argv, self._env())
        except BackendError as exc:
            log.warning("end records at %s not pruned: %s", self.name, exc)
            return
        if result.returncode != 0 and "No such file or directory" not in result.stderr:
            log.warning("end records at %s not pruned: %s", self.name,
                        (result.stderr or result.stdout).strip())
