"""SLURM through slurmrestd: a site that gives the provisioner an HTTP API and a JWT
instead of an SSH login.

The same pilot as over SSH: the rendered batch script with the same job name,
comment, shape, walltime, warning signal, no requeue, working directory and output
file; a job description instead of sbatch's options. Jobs are read from `/jobs` (the
same records as `squeue --json`, read by provisioner.sites.slurm_jobs), refusals
classified by provisioner.sites.slurm_refusals from SLURM's error numbers and words.

End records: the pilot cannot leave a file the service reads (there is no login),
so a pilot of a REST site also puts its end record into its own job's comment
(`scontrol update`, as the job's owner, from the node; provisioner.pilot.endrecord).
SLURM keeps a finished job, comment and all, for MinJobAge (300 s by default): the
record is taken from every `/jobs` reply that shows the job finished, and asked for
by job id (`/job/{id}`) when none was seen; a job SLURM no longer knows has none.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from provisioner.errors import Rejected, Transient, Unreachable
from provisioner.pilot import endrecord
from provisioner.pilot.endrecord import BadEndRecord, EndRecord
from provisioner.sites.base import MAX_END_RECORDS, AccountCharge, PilotRequest, SiteJob
from provisioner.sites.rest_client import RestClient, RestReply
from provisioner.sites.shares import SharesError, parse_shares, wanted_accounts
from provisioner.sites.slurm_jobs import (
    RELEASE_SIGNAL,
    RETIRE_SIGNAL,
    STATE_TABLE,
    UNRETIRE_SIGNAL,
    SlurmSiteFields,
    charged_account,
    parse_squeue,
)
from provisioner.sites.slurm_refusals import UNKNOWN_JOB, classify_failure, classify_sbatch

log = logging.getLogger(__name__)

#: SLURM's error numbers for "no such job" and "already done" (slurm_errno.h).
ESLURM_INVALID_JOB_ID = 2017
ESLURM_ALREADY_DONE = 2021
#: End records seen in job lists are kept for this many jobs at most.
MAX_KEPT_RECORDS = 2000


def _set(number: int) -> dict[str, Any]:
    return {"set": True, "infinite": False, "number": number}


@dataclass
class SlurmRestBackend(SlurmSiteFields):
    """A SLURM site reached through slurmrestd (`client`: its HTTP side)."""

    client: RestClient
    _records: dict[str, EndRecord] = field(default_factory=dict, init=False, repr=False)

    def job_description(self, request: PilotRequest) -> dict[str, Any]:
        """What sbatch_argv says on the command line, as slurmrestd's job description."""
        job: dict[str, Any] = {
            "script": request.script,
            "name": self.job_name,
            "comment": f"htcondor-pilot provisioner={self.provisioner_id}",
            "cpus_per_task": request.cpus,
            "memory_per_node": _set(request.memory_mb),
            "time_limit": _set(max(1, math.ceil(request.walltime_s / 60))),
            "kill_warning_signal": "TERM",
            "kill_warning_delay": _set(request.shutdown_margin_s),
            "kill_warning_flags": ["BATCH_JOB"],
            "requeue": False,
            "current_working_directory": "/",
            "standard_output": (f"{self.output_dir}/%x-{self.name}-%j.out"
                                if self.output_dir else "/dev/null"),
            # sbatch passes on the login shell's; the batch script exports its own.
            "environment": ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"],
        }
        account = charged_account(request, self.account)
        for key, value in (("partition", self.partition), ("account", account),
                           ("qos", self.qos)):
            if value:
                job[key] = value
        if request.gpus > 0:
            typed = f"{self.gpu_type}:" if self.gpu_type else ""
            key = "tres_per_job" if self.gpu_request == "gpus" else "tres_per_node"
            job[key] = f"gres/gpu:{typed}{request.gpus}"
        if request.deadline_s > 0:  # sbatch --deadline=now+S: its token ends then
            job["deadline"] = int(self.clock()) + request.deadline_s
        return job

    def submit(self, request: PilotRequest) -> str:
        reply = self.client.call("POST", "job/submit",
                                 json={"job": self.job_description(request)})
        if reply.text or reply.status != 200:
            # a job_submit plugin's message (the limit's name, say) comes beside the error
            said = "\n".join(w for w in (str(reply.doc.get("job_submit_user_msg") or ""),
                                           reply.text) if w)
            raise classify_sbatch(self.name, said or f"HTTP {reply.status}", action="submit")
        job_id = reply.doc.get("job_id")
        if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id <= 0:
            raise Transient(f"site {self.name}: submit answered no job_id (field 'job_id': "
                            f"{job_id!r})")
        return str(job_id)

    def _jobs(self) -> list[Mapping[str, Any]]:
        reply = self.client.call("GET", "jobs")
        if reply.status != 200:
            raise Unreachable(f"site {self.name}: GET jobs failed: "
                              f"{reply.text or reply.status}")
        jobs = reply.doc.get("jobs")
        if not isinstance(jobs, list):
            raise Unreachable(f"site {self.name}: GET jobs answered no 'jobs' list "
                              f"(field 'jobs': {type(jobs).__name__})")
        return [j for j in jobs if isinstance(j, dict) and j.get("name") == self.job_name
                and j.get("user_name", self.client.user) == self.client.user]

    def list_pilots(self) -> list[SiteJob]:
        try:
            jobs = self._jobs()
        except Rejected as exc:
            raise Unreachable(str(exc)) from None
        self._keep_records(jobs)
        return parse_squeue({"jobs": jobs}, self.job_name)

    def _keep_records(self, jobs: Sequence[Mapping[str, Any]]) -> None:
        """End records in the comments of finished pilots, kept until asked for."""
        for job in jobs:
            raw = job.get("job_state")
            state = str(raw[0] if isinstance(raw, list) and raw else raw or "")
            if state in STATE_TABLE and STATE_TABLE[state] is None:
                record = self._record(job)
                if record is not None:
                    self._records[record.job_id] = record
        while len(self._records) > MAX_KEPT_RECORDS:
            self._records.pop(next(iter(self._records)))

    def _record(self, job: Mapping[str, Any]) -> EndRecord | None:
        job_id = str(job.get("job_id"))
        comment = job.get("comment")
        text = comment.get("job") if isinstance(comment, dict) else comment
        if not isinstance(text, str) or not text.startswith("{"):
            return None
        try:
            return endrecord.parse(text, self.name, job_id, self.provisioner_id)
        except BadEndRecord as exc:
            if job_id not in self._warned:
                self._warned.add(job_id)
                log.warning("end record of job %s at %s ignored: %s", job_id, self.name, exc)
            return None

    def account_charges(self, accounts: Sequence[str]) -> dict[str, AccountCharge]:
        """GET /shares (provisioner.sites.shares). slurmrestd 24.11 answers every
        association whatever `accounts` asks for: the wanted ones are picked here."""
        wanted = wanted_accounts(accounts)
        if not wanted:
            return {}
        try:
            reply = self.client.call("GET", "shares", params={"accounts": ",".join(wanted)})
        except Rejected as exc:
            raise Unreachable(str(exc)) from None
        if reply.text or reply.status != 200:
            raise Unreachable(f"site {self.name}: GET shares failed: "
                              f"{reply.text or reply.status}")
        try:
            return parse_shares(reply.doc, wanted)
        except SharesError as exc:
            raise Unreachable(f"site {self.name}: GET shares: {exc}") from None

    def _signal(self, job_id: str, signal: str | None, flags: str | None) -> None:
        if not job_id.isdigit():
            raise Rejected(f"not a SLURM job id: {job_id!r}")
        params = {k: v for k, v in (("signal", signal), ("flags", flags)) if v}
        reply = self.client.call("DELETE", f"job/{job_id}", params=params)
        self._done_or_raise(job_id, reply, "signal" if signal else "cancel")

    def _done_or_raise(self, job_id: str, reply: RestReply, what: str) -> None:
        if not reply.text and reply.status == 200:
            return
        if ({ESLURM_INVALID_JOB_ID, ESLURM_ALREADY_DONE} & set(reply.numbers)
                or UNKNOWN_JOB.search(reply.text)):
            log.info("%s %s at %s: already gone", what, job_id, self.name)
            return
        raise classify_failure(f"{what} {job_id} at {self.name} failed "
                               f"(HTTP {reply.status}): {reply.text}", reply.text)

    def release(self, job_id: str) -> None:
        self._signal(job_id, RELEASE_SIGNAL, "BATCH_JOB")

    def retire(self, job_id: str, retire: bool = True) -> None:
        self._signal(job_id, RETIRE_SIGNAL if retire else UNRETIRE_SIGNAL, "BATCH_JOB")

    def cancel(self, job_id: str, only_pending: bool = False) -> None:
        if not only_pending:
            self._signal(job_id, None, None)
            return
        if not job_id.isdigit():
            raise Rejected(f"not a SLURM job id: {job_id!r}")
        # The controller itself cancels it only while it pends (scancel --state).
        reply = self.client.call("DELETE", "jobs",
                                 json={"jobs": [job_id], "job_state": ["PENDING"]})
        self._done_or_raise(job_id, reply, "cancel")

    def end_records(self, job_ids: Sequence[str]) -> dict[str, EndRecord]:
        records: dict[str, EndRecord] = {}
        for job_id in list(job_ids)[:MAX_END_RECORDS]:
            if job_id in self._records:
                records[job_id] = self._records.pop(job_id)
                continue
            if not job_id.isdigit():
                continue
            record = self._ask_record(job_id)
            if record is not None:
                records[job_id] = record
        return records

    def _ask_record(self, job_id: str) -> EndRecord | None:
        try:
            reply = self.client.call("GET", f"job/{job_id}")
        except Rejected:
            return None
        if reply.text or reply.status != 200:
            if ESLURM_INVALID_JOB_ID in reply.numbers or UNKNOWN_JOB.search(reply.text):
                return None
            raise Transient(f"end record of job {job_id} at {self.name}: "
                            f"{reply.text or reply.status}")
        jobs = reply.doc.get("jobs")
        for job in jobs if isinstance(jobs, list) else []:
            if isinstance(job, dict) and str(job.get("job_id")) == job_id:
                return self._record(job)
        return None

    def close(self) -> None:
        self.client.close()
