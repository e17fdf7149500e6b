"""A job whose cool-down ended is offered again: the schedd's runnable list marked stale.

The pool's policy puts a job whose start failed into a short cool-down
(`provisioner.decide.failed_starts`, condor_config/central-manager.conf). HTCondor's
schedd before 24.10.2 (HTCONDOR-3059) offers the negotiator only the jobs of its
prioritized runnable list, and rebuilds that list only when it is marked stale: a job
going idle, an attribute of category DirtyPrioRec set (JobPrio, AccountingGroup,
ConcurrencyLimits), an autocluster attribute changed, or every 20 minutes
(qmgmt.cpp: SetAttribute, BuildPrioRecArrayPeriodic). condor_reschedule does not mark
it. A job leaving its cool-down marks nothing, so in a quiet queue (no other job going
idle or changing) the job waits up to 20 minutes for its next try, and the hold after
its third failed start comes 40 minutes late. 24.10.2 and 25.0 set a timer for the
next end of a cool-down themselves.

The provisioner knows each cool-down's end (`JobCoolDownExpiration`, read with the
failed start). Once one has passed, it sets JobPrio of a job of its own on that schedd
to the value it has (0): a held job that never runs (`Requirements` false), submitted
when first needed and removed once no job of that schedd has cooled down for
`KEEP_S`. SetAttribute
marks the list stale for any JobPrio write, changed or not; then it asks the schedd
for a negotiation (condor_reschedule), whose first step rebuilds the list. No user's
job or attribute is touched, and the provisioner needs no right beyond submitting
and editing its own job (the pool's ALLOW_WRITE). Nothing is done at a schedd that
says it has the upstream fix (`fixed_upstream`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

#: The attribute that marks the provisioner's own job (value: its provisioner id).
MARK_ATTR = "ProvisionerCoolDownNudge"
#: The first HTCondor version whose schedd rebuilds its list when a cool-down ends.
FIXED_IN = (24, 10, 2)
#: Our job stays this long after the last cool-down ended (a job failing at start
#: fails again within it: one job of ours serves all its tries).
KEEP_S = 600.0
#: The schedd compares `JobCoolDownExpiration >= now` (a job is runnable the second
#: after it): the list is marked stale this long after the end.
AFTER_END_S = 1.0


def fixed_upstream(condor_version: str) -> bool:
    """Whether a schedd's `CondorVersion` ("$CondorVersion: 23.9.6 ...") says it rebuilds
    its runnable list when a cool-down ends itself; an unreadable version is not."""
    found = re.search(r"(\d+)\.(\d+)\.(\d+)", condor_version or "")
    return found is not None and tuple(int(g) for g in found.groups()) >= FIXED_IN


@dataclass
class CoolDownEnds:
    """Per schedd, the ends of the cool-downs seen in its queue and not passed on yet
    (pure: times are passed in)."""

    ends: dict[str, set[float]] = field(default_factory=dict)

    def seen(self, schedd: str, ends: Iterable[float]) -> None:
        """A read of `schedd`'s queue: the ends of the cool-downs running now, added to
        those not passed on yet. An end stays until it is passed on, even if a later
        read no longer shows it: a read between the end and its hand-over sees the job
        out of its cool-down, and the schedd still does not offer it."""
        now_ends = {float(e) for e in ends if e > 0}
        if now_ends:
            self.ends.setdefault(schedd, set()).update(now_ends)

    def due(self, now: float) -> tuple[str, ...]:
        """The schedds with a cool-down that ended at least `AFTER_END_S` before `now`."""
        return tuple(sorted(name for name, ends in self.ends.items()
                            if any(e + AFTER_END_S <= now for e in ends)))

    def passed_on(self, schedd: str, now: float) -> None:
        """The schedd's list was marked stale at `now`: the ends up to then are done."""
        left = {e for e in self.ends.get(schedd, ()) if e + AFTER_END_S > now}
        if left:
            self.ends[schedd] = left
        else:
            self.ends.pop(schedd, None)

    def cooling(self, schedd: str) -> bool:
        return bool(self.ends.get(schedd))


def submit_description(provisioner_id: str) -> dict[str, str]:
    """The provisioner's own job: held, never runnable, marked with its id."""
    return {
        "executable": "/bin/true", "transfer_executable": "false", "initialdir": "/",
        "hold": "true", "requirements": "false", "request_memory": "1",
        "batch_name": "provisioner-cool-down-nudge",
        f"+{MARK_ATTR}": f'"{provisioner_id}"'}


class Nudger:
    """Marks a schedd's runnable list stale once a cool-down in its queue has ended,
    through a job of the provisioner's own (`submit_description`)."""

    def __init__(self, htcondor: Any, provisioner_id: str) -> None:
        self.htcondor = htcondor
        self.provisioner_id = provisioner_id
        self.ends = CoolDownEnds()
        self.own: dict[str, str] = {}  # schedd name -> its job of ours ("cluster.proc")
        self.used: dict[str, float] = {}  # schedd name -> when its job was last written

    def _constraint(self) -> str:
        return f'{MARK_ATTR} == "{self.provisioner_id}"'

    def _own_job(self, name: str, schedd: Any) -> str:
        """The provisioner's job on the schedd: the one it has, or a new one."""
        if name in self.own:
            return self.own[name]
        ads = list(schedd.query(constraint=self._constraint(),
                                projection=["ClusterId", "ProcId"]))
        if ads:
            job = f"{int(ads[0]['ClusterId'])}.{int(ads[0].get('ProcId', 0))}"
        else:
            result = schedd.submit(self.htcondor.Submit(
                submit_description(self.provisioner_id)))
            job = f"{result.cluster()}.0"
            log.info("schedd %s: submitted job %s of ours, held, never runs: its JobPrio "
                     "is set when a failed start's cool-down ends, so that the schedd "
                     "offers the job again (HTCondor before 24.10.2)", name, job)
        self.own[name] = job
        return job

    def nudge(self, schedds: Mapping[str, tuple[Any, str]], now: float) -> list[str]:
        """Mark stale the runnable list of each schedd (name -> (Schedd, CondorVersion))
        whose cool-down ended, and ask it for a negotiation; remove our job from a schedd
        where nothing cools down any more. Returns the schedds marked. A failure is
        logged; the ends stay, so the next tick tries again."""
        marked = []
        for name in self.ends.due(now):
            if name not in schedds:
                continue
            schedd, version = schedds[name]
            if fixed_upstream(version):
                self.ends.passed_on(name, now)
                continue
            try:
                schedd.edit(self._own_job(name, schedd), "JobPrio", "0")
                schedd.reschedule()
            except Exception as exc:  # the bindings raise HTCondorException and friends
                self.own.pop(name, None)  # removed by someone: look again next time
                log.warning("schedd %s: could not have a job whose cool-down ended offered "
                            "again (it is, at the schedd's own rebuild): %s", name, exc)
                continue
            self.ends.passed_on(name, now)
            self.used[name] = now
            marked.append(name)
        for name in [n for n in self.own if not self.ends.cooling(n) and n in schedds
                     and now - self.used.get(n, 0.0) >= KEEP_S]:
            self._remove(name, schedds[name][0])
        return marked

    def _remove(self, name: str, schedd: Any) -> None:
        try:
            schedd.act(self.htcondor.JobAction.Remove, self._constraint())
        except Exception as exc:
            log.warning("schedd %s: could not remove our held job %s (removed with the "
                        "next one): %s", name, self.own[name], exc)
            return
        del self.own[name]
