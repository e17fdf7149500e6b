"""Running the service: the Provisioner's tick on an APScheduler timer, woken early by
the schedd's event log (`provisioner.pool.submit_events`); one bad cycle never stops it."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from provisioner.pool.submit_events import EventLogFollower, resolve_path
from provisioner.service.loop import Provisioner

log = logging.getLogger(__name__)

#: The APScheduler job of the quick check (and the join check).
TICK_JOB = "tick"


def follow_submits(prov: Provisioner, sched: Any) -> EventLogFollower | None:
    """A follower of the schedd's event log (`pool.event_log`) that wakes `sched`'s tick
    job early, or None when there is none to follow (then the quick check alone)."""
    import htcondor2

    path = resolve_path(prov.config.pool.event_log, htcondor2.param)
    if path is None:
        log.info("no schedd event log to follow (pool.event_log: %s): new jobs are seen by "
                 "the quick check", prov.config.pool.event_log)
        return None

    def poke() -> None:
        try:
            sched.modify_job(TICK_JOB, next_run_time=datetime.now(sched.timezone))
        except Exception as exc:  # the tick job's next run comes on its timer
            log.debug("no early check scheduled: %s", exc)

    prov.wakeup.poke = poke
    return EventLogFollower(path, prov.wakeup, prov.config.policy.quick_check_s)


def run_forever(prov: Provisioner) -> None:
    """The service: an APScheduler interval job, one instance at a time, missed runs
    coalesced, run early when the schedd's event log shows a submit."""
    from apscheduler.schedulers.blocking import BlockingScheduler

    sched = BlockingScheduler()

    def job() -> None:
        try:
            with prov.wakeup.busy():
                prov.tick()
        except Exception:  # one bad cycle must never stop the service
            log.exception("cycle failed; the next one runs as scheduled")

    policy = prov.config.policy
    sched.add_job(job, "interval", seconds=policy.tick_s,
                  max_instances=1, coalesce=True, id=TICK_JOB)
    log.info("provisioner %s: %d site(s), interval %.0f s, quick check %.0f s",
             prov.config.pool.provisioner_id, len(prov.config.sites),
             prov.config.policy.interval_s, prov.config.policy.quick_check_s)
    prov.start_metrics()
    # Following before the first cycle reads the queue: a job submitted between the two
    # wakes the loop (started after, it would wait for the next quick check).
    follower = follow_submits(prov, sched)
    if follower is not None:
        follower.start()
    job()
    try:
        sched.start()
    except (KeyboardInterrupt, SystemExit):
        log.info("stopping")
    finally:
        if follower is not None:
            follower.stop()
