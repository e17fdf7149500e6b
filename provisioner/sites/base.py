"""The site backend interface: the only way the provisioner touches a batch system.

A backend submits pilot jobs, lists them, cancels them and reads the end records
they leave behind, at one site. It
translates the batch system's states and errors at its boundary: states into
`SiteJobState`, errors into the four `BackendError` kinds; the service
reacts only to those (the kinds live in `provisioner.errors`, where the decisions
that learn from a refusal read them too).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from provisioner.pilot.endrecord import EndRecord

#: At most this many end records are read per site and call (the caller passes the
#: rest next time).
MAX_END_RECORDS = 50


class SiteJobState(str, enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    ENDING = "ending"


@dataclass(frozen=True)
class PilotRequest:
    """One pilot job to submit: its shape and the rendered batch script."""

    cpus: int
    memory_mb: int
    walltime_s: int
    shutdown_margin_s: int
    script: str
    gpus: int = 0  # GPUs to ask the batch system for (0: none)
    #: Seconds from now by which the pilot must have ended, or the batch system drops
    #: it unstarted (its token expires then); 0: no deadline.
    deadline_s: int = 0
    #: The SLURM account to charge (sbatch --account); None: the site's `account`, or
    #: the submitting user's default.
    account: str | None = None


@dataclass(frozen=True)
class SiteJob:
    """A pilot job as the batch system reports it."""

    job_id: str
    state: SiteJobState
    cpus: int
    memory_mb: int
    submitted_at: float
    started_at: float | None
    ends_at: float | None
    gpus: int = 0  # GPUs asked for (pending) or allocated (running)
    #: A pending job's reason when it is a job-count limit of the account
    #: (QOSMaxJobsPerUserLimit, AssocMaxJobsLimit, ...): no capacity on its way; "" else.
    limit_reason: str = ""
    account: str = ""  # the SLURM account charged (squeue %a); "" = not reported


@dataclass(frozen=True)
class AccountCharge:
    """What SLURM's accounting says of one account (slurmdbd's association, as `sshare`
    or slurmrestd's /shares report it): TRES-minutes used and the grant, both keyed by
    TRES name ("cpu", "node", "gres/gpu"). A TRES absent from `grant_minutes` has no
    GrpTRESMins limit."""

    account: str
    used_minutes: Mapping[str, float]
    grant_minutes: Mapping[str, float]


class SiteBackend(Protocol):
    """Contract of a site backend (implementation required for all seven methods).

    Implementations must be safe to call once per cycle per site and must never
    build a shell command string from configuration or ClassAd values.
    """

    name: str

    def submit(self, request: PilotRequest) -> str:
        """Submit one pilot; return the site's job id.

        Raises AtLimit if an account limit refused it, Misconfigured if the site refused
        the configuration, Rejected for another refusal, Transient/Unreachable otherwise.
        Not idempotent: each call may create a job.
        """
        ...

    def list_pilots(self) -> Sequence[SiteJob]:
        """All live pilot jobs of this provisioner at the site, in one query.

        Finished jobs are not listed. Raises Unreachable when the site cannot
        be read: callers must then treat the site as unknown, not empty.
        """
        ...

    def release(self, job_id: str) -> None:
        """Ask a running pilot to leave if it is idle (it drains itself and exits).

        The pilot re-checks inside its own startd, atomically, that nothing is
        claimed; if a job arrived meanwhile it stays. Idempotent; an unknown or
        finished job succeeds. The site's own authentication (munge, SSH)
        authorises the request: the pilot's startd needs to trust nobody new.
        """
        ...

    def retire(self, job_id: str, retire: bool = True) -> None:
        """Ask a running pilot to leave as soon as its running jobs end (it still takes
        jobs until then), or, with `retire` False, withdraw that order.

        The pilot checks, atomically in its own startd, that nothing is claimed before it
        leaves. Idempotent; an unknown or finished job succeeds.
        """
        ...

    def cancel(self, job_id: str, only_pending: bool = False) -> None:
        """Cancel a pilot job. Idempotent: cancelling an unknown or finished job succeeds.

        With only_pending the site cancels it only if it has not started yet
        (checked by the batch system itself, not from a possibly stale list).
        """
        ...

    def end_records(self, job_ids: Sequence[str]) -> Mapping[str, EndRecord]:
        """The end records (provisioner.pilot.endrecord) that the pilots `job_ids`, which
        have left the batch system, wrote on their way out, by job id; at most the
        first MAX_END_RECORDS ids are read.

        A pilot without one (it never ran, was killed, or the site keeps no log
        directory) is absent. A record that cannot be used (bad JSON, another job's) is
        left out with one warning naming its file; never raised. Raises Unreachable or
        Transient when the records cannot be read at all. Reading changes nothing; the
        backend keeps the site's record directory from growing without bound.
        """
        ...

    def account_charges(self, accounts: Sequence[str]) -> Mapping[str, AccountCharge]:
        """What SLURM's accounting says of each of `accounts` (SLURM account names), by
        account: the TRES-minutes its jobs used since SLURM last reset the use, running
        jobs included up to SLURM's last usage pass, and its GrpTRESMins grant.

        One read of the site per call (no account is asked for alone). An account
        SLURM does not know, or whose use the pilot account may not read, is absent;
        an empty `accounts` reads nothing. Raises Unreachable or Transient when the
        site's accounting cannot be read at all (no slurmdbd, the controller down, a
        report not as expected): never a partial or guessed answer. Reading changes
        nothing.
        """
        ...
