"""The backends' error vocabulary: what a site call's failure means to its caller.

A site backend (`provisioner.sites`) translates every failure of its batch system into
one of four kinds: transient, unreachable, rejected (with two refinements, at a limit
and misconfigured) and gone. The service reacts only to these, and the decisions learn
from a refusal's kind (`provisioner.decide.limits`), so the vocabulary sits beside the
model, below both.
"""

from __future__ import annotations


class BackendError(Exception):
    """A backend call failed; subclasses say how the caller should react."""


class Transient(BackendError):
    """Try again next cycle (busy controller, timeout); nothing changed."""


class Unreachable(BackendError):
    """The site cannot be read or reached; its state is unknown, never empty."""


class Rejected(BackendError):
    """The site refused the request (bad partition, limit); retrying will not help."""


class AtLimit(Rejected):
    """The site refused because the account holds as many jobs as a limit allows (a
    QOS or association submit limit): no sbatch there until one of its pilots leaves.
    `reason` is SLURM's name of the limit (QOSMaxSubmitJobPerUserLimit, ...)."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class Misconfigured(Rejected):
    """The site refused the pilot's configuration (account, partition, QOS, time limit):
    every further sbatch would be refused too. `field` names the configuration field
    (sites[].account, ...), `slurm_message` is SLURM's own words."""

    def __init__(self, message: str, field: str = "", slurm_message: str = "") -> None:
        super().__init__(message)
        self.field = field
        self.slurm_message = slurm_message


class Gone(BackendError):
    """The job no longer exists at the site."""
