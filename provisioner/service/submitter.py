"""Sending a cycle's `Submit`s, shared by the service and the simulator.

SLURM may refuse a submission mid-cycle (a submit limit, a refused configuration, a
busy controller). Then the failed site gets no further sbatch this cycle (at most one
refused sbatch per site and cycle), the controller learns from the refusal
(`Controller.sent`), and what that site was to take is placed at the other sites in the
same cycle (`Controller.replan`), at most once per site.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from provisioner.decide.controller import Controller
from provisioner.errors import AtLimit, BackendError, Misconfigured, Transient, Unreachable
from provisioner.model import Submit

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sent:
    """One `Submit` and what became of it: the job ids SLURM accepted, the error that
    stopped it (None: all accepted), or `skipped` (its site failed earlier this cycle)."""

    action: Submit
    ids: tuple[str, ...] = ()
    error: BackendError | None = None
    skipped: bool = False
    replanned: bool = False  # placed anew after another site's refusal


#: `send(action)` submits `action.count` pilots one by one; returns the ids accepted and
#: the error that stopped it (None if none).
Send = Callable[[Submit], tuple[list[str], BackendError | None]]


def refusal_kind(error: BackendError) -> str:
    """A failed sbatch in one word: limit, config, busy or other."""
    if isinstance(error, AtLimit):
        return "limit"
    if isinstance(error, Misconfigured):
        return "config"
    return "busy" if isinstance(error, Transient | Unreachable) else "other"


def submit_all(controller: Controller, submits: Sequence[Submit], send: Send,
               now: float) -> list[Sent]:
    """Send `submits`; after a failure, send what `controller.replan` places instead,
    until a round fails nowhere new. Lines of what the controller learnt are logged."""
    out: list[Sent] = []
    batch, replanned = list(submits), False
    for _round in range(len(controller.config.sites) + 1):
        failed_before = set(controller.failed_sites)
        for action in batch:
            if action.site in controller.failed_sites:
                out.append(Sent(action, skipped=True, replanned=replanned))
                continue
            ids, error = send(action)
            line = controller.sent(action, ids, error, now)
            if line:
                log.warning("%s", line)
            out.append(Sent(action, tuple(ids), error, replanned=replanned))
        if controller.failed_sites == failed_before:
            break
        batch, replanned = controller.replan(now), True
        if not batch:
            break
    return out
