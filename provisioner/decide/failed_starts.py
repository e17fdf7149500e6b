"""Jobs whose start failed (pure): read from their job ads, grouped by shape.

HTCondor sends a job whose starter fails with an error of its own back to idle instead
of holding it: `VacateReasonCode` 1007 (StarterError), `VacateReason` "Error from
<slot>: Singularity test failed: ..." for a container image that cannot be used, or
"... The job wrapper failed to execute the job: ..." when the pilots' job wrapper finds
no executable to run. Such a try failed at start when the job never really ran: it
never began to execute (`JobCurrentStartExecutingDate` older than its
`JobCurrentStartDate`), or it was vacated (`LastVacateTime`) at most
`FAILED_START_WITHIN_S` after it began to. The second is the usual case: the starter
reports the job executing (and `NumJobStarts` grows) just before the container test
and the job wrapper run. The pool's policy (condor_config/central-manager.conf, the
same rule) counts these starts as schedd cool-downs (`NumJobCoolDowns`) and holds the
job after the third; until then the job is idle and is retried, and the last cool-down
keeps it from starting before the hold. A job evicted for any other reason (pilot
walltime, release, lost node), or ended by a starter error after it ran longer than
the window, is not failing; nor is one whose pilot was killed under it (SLURM ends the
batch job: a starter that outlives the pilot's other daemons for a moment ends with a 1007
of its own, that it lost the pilot's process tracker or its startd, `PILOT_LOST`), however
soon after the start.

The reports (`provisioner.decide.stuck`, `provisioner status`) give this as the cause, instead of
"idle beside an unclaimed pilot"; a job in its cool-down is not demand (no pilot can start
it, and it will be held).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from provisioner.model import FailingStarts, JobShape

#: CONDOR_HOLD_CODE::StarterError (src/condor_utils/condor_holdcodes.h): a starter's
#: critical error without a hold code of its own.
STARTER_ERROR = 1007
#: PROVISIONER_FAILED_START_WITHIN_S of the pool's policy (condor_config; a unit test
#: keeps the two equal): a try vacated by a starter error at most this long after the
#: job began to execute failed at start (why this long: the comment there).
FAILED_START_WITHIN_S = 60
#: PROVISIONER_PILOT_LOST of the pool's policy (condor_config; a unit test keeps the two
#: equal), a regular expression: the starter's own error when the pilot is killed under
#: it: it lost the pilot's process tracker ("unable to restart the ProcD after several
#: tries", "ProcD has failed": src/condor_utils/proc_family_proxy.cpp) or its startd
#: ("FAILED TO SEND INITIAL KEEP ALIVE TO OUR PARENT": daemon_keep_alive.cpp).
PILOT_LOST = "ProcD|KEEP ALIVE TO OUR PARENT"
#: PROVISIONER_START_ERROR of the pool's policy (condor_config; a unit test keeps the two
#: equal): a starter's error without the slot, the starter's and Apptainer's prefixes.
START_ERROR = (r"^(Error from [^ ]*: )?(Singularity test failed: *|The job wrapper failed "
               r"to execute the job: *)?(FATAL: *)?(.*)$")
#: The job attributes read for it (added to the queue query's projection).
START_ATTRS = ("VacateReasonCode", "VacateReason", "JobCurrentStartDate",
               "JobCurrentStartExecutingDate", "LastVacateTime", "NumJobCoolDowns",
               "JobCoolDownExpiration")


@dataclass(frozen=True)
class StartFailure:
    """One idle job's failed start: how many (at least 1), the error, and the end of its
    cool-down (0: none)."""

    failed_starts: int
    reason: str
    cooling_until: float = 0.0


def failed_at_start(start_date: int, executing_date: int, vacate_time: int,
                    within_s: int = FAILED_START_WITHIN_S) -> bool:
    """Whether a try the starter ended (1007) never really ran, as the pool's
    PROVISIONER_START_FAILED decides it (0 where an attribute is absent): it never
    began to execute (the executing date is an earlier try's, or none), or it was
    vacated at most `within_s` after it began to."""
    never_executed = executing_date < start_date
    briefly = 0 < executing_date <= vacate_time <= executing_date + within_s
    return never_executed or briefly


def pilot_lost(vacate_reason: str) -> bool:
    """Whether the starter's error says the pilot was killed under the job (it lost its
    ProcD or its startd), as the pool's PROVISIONER_PILOT_LOST decides it."""
    return re.search(PILOT_LOST, vacate_reason) is not None


def start_failure(vacate_code: int, vacate_reason: str, start_date: int,
                  executing_date: int, vacate_time: int, cool_downs: int,
                  cool_down_until: int) -> StartFailure | None:
    """The failed start of an idle job from its attributes (0 / "" where absent), or None
    if its last try did not fail at start. The count is the schedd's cool-downs (the
    pool's policy counts failed starts so); without them (a pool without the policy),
    only the last try is known to have failed: NumJobStarts cannot tell, the starter
    counts these tries as starts. A pilot killed under the job is not a failed start."""
    if vacate_code != STARTER_ERROR or pilot_lost(vacate_reason) or not failed_at_start(
            start_date, executing_date, vacate_time):
        return None
    return StartFailure(max(1, cool_downs), vacate_reason, float(max(0, cool_down_until)))


def cooling(failure: StartFailure | None, now: float | None) -> bool:
    """Whether the schedd will not start the job at `now` (its cool-down runs until
    then, inclusive, as the schedd compares it); None: not known."""
    return failure is not None and now is not None and failure.cooling_until >= now


def fold(failures: Iterable[tuple[JobShape, StartFailure]], now: float | None
         ) -> tuple[FailingStarts, ...]:
    """Failed starts grouped by shape: the jobs, the most failed starts, the error of
    the job with the most (the first seen among equals), the jobs cooling down."""
    groups: dict[JobShape, FailingStarts] = {}
    for shape, f in failures:
        g = groups.get(shape)
        cool = int(cooling(f, now))
        if g is None:
            groups[shape] = FailingStarts(shape, 1, f.failed_starts, f.reason, cool)
            continue
        worst = f.failed_starts > g.failed_starts
        groups[shape] = FailingStarts(
            shape, g.jobs + 1, max(g.failed_starts, f.failed_starts),
            f.reason if worst else g.reason, g.cooling + cool)
    return tuple(groups.values())


def cause(reason: str) -> str:
    """The error without the slot it happened on ("Error from <slot>: "), so one cause
    on different pilots reads the same."""
    if reason.startswith("Error from "):
        head, sep, rest = reason.partition(": ")
        if sep and " " not in head[len("Error from "):]:
            return rest
    return reason


def start_error(reason: str) -> str:
    """A failed start's error as the pool's hold reason words it: "container image
    could not be used: <Apptainer's error>" or "the job could not be started: <error>"."""
    m = re.match(START_ERROR, reason, re.S)
    error = m.group(4) if m else reason
    if m and (m.group(2) or "").startswith("Singularity"):
        return f"container image could not be used: {error}"
    return f"the job could not be started: {error}"


def describe_failing(g: FailingStarts, limit: int = 300) -> str:
    """One group in words, its cause first."""
    text = cause(g.reason)
    if len(text) > limit:
        text = text[:limit] + "..."
    held = f"; {g.cooling} waiting for the pool's hold" if g.cooling else ""
    return (f"{g.jobs} idle job(s) failed to start (up to {g.failed_starts} failed "
            f"start(s){held}): {text}")
