"""A submit wakes the service at once through the schedd's event log (EVENT_LOG, set on
the testbed's central manager by condor_config/central-manager.conf); when the log
cannot be read the quick check is the fallback, said once.

The service runs as its own account beside the schedd with `pool.event_log: auto`. The
quick check and the interval are an hour here: within a test, the only cycle after the
first that can find "idle jobs rose" is one an event woke. Assertions are on log lines
and their order, never on how long something took.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import htcondor2 as htcondor
from conftest import SITES, run
from servicectl import (
    SERVICE_USER,
    Service,
    pilot_ids,
    service_dir,
    workers_drained,
    write_config,
)
from test_loop import ADMIN, clean, submit, wait_for  # noqa: F401 (clean: a fixture)

FOLLOWING = "following the schedd's event log"
FALLBACK = "cannot follow the schedd's event log"
HOUR = 3600


def slow_timer(event_log: str = "auto", quick_check_s: float = HOUR) -> Callable[[dict], None]:  # type: ignore[type-arg]
    """The service's timer an hour (or `quick_check_s`) apart: only a wake-up runs a
    check sooner. stuck_after_s off: its check against the pilots' no-claim shutdown
    would refuse an hour's interval."""

    def edit(data: dict) -> None:  # type: ignore[type-arg]
        data["pool"]["event_log"] = event_log
        data["policy"].update({"interval_s": HOUR, "quick_check_s": quick_check_s,
                               "join_check_s": 0, "min_cycle_gap_s": 1, "stuck_after_s": 0})
        data.pop("metrics", None)  # the testbed's own service may hold its port

    return edit


def schedd_start() -> int:
    """When the schedd last started, as its ad in the collector says."""
    ads = htcondor.Collector().query(htcondor.AdType.Schedd, projection=["DaemonStartTime"])
    return max(int(ad.get("DaemonStartTime", 0)) for ad in ads)


def lines(svc: Service) -> list[str]:
    return svc.text().splitlines()


def first_index(svc: Service, text: str) -> int:
    return next(i for i, line in enumerate(lines(svc)) if text in line)


def test_a_submit_is_seen_at_once_through_the_event_log(
        clean: None, tmp_path: Path) -> None:  # noqa: F811
    event_log = htcondor.param.get("EVENT_LOG")
    assert event_log, "EVENT_LOG is not set on the central manager"
    directory = service_dir()
    svc = Service(write_config(directory, slow_timer()), directory / "service.log")
    # Every worker drained: the pilots stay pending, so no pilot that becomes idle wakes
    # a cycle of its own; only the submits do.
    with workers_drained():
        svc.start()
        try:
            wait_for("the service follows the event log", lambda: FOLLOWING in svc.text(), 60)
            wait_for("the first cycle", lambda: "cycle 1 (first cycle)" in svc.text(), 60)
            assert not any(pilot_ids(site) for site in SITES)
            submit("woken", 1, 5)
            # The next timed check is an hour away: this cycle was woken by the submit.
            wait_for("a cycle woken by the submit",
                     lambda: "cycle 2 (idle jobs rose)" in svc.text(), 120)
            woken = lines(svc)[first_index(svc, "cycle 2 (idle jobs rose)")]
            assert "submit " in woken, woken  # it provisions for the job
            assert first_index(svc, FOLLOWING) < first_index(svc, "cycle 2 (idle jobs rose)")
            # The schedd restarts: it goes on appending to the same log; still followed.
            started = schedd_start()
            run(["condor_restart", "-daemon", "schedd"], env=ADMIN)
            wait_for("the schedd restarted", lambda: schedd_start() > started, 120)
            assert "cycle 3 " not in svc.text()
            submit("woken-again", 3, 5)  # more idle jobs than cycle 2 saw
            wait_for("a cycle woken by a submit after the schedd's restart",
                     lambda: "cycle 3 (idle jobs rose)" in svc.text(), 120)
            assert svc.text().count(FALLBACK) == 0 and svc.text().count(FOLLOWING) == 1
        finally:
            svc.stop()
            print(f"--- service log ---\n{svc.text()}")


def test_an_unreadable_event_log_falls_back_to_the_quick_check_said_once(
        clean: None, tmp_path: Path) -> None:  # noqa: F811
    directory = service_dir()
    unreadable = directory / "EventLog"
    config = write_config(directory, slow_timer(str(unreadable), quick_check_s=3))
    unreadable.write_text("")  # after write_config, which gives the directory away
    unreadable.chmod(0o600)  # root's: the service's account cannot read it
    svc = Service(config, directory / "service.log")
    svc.start()
    try:
        wait_for("the fallback said", lambda: FALLBACK in svc.text(), 60)
        assert "Permission denied" in lines(svc)[first_index(svc, FALLBACK)]
        wait_for("the first cycle", lambda: "cycle 1 (first cycle)" in svc.text(), 60)
        submit("fallback", 1, 5)
        # The quick check sees the job (every 3 s; the follower tried every second).
        wait_for("the quick check sees the job",
                 lambda: "(idle jobs rose)" in svc.text(), 120)
        assert svc.text().count(FALLBACK) == 1 and FOLLOWING not in svc.text()
        subprocess.run(["chown", f"{SERVICE_USER}:", str(unreadable)], check=True)
        wait_for("following once readable", lambda: FOLLOWING in svc.text(), 60)
        assert first_index(svc, FALLBACK) < first_index(svc, FOLLOWING)
        assert " again" in lines(svc)[first_index(svc, FOLLOWING)]
        assert svc.text().count(FALLBACK) == 1 and svc.text().count(FOLLOWING) == 1
    finally:
        svc.stop()
        print(f"--- service log ---\n{svc.text()}")
