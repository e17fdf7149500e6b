"""The small-workload measurement's pure part (bench/small_workload.py): the policy reset
against the testbed's real configuration, waits, a run's figures, the table, progress."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from bench import small_workload as small
from provisioner.config import Config, PolicyConfig
from provisioner.service.accounting import JobRun, PilotRecord

TESTBED = Path(__file__).resolve().parents[2] / "deploy/testbed/provisioner.yaml"


def test_reset_drops_the_testbeds_policy_and_keeps_its_sites() -> None:
    data = yaml.safe_load(TESTBED.read_text())
    before = copy.deepcopy(data)
    out, lines = small.reset_policy(data)
    assert data == before  # the input is left alone
    assert "policy" not in out
    assert {k: v for k, v in out.items() if k != "sites"} == \
        {k: v for k, v in data.items() if k not in ("policy", "sites")}
    # the pilots' no-claim timer goes back to its default too (the default stuck_after_s
    # is refused beside the testbed's short one); nothing else of the sites changes
    for site_out, site_in in zip(out["sites"], data["sites"], strict=True):
        runtime_in = dict(site_in["runtime"])
        runtime_in.pop("noclaim_shutdown_s")
        assert site_out == {**site_in, "runtime": runtime_in}
    assert "sites[0].runtime.noclaim_shutdown_s: 600 -> 1200" in lines
    assert "policy.interval_s: 10 -> 300" in lines
    assert "policy.quick_check_s: 3 -> 10" in lines
    assert "policy.reserve.enabled: false -> true" in lines
    assert "policy.idle_release_cycles: 2 -> 1" in lines
    assert len(lines) == len(list(small._flat(data["policy"]))) + len(data["sites"])
    config = Config.model_validate(out)
    assert config.policy == PolicyConfig()
    assert [s.name for s in config.sites] == ["gsi", "frankfurt"]
    assert config.sites[0].caps.max_pilots == 1


def test_reset_without_a_policy_section_changes_nothing() -> None:
    out, lines = small.reset_policy({"sites": [{"name": "x"}]})
    assert out == {"sites": [{"name": "x"}]} and lines == []


def test_waits_are_submission_to_first_start_of_the_jobs_that_started() -> None:
    ads = [{"QDate": 100, "JobStartDate": 130, "JobCurrentStartDate": 500},
           {"QDate": 100, "JobStartDate": 100},
           {"QDate": 100},  # never started
           {"QDate": 200, "JobStartDate": 0}]
    assert small.job_waits(ads) == [30.0, 0.0]


def pilot(job_id: str, start: float | None, end: float | None, cores: int = 4) -> PilotRecord:
    return PilotRecord("gsi", job_id, cores, submit_at=0.0, start_at=start, end_at=end)


def run(job_id: str, pilot_id: str, start: float, end: float) -> JobRun:
    return JobRun(job_id, "alice", "gsi", pilot_id, 1, start, end)


def test_a_runs_figures_from_its_pilots_and_job_runs() -> None:
    pilots = [pilot("1", 10, 110), pilot("2", 10, 110), pilot("3", None, None)]
    runs = [run(f"1.{i}", "1", 10, 110) for i in range(4)] + [run("2.0", "99", 10, 20)]
    r = small.measure(2, 3.5, pilots, runs, [5.0, 10.0, 40.0], now=1000.0)
    # pilot 1 full (400 core-s), pilot 2 idle (400), pilot 3 never started (0)
    assert r.efficiency == 0.5
    assert (r.pilots, r.started, r.never_claimed, r.unattributed) == (3, 2, 1, 1)
    assert (r.run, r.offset_s, r.wait(95), r.wait(100)) == (2, 3.5, 40.0, 40.0)
    assert not r.met()  # efficiency below the target
    assert small.measure(1, 0, [], [], [], 0.0).efficiency is None


def test_the_target_needs_both_figures() -> None:
    good = small.RunResult(1, 0.0, efficiency=0.88, waits=(5.0, 10.0))
    assert good.met()
    assert not small.RunResult(1, 0.0, efficiency=0.87, waits=(5.0, 10.0)).met()
    assert not small.RunResult(1, 0.0, efficiency=0.9, waits=(10.0, 11.0)).met()
    assert not small.RunResult(1, 0.0, efficiency=0.9, waits=()).met()
    assert not small.RunResult(1, 0.0, efficiency=0.9, waits=(1.0,), error="timed out").met()
    # the first-jobs workload has no efficiency target
    assert small.RunResult(1, 0.0, efficiency=0.5, waits=(9.0,)).met(small.FIRST)
    assert not small.RunResult(1, 0.0, efficiency=0.99, waits=(11.0,)).met(small.FIRST)


def test_table_has_a_row_per_run_and_the_mean_of_the_completed_ones() -> None:
    results = [small.RunResult(1, 2.0, 0.8, (10.0, 20.0, 30.0), 3, 3, 0),
               small.RunResult(2, 7.25, None, error="not over by the deadline"),
               small.RunResult(3, 12.0, 0.9, (20.0, 30.0, 50.0), 5, 4, 1)]
    lines = small.table(results).splitlines()
    assert lines[0].startswith("| run | offset s | efficiency | wait p50 s | wait p95 s")
    assert lines[2] == "| 1 | 2.0 | 0.800 | 20.0 | 30.0 | 30.0 | 3 | 3 | 0 |"
    assert lines[3].startswith("| 2 | 7.2 | failed: not over by the deadline |")
    assert lines[5] == "| mean |  | 0.850 | 25.0 | 40.0 | 40.0 | 4.0 | 3.5 | 0.5 |"
    assert all(line.count("|") == 10 for line in lines)
    assert len(small.table([results[1]]).splitlines()) == 3  # no mean of nothing


def test_document_names_the_reset_the_target_and_the_plot() -> None:
    results = [small.RunResult(1, 2.0, 0.9, (5.0, 10.0)),
               small.RunResult(2, 5.0, 0.7, (5.0, 10.0))]
    text = small.document(results, "2026-01-31 12:00 UTC", ["policy.interval_s: 10 -> 300"],
                          ("testbed-small.png", 1))
    assert "2026-01-31 12:00 UTC" in text and "`policy.interval_s: 10 -> 300`" in text
    assert "met in 1 of 2 runs" in text
    assert "](testbed-small.png)" in text
    assert "Reset to the defaults: nothing" in small.document(results, "d", [])


def test_progress_line() -> None:
    line = small.progress(135.4, {1: 3, 2: 4, 5: 1}, 12,
                          {"gsi": ["RUNNING"], "frankfurt": ["RUNNING", "PENDING", "RUNNING"]},
                          7)
    assert line == ("  [  135 s] jobs 3 idle, 4 running, 4/12 done, 1 held | pilots gsi 1 "
                    "RUNNING, frankfurt 1 PENDING 2 RUNNING | 7 cycles")
    assert small.progress(0, None, 8, {"gsi": []}, 0) == \
        "  [    0 s] jobs ? | pilots gsi 0 | 0 cycles"
    assert "pilots ?" in small.progress(0, {}, 8, None, 0)


def test_a_pilot_the_service_did_not_see_end_ends_when_its_record_says(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from provisioner.pilot import endrecord
    from provisioner.pilot.endrecord import EndRecord

    alive = PilotRecord("gsi", "7", 4, 900.0, 1000.0)
    ended = PilotRecord("gsi", "8", 4, 900.0, 1000.0, 1090.0, end_source="squeue")
    bad = PilotRecord("gsi", "9", 4, 900.0, 1000.0)
    pending = PilotRecord("gsi", "10", 4, 900.0)
    endrecord.write(tmp_path, EndRecord("7", "gsi", "prov", 1000.0, 1080.0, 4, "retired"))
    endrecord.write(tmp_path, EndRecord("8", "gsi", "prov", 1000.0, 1070.0, 4, "released"))
    (tmp_path / endrecord.file_name("gsi", "9")).write_text("{")
    got = small.with_recorded_ends([alive, ended, bad, pending], "prov", tmp_path)
    assert (got[0].end_at, got[0].end_source, got[0].end_reason) == (1080.0, "record",
                                                                      "retired")
    assert got[1] == ended  # the journal's own end stands
    assert got[2] == bad and "gsi-9.json" in capsys.readouterr().out
    assert got[3] == pending
