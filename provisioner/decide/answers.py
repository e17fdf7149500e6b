"""SLURM's answers to one cycle's submissions, for the controller (pure).

`SubmitAnswers` is the part of `provisioner.decide.controller.Controller` that follows
each `Submit` the service sends: the pilots SLURM accepted count as pending from then
on (charged to their allocation's account), a refusal teaches the site's limits
(`provisioner.decide.limits`), a refused account stops only its allocation
(`stopped_allocations`), and `replan` places what a failed site or allocation was to
take elsewhere in the same cycle.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from provisioner.config import Config
from provisioner.decide.limits import SiteLimits
from provisioner.decide.plan import plan
from provisioner.errors import BackendError, Misconfigured
from provisioner.model import CycleMemory, Pilot, PilotState, Snapshot, Submit


class SubmitAnswers:
    """What the controller learns from the answers to its submissions (its state is
    the controller's own fields, declared here for the methods)."""

    config: Config
    limits: SiteLimits
    planned: tuple[Snapshot, CycleMemory] | None
    just_sent: list[Pilot]
    failed_sites: set[str]
    failed_allocations: set[tuple[str, str]]
    allocation_stops: dict[tuple[str, str], str]

    def sent(self, action: Submit, ids: Iterable[str], error: BackendError | None,
             now: float) -> str:
        """A `Submit` of this cycle was sent: `ids` the jobs SLURM accepted, `error` what
        stopped it (None: all accepted). Learns from a refusal (`SiteLimits.refused`) and
        returns its line for the log ("" when nothing changed)."""
        account = self._account(action)
        for job_id in ids:
            self.just_sent.append(Pilot(action.site, job_id, PilotState.PENDING, action.cpus,
                                        action.memory_mb, now, free_cpus=action.cpus,
                                        free_memory_mb=action.memory_mb, gpus=action.gpus,
                                        free_gpus=action.gpus, account=account))
        pilots = (self.planned[0].pilots if self.planned is not None else ()) + tuple(
            self.just_sent)
        held = _held(pilots).get(action.site, 0)
        if error is None:
            return self.limits.submitted(action.site, held)
        if action.allocation and refused_account(error):
            return self._stop_allocation(action, error)
        self.failed_sites.add(action.site)
        return self.limits.refused(action.site, error, held, now)

    @property
    def stopped_allocations(self) -> dict[tuple[str, str], str]:
        """(site, allocation) -> why it is stopped: SLURM refused its account (until the
        service restarts; the site's other allocations go on). `plan()` charges no new
        pilot to them (`provisioner.decide.budget.budgets` reads it)."""
        return dict(self.allocation_stops)

    def _account(self, action: Submit) -> str:
        """The SLURM account `action`'s pilots are charged to ("" at a site without
        allocations: its default)."""
        if not action.allocation:
            return ""
        try:
            return self.config.site(action.site).allocation(action.allocation).account
        except KeyError:
            return ""

    def _stop_allocation(self, action: Submit, error: BackendError) -> str:
        """SLURM refused the account of `action`'s allocation: that allocation stops,
        named by its field; returns the line for the log."""
        assert isinstance(error, Misconfigured)
        index = self.config.site_names.index(action.site)
        account = self._account(action)
        why = (f"stopped: SLURM refused its account, field sites[{index}].allocations"
               f"[account={account}].account: {error.slurm_message or error}")
        self.allocation_stops[(action.site, action.allocation)] = why
        self.failed_allocations.add((action.site, action.allocation))
        return (f"{action.site}/{action.allocation}: {why}; no further pilots are charged "
                "to it until its account is fixed and the service restarted (the site's "
                "other allocations go on)")

    def held_now(self, snapshot: Snapshot) -> dict[str, int]:
        """Pilots each site holds: those of `snapshot` and this cycle's submissions (what
        its SLURM limits count)."""
        return _held(snapshot.pilots + tuple(self.just_sent))

    def replan(self, now: float) -> list[Submit]:
        """After an sbatch failed this cycle: the submissions that place the demand the
        failed sites were to take at the other sites (what was submitted so far counts as
        pending pilots, within this cycle's caps). Only `Submit`s; nothing is remembered
        (the next cycle sees the new pilots in squeue)."""
        if self.planned is None or not (self.failed_sites or self.failed_allocations):
            return []
        snap, memory = self.planned
        pilots = snap.pilots + tuple(self.just_sent)
        room = self.limits.rooms(_held(pilots), self.config.site_names, now)
        sent = _held(self.just_sent)
        for site in self.config.sites:
            if sent.get(site.name):
                left = site.caps.max_submit_per_cycle - sent[site.name]
                room[site.name] = min(room.get(site.name, left), left)
        policy = self.config.policy
        left = max(0, policy.max_submit_per_cycle - len(self.just_sent))
        config = self.config.model_copy(update={"policy": policy.model_copy(
            update={"max_submit_per_cycle": left})})
        result = plan(replace(snap, pilots=pilots),
                      replace(memory, limit_room=room,
                              stopped_allocations=self.stopped_allocations), config, now)
        return [a for a in result.submits if a.site not in self.failed_sites
                and (a.site, a.allocation) not in self.failed_allocations]


def refused_account(error: BackendError) -> bool:
    """Whether SLURM refused a submission for its account (an allocation's alone: the
    site's other allocations have accounts of their own)."""
    return isinstance(error, Misconfigured) and error.field.startswith("account")


def _held(pilots: Iterable[Pilot]) -> dict[str, int]:
    """Pilots each site holds in SLURM (what its limits count)."""
    out: dict[str, int] = {}
    for p in pilots:
        out[p.site] = out.get(p.site, 0) + 1
    return out
