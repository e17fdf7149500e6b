"""Jobs whose start failed (pure): read from their job ads, grouped by shape.

HTCondor (23.7 on) sends a job whose starter fails with an error of its own back to idle
instead of holding it: `VacateReasonCode` 1007 (StarterError), `VacateReason` "Error from
<slot>: Singularity test failed: ..." for a container image that cannot be used. Such a
start failed before the job ran when the job's `JobCurrentStartExecutingDate` is older
than its `JobCurrentStartDate` (the attempt never began to execute). The pool's policy
(condor_config/central-manager.conf) counts these starts as schedd cool-downs
(`NumJobCoolDowns`) and holds the job after the third; until then the job is idle and is
retried, and the last cool-down keeps it from starting before the hold. A job evicted for
any other reason (pilot walltime, release, lost node) or after it ran is not failing.

The reports (`provisioner.stuck`, `provisioner status`) give this as the cause, instead of
"idle beside an unclaimed pilot"; a job in its cool-down is not demand (no pilot can start
it, and it will be held).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from provisioner.model import FailingStarts, JobShape

#: CONDOR_HOLD_CODE::StarterError (src/condor_utils/condor_holdcodes.h): a starter's
#: critical error without a hold code of its own.
STARTER_ERROR = 1007
#: The job attributes read for it (added to the queue query's projection).
START_ATTRS = ("VacateReasonCode", "VacateReason", "JobCurrentStartDate",
               "JobCurrentStartExecutingDate", "NumJobCoolDowns", "NumShadowStarts",
               "NumJobStarts", "JobCoolDownExpiration")


@dataclass(frozen=True)
class StartFailure:
    """One idle job's failed start: how many (at least 1), the error, and the end of its
    cool-down (0: none)."""

    failed_starts: int
    reason: str
    cooling_until: float = 0.0


def start_failure(vacate_code: int, vacate_reason: str, start_date: int,
                  executing_date: int, cool_downs: int, shadow_starts: int,
                  job_starts: int, cool_down_until: int) -> StartFailure | None:
    """The failed start of an idle job from its attributes (0 / "" where absent), or None
    if its last try did not fail before it ran. The count is the schedd's cool-downs when
    the pool runs the policy, else the tries that never ran."""
    if vacate_code != STARTER_ERROR or start_date <= 0 or executing_date >= start_date:
        return None
    failed = cool_downs if cool_downs > 0 else shadow_starts - job_starts
    return StartFailure(max(1, failed), vacate_reason, float(max(0, cool_down_until)))


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


def describe_failing(g: FailingStarts, limit: int = 300) -> str:
    """One group in words, its cause first."""
    text = cause(g.reason)
    if len(text) > limit:
        text = text[:limit] + "..."
    held = f"; {g.cooling} waiting for the pool's hold" if g.cooling else ""
    return (f"{g.jobs} idle job(s) failed to start (up to {g.failed_starts} failed "
            f"start(s){held}): {text}")
