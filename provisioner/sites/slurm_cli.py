"""SLURM through its command-line tools: sbatch, squeue --json, scancel; and the
pilots' end records read with head (and pruned with find) on the login node.
SLURM's states and refusals are read as every backend reads them
(provisioner.sites.slurm_jobs, provisioner.sites.slurm_refusals).

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from provisioner.errors import BackendError, Rejected, Transient, Unreachable
from provisioner.pilot import endrecord
from provisioner.pilot.endrecord import BadEndRecord, EndRecord
from provisioner.sites.base import MAX_END_RECORDS, AccountCharge, PilotRequest, SiteJob
from provisioner.sites.executor import CommandResult, Executor
from provisioner.sites.shares import SharesError, parse_shares, sshare_argv, wanted_accounts
from provisioner.sites.slurm_jobs import (
    RELEASE_SIGNAL,
    RETIRE_SIGNAL,
    UNRETIRE_SIGNAL,
    SlurmSiteFields,
    charged_account,
    parse_squeue,
)
from provisioner.sites.slurm_refusals import UNKNOWN_JOB, classify_failure, classify_sbatch

log = logging.getLogger(__name__)

_HEAD_HEADER = re.compile(r"^==> (.*) <==$")

#: End records are kept this long at the site (an admin may look at them; the
#: provisioner reads each within the hour after its pilot left squeue), then pruned,
#: by the provisioner, at most once per RECORD_PRUNE_EVERY_S.
RECORD_KEEP_S = 7 * 86400
RECORD_PRUNE_EVERY_S = 86400


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
    return classify_failure(f"{action} failed (exit {result.returncode}): {text}", text)


@dataclass
class SlurmCliBackend(SlurmSiteFields):
    """A SLURM site reached through sbatch/squeue/scancel."""

    executor: Executor
    slurm_conf: str | None = None
    #: The pilots' log directory on the site's shared file system (None: they keep
    #: none, so they leave no end records).
    log_dir: str | None = None
    _pruned_at: float | None = field(default=None, init=False, repr=False)

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
        account = charged_account(request, self.account)
        if account:
            argv.append(f"--account={account}")
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

    def account_charges(self, accounts: Sequence[str]) -> dict[str, AccountCharge]:
        """`sshare --json --accounts=...` (provisioner.sites.shares)."""
        wanted = wanted_accounts(accounts)
        if not wanted:
            return {}
        result = self.executor.run(sshare_argv(wanted), self._env())
        if result.returncode != 0:
            err = _classify(f"sshare at {self.name}", result)
            raise err if isinstance(err, Unreachable | Transient) else Unreachable(str(err))
        try:
            return parse_shares(json.loads(result.stdout), wanted)
        except (json.JSONDecodeError, SharesError) as exc:
            raise Unreachable(f"sshare at {self.name}: {exc}") from exc

    def _scancel(self, job_id: str, *options: str) -> None:
        if not job_id.isdigit():
            raise Rejected(f"not a SLURM job id: {job_id!r}")
        result = self.executor.run(["scancel", *options, job_id], self._env())
        text = result.stderr + result.stdout
        if UNKNOWN_JOB.search(text):
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
