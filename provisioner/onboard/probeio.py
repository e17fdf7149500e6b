"""How the probe pilot follows its job at each kind of site: the job's state, and
the probe's output (its node checks and the pilot's log) where the site lets the
provisioner read files. The pilot's own end record comes through the backend
(`SiteBackend.end_records`), on both kinds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from provisioner.errors import BackendError
from provisioner.onboard.nodecheck import PREFIX
from provisioner.sites.slurm_cli import SlurmCliBackend
from provisioner.sites.slurm_jobs import STATE_TABLE
from provisioner.sites.slurm_refusals import UNKNOWN_JOB
from provisioner.sites.slurm_rest import ESLURM_INVALID_JOB_ID, SlurmRestBackend

#: The probe's output is read up to this much.
MAX_OUTPUT = 200_000
#: A line of the pilot's log that says why it failed.
_TROUBLE = re.compile(r"error|failed|no space left|permission denied|cannot|not found|"
                      r"refused|denied", re.IGNORECASE)


def parse_squeue_state(stdout: str) -> tuple[str, str] | None:
    """``squeue -h -j ID -o %T|%r`` -> (state, reason); None: SLURM no longer lists it."""
    for line in stdout.splitlines():
        if "|" in line:
            state, reason = line.strip().split("|", 1)
            return state, reason
    return None


def trouble_line(text: str) -> str:
    """The last line of a pilot's output that names a failure ("" if none)."""
    for line in reversed(text.splitlines()):
        if _TROUBLE.search(line) and line.strip():
            line = line.strip()
            return line if len(line) <= 200 else line[:197] + "..."
    return ""


class ProbeIO(Protocol):
    def state(self, job_id: str) -> tuple[str, str] | None:
        """(SLURM state, reason) of the job; None once SLURM no longer lists it live."""
        ...

    def output(self, job_id: str) -> tuple[str, str]:
        """The probe's output and where it was read (or why it could not be)."""
        ...


@dataclass
class CliProbeIO:
    """squeue for the state, head for the output file, both on the login node."""

    backend: SlurmCliBackend
    site: str
    log_dir: str | None

    def state(self, job_id: str) -> tuple[str, str] | None:
        result = self.backend.executor.run(
            ["squeue", "--noheader", f"--jobs={job_id}", "--format=%T|%r"],
            self.backend._env())
        if result.returncode != 0 and "Invalid job id" in result.stderr:
            return None
        return parse_squeue_state(result.stdout)

    def output(self, job_id: str) -> tuple[str, str]:
        if not self.log_dir:
            return "", ""
        path = f"{self.log_dir}/{self.backend.job_name}-{self.site}-{job_id}.out"
        try:
            result = self.backend.executor.run(
                ["head", "-c", str(MAX_OUTPUT), "--", path], self.backend._env())
        except BackendError as exc:
            return "", f"{path} ({exc})"
        return result.stdout, path


@dataclass
class RestProbeIO:
    """The job record from slurmrestd; no file can be read (no login), but the probe's
    node checks put their lines into the job's comment (provisioner.onboard.nodecheck),
    kept here once seen (the pilot's end record replaces them when it ends)."""

    backend: SlurmRestBackend
    _lines: dict[str, str] = field(default_factory=dict)

    def _job(self, job_id: str) -> dict[str, Any] | None:
        reply = self.backend.client.call("GET", f"job/{job_id}")
        if reply.text or reply.status != 200:
            if ESLURM_INVALID_JOB_ID in reply.numbers or UNKNOWN_JOB.search(reply.text):
                return None
            raise BackendError(f"job {job_id} at {self.backend.name}: "
                               f"{reply.text or reply.status}")
        for job in reply.doc.get("jobs") or []:
            if isinstance(job, dict) and str(job.get("job_id")) == job_id:
                return job
        return None

    def state(self, job_id: str) -> tuple[str, str] | None:
        job = self._job(job_id)
        if job is None:
            return None
        raw = job.get("job_state")
        states = [str(s) for s in raw] if isinstance(raw, list) else [str(raw or "")]
        # a cancelled job still completing ([CANCELLED, COMPLETING]) is listed by squeue
        state = "COMPLETING" if "COMPLETING" in states else (states[0] if states else "")
        if state in STATE_TABLE and STATE_TABLE[state] is None:
            return None  # finished: squeue would no longer list it
        return state, str(job.get("state_reason") or "")

    def output(self, job_id: str) -> tuple[str, str]:
        where = "the job's comment (no login at a slurm-rest site: no output file)"
        try:
            job = self._job(job_id)
        except BackendError as exc:
            return self._lines.get(job_id, ""), f"{where}: {exc}"
        comment = job.get("comment") if job else None
        if isinstance(comment, dict):  # some versions: {"job": ..., "admin": ...}
            comment = comment.get("job")
        if isinstance(comment, str) and comment.startswith(PREFIX):
            self._lines[job_id] = comment
        return self._lines.get(job_id, ""), where
