"""Scale-down (pure): the last stage of `plan()`, and the flag state it carries over.

IDLE pilots without assigned demand (or reserve) are flagged, and released once observed
idle for `idle_release_cycles` consecutive cycles (minimum lifetime and keep_warm
permitting); flagged pilots that are busy again or received demand are unflagged; PENDING
pilots without assigned demand are cancelled (keep_warm permitting; not a half-open site's
probe); pilots running at
their site whose startd never joined the pool within `start_timeout_s` are cancelled.
BUSY pilots whose free room nothing needs, in a cycle that places all demand on pilots
already in the pool and expects no arrival (no reserve), are retired
(`policy.retire_when_done`): they leave when their running jobs end instead of a quick
check later; the order is withdrawn when that no longer holds.
"""

from __future__ import annotations

import math
from collections import defaultdict

from provisioner.config import Config
from provisioner.model import (
    Action,
    Cancel,
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


def _idle_observations(snapshot: Snapshot, p: Pilot, now: float) -> int:
    """How many consecutive cycles `p` has been seen idle, this one included. Earlier
    observations count only if the pilot was flagged in an earlier cycle (flagged_at < now);
    `snapshot.idle_cycles` (from `carry_over`) tells how many, else one."""
    flagged_at = snapshot.flagged.get(p.key)
    if flagged_at is None or flagged_at >= now:
        return 1
    return max(1, snapshot.idle_cycles.get(p.key, 1)) + 1


def drained_empty(p: Pilot) -> bool:
    """A DRAINING pilot with nothing claimed and no job running (the observer reports a
    draining pilot that runs anything with fewer free cores than it has)."""
    return (p.state is PilotState.DRAINING and p.free_cpus >= p.cpus
            and p.free_memory_mb >= p.memory_mb)


def _age(p: Pilot, now: float) -> float:
    return now - (p.started_at if p.started_at is not None else p.submitted_at)


def pilot_actions(
    snapshot: Snapshot, config: Config, now: float, used: set[str], site_ok: dict[str, bool],
    submitting: bool = False, spare: bool = False,
) -> tuple[list[Action], list[str]]:
    """Flag, unflag, release, cancel, retire and unretire existing pilots; also returns the
    pending pilots no demand needed this cycle. `used`: pilots that received demand (or
    reserve) or must be kept for it; `submitting`: this cycle submits new pilots (then no
    pending pilot is cancelled: it would be replaced by an equivalent one); `spare`: the
    cycle placed every idle job on pilots already in the pool, submits none and keeps no
    reserve (then busy pilots nothing needs are retired)."""
    out: list[Action] = []
    unneeded: list[str] = []
    cancel_after = config.policy.placement.pending_cancel_cycles
    by_site: dict[str, list[Pilot]] = defaultdict(list)
    for p in snapshot.pilots:
        if site_ok.get(p.site, False):
            by_site[p.site].append(p)
    flagged_at, retiring_now = snapshot.flagged, snapshot.retiring  # looked up per pilot
    n_release = config.policy.idle_release_cycles
    retire_ok = config.policy.retire_when_done and spare
    for site_name, pilots in sorted(by_site.items()):
        site = config.site(site_name)
        # warm = unclaimed pilots that are up or coming up; keep_warm of them are kept
        warm = 0
        cancels: list[Pilot] = []
        releases: list[Pilot] = []
        spare_busy: list[Pilot] = []
        for p in pilots:
            state = p.state
            if state is PilotState.BUSY:
                if p.key in flagged_at:
                    out.append(Unflag(p, "busy again"))
                if retire_ok and p.key not in used:
                    spare_busy.append(p)
                elif p.key in retiring_now:
                    out.append(Unretire(p, "demand for its room again" if p.key in used
                                        else "demand waits for pilots not yet in the pool"))
                continue
            if state in _WARM and p.key not in used:
                warm += 1
            if state is PilotState.IDLE:
                flagged = p.key in flagged_at
                if p.key in used:
                    if flagged:
                        out.append(Unflag(p, "idle demand will use it"))
                    if p.key in retiring_now:
                        out.append(Unretire(p, "idle demand will use it"))
                elif _idle_observations(snapshot, p, now) >= n_release:
                    releases.append(p)
                elif not flagged:
                    out.append(Flag(p, "idle, no demand for it"))
            elif state is PilotState.PENDING:
                if p.key not in used:
                    unneeded.append(p.key)
                    # a half-open site's pending pilot is its probe: cancelled, it would
                    # only be replaced by another probe as soon as demand comes back
                    if (not submitting and site_name not in snapshot.probing
                            and snapshot.unneeded_cycles.get(p.key, 0) + 1 >= cancel_after):
                        cancels.append(p)
            elif (drained_empty(p)
                  and snapshot.drained_cycles.get(p.key, 0) + 1 >= n_release):
                # drained by someone else (an admin's condor_drain), running nothing: it
                # would count against the caps for ever
                out.append(Cancel(p, f"draining with nothing running for {n_release} cycles"))
            elif (state is PilotState.STARTING and p.started_at is not None
                  and now - p.started_at > config.policy.start_timeout_s):
                # Running at the site but its startd never registered (and the schedd
                # runs nothing there, or it would be BUSY): it only burns allocation.
                out.append(Cancel(p, f"started {now - p.started_at:.0f} s ago, never joined "
                                     "the pool"))
        # release the pilots that end soonest, cancel the ones submitted last; keep the rest
        releases.sort(key=lambda p: (p.walltime_end or math.inf, p.job_id))
        for p in releases:
            if _age(p, now) >= config.policy.min_pilot_lifetime_s and warm > site.keep_warm:
                out.append(Release(p, f"idle for {n_release} cycles, no demand for it"))
                warm -= 1
            elif p.key not in snapshot.flagged:
                out.append(Flag(p, "idle, no demand for it (kept: lifetime/keep_warm)"))
        for p in sorted(cancels, key=lambda p: (-p.submitted_at, p.job_id)):
            if warm > site.keep_warm:
                out.append(Cancel(p, f"pending, no demand for it for {cancel_after} cycles"))
                warm -= 1
        out += _retirements(snapshot, spare_busy, max(0, site.keep_warm - warm),
                            config.policy.min_pilot_lifetime_s, now)
    return out, unneeded


def _retirements(snapshot: Snapshot, spare_busy: list[Pilot], keep: int,
                 min_lifetime_s: float, now: float) -> list[Action]:
    """Retire the busy pilots nothing needs, but keep (or unretire) the `keep` that end
    last (they become the site's keep_warm pilots) and those younger than the minimum
    lifetime."""
    out: list[Action] = []
    spare_busy.sort(key=lambda p: (-(p.walltime_end or math.inf), p.job_id))
    for i, p in enumerate(spare_busy):
        retiring = p.key in snapshot.retiring
        if i < keep or _age(p, now) < min_lifetime_s:
            if retiring:
                out.append(Unretire(p, "kept: lifetime/keep_warm"))
        elif not retiring:
            out.append(Retire(p, "busy, no demand for its room: leave when the jobs end"))
    return out


def carry_over(
    snapshot: Snapshot, result: Plan, now: float
) -> tuple[dict[str, float], dict[str, int]]:
    """The `flagged` and `idle_cycles` maps for the next cycle's Snapshot.

    Flags set this cycle are stamped `now`; unflagged, released, cancelled and vanished
    pilots drop out; pilots at unknown sites keep what they had, and all do while the pool
    or a schedd is unknown. Pure helper for the service
    (and the simulator), so hysteresis state lives in one place.
    """
    if not snapshot.scale_down_ok:  # nothing learnt from a queue read in part
        return dict(snapshot.flagged), dict(snapshot.idle_cycles)
    known = {v.name for v in snapshot.sites if v.known}
    flagged = dict(snapshot.flagged)
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
            if key in snapshot.idle_cycles:
                idle_cycles[key] = snapshot.idle_cycles[key]
        elif p.state is PilotState.IDLE and key not in dropped and key in flagged:
            idle_cycles[key] = _idle_observations(snapshot, p, now)
    return flagged, idle_cycles
