"""Scale-down (pure): the last stage of `plan()`, and the flag state it carries over.

Each rule is one function below, with the rule and its reason in its docstring.
`pilot_actions` applies them site by site (sites in name order): first the rules of
one pilot, chosen by the pilot's state (`_PILOT_RULES`, in the pilots' order), then
the rules that weigh a site's pilots against each other (`_SITE_RULES`: release,
cancel, retire, in that order). A rule appends its actions to the cycle's list, so
that list reads in the order the rules ran.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from provisioner.config import Config, SiteBase
from provisioner.model import (
    Action,
    Cancel,
    CycleMemory,
    Flag,
    Pilot,
    PilotState,
    Plan,
    Release,
    Retire,
    Snapshot,
    Unflag,
    Unretire,
)

# a tuple, not a set: membership by identity (an enum member hashes in Python)
_WARM = (PilotState.IDLE, PilotState.STARTING, PilotState.PENDING)
#: a module constant: reading an enum member off its class costs a descriptor call (3.11)
_BUSY = PilotState.BUSY


@dataclass
class _Cycle:
    """What every rule reads (this cycle's inputs) and what the rules write: the
    actions, and the pending pilots no demand needed."""

    snapshot: Snapshot
    memory: CycleMemory
    config: Config
    now: float
    #: pilots that received demand (or reserve) or must be kept for it
    used: set[str]
    #: this cycle submits new pilots
    submitting: bool
    #: busy pilots nothing needs may be retired this cycle
    retire_ok: bool
    out: list[Action] = field(default_factory=list)
    unneeded: list[str] = field(default_factory=list)

    @property
    def n_release(self) -> int:
        return self.config.policy.idle_release_cycles


@dataclass
class _Site:
    """One site's pilots set aside by the pilot rules for the site rules, and its warm
    pilots: unclaimed, up or coming up, and nothing needs them (keep_warm of them stay)."""

    name: str
    config: SiteBase
    warm: int = 0
    releases: list[Pilot] = field(default_factory=list)
    cancels: list[Pilot] = field(default_factory=list)
    spare_busy: list[Pilot] = field(default_factory=list)


def _idle_observations(memory: CycleMemory, p: Pilot, now: float) -> int:
    """How many consecutive cycles `p` has been seen idle, this one included. Earlier
    observations count only if the pilot was flagged in an earlier cycle (flagged_at < now);
    `memory.idle_cycles` (from `carry_over`) tells how many, else one."""
    flagged_at = memory.flagged.get(p.key)
    if flagged_at is None or flagged_at >= now:
        return 1
    return max(1, memory.idle_cycles.get(p.key, 1)) + 1


def drained_empty(p: Pilot) -> bool:
    """A DRAINING pilot with nothing claimed and no job running (the observer reports a
    draining pilot that runs anything with fewer free cores than it has)."""
    return (p.state is PilotState.DRAINING and p.free_cpus >= p.cpus
            and p.free_memory_mb >= p.memory_mb)


def _age(p: Pilot, now: float) -> float:
    return now - (p.started_at if p.started_at is not None else p.submitted_at)


# --- the rules of one pilot, by its state ------------------------------------------------

def unflag_busy(c: _Cycle, s: _Site, p: Pilot) -> None:
    """A flagged pilot that runs a job again is unflagged: its idle count starts over."""
    if p.key in c.memory.flagged:
        c.out.append(Unflag(p, "busy again"))


def unretire_busy(c: _Cycle, s: _Site, p: Pilot) -> None:
    """A retiring busy pilot is unretired when demand wants its room, or when retiring is
    off this cycle (demand waits for pilots not yet in the pool): it will be needed."""
    if p.key in c.memory.retiring and not (c.retire_ok and p.key not in c.used):
        c.out.append(Unretire(p, "demand for its room again" if p.key in c.used
                              else "demand waits for pilots not yet in the pool"))


def set_aside_spare_busy(c: _Cycle, s: _Site, p: Pilot) -> None:
    """A busy pilot whose free room nothing needs, in a cycle that may retire, is a
    candidate for `retire_spare_busy`."""
    if c.retire_ok and p.key not in c.used:
        s.spare_busy.append(p)


def keep_used_idle(c: _Cycle, s: _Site, p: Pilot) -> None:
    """An idle pilot that idle demand will use is kept: its flag and its retirement are
    withdrawn."""
    if p.key in c.used:
        if p.key in c.memory.flagged:
            c.out.append(Unflag(p, "idle demand will use it"))
        if p.key in c.memory.retiring:
            c.out.append(Unretire(p, "idle demand will use it"))


def flag_idle(c: _Cycle, s: _Site, p: Pilot) -> None:
    """An idle pilot nothing needs is flagged; once seen idle for `idle_release_cycles`
    consecutive cycles it is a candidate for `release_idle` (one idle moment between
    two jobs does not end a pilot)."""
    if p.key in c.used:
        return
    if _idle_observations(c.memory, p, c.now) >= c.n_release:
        s.releases.append(p)
    elif p.key not in c.memory.flagged:
        c.out.append(Flag(p, "idle, no demand for it"))


def set_aside_unneeded_pending(c: _Cycle, s: _Site, p: Pilot) -> None:
    """A pending pilot nothing needs is reported unneeded; after `pending_cancel_cycles`
    such cycles it is a candidate for `cancel_pending`, unless this cycle submits (it
    would be replaced by an equivalent one) or it is a half-open site's probe (it would
    only be replaced by another probe as soon as demand comes back)."""
    if p.key in c.used:
        return
    c.unneeded.append(p.key)
    if (not c.submitting and s.name not in c.memory.probing
            and c.memory.unneeded_cycles.get(p.key, 0) + 1
            >= c.config.policy.placement.pending_cancel_cycles):
        s.cancels.append(p)


def cancel_drained(c: _Cycle, s: _Site, p: Pilot) -> None:
    """A pilot drained by someone else (an admin's condor_drain) and running nothing for
    `idle_release_cycles` is cancelled: it would count against the caps for ever."""
    if drained_empty(p) and c.memory.drained_cycles.get(p.key, 0) + 1 >= c.n_release:
        c.out.append(Cancel(p, f"draining with nothing running for {c.n_release} cycles"))


def cancel_never_joined(c: _Cycle, s: _Site, p: Pilot) -> None:
    """A pilot running at its site whose startd has not joined the pool `start_timeout_s`
    after its start (and the schedd runs nothing there, or it would be BUSY) is
    cancelled: it only burns allocation."""
    if p.started_at is not None and c.now - p.started_at > c.config.policy.start_timeout_s:
        c.out.append(Cancel(p, f"started {c.now - p.started_at:.0f} s ago, never joined "
                               "the pool"))


# --- the rules that weigh a site's pilots against each other ----------------------------

def release_idle(c: _Cycle, s: _Site) -> None:
    """Idle pilots due for release are released, those that end soonest first, while
    the site keeps more than `keep_warm` warm pilots; a pilot younger than
    `min_pilot_lifetime_s`, or one kept warm, stays flagged (the start-up it cost is
    paid back first; keep_warm holds a site's first slot ready)."""
    s.releases.sort(key=lambda p: (p.walltime_end or math.inf, p.job_id))
    for p in s.releases:
        if _age(p, c.now) >= c.config.policy.min_pilot_lifetime_s and s.warm > s.config.keep_warm:
            c.out.append(Release(p, f"idle for {c.n_release} cycles, no demand for it"))
            s.warm -= 1
        elif p.key not in c.memory.flagged:
            c.out.append(Flag(p, "idle, no demand for it (kept: lifetime/keep_warm)"))


def cancel_pending(c: _Cycle, s: _Site) -> None:
    """Pending pilots due for cancelling are cancelled, those submitted last first (they
    would start last), while the site keeps more than `keep_warm` warm pilots."""
    cancel_after = c.config.policy.placement.pending_cancel_cycles
    for p in sorted(s.cancels, key=lambda p: (-p.submitted_at, p.job_id)):
        if s.warm > s.config.keep_warm:
            c.out.append(Cancel(p, f"pending, no demand for it for {cancel_after} cycles"))
            s.warm -= 1


def retire_spare_busy(c: _Cycle, s: _Site) -> None:
    """Busy pilots nothing needs are retired (`policy.retire_when_done`: they leave when
    their running jobs end instead of a quick check later), but the ones that end last
    are kept (or unretired) as the site's keep_warm pilots, and so are those younger
    than the minimum lifetime."""
    keep = max(0, s.config.keep_warm - s.warm)
    min_lifetime_s = c.config.policy.min_pilot_lifetime_s
    s.spare_busy.sort(key=lambda p: (-(p.walltime_end or math.inf), p.job_id))
    for i, p in enumerate(s.spare_busy):
        retiring = p.key in c.memory.retiring
        if i < keep or _age(p, c.now) < min_lifetime_s:
            if retiring:
                c.out.append(Unretire(p, "kept: lifetime/keep_warm"))
        elif not retiring:
            c.out.append(Retire(p, "busy, no demand for its room: leave when the jobs end"))


PilotRule = Callable[[_Cycle, _Site, Pilot], None]
SiteRule = Callable[[_Cycle, _Site], None]

#: The rules of one pilot, by its state, applied in this order (ENDING: none).
_PILOT_RULES: dict[PilotState, tuple[PilotRule, ...]] = {
    PilotState.BUSY: (unflag_busy, unretire_busy, set_aside_spare_busy),
    PilotState.IDLE: (keep_used_idle, flag_idle),
    PilotState.PENDING: (set_aside_unneeded_pending,),
    PilotState.DRAINING: (cancel_drained,),
    PilotState.STARTING: (cancel_never_joined,),
    PilotState.ENDING: (),
}
#: The rules of a site, applied after its pilots' rules, in this order.
_SITE_RULES: tuple[SiteRule, ...] = (release_idle, cancel_pending, retire_spare_busy)


def pilot_actions(
    snapshot: Snapshot, memory: CycleMemory, config: Config, now: float, used: set[str],
    site_ok: dict[str, bool], submitting: bool = False, spare: bool = False,
) -> tuple[list[Action], list[str]]:
    """Flag, unflag, release, cancel, retire and unretire the pilots of the sites whose
    scale-down is safe (`site_ok`); also returns the pending pilots no demand needed this
    cycle. `used`: pilots that received demand (or reserve) or must be kept for it;
    `submitting`: this cycle submits new pilots (then no pending pilot is cancelled);
    `spare`: the cycle placed every idle job on pilots already in the pool, submits none
    and keeps no reserve (then busy pilots nothing needs are retired)."""
    c = _Cycle(snapshot, memory, config, now, used, submitting,
               retire_ok=config.policy.retire_when_done and spare)
    # The BUSY rules act only on a flagged or retiring pilot, or in a cycle that may
    # retire (`retire_ok`). Most pilots are busy: a busy pilot none of them can act on is
    # left out from the start (it counts no warm pilot either; a site left with no pilot
    # has nothing for its site rules).
    busy_quiet = not c.retire_ok
    marked = memory.flagged.keys() | memory.retiring
    by_site: dict[str, list[Pilot]] = defaultdict(list)
    for p in snapshot.pilots:
        if p.state is _BUSY and busy_quiet and p.key not in marked:
            continue
        if site_ok.get(p.site, False):
            by_site[p.site].append(p)
    for name, pilots in sorted(by_site.items()):
        s = _Site(name, config.site(name))
        for p in pilots:
            state = p.state
            if state in _WARM and p.key not in used:
                s.warm += 1
            for rule in _PILOT_RULES[state]:
                rule(c, s, p)
        for site_rule in _SITE_RULES:
            site_rule(c, s)
    return c.out, c.unneeded


def carry_over(
    snapshot: Snapshot, memory: CycleMemory, result: Plan, now: float
) -> tuple[dict[str, float], dict[str, int]]:
    """The `flagged` and `idle_cycles` maps for the next cycle's `CycleMemory`, after
    the cycle that observed `snapshot` with `memory` decided `result`.

    Flags set this cycle are stamped `now`; unflagged, released, cancelled and vanished
    pilots drop out; pilots at unknown sites keep what they had, and all do while the pool
    or a schedd is unknown. Pure helper for the service
    (and the simulator), so hysteresis state lives in one place.
    """
    if not snapshot.scale_down_ok:  # nothing learnt from a queue read in part
        return dict(memory.flagged), dict(memory.idle_cycles)
    known = {v.name for v in snapshot.sites if v.known}
    flagged = dict(memory.flagged)
    idle_cycles: dict[str, int] = {}
    present = {p.key: p for p in snapshot.pilots}
    for key in list(flagged):
        if key not in present:
            del flagged[key]
    dropped: set[str] = set()
    for a in result.actions:
        if isinstance(a, Flag):
            flagged[a.pilot.key] = now
        elif isinstance(a, (Unflag, Release, Cancel)):
            flagged.pop(a.pilot.key, None)
            dropped.add(a.pilot.key)
    for key, p in present.items():
        if p.site not in known:
            if key in memory.idle_cycles:
                idle_cycles[key] = memory.idle_cycles[key]
        elif p.state is PilotState.IDLE and key not in dropped and key in flagged:
            idle_cycles[key] = _idle_observations(memory, p, now)
    return flagged, idle_cycles
