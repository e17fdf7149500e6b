"""Site lead-time estimates: each pilot's SLURM queue wait is learnt once, across a
restart of the service and across a site that could not be read for a while."""

from __future__ import annotations

import dataclasses

import pytest

from provisioner.decide.controller import Controller
from provisioner.model import PilotState

from .helpers import NOW, config, pilot, snap


def running(job_id: str, wait: float) -> object:
    """A pilot of gsi that started `wait` s after its submission, an hour ago."""
    return dataclasses.replace(pilot(job_id, PilotState.BUSY, started=NOW - 3600, free_cpus=0),
                               submitted_at=NOW - 3600 - wait)


def test_a_restarted_service_does_not_learn_a_running_pilots_wait_again() -> None:
    ctl = Controller(config())
    ctl.cycle(snap([], [running("1", 100)]), NOW)
    before = ctl.estimates.sites["gsi"]
    assert before.samples == 1 and before.wait_s == 100
    restarted = Controller(config())
    restarted.load(ctl.state())
    for i in range(3):
        restarted.cycle(snap([], [running("1", 100), running("2", 500)]), NOW + 10 * i)
    after = restarted.estimates.sites["gsi"]
    # pilot 1 once (before the restart), pilot 2 once: 2 samples, not 3
    assert after.samples == 2
    assert after.wait_s == ctl.config.policy.placement.smoothing * 500 + (
        1 - ctl.config.policy.placement.smoothing) * 100


def test_a_site_that_was_not_read_does_not_have_its_pilots_learnt_again() -> None:
    ctl = Controller(config())
    ctl.cycle(snap([], [running("1", 100)]), NOW)
    ctl.cycle(snap([], [running("1", 100)], unknown=("gsi",)), NOW + 10)  # squeue failed
    ctl.cycle(snap([], [running("1", 100)]), NOW + 20)
    assert ctl.estimates.sites["gsi"].samples == 1


def test_a_pilot_gone_from_its_site_is_forgotten() -> None:
    ctl = Controller(config())
    ctl.cycle(snap([], [running("1", 100)]), NOW)
    ctl.cycle(snap([], []), NOW + 10)
    assert ctl.estimates.counted() == []
    restarted = Controller(config())
    restarted.load({"waits_counted": ["gsi/7", 3, "nokey"]})
    assert restarted.estimates.counted() == ["gsi/7"]


def up(job_id: str, started: float, joined: float | None) -> object:
    return dataclasses.replace(pilot(job_id, PilotState.IDLE, started=started),
                               submitted_at=started - 30, joined_at=joined)


def test_boot_is_learnt_from_the_startds_start_when_first_seen_up() -> None:
    ctl = Controller(config())
    ctl.cycle(snap([], [up("1", NOW - 40, NOW - 33)]), NOW)  # started and joined between cycles
    est = ctl.estimates.sites["gsi"]
    a = ctl.config.policy.placement.smoothing
    default = ctl.config.policy.placement.default_boot_s
    assert est.boot_s == (1 - a) * default + a * 7
    restarted = Controller(config())
    restarted.load(ctl.state())
    restarted.cycle(snap([], [up("1", NOW - 40, NOW - 33)]), NOW + 10)
    assert restarted.estimates.sites["gsi"] == est  # boot not learnt again either


def test_without_the_startds_time_a_boot_not_seen_is_not_guessed() -> None:
    ctl = Controller(config())
    ctl.cycle(snap([], [up("1", NOW - 40, None)]), NOW)
    assert ctl.estimates.sites["gsi"].boot_s == ctl.config.policy.placement.default_boot_s
    starting = dataclasses.replace(pilot("2", PilotState.STARTING, started=NOW + 5),
                                   submitted_at=NOW)
    ctl.cycle(snap([], [up("1", NOW - 40, None), starting]), NOW + 10)
    ctl.cycle(snap([], [up("1", NOW - 40, None), up("2", NOW + 5, None)]), NOW + 20)
    a = ctl.config.policy.placement.smoothing
    assert ctl.estimates.sites["gsi"].boot_s == pytest.approx(
        (1 - a) * ctl.config.policy.placement.default_boot_s + a * 15)  # to one cycle


def test_a_pilot_seen_starting_before_a_restart_has_its_boot_learnt_after_it() -> None:
    """Killed while a pilot boots: the restarted service sees it up, with the startd's
    start time in its ad, and learns its boot (its wait stays counted once)."""
    ctl = Controller(config())
    starting = dataclasses.replace(pilot("1", PilotState.STARTING, started=NOW - 2),
                                   submitted_at=NOW - 5)
    ctl.cycle(snap([], [starting]), NOW)
    est = ctl.estimates.sites["gsi"]
    default = ctl.config.policy.placement.default_boot_s
    assert est.samples == 1 and est.boot_s == default
    assert ctl.state()["boots_pending"] == ["gsi/1"]
    restarted = Controller(config())
    restarted.load(ctl.state())
    joined = dataclasses.replace(up("1", NOW - 2, NOW + 2), submitted_at=NOW - 5)
    restarted.cycle(snap([], [joined]), NOW + 10)
    after = restarted.estimates.sites["gsi"]
    a = ctl.config.policy.placement.smoothing
    assert after.samples == 1 and after.boot_s == (1 - a) * default + a * 4
    assert restarted.state()["boots_pending"] == []
    again = Controller(config())  # and once up, a further restart learns nothing more
    again.load(restarted.state())
    again.cycle(snap([], [joined]), NOW + 20)
    assert again.estimates.sites["gsi"] == after
    bad = Controller(config())
    bad.load({"boots_pending": ["gsi/9", 4, "nokey"]})
    assert bad.estimates.booting() == ["gsi/9"]
