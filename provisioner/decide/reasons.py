"""The one vocabulary of why a job waits, runs or is held (pure).

Each reason is a `Reason` code with a few named parameters; `sentence()` turns it into
the plain words every report uses: `provisioner why` (the job's own answer), the
service's status ad in the collector (`provisioner.decide.explain` writes codes and
parameters, never text), `provisioner status`, the stuck/unmatchable report and the
metrics (`provisioner_waiting_jobs{reason}`). A code's value is stable: scripts read it
from `provisioner why --json` and the metrics' label.

Where sites have allocations, a job may wait for its accounting group's allocations
(`provisioner.decide.budget_why`): spent, closed, paced, at their max_pilots, or none
serving its group; those codes carry the group, and are never a shape's resources.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from provisioner.config import SiteBase
from provisioner.model import JobShape, round_memory


class Reason(StrEnum):
    """What the provisioner is doing for a job, or why it cannot."""

    RUNNING = "running"  # on a pilot: site, pilot, since
    PILOT_READY = "pilot_ready"  # a pilot in the pool has room for it: site, pilot
    PILOT_STARTING = "pilot_starting"  # its pilot runs in SLURM, not yet joined
    PILOT_PENDING = "pilot_pending"  # its pilot waits in the site's SLURM queue
    SITE_LIMIT = "site_limit"  # the site's SLURM limits (submission/job limit, stopped)
    SITE_CAP = "site_cap"  # the site's configured caps (max_pilots, max_pending)
    SITE_PAUSED = "site_paused"  # the site's circuit breaker is open
    SITE_UNKNOWN = "site_unknown"  # the site could not be read
    NEXT_CYCLE = "next_cycle"  # other jobs first this cycle (the per-cycle budget)
    NO_SITE = "no_site_fits"  # no site's largest pilot has its resources
    REQUIREMENTS = "requirements"  # its Requirements or DesiredSites match no site
    STUCK = "stuck"  # idle beside a fitting pilot that never matched it
    FAILED_STARTS = "failed_starts"  # its last start(s) failed; held after the third
    HELD_FAILED_STARTS = "held_failed_starts"  # held by the pool after failed starts
    HELD = "held"  # held for another reason (its hold reason)
    POOL_UNKNOWN = "pool_unknown"  # the provisioner could not read the pool
    NOT_SEEN = "not_seen"  # its shape is not in the provisioner's last report
    NO_REPORT = "no_report"  # no provisioner reports to this pool
    WAITING = "waiting"  # demand known, no pilot on its way yet (the next cycle decides)
    DONE = "done"  # completed or removed, still in the queue
    GROUP_UNSERVED = "group_unserved"  # no allocation serves its group where it fits
    GROUP_SPENT = "group_spent"  # its group's allocations have nothing left for a pilot
    GROUP_CLOSED = "group_closed"  # its group's allocations take no pilot (ended, ...)
    GROUP_PACED = "group_paced"  # even pace holds its group's allocations back: until
    GROUP_MAX_PILOTS = "group_max_pilots"  # its group's allocation holds max_pilots


#: The text a stuck shape's report starts with (`provisioner.decide.stuck`).
STUCK_TEXT = "stuck: matches no pilot in practice"


@dataclass(frozen=True)
class Why:
    """One reason and its parameters (plain values: str, int, float)."""

    reason: Reason
    params: Mapping[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.params.get(key, default)


def duration(seconds: float) -> str:
    """A duration as people say it: "40 s", "3 min", "2.5 h"."""
    s = max(0.0, float(seconds))
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def utc_clock(epoch: float) -> str:
    """A time of day in UTC (HH:MM); `sentence` takes another (the host's local time)."""
    day_s = int(epoch) % 86400
    return f"{day_s // 3600:02d}:{day_s % 3600 // 60:02d} UTC"


#: Formats a time of day (epoch seconds) for a sentence.
Clock = Callable[[float], str]


def memory(mb: int) -> str:
    """Memory in the unit a user asks in: MB below a GB, GB (or TB) above."""
    if mb >= 1024 * 1024 and mb % (1024 * 1024) == 0:
        return f"{mb // (1024 * 1024)} TB"
    if mb >= 1024:
        gb = mb / 1024
        return f"{gb:.0f} GB" if gb == int(gb) or gb >= 100 else f"{gb:.1f} GB"
    return f"{mb} MB"


def shape_words(cpus: int, memory_mb: int, gpus: int = 0, group: str = "") -> str:
    """A job's shape in a few words: "4 cores, 8 GB, 1 GPU, group cms"."""
    text = f"{cpus} core{'s' if cpus != 1 else ''}, {memory(memory_mb)}"
    if gpus:
        text += f", {gpus} GPU{'s' if gpus != 1 else ''}"
    if group:
        text += f", group {group}"
    return text


def largest_offer(shape: JobShape, sites: Sequence[SiteBase]) -> dict[str, Any]:
    """For a shape no site's largest pilot can run: the first resource it asks too much
    of and the site that offers the most of it, as `Why` parameters (resource, asked,
    largest, site); {} if every resource fits some site (then it is the runtime, the
    Requirements or DesiredSites)."""
    if not sites:
        return {}
    pool = [s for s in sites if not shape.desired_sites or s.name in shape.desired_sites]
    pool = pool or list(sites)
    checks = (("cores", max(1, shape.cpus), "cpus"),
              ("memory", round_memory(shape.memory_mb), "memory_mb"),
              ("gpus", max(0, shape.gpus), "gpus"))
    for resource, asked, attr in checks:
        offers = [(int(getattr(s.pilot, attr)), s.name) for s in pool]
        # the largest offer, the first site among equals
        largest = max(o for o, _ in offers)
        if asked > largest:
            shown = shape.memory_mb if resource == "memory" else asked
            return {"resource": resource, "asked": shown, "largest": largest,
                    "site": next(n for o, n in offers if o == largest)}
    if shape.runtime_s is not None:
        best = max(pool, key=lambda s: s.pilot.usable_s)
        if shape.runtime_s > best.pilot.usable_s:
            return {"resource": "runtime", "asked": shape.runtime_s,
                    "largest": best.pilot.usable_s, "site": best.name}
    return {}


def unmatchable_reason(text: str) -> Reason:
    """The code of an unmatchable shape's reason text (`provisioner.decide.matching`)."""
    if text.startswith(STUCK_TEXT):
        return Reason.STUCK
    if text.startswith(("RequestCpus", "RequestMemory", "RequestGPUs", "runtime")):
        return Reason.NO_SITE
    return Reason.REQUIREMENTS


def _amount(resource: str, value: int) -> str:
    if resource == "memory":
        return memory(int(value))
    if resource == "runtime":
        return duration(value) + " of runtime"
    if resource == "gpus":
        return f"{value} GPU{'s' if value != 1 else ''}"
    return f"{value} core{'s' if value != 1 else ''}"


def _no_site(w: Why) -> str:
    resource = w.get("resource", "")
    if not resource:
        return f"no site can run it: {w.get('detail', 'no single site fits')}"
    asked, largest = int(w.get("asked", 0)), int(w.get("largest", 0))
    return (f"no site offers {_amount(resource, asked)} per job; the largest is "
            f"{w.get('site', '?')}'s {_amount(resource, largest)}. No pilot is started for "
            f"it: ask for less, or ask the site's admins")


def _cores(w: Why) -> str:
    n = w.get("cores", "?")
    return f"{n} core{'' if n == 1 else 's'}"


def _pending(w: Why, now: float) -> str:
    since = float(w.get("since", now))
    text = (f"a pilot for {_cores(w)} is pending at {w.get('site', '?')} "
            f"({duration(now - since)} so far")
    lead = w.get("lead_s")
    if lead:
        text += f"; this site's pilots start in about {duration(float(lead))}"
    return text + ")"


def _limit(w: Why) -> str:
    site, limit = w.get("site", "?"), str(w.get("limit", ""))
    if limit.startswith("stopped"):
        return f"{site} is {limit}; the provisioner's admins have been told"
    if limit.startswith("sbatch backed off"):
        return f"{site}'s batch system is busy ({limit}); the provisioner tries again"
    if limit:
        return f"{site} is {limit}; waiting for a pilot there to end"
    return f"{site} is at its limits; waiting for a pilot there to end"


def _failed(w: Why) -> str:
    n = int(w.get("failed_starts", 1))
    text = f"its last start failed ({n} failed start{'s' if n != 1 else ''}): " \
           f"{w.get('cause', 'unknown error')}"
    return text + "; the pool holds it after the third"


def _paused(w: Why, now: float, clock: Clock) -> str:
    site, n, until = w.get("site", "?"), w.get("failures"), w.get("until")
    if not n:  # a report without the breaker's numbers
        return (f"{site} is paused: its last pilots never joined the pool "
                f"({w.get('breaker', 'circuit open')})")
    text = f"{site} is paused: its last {n} pilots ended without joining the pool; "
    if until is None:
        return text + "one pilot tests it now, and more follow once it joins"
    if float(until) <= now:
        return text + "one pilot tests it at the provisioner's next cycle"
    return (text + f"one pilot tests it again at {clock(float(until))} (in about "
            f"{duration(float(until) - now)})")


def _group_texts(w: Why, now: float, clock: Clock) -> dict[Reason, Callable[[], str]]:
    """The words of the reasons of a group's allocations (`sentence`'s table)."""
    group = w.get("group", "?")
    return {
        Reason.GROUP_UNSERVED: lambda: _unserved(w),
        Reason.GROUP_SPENT: lambda: (f"the allocations of group {group} are spent "
                                     f"({w.get('budgets', '')}); its jobs wait for the "
                                     "next period or a larger grant"),
        Reason.GROUP_CLOSED: lambda: (f"the allocations of group {group} take no new "
                                      f"pilot ({w.get('budgets', '')})"),
        Reason.GROUP_PACED: lambda: _paced(w, now, clock),
        Reason.GROUP_MAX_PILOTS: lambda: (f"group {group}'s allocation "
                                          f"{w.get('allocation', '?')} holds as many pilots "
                                          f"as it may (max_pilots {w.get('max_pilots', '?')})"
                                          "; waiting for one of them to end"),
    }


def _unserved(w: Why) -> str:
    group, groups = str(w.get("group", "")), w.get("groups", "")
    known = f"configured groups: {groups}" if groups else "no group is configured"
    if not group:
        return (f"the job names no accounting group, and the pilots of every site that "
                f"fits it serve only their allocations' groups ({known}); submit it with "
                "accounting_group set to one of them")
    sites = w.get("sites", "")
    if sites:
        return (f"accounting group {group} has allocations only at {sites}, which cannot "
                f"run this job ({known}); no pilot is started for it")
    return f"accounting group {group} is served by no allocation ({known}); no pilot is " \
           "started for it"


def _paced(w: Why, now: float, clock: Clock) -> str:
    unit, until = w.get("unit", ""), float(w.get("until", now))
    when = (f"at {clock(until)} (in about {duration(until - now)})" if until > now + 60
            else "at the provisioner's next cycle")
    return (f"group {w.get('group', '?')} is paced: {w.get('allocation', '?')} allows "
            f"{_units(w.get('allows', 0))} {unit} more now, and its next pilot needs "
            f"{_units(w.get('needs', 0))} {unit}; the even pace lets it in {when}")


def _units(x: Any) -> str:
    v = float(x)
    return f"{v:.0f}" if v >= 100 or v == int(v) else f"{v:.3g}"


def _done(state: str) -> str:
    if state == "completed":
        return ("completed; nothing more is provisioned for it (it stays in the queue while "
                "its leave_in_queue says so: condor_rm takes it out)")
    return f"{state}; it leaves the queue shortly"


def sentence(w: Why, now: float, clock: Clock = utc_clock) -> str:
    """`w` in one or two plain sentences, as `provisioner why` prints it; times of day
    by `clock`."""
    r, site = w.reason, w.get("site", "?")
    texts: dict[Reason, Callable[[], str]] = {
        Reason.RUNNING: lambda: (f"running on pilot {_pilot(w)}"
                                 + (f" since {clock(float(w.get('since')))}"
                                    if w.get("since") else "")),
        Reason.PILOT_READY: lambda: (f"pilot {site}/{w.get('pilot', '?')} is in the pool "
                                     "with room for it; the negotiator starts it at its "
                                     "next cycle"),
        Reason.PILOT_STARTING: lambda: (f"a pilot for {_cores(w)} is "
                                        f"starting at {site} (running "
                                        f"{duration(now - float(w.get('since', now)))}, "
                                        "joining the pool)"),
        Reason.PILOT_PENDING: lambda: _pending(w, now),
        Reason.SITE_LIMIT: lambda: _limit(w),
        Reason.SITE_CAP: lambda: (f"{site} holds as many pilots as it may "
                                  f"({w.get('cap', 'its caps')}); waiting for a pilot "
                                  "there to end"),
        Reason.SITE_PAUSED: lambda: _paused(w, now, clock),
        Reason.SITE_UNKNOWN: lambda: (f"{site} could not be read at the provisioner's last "
                                      "cycle; no pilot is sent there until it can"),
        Reason.NEXT_CYCLE: lambda: ("the provisioner sends a limited number of pilots per "
                                    "cycle and other jobs came first; more go at its next "
                                    "cycle"),
        Reason.NO_SITE: lambda: _no_site(w),
        Reason.REQUIREMENTS: lambda: (f"no site's pilot matches its Requirements or "
                                      f"DesiredSites ({w.get('detail', '')}); no pilot is "
                                      "started for it"),
        Reason.STUCK: lambda: (f"jobs of this shape stayed idle beside a pilot that fits "
                               f"them ({w.get('detail', STUCK_TEXT)}); no pilot is started "
                               "for it for now: check its Requirements"),
        Reason.FAILED_STARTS: lambda: _failed(w),
        Reason.HELD_FAILED_STARTS: lambda: (f"held after {w.get('failed_starts', '?')} "
                                            f"failed starts: {w.get('cause', '')}"),
        Reason.HELD: lambda: f"held: {w.get('cause', '')}",
        Reason.POOL_UNKNOWN: lambda: ("the provisioner could not read the pool at its last "
                                      "cycle; it provisions once it can"),
        Reason.NOT_SEEN: lambda: _not_seen(w, clock),
        Reason.NO_REPORT: lambda: ("no provisioner reports to this pool (none is running, "
                                   "or it cannot advertise its status)"),
        Reason.WAITING: lambda: ("no pilot is on its way for it yet; the provisioner "
                                 "decides at its next cycle"),
        Reason.DONE: lambda: _done(str(w.get("state", "done"))),
        **_group_texts(w, now, clock),
    }
    text = texts[r]()
    also = w.get("also")
    return f"{text} (its other sites: {also})" if also else text


def _pilot(w: Why) -> str:
    """A pilot as site/SLURM job id, or its startd's name where the site is not known."""
    site, pilot = w.get("site", ""), w.get("pilot", "?")
    return f"{site}/{pilot}" if site and site != "?" else str(pilot)


def _not_seen(w: Why, clock: Clock) -> str:
    cycle = w.get("cycle_at")
    if w.get("newer"):
        return ("submitted after the provisioner's last cycle"
                + (f" ({clock(float(cycle))})" if cycle else "")
                + "; it is seen at the next one")
    return ("the provisioner has never seen this job's shape"
            + (f" (its last cycle: {clock(float(cycle))})" if cycle else "")
            + "; it is not idle demand to it")


def stale(age_s: float) -> str:
    """The warning put before an answer from a report older than two cycles."""
    return f"the provisioner has not reported for {duration(age_s)}; what it last said: "
