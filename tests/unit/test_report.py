"""`provisioner report` and `provisioner status`: nothing to report on a missing or empty
journal (none created), a bad --since named, the table, CSV and plots; status as data."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from provisioner import cli
from provisioner.config import parse_config
from provisioner.model import Demand, JobShape, PilotState, SiteView, Snapshot
from provisioner.service.accounting import DAY_S, JobRun, PilotRecord
from provisioner.service.journal import Journal, SeenPilot
from provisioner.service.report import (
    NEVER_STARTED,
    NO_RECORD,
    NOTHING,
    ReportError,
    ends,
    parse_since,
    report,
)
from provisioner.service.status import gather, render
from tests.unit.helpers import pilot
from tests.unit.test_service_act import CONFIG

T0 = 20_000 * DAY_S


def filled(path: Path) -> Journal:
    j = Journal(str(path))
    j.record_pilots("gsi", [SeenPilot("7", 4, 8000, T0 - 600, None, False)], T0 - 500)
    j.record_pilots("gsi", [SeenPilot("7", 4, 8000, T0 - 600, T0, True)], T0 + 60)
    j.record_pilots("gsi", [], T0 + DAY_S + 3600)  # ended the next day
    j.add_job_runs([JobRun("1.0", "alice", "gsi", "7", 2, T0 + 3600, T0 + 7200, 3000.0)])
    return j


def test_missing_or_empty_journal_reports_nothing_and_creates_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "none.sqlite"
    assert cli.main(["report", "--journal", str(missing)]) == 0
    assert NOTHING in capsys.readouterr().out and not missing.exists()
    Journal(str(tmp_path / "empty.sqlite"))
    assert report(str(tmp_path / "empty.sqlite"), T0) == (NOTHING, [])


def test_bad_since_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["report", "--journal", str(tmp_path / "j"), "--since", "yesterday"])
    assert exc.value.code == 2 and "--since 'yesterday'" in capsys.readouterr().err
    with pytest.raises(ReportError):
        parse_since("2026-13-01")
    assert parse_since("1970-01-02") == DAY_S


def test_report_table_csv_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    filled(tmp_path / "j.sqlite")
    out = tmp_path / "out"
    assert cli.main(["report", "--journal", str(tmp_path / "j.sqlite"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "2024-10-04" in text and "2024-10-05" in text and "total" in text
    rows = list(csv.DictReader((out / "report.csv").open()))
    assert [r["day"] for r in rows] == ["2024-10-04", "2024-10-05"]
    assert float(rows[0]["allocated_core_h"]) == 96 and float(rows[0]["claimed_core_h"]) == 2
    assert float(rows[1]["allocated_core_h"]) == 4
    assert (out / "cores.png").stat().st_size > 0 and (out / "idle.png").stat().st_size > 0
    assert "pilot end" in text and NO_RECORD in text  # the pilot left squeue, no record
    assert list(csv.reader((out / "ends.csv").open()))[1][:3] == ["gsi", NO_RECORD, "1"]
    text, _ = report(str(tmp_path / "j.sqlite"), T0 + 2 * DAY_S,
                     since=parse_since("2024-10-05"), site="gsi")
    assert "2024-10-04" not in text.split("total")[0] and "2024-10-05" in text


def test_status_gather_and_render() -> None:
    cfg = parse_config(CONFIG, "t.yaml")
    now = 100_000.0
    snap = Snapshot(
        demand=(Demand(JobShape(1, 1000), 5), Demand(JobShape(64, 1000), 2)),
        pilots=(pilot("7", PilotState.BUSY, cpus=4, free_cpus=1),
                pilot("8", PilotState.PENDING, cpus=4)),
        sites=(SiteView("gsi", True), SiteView("fra", False, "ssh down")))
    j = Journal("")
    j.record_pilots("gsi", [SeenPilot("7", 4, 8000, now - 700, now - 600, True)], now - 500)
    st = gather(cfg, snap, now, {"fra": "open (3 pilots ...)"}, {"gsi/7": now},
                j.pilots(), {"at": now - 30, "summary": "s", "timings": {"observe": 0.5},
                             "actions": [["submit 1 at gsi", "submitted ['9']"]]},
                {"gsi": {"wait_s": 42.04, "boot_s": 7.0, "samples": 3}, "fra": {"x": 1}})
    gsi = st["sites"][0]
    assert gsi["learnt"] == {"queue_wait_s": 42.0, "boot_s": 7.0, "samples": 3}
    assert st["sites"][1]["learnt"]["samples"] == 0  # malformed: the defaults
    assert gsi["cores_allocated"] == 4 and gsi["cores_claimed"] == 3
    assert gsi["pilots"]["busy"]["count"] == 1 and gsi["flagged"] == ["gsi/7"]
    assert gsi["lead_time_p50_s"] == {"queue_wait": 100.0, "boot": 100.0}
    assert st["demand"][0]["sites"] == ["gsi", "fra"] and st["unmatchable"][0]["idle"] == 2
    assert st["last_cycle"]["duration_s"] == 0.5
    json.dumps(st)  # JSON-able
    text = render(st, tty=False)
    assert "placement estimate: queue wait 42 s, boot 7 s, learnt from 3 pilot(s)" in text
    assert "configured defaults" in text
    assert "\033" not in text and "UNKNOWN (ssh down)" in text and "RequestCpus 64" in text
    assert "\033[1m" in render(st, tty=True)


def test_status_command_text_and_json_without_creating_a_journal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import provisioner.service.loop as service
    from tests.unit.fakes import FakeBackend, FakePool

    real = service.Provisioner
    pool = FakePool(demand=(Demand(JobShape(1, 1000), 4), Demand(JobShape(64, 1000), 1)))

    def fake(config, journal=None):  # type: ignore[no-untyped-def]
        return real(config, pool=pool, backends={"gsi": FakeBackend("gsi"),  # type: ignore[arg-type]
                                                 "fra": FakeBackend("fra")}, journal=journal)

    monkeypatch.setattr(service, "Provisioner", fake)
    journal = tmp_path / "j.sqlite"
    cfg = parse_config(CONFIG + f"journal: {journal}\n", "t.yaml")
    assert cli.cmd_status(cfg, as_json=True) == 0
    st = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in st["sites"]] == ["gsi", "fra"] and st["unmatchable"][0]["idle"] == 1
    assert not journal.exists()
    assert cli.cmd_status(cfg, as_json=False) == 0
    assert "Idle demand by job shape" in capsys.readouterr().out


def test_the_cores_plot_samples_a_short_run_finely_and_a_long_one_coarsely() -> None:
    from provisioner.service.accounting import PilotRecord
    from provisioner.service.plots import plot_step

    short = [PilotRecord("gsi", "1", 4, 0.0, 10.0, 60.0)]
    long = [PilotRecord("gsi", "1", 4, 0.0, 0.0, 2 * 86400.0)]
    assert plot_step(short, 100.0) == 1.0  # a one-minute run: every second
    assert plot_step(long, 3 * 86400.0) == 300.0
    assert plot_step([PilotRecord("gsi", "1", 4, 0.0, None, None)], 50.0) == 300.0


def test_pilot_ends_per_site_and_reason() -> None:
    rec = [PilotRecord("gsi", "1", 4, 0, 100, 3700, end_reason="released"),
           PilotRecord("gsi", "2", 4, 0, 100, 1900, end_reason="released"),
           PilotRecord("gsi", "3", 4, 0, 100, None),  # still running: not an end
           PilotRecord("gsi", "4", 4, 0, None, 50),  # cancelled before it started
           PilotRecord("fra", "5", 8, 0, 0, 3600, end_reason="walltime-drain"),
           PilotRecord("fra", "6", 8, 0, 0, 1800)]
    assert ends(rec) == [("fra", NO_RECORD, 1, 4.0), ("fra", "walltime-drain", 1, 8.0),
                         ("gsi", NEVER_STARTED, 1, 0.0), ("gsi", "released", 2, 6.0)]
    assert ends([]) == []
