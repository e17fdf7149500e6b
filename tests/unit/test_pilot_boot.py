"""The pilot's boot steps: start delays of pilots sent together, the marks in the
startd's configuration, and the step table read back from an ad."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provisioner.pilot import boot


@given(st.floats(0, 600), st.integers(0, 200), st.integers(1, 200), st.integers(0, 2**32))
def test_start_delays_stay_within_the_maximum_and_the_first_starts_at_once(
        max_s: float, slot: int, slots: int, seed: int) -> None:
    delay = boot.start_delay(max_s, min(slot, slots - 1), slots, random.Random(seed))
    assert 0.0 <= delay <= max_s
    if slot == 0 or slots == 1:
        assert delay == 0.0


def test_a_burst_spreads_over_the_maximum_in_order() -> None:
    delays = [boot.start_delay(30, k, 10, random.Random(k)) for k in range(10)]
    assert delays[0] == 0.0
    assert all(3 * k <= d <= 3 * (k + 1) for k, d in enumerate(delays))
    assert delays[-1] > 27


def test_a_batch_script_that_does_not_say_keeps_the_random_delay() -> None:
    delays = {boot.start_delay(30, 0, 0, random.Random(seed)) for seed in range(20)}
    assert len(delays) == 20 and all(0 <= d <= 30 for d in delays)
    assert boot.start_delay(0, 3, 5, random.Random(1)) == 0.0


def test_marks_become_startd_attributes_in_order() -> None:
    text = boot.config_lines({"PilotBootTested": 12.5, "PilotBootWrapperStart": 10.0})
    assert text.splitlines() == ["PilotBootWrapperStart = 10.000", "PilotBootTested = 12.500",
                                 "STARTD_ATTRS = $(STARTD_ATTRS) PilotBootWrapperStart "
                                 "PilotBootTested"]


def test_steps_from_an_ad_and_what_the_pool_saw() -> None:
    ad = {"PilotBootSlurmStart": 100, "PilotBootWrapperStart": 100.4,
          "PilotBootDelayEnd": 100.4, "PilotBootPrepared": 100.5, "PilotBootTested": 100.6,
          "PilotBootMasterStart": 100.6, "DaemonStartTime": 102}
    rows = dict(boot.steps(ad, first_seen=105.0, first_claim=106.0))
    assert rows["SLURM start -> wrapper (batch script, Python)"] == pytest.approx(0.4)
    assert rows["start delay"] == 0.0
    assert rows["nested-container self-test (before the master)"] == pytest.approx(0.1)
    assert rows["Apptainer + condor_master -> startd"] == pytest.approx(1.4)
    assert rows["startd -> ad in the collector (CCB)"] == 3.0
    assert rows["negotiation -> first job starts"] == 1.0
    assert "total" in boot.table(list(rows.items()))


def test_a_self_test_beside_the_master_is_off_the_path_and_told_apart() -> None:
    ad = {"PilotBootPrepared": 100.5, "PilotBootMasterStart": 100.5, "PilotBootTested": 104.0,
          "PilotContainerTest": "ok: apptainer exec of /p.sif: 3.5 s"}
    rows = dict(boot.steps(ad))
    assert rows["nested-container self-test (before the master)"] == 0.0
    assert boot.tested_beside(ad) == pytest.approx(3.5)
    running = {**ad, "PilotContainerTest": "running: apptainer exec of /p.sif, beside ..."}
    assert boot.tested_beside(running) is None
    assert boot.tested_beside({**ad, "PilotBootTested": 100.4}) is None  # before the master
    assert boot.tested_beside({k: v for k, v in ad.items() if k != "PilotBootTested"}) is None


def test_unknown_times_are_shown_as_unknown_not_zero() -> None:
    rows = dict(boot.steps({"PilotBootWrapperStart": 1.0, "DaemonStartTime": True}))
    assert rows["SLURM start -> wrapper (batch script, Python)"] is None
    assert rows["Apptainer + condor_master -> startd"] is None
    assert "?" in boot.table(list(rows.items()))

