"""The pilot's container support: the start-up test of nested Apptainer, the settings
it leads to, and the loader variables the batch script drops before anything starts."""

from __future__ import annotations

import subprocess

import pytest

from provisioner.config import parse_config
from provisioner.pilot.containers import (
    LOADER_VARIABLES,
    ContainerSupport,
    config_string,
    container_config,
    self_test,
)
from provisioner.pilot.script import render_pilot_script
from tests.unit.test_gpus import SITE_YAML


def test_the_batch_script_drops_every_loader_variable_before_the_pilot_starts() -> None:
    cfg = parse_config(SITE_YAML, "t.yaml")
    script = render_pilot_script(cfg, cfg.site("gpu"), 3600, gpus=0)
    head, _, _ = script.rpartition("exec ")
    env = {"PATH": "/usr/bin:/bin", **{k: "/site/audit.so" for k in LOADER_VARIABLES}}
    out = subprocess.run(["bash", "-c", head + "env\n"], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert not [k for k in LOADER_VARIABLES if f"{k}=" in out], out
    assert "LD_AUDIT" in LOADER_VARIABLES and "APPTAINERENV_LD_PRELOAD" in LOADER_VARIABLES


def test_self_test_runs_nested_apptainer_exec_and_times_it() -> None:
    calls: list[list[str]] = []
    ticks = iter([10.0, 12.5])

    def execute(argv: list[str]) -> tuple[int, str]:
        calls.append(argv)
        return 0, ""

    result = self_test(execute, "/img/pilot.sif", clock=lambda: next(ticks))
    assert result == ContainerSupport(True, "apptainer exec of /img/pilot.sif: 2.5 s", 2.5)
    assert calls[0][0] == "/usr/bin/apptainer" and calls[0][-2:] == ["/img/pilot.sif",
                                                                     "/bin/true"]
    assert "--contain" in calls[0] and "--pid" in calls[0]


@pytest.mark.parametrize("outcome, detail", [
    ((255, "FATAL: could not create user namespace\nmore\n"),
     "failed (exit 255): FATAL: could not create user namespace | more"),
    (OSError("no such file: apptainer"), "no such file: apptainer"),
])
def test_a_failed_self_test_says_why(outcome: object, detail: str) -> None:
    def execute(argv: list[str]) -> tuple[int, str]:
        if isinstance(outcome, Exception):
            raise outcome
        return outcome  # type: ignore[return-value]

    result = self_test(execute, "/img/pilot.sif", clock=lambda: 0.0)
    assert not result.ok and detail in result.detail, result
    assert not self_test(execute, "").ok  # no image to test with


def test_settings_after_a_passed_test_name_apptainer() -> None:
    ok = container_config(ContainerSupport(True, "apptainer exec of /p.sif: 1.0 s"))
    assert ok["SINGULARITY"] == "/usr/bin/apptainer" and "SINGULARITY_JOB" not in ok
    assert ok["PilotContainerTest"] == '"ok: apptainer exec of /p.sif: 1.0 s"'
    default = container_config(ContainerSupport(True, "x"), payload_image="/cvmfs/p.sif")
    assert default["SINGULARITY_JOB"] == "true"
    assert default["SINGULARITY_IMAGE_EXPR"] == (
        'ifThenElse(isUndefined(TARGET.SingularityImage), "/cvmfs/p.sif", '
        "TARGET.SingularityImage)")


def test_settings_after_a_failed_test_switch_containers_off_and_stay_one_line() -> None:
    bad = container_config(ContainerSupport(False, 'FATAL "x" $(EVIL)\nline\\2'))
    assert bad["SINGULARITY"] == ""
    value = bad["PilotContainerTest"]
    assert "\n" not in value and "$" not in value and value.startswith('"failed: FATAL')
    assert value == '"failed: FATAL \\"x\\"  (EVIL) line\\\\2"'


def test_config_strings_cannot_expand_or_break_the_pilot_config() -> None:
    # $(...) would be expanded by HTCondor's config language; a newline would start a
    # new setting; quotes and backslashes are escaped for the ClassAd string.
    assert config_string('a$(LIB)"b\\c\nSTART = True') == '"a (LIB)\\"b\\\\c START = True"'
