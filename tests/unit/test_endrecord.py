"""The pilot's end record: written atomically from the pilot's environment, parsed
back only when it is whole and the record of the job asked for."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from provisioner.pilot import endrecord
from provisioner.pilot.endrecord import BadEndRecord, EndRecord

REC = EndRecord("7", "gsi", "prov1", 1000.0, 1100.5, 4, "released")


def test_written_atomically_and_read_back(tmp_path: Path) -> None:
    path = endrecord.write(tmp_path / "end", REC)
    assert path == tmp_path / "end" / "gsi-7.json"
    assert os.listdir(tmp_path / "end") == ["gsi-7.json"]  # no temporary file left
    text = path.read_text()
    assert text.endswith("\n") and text.count("\n") == 1
    assert endrecord.parse(text, "gsi", "7", "prov1") == REC
    assert json.loads(text) == {"v": 1, "job_id": "7", "site": "gsi",
                                "provisioner_id": "prov1", "start": 1000.0, "end": 1100.5,
                                "cores": 4, "reason": "released"}


def test_a_failed_write_leaves_no_temporary_file(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_replace(src: object, dst: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(endrecord.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        endrecord.write(tmp_path, REC)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(("site", "job_id"), [("gsi", "../7"), ("gsi", "7 8"), ("GSI", "7"),
                                              ("../x", "7"), ("gsi", "")])
def test_no_file_name_that_could_leave_the_directory(site: str, job_id: str) -> None:
    with pytest.raises(ValueError, match="no end record name"):
        endrecord.file_name(site, job_id)


GOOD = json.loads(REC.to_json())


@pytest.mark.parametrize(("text", "why"), [
    ("", "not JSON"),
    ('{"v": 1, "job_id": "7"', "not JSON"),
    ("[1, 2]", "not a JSON object"),
    (json.dumps({**GOOD, "v": None}), "no format version"),
    (json.dumps({**GOOD, "job_id": "8"}), "job_id '8' is not '7'"),
    (json.dumps({**GOOD, "job_id": 7}), "job_id 7 is not '7'"),
    (json.dumps({**GOOD, "site": "fra"}), "site 'fra' is not 'gsi'"),
    (json.dumps({**GOOD, "provisioner_id": "other"}), "provisioner_id 'other'"),
    (json.dumps({**GOOD, "start": "1000"}), "'start' is not a number"),
    (json.dumps({**GOOD, "end": True}), "'end' is not a number"),
    (json.dumps({**GOOD, "end": 999.0}), "not 0 < start <= end"),
    (json.dumps({**GOOD, "start": 0}), "not 0 < start <= end"),
    (json.dumps({**GOOD, "cores": -1}), "'cores' is not a count"),
    (json.dumps({**GOOD, "cores": 2.5}), "'cores' is not a count"),
    (json.dumps({**GOOD, "reason": "rm -rf /"}), "'reason' is not a word"),
    (json.dumps(GOOD) + " " * endrecord.MAX_BYTES, "longer than"),
])
def test_bad_records_are_refused_saying_why(text: str, why: str) -> None:
    with pytest.raises(BadEndRecord, match=why.replace("(", r"\(").replace(")", r"\)")):
        endrecord.parse(text, "gsi", "7", "prov1")


def test_a_newer_record_with_more_fields_and_an_unknown_reason_is_read() -> None:
    text = json.dumps({**GOOD, "v": 2, "node": "n1", "reason": "preempted"})
    assert endrecord.parse(text, "gsi", "7", "prov1").reason == "preempted"


ENV = {"PILOT_LOG_DIR": "", "SLURM_JOB_ID": "7", "PILOT_SITE": "gsi",
       "PILOT_PROVISIONER_ID": "prov1", "SLURM_CPUS_ON_NODE": "4"}


def test_write_from_env(tmp_path: Path) -> None:
    env = {**ENV, "PILOT_LOG_DIR": str(tmp_path)}
    path = endrecord.write_from_env(env, 1000.0, 1100.5, "released")
    assert path is not None
    assert endrecord.parse(path.read_text(), "gsi", "7", "prov1") == REC


def test_write_from_env_never_raises(tmp_path: Path) -> None:
    assert endrecord.write_from_env(ENV, 1.0, 2.0, "released") is None  # no log dir
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the log directory should be
    env = {**ENV, "PILOT_LOG_DIR": str(blocked)}
    assert endrecord.write_from_env(env, 1.0, 2.0, "released") is None
    env = {**ENV, "PILOT_LOG_DIR": str(tmp_path), "SLURM_JOB_ID": ""}
    assert endrecord.write_from_env(env, 1.0, 2.0, "released") is None
    assert not (tmp_path / "end").exists() or os.listdir(tmp_path / "end") == []


@pytest.mark.parametrize(("env", "cores"), [
    ({"SLURM_CPUS_ON_NODE": "8", "SLURM_CPUS_PER_TASK": "4"}, 8),
    ({"SLURM_CPUS_PER_TASK": "4"}, 4),
    ({"SLURM_JOB_CPUS_PER_NODE": "16(x2)"}, 16),
    ({"SLURM_CPUS_ON_NODE": "many", "SLURM_CPUS_PER_TASK": "2"}, 2),
    ({}, 0),
])
def test_cores_from_env(env: dict[str, str], cores: int) -> None:
    assert endrecord.cores_from_env(env) == cores
