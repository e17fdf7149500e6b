"""Circuit breaker for black-hole sites, pilots drained by someone else, and the learnt
state that survives a restart."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.breaker import Breakers
from provisioner.config import BreakerConfig
from provisioner.controller import Controller
from provisioner.model import Cancel, JobShape, Pilot, PilotState, Submit
from provisioner.plan import plan

from .helpers import NOW, config, pilot, site, snap

CFG = BreakerConfig(failures=3, backoff_s=600, max_backoff_s=2400, early_exit_s=300)


def starting(job_id: str, t: float, site: str = "gsi") -> Pilot:
    return pilot(job_id, PilotState.STARTING, site=site, started=t - 10)


def fail_one(b: Breakers, job_id: str, t: float) -> list[str]:
    """A pilot seen starting at `t`, gone (never joined) at `t + 60`."""
    b.observe([starting(job_id, t)], ["gsi"], t)
    return b.observe([], ["gsi"], t + 60)


def test_black_hole_site_opens_backs_off_and_is_probed() -> None:
    b = Breakers(CFG)
    assert fail_one(b, "1", 0) == [] and fail_one(b, "2", 100) == []
    (line,) = fail_one(b, "3", 200)
    assert "open for 600 s" in line and b.limits({}) == {"gsi": 0}
    assert b.status()["gsi"]["state"] == "open"
    (line,) = b.observe([], ["gsi"], 260 + 600)
    assert "half-open" in line and b.limits({}) == {"gsi": 1}
    assert b.limits({"gsi": 1}) == {"gsi": 0}  # the probe is in flight
    (line,) = fail_one(b, "4", 900)  # the probe fails: reopen, twice as long
    assert "open for 1200 s" in line
    b.observe([], ["gsi"], 960 + 1200)
    b.observe([starting("5", 2200)], ["gsi"], 2200)
    (line,) = b.observe([pilot("5", PilotState.IDLE, started=2190)], ["gsi"], 2260)
    assert "closed" in line and b.limits({}) == {}


def test_released_and_unknown_site_pilots_are_no_failures() -> None:
    b = Breakers(CFG)
    for i in range(5):
        t = 1000.0 * i
        b.observe([pilot(str(i), PilotState.IDLE, started=t)], ["gsi"], t + 10)
        b.observe([], ["gsi"], t + 20, ours={f"gsi/{i}"})  # we released it
    b.observe([starting("9", 9000)], ["gsi"], 9000)
    b.observe([], [], 9100)  # site not read: the pilot is not gone
    assert b.limits({}) == {} and b.status() == {}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=30))
def test_breaker_opens_only_after_consecutive_failures(outcomes: list[bool]) -> None:
    """Never open before `failures` failed pilots in a row (a joined pilot resets)."""
    b = Breakers(CFG)
    run = 0
    for i, ok in enumerate(outcomes):
        t = 100.0 * i
        if ok:
            b.observe([pilot(str(i), PilotState.BUSY, started=t)], ["gsi"], t)
            run = 0
        else:
            fail_one(b, str(i), t)
            run += 1
        state = b.sites["gsi"].state if "gsi" in b.sites else "closed"
        if run < CFG.failures and state == "open":
            raise AssertionError(f"open after {run} failures in a row")
        if ok:
            assert state == "closed"


def test_open_breaker_moves_demand_to_the_other_site() -> None:
    cfg = config(site("gsi"), site("fra"))
    s = dataclasses.replace(snap([(JobShape(1, 2000), 8)], sites=("gsi", "fra")),
                            submit_limit={"gsi": 0})
    submits = [a for a in plan(s, cfg, NOW).actions if isinstance(a, Submit)]
    assert submits and {a.site for a in submits} == {"fra"}


def test_pilot_drained_by_someone_else_is_cancelled_once_empty_for_n_cycles() -> None:
    drained = dataclasses.replace(pilot("1", PilotState.DRAINING), free_cpus=16,
                                  free_memory_mb=64000)
    busy = dataclasses.replace(pilot("2", PilotState.DRAINING), free_cpus=8,
                               free_memory_mb=32000)
    ctl = Controller(config())
    kinds = []
    for i in range(3):
        result = ctl.cycle(snap([], [drained, busy]), NOW + 20 * i)
        kinds.append(sorted(a.pilot.job_id for a in result.actions if isinstance(a, Cancel)))
    assert kinds == [[], ["1"], ["1"]]  # idle_release_cycles = 2; the busy one never
    ctl.released(busy.key, NOW)
    emptied = dataclasses.replace(busy, free_cpus=16, free_memory_mb=64000)
    for i in range(3):  # our own release: the release follow-up handles it, not this
        result = ctl.cycle(snap([], [emptied]), NOW + 100 + 20 * i)
        assert not [a for a in result.actions if isinstance(a, Cancel)]


def test_learnt_state_survives_a_restart() -> None:
    ctl = Controller(config())
    sub = NOW - 500
    pend = dataclasses.replace(pilot("1", PilotState.PENDING), submitted_at=sub)
    ctl.cycle(snap([], [pend]), NOW - 400)
    up = dataclasses.replace(pilot("1", PilotState.IDLE, started=NOW - 300), submitted_at=sub)
    ctl.cycle(snap([], [up]), NOW - 250)
    est = ctl.estimates.sites["gsi"]
    assert est.samples == 1 and est.wait_s == 200 and 0 < est.boot_s < 90
    for i in range(3):
        fail = starting(str(10 + i), NOW + 100 * i)
        ctl.cycle(snap([], [fail]), NOW + 100 * i)
        ctl.cycle(snap([], []), NOW + 100 * i + 50)
    restarted = Controller(config())
    restarted.load(ctl.state())
    assert restarted.state() == ctl.state()
    assert restarted.estimates.sites == ctl.estimates.sites
    assert restarted.state()["breakers"]["gsi"]["state"] == "open"
    restarted.load({"estimates": {"gsi": {"wait_s": "x"}}, "breakers": None})  # ignored
