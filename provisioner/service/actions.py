"""What a cycle does to pilots other than submitting them: release (checked against a
fresh read of the pool right before), cancel, retire, and the cancel of released pilots
whose startd is gone; each handler returns the action's outcome as text."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from provisioner.decide.controller import Controller, PoolView
from provisioner.errors import BackendError
from provisioner.model import (
    Cancel,
    Flag,
    PilotState,
    Release,
    Retire,
    Unflag,
    Unretire,
)
from provisioner.pool.classads import PilotAd
from provisioner.pool.pilot_view import ad_busy, runs_jobs
from provisioner.service.cycle import Observation
from provisioner.service.metrics import Metrics
from provisioner.service.pilot_tokens import PilotTokens
from provisioner.sites.base import SiteBackend


class Provisioner(Protocol):
    """What the handlers use of the service (`provisioner.service.loop.Provisioner`)."""

    backends: dict[str, SiteBackend]
    controller: Controller
    metrics: Metrics
    tokens: PilotTokens
    clock: Callable[[], float]

#: The pool as read once right before this cycle's releases (the pilot ads, the pilots
#: that run jobs), or None when it could not be read.
Fresh = tuple[Mapping[str, PilotAd], frozenset[str]] | None


def _release(prov: Provisioner, action: Release, fresh: Fresh) -> str:
    key = action.pilot.key
    if fresh is None:
        return "skipped: pool unreadable right before release"
    ads, running_on = fresh
    ad = ads.get(key)
    if ad is None:
        return "skipped: ad gone right before release"
    if ad_busy(ad, running_on) or ad.draining:
        return "skipped: claimed since the snapshot"
    prov.backends[action.pilot.site].release(action.pilot.job_id)
    prov.controller.released(key, prov.clock())
    prov.metrics.count("pilots_released", action.pilot.site)
    return "release sent (the pilot drains itself if still idle)"

def _cancel(prov: Provisioner, action: Cancel, _fresh: Fresh) -> str:
    pending = action.pilot.state is PilotState.PENDING
    prov.backends[action.pilot.site].cancel(action.pilot.job_id, only_pending=pending)
    if not pending:  # one that started meanwhile runs on: its token with it
        prov.tokens.cancelled(action.pilot.site, action.pilot.job_id)
    prov.metrics.count("pilots_cancelled", action.pilot.site)
    return "cancelled if still pending" if pending else "cancelled"

def _retire(prov: Provisioner, action: Retire | Unretire, _fresh: Fresh) -> str:
    retire = isinstance(action, Retire)
    prov.backends[action.pilot.site].retire(action.pilot.job_id, retire)
    if retire:
        prov.metrics.count("pilots_retired", action.pilot.site)
        return "sent (the pilot leaves when its running jobs end)"
    return "sent (the pilot stays when its running jobs end)"

def _noted(_prov: Provisioner, _action: Flag | Unflag, _fresh: Fresh) -> str:
    """A flag is the controller's memory: nothing to send."""
    return "ok"

#: How `Provisioner.act` applies each kind of action (submissions go first, all
#: together, through its `_submit_all`): the handler's outcome is the action's outcome.
HANDLERS: dict[type, Callable[[Provisioner, Any, Fresh], str]] = {
    Release: _release, Cancel: _cancel, Retire: _retire, Unretire: _retire,
    Flag: _noted, Unflag: _noted,
}

def cancel_lingering(prov: Provisioner, obs: Observation) -> list[tuple[str, str]]:
    """Cancel the SLURM jobs of released pilots the controller says linger."""
    out: list[tuple[str, str]] = []
    if not obs.snapshot.scale_down_ok:  # a schedd not read may run jobs there
        return out
    followed = prov.controller.releases
    view = PoolView(
        jobs={site: frozenset(j.job_id for j in jobs) for site, jobs in obs.jobs.items()},
        ads={key: ad.draining for key, ad in obs.ads.items() if key in followed},
        running=frozenset(key for key in followed
                          if runs_jobs(*key.split("/", 1), obs.running_on)))
    for key in prov.controller.follow_releases(prov.clock(), view):
        site, job_id = key.split("/", 1)
        try:
            prov.backends[site].cancel(job_id)
            prov.tokens.cancelled(site, job_id)
            out.append((f"cancel {key}", "startd gone after release; job cancelled"))
            prov.controller.cancelled(key)
            prov.metrics.count("pilots_cancelled", site)
        except BackendError as exc:
            out.append((f"cancel {key}", f"failed: {exc}"))
    return out
