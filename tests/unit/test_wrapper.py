"""The pilot wrapper's pure parts: what it copies back from the node."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from provisioner.pilot.wrapper import Pilot, params_from_env

ENV = {
    "PILOT_SITE": "gsi", "PILOT_PROVISIONER_ID": "t", "PILOT_COLLECTOR": "cm:9618",
    "PILOT_UID_DOMAIN": "t", "PILOT_IMAGE": "/i.sif", "PILOT_TOKEN_FILE": "/t",
    "PILOT_CONDOR_CONFIG": "/c", "SLURM_JOB_ID": "7", "PILOT_WALLTIME_S": "600",
}


def test_logs_are_copied_back_but_never_a_core_dump(tmp_path: Path) -> None:
    params = dataclasses.replace(params_from_env(ENV, 0.0), log_dir=tmp_path / "logs")
    workdir = tmp_path / "work"
    logs = workdir / "local" / "log"
    logs.mkdir(parents=True)
    (logs / "StartLog").write_text("started\n")
    (logs / "core").write_bytes(b"memory with a token")
    (logs / "core.12345").write_bytes(b"memory with a token")
    Pilot(params, workdir, workdir / "condor_config").copy_logs()
    copied = sorted(p.name for p in (tmp_path / "logs" / params.name).iterdir())
    assert copied == ["StartLog"]


def test_pilot_daemons_write_no_core_files() -> None:
    conf = (Path(__file__).parents[2] / "condor_config" / "pilot.conf").read_text()
    assert "\nCREATE_CORE_FILES = False\n" in conf
