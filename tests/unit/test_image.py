"""`provisioner image check`: every check's pass and fail path against a fake apptainer.

The fake models what the checks rely on (inspect's JSON, `env` output, the caller's
environment reaching the container or not); that the real apptainer behaves so is the
testbed's job (TESTBED-PAYLOAD.md).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from provisioner import cli
from provisioner.data import image
from provisioner.data.image import (
    FAIL,
    LABEL_ENVIRONMENT,
    LOADER_MARKER,
    OK,
    SKIPPED,
    Checker,
    ImageError,
    image_kind,
    parse_env,
    render,
    run_command,
    tree_size,
)

REPO = Path(__file__).resolve().parents[2]
INSIDE = {"EXPERIMENT_NAME": "example", "EXPERIMENT_RELEASE": "2025.1",
          "EXPERIMENT_ROOT": "/opt/experiment/2025.1", "PATH": "/usr/bin:/bin"}


@dataclass
class FakeApptainer:
    """Answers apptainer's subcommands from its fields and records every call.

    Its clock advances by `durations[subcommand]` per call, so start-up times are exact.
    """

    labels: dict[str, str] = field(default_factory=lambda: {
        LABEL_ENVIRONMENT: "EXPERIMENT_NAME EXPERIMENT_RELEASE EXPERIMENT_ROOT"})
    test_script: str = "#!/bin/sh\nexp-info\n"
    test_rc: int = 0
    test_output: str = "payload environment example 2025.1: ok\n"
    inside: dict[str, str] = field(default_factory=lambda: dict(INSIDE))
    caller_env_reaches: bool = False  # the image does not unset the loader variables
    inspect_rc: int = 0
    inspect_stdout: str | None = None
    exec_rc: int = 0
    version_rc: int = 0
    missing: bool = False
    timeout_on: str | None = None
    build_rc: int = 0
    unpacked_bytes: int = 4000
    durations: dict[str, float] = field(default_factory=lambda: {"exec": 0.25, "test": 1.5})
    slow_runs: list[float] = field(default_factory=list)  # per /bin/true run, overrides
    now: float = 1000.0
    calls: list[tuple[list[str], float, dict[str, str]]] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def __call__(self, argv: list[str], timeout: float,
                 env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
        self.calls.append((list(argv), timeout, dict(env)))
        if self.missing:
            raise FileNotFoundError(2, "No such file or directory", argv[0])
        sub = argv[1]
        if sub == self.timeout_on:
            raise subprocess.TimeoutExpired(argv, timeout)
        if argv[-1] == "/bin/true" and self.slow_runs:
            self.now += self.slow_runs.pop(0)
        else:
            self.now += self.durations.get(sub, 0.0)
        if sub == "--version":
            return self._done(argv, self.version_rc, "apptainer version 1.4.5\n")
        if sub == "inspect":
            doc = {"data": {"attributes": {"labels": self.labels, "test": self.test_script}},
                   "type": "container"}
            out = self.inspect_stdout if self.inspect_stdout is not None else json.dumps(doc)
            err = "FATAL: could not open image: unknown image format" if self.inspect_rc else ""
            return self._done(argv, self.inspect_rc, out, err)
        if sub == "test":
            return self._done(argv, self.test_rc, self.test_output,
                              "" if self.test_rc == 0 else "%test: cc/make do not work")
        if sub == "exec":
            if self.exec_rc:
                return self._done(argv, self.exec_rc, "", "FATAL: container creation failed")
            if argv[-1] == "/bin/true":
                return self._done(argv, 0, "")
            seen = dict(self.inside)
            if "--cleanenv" not in argv and self.caller_env_reaches:
                seen = {**env, **seen}
            return self._done(argv, 0, "".join(f"{k}={v}\n" for k, v in seen.items()))
        if sub == "build":
            if self.build_rc == 0:
                tree = Path(argv[argv.index("--sandbox") + 1])
                (tree / "usr").mkdir(parents=True)
                (tree / "usr" / "blob").write_bytes(b"x" * self.unpacked_bytes)
                (tree / "usr" / "ro").mkdir(mode=0o500)  # as unprivileged builds leave
            return self._done(argv, self.build_rc, "", "FATAL: unsquashfs failed")
        raise AssertionError(f"unexpected command {argv}")

    @staticmethod
    def _done(argv: list[str], rc: int, out: str,
              err: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, rc, out, err)


def sif(tmp_path: Path, size: int = 1000) -> Path:
    path = tmp_path / "payload.sif"
    launch = b"#!/usr/bin/env run-singularity\n".ljust(32, b"\0")
    path.write_bytes((launch + b"SIF_MAGIC\0" + b"01\0").ljust(size, b"\0"))
    return path


def checker(fake: FakeApptainer, caller_env: Mapping[str, str] | None = None,
            **kw: object) -> Checker:
    return Checker(apptainer="/usr/bin/apptainer", runner=fake, clock=fake.clock,
                   caller_env=dict(caller_env or {"PATH": "/usr/bin:/bin"}), **kw)  # type: ignore[arg-type]


def status(report: image.Report) -> dict[str, str]:
    return {c.name: c.status for c in report.checks}


def detail(report: image.Report, name: str) -> str:
    return next(c.detail for c in report.checks if c.name == name)


# --- a good image ---------------------------------------------------------------------

def test_a_good_image_passes_every_check_and_is_measured(tmp_path: Path) -> None:
    fake = FakeApptainer()
    report = checker(fake).check(str(sif(tmp_path, 1000)))
    assert status(report) == dict.fromkeys(image.CHECKS, OK)
    assert report.ok and report.kind == "sif"
    assert report.environment == {k: v for k, v in INSIDE.items() if k != "PATH"}
    assert report.startup_s == [0.25, 0.25, 0.25]
    assert report.size_bytes == 1000 and report.unpacked_bytes is None
    assert "apptainer version 1.4.5" in detail(report, "apptainer")
    assert "passed in 1.5 s" in detail(report, "%test")


def test_every_command_is_an_argv_list_with_a_timeout(tmp_path: Path) -> None:
    fake = FakeApptainer()
    path = str(sif(tmp_path))
    checker(fake, timeout_s=7.0, unpacked=True, build_timeout_s=99.0).check(path)
    subcommands = [argv[1] for argv, _, _ in fake.calls]
    assert subcommands == ["--version", "inspect", "test", "exec", "exec", "exec", "exec",
                           "exec", "build"]
    for argv, timeout, _ in fake.calls:
        assert argv[0] == "/usr/bin/apptainer" and all(isinstance(a, str) for a in argv)
        assert timeout == (99.0 if argv[1] == "build" else 7.0)
    assert ["/usr/bin/apptainer", "test", path] in [c[0] for c in fake.calls]
    assert ["/usr/bin/apptainer", "exec", "--cleanenv", path, "env"] in [c[0] for c in fake.calls]


def test_the_table_names_each_check_and_the_result(tmp_path: Path) -> None:
    report = checker(FakeApptainer()).check(str(sif(tmp_path)))
    text = render(report)
    for name in image.CHECKS:
        assert re.search(rf"^  {re.escape(name)} +ok +\S", text, re.MULTILINE), name
    assert text.splitlines()[-1] == "Result: ok"
    assert "median 0.25 s over 3 runs" in text


# --- apptainer and the image itself ---------------------------------------------------

def test_apptainer_missing_fails_loudly_and_skips_the_rest(tmp_path: Path) -> None:
    report = checker(FakeApptainer(missing=True)).check(str(sif(tmp_path)))
    assert status(report)["apptainer"] == FAIL
    assert "apptainer missing" in detail(report, "apptainer")
    assert [c.status for c in report.checks[2:]] == [SKIPPED] * 5
    assert not report.ok


def test_apptainer_that_does_not_run_fails(tmp_path: Path) -> None:
    report = checker(FakeApptainer(version_rc=1)).check(str(sif(tmp_path)))
    assert status(report)["apptainer"] == FAIL and not report.ok


def test_a_missing_image_is_named(tmp_path: Path) -> None:
    fake = FakeApptainer()
    report = checker(fake).check(str(tmp_path / "nope.sif"))
    assert status(report)["image"] == FAIL
    assert detail(report, "image").startswith("image missing:")
    assert [argv[1] for argv, _, _ in fake.calls] == ["--version"]  # nothing else ran


@pytest.mark.parametrize("content", [b"#!/bin/sh\necho hello\n", b"", b"\0" * 100])
def test_a_file_that_is_no_image_is_refused_before_apptainer_sees_it(
        tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.sif"
    path.write_bytes(content)
    report = checker(FakeApptainer()).check(str(path))
    assert detail(report, "image").startswith("not an image:") and not report.ok


def test_a_directory_without_singularity_d_is_no_sandbox(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="not a sandbox"):
        image_kind(tmp_path)


def test_image_kinds_by_their_magic(tmp_path: Path) -> None:
    assert image_kind(sif(tmp_path)) == "sif"
    squash = tmp_path / "legacy.simg"
    squash.write_bytes(b"hsqs" + b"\0" * 60)
    assert image_kind(squash) == "squashfs"
    (tmp_path / "sandbox" / ".singularity.d").mkdir(parents=True)
    assert image_kind(tmp_path / "sandbox") == "sandbox"


def test_an_image_apptainer_cannot_inspect_is_not_an_image(tmp_path: Path) -> None:
    report = checker(FakeApptainer(inspect_rc=255)).check(str(sif(tmp_path)))
    assert status(report)["image"] == FAIL
    assert "unknown image format" in detail(report, "image")
    assert status(report)["%test"] == SKIPPED


def test_inspect_output_that_is_not_json_fails(tmp_path: Path) -> None:
    report = checker(FakeApptainer(inspect_stdout="WARNING: x\n")).check(str(sif(tmp_path)))
    assert "no JSON metadata" in detail(report, "image") and not report.ok


# --- %test ----------------------------------------------------------------------------

def test_a_failing_test_fails_with_its_output_and_the_rest_still_runs(tmp_path: Path) -> None:
    report = checker(FakeApptainer(test_rc=1)).check(str(sif(tmp_path)))
    assert status(report)["%test"] == FAIL
    assert "exit 1" in detail(report, "%test") and "cc/make do not work" in detail(report,
                                                                                 "%test")
    assert status(report)["environment"] == OK and status(report)["start-up"] == OK
    assert report.failed == [c for c in report.checks if c.name == "%test"]


def test_an_image_without_a_test_section_fails(tmp_path: Path) -> None:
    fake = FakeApptainer(test_script="   \n")
    report = checker(fake).check(str(sif(tmp_path)))
    assert status(report)["%test"] == FAIL and "no %test section" in detail(report, "%test")
    assert "test" not in [argv[1] for argv, _, _ in fake.calls]


def test_a_test_that_hangs_times_out(tmp_path: Path) -> None:
    report = checker(FakeApptainer(timeout_on="test"), timeout_s=30.0).check(str(sif(tmp_path)))
    assert status(report)["%test"] == FAIL
    assert "timed out after 30 s" in detail(report, "%test")


# --- the declared environment ---------------------------------------------------------

def test_a_declared_variable_missing_inside_is_named(tmp_path: Path) -> None:
    inside = {k: v for k, v in INSIDE.items() if k != "EXPERIMENT_ROOT"}
    report = checker(FakeApptainer(inside=inside)).check(str(sif(tmp_path)))
    assert status(report)["environment"] == FAIL
    assert detail(report, "environment") == "not set inside: EXPERIMENT_ROOT"


def test_a_declared_variable_empty_inside_fails(tmp_path: Path) -> None:
    report = checker(FakeApptainer(inside={**INSIDE, "EXPERIMENT_RELEASE": ""})).check(
        str(sif(tmp_path)))
    assert detail(report, "environment") == "empty inside: EXPERIMENT_RELEASE"


def test_the_environment_is_read_with_a_clean_caller_environment(tmp_path: Path) -> None:
    # Only --cleanenv proves the image sets the variables, not the caller.
    fake = FakeApptainer(inside={"PATH": "/bin"}, caller_env_reaches=True)
    report = checker(fake, caller_env={"PATH": "/bin", **INSIDE}).check(str(sif(tmp_path)))
    assert status(report)["environment"] == FAIL
    assert "EXPERIMENT_NAME" in detail(report, "environment")


def test_an_image_that_declares_nothing_fails_unless_variables_are_named(
        tmp_path: Path) -> None:
    path = str(sif(tmp_path))
    report = checker(FakeApptainer(labels={})).check(path)
    assert status(report)["environment"] == FAIL
    assert LABEL_ENVIRONMENT in detail(report, "environment")
    named = checker(FakeApptainer(labels={}), extra_vars=("EXPERIMENT_NAME",)).check(path)
    assert status(named)["environment"] == OK
    assert named.environment == {"EXPERIMENT_NAME": "example"}


def test_variables_named_with_env_are_checked_besides_the_declared_ones(
        tmp_path: Path) -> None:
    report = checker(FakeApptainer(), extra_vars=("CMTCONFIG",)).check(str(sif(tmp_path)))
    assert detail(report, "environment") == "not set inside: CMTCONFIG"


def test_a_label_with_invalid_names_fails(tmp_path: Path) -> None:
    fake = FakeApptainer(labels={LABEL_ENVIRONMENT: "EXPERIMENT_NAME, $(id)"})
    report = checker(fake).check(str(sif(tmp_path)))
    assert "invalid variables: $(id)" in detail(report, "environment")


def test_the_label_takes_spaces_and_commas() -> None:
    assert image.declared_variables({LABEL_ENVIRONMENT: " A,B  C,,D "}) == ["A", "B", "C", "D"]
    assert image.declared_variables({}) == []


# --- loader variables -----------------------------------------------------------------

def test_loader_variables_of_the_caller_reaching_the_container_are_reported(
        tmp_path: Path) -> None:
    """Apptainer passes them whatever the image does: said, not failed."""
    fake = FakeApptainer(caller_env_reaches=True)
    report = checker(fake).check(str(sif(tmp_path)))
    assert status(report)["loader variables"] == OK
    assert "the caller's LD_AUDIT, LD_PRELOAD reach the container" in detail(
        report, "loader variables")
    probes = [env for argv, _, env in fake.calls if argv[1:2] == ["exec"]
              and "--cleanenv" not in argv and argv[-1] == "env"]
    assert len(probes) == 1
    assert probes[0]["LD_AUDIT"] == probes[0]["LD_PRELOAD"] == LOADER_MARKER


def test_an_image_that_sets_a_loader_variable_itself_fails(tmp_path: Path) -> None:
    fake = FakeApptainer(inside={**INSIDE, "LD_PRELOAD": "/usr/lib/libintercept.so"})
    report = checker(fake).check(str(sif(tmp_path)))
    assert detail(report, "loader variables") == "the image itself sets LD_PRELOAD"


def test_injected_loader_variables_are_removed_from_every_command_and_reported(
        tmp_path: Path) -> None:
    fake = FakeApptainer()
    caller = {"PATH": "/bin", "APPTAINERENV_LD_AUDIT": "/site/libdlaudit.so",
              "SINGULARITYENV_LD_AUDIT": "/site/libdlaudit.so", "LD_PRELOAD": "/x.so",
              "HOME": "/home/pilot"}
    report = checker(fake, caller_env=caller).check(str(sif(tmp_path)))
    assert status(report)["loader variables"] == OK
    assert "the caller had APPTAINERENV_LD_AUDIT, LD_PRELOAD, SINGULARITYENV_LD_AUDIT set" \
        in detail(report, "loader variables")
    for argv, _, env in fake.calls:
        assert not any(k.endswith(("LD_AUDIT", "LD_PRELOAD")) and v != LOADER_MARKER
                       for k, v in env.items()), argv
        assert env["HOME"] == "/home/pilot"


def test_a_plain_caller_environment_gets_no_note(tmp_path: Path) -> None:
    report = checker(FakeApptainer()).check(str(sif(tmp_path)))
    assert detail(report, "loader variables") == "the image sets none of LD_AUDIT, LD_PRELOAD"


# --- start-up -------------------------------------------------------------------------

def test_start_up_is_the_median_so_one_slow_run_does_not_fail_it(tmp_path: Path) -> None:
    report = checker(FakeApptainer(slow_runs=[0.2, 30.0, 0.3])).check(str(sif(tmp_path)))
    assert report.startup_median_s == pytest.approx(0.3)
    assert status(report)["start-up"] == OK


def test_start_up_above_the_bound_fails(tmp_path: Path) -> None:
    fake = FakeApptainer(slow_runs=[3.1, 2.9, 3.0, 3.3, 3.2])
    report = checker(fake, runs=5, max_startup_s=1.0).check(str(sif(tmp_path)))
    assert status(report)["start-up"] == FAIL
    assert "median 3.10 s over 5 runs" in detail(report, "start-up")
    assert "above 1 s" in detail(report, "start-up")


def test_a_container_that_does_not_start_fails_every_exec_check(tmp_path: Path) -> None:
    report = checker(FakeApptainer(exec_rc=255)).check(str(sif(tmp_path)))
    assert {n for n, s in status(report).items() if s == FAIL} == {
        "environment", "loader variables", "start-up"}
    assert "container creation failed" in detail(report, "start-up")


# --- size -----------------------------------------------------------------------------

def test_unpacked_size_and_ratio_of_a_sif(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    fake = FakeApptainer(unpacked_bytes=4000)
    report = checker(fake, unpacked=True, tmpdir=str(work)).check(str(sif(tmp_path, 1000)))
    assert report.size_bytes == 1000 and report.unpacked_bytes == 4000
    assert report.ratio == pytest.approx(4.0)
    assert "(4.0x the image)" in detail(report, "size")
    assert list(work.iterdir()) == []  # the unpacked tree is gone, read-only dirs too


def test_unpacking_that_fails_fails_the_size_check(tmp_path: Path) -> None:
    report = checker(FakeApptainer(build_rc=255), unpacked=True).check(str(sif(tmp_path)))
    assert status(report)["size"] == FAIL and "unsquashfs failed" in detail(report, "size")
    assert report.unpacked_bytes is None


def test_a_sandbox_is_measured_as_its_tree(tmp_path: Path) -> None:
    box = tmp_path / "box"
    (box / ".singularity.d").mkdir(parents=True)
    (box / "a").write_bytes(b"x" * 300)
    os.link(box / "a", box / "a-hardlink")  # one inode, counted once
    os.symlink("/usr", box / "usr-link")  # not followed
    report = checker(FakeApptainer()).check(str(box))
    assert report.kind == "sandbox"
    assert report.size_bytes == report.unpacked_bytes == 300 + len("/usr")
    assert status(report)["size"] == OK


def test_tree_size_sums_files_in_subdirectories(tmp_path: Path) -> None:
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "f").write_bytes(b"1" * 10)
    (tmp_path / "d" / "e" / "g").write_bytes(b"2" * 20)
    assert tree_size(tmp_path) == 30


# --- parsing --------------------------------------------------------------------------

def test_env_output_with_a_multi_line_value() -> None:
    text = "A=1\nFUNC=() {  echo\n}\nB=x=y\n not a line\nEMPTY=\n"
    assert parse_env(text) == {"A": "1", "FUNC": "() {  echo", "B": "x=y", "EMPTY": ""}


# --- the command ----------------------------------------------------------------------

def _main(argv: list[str], fake: FakeApptainer) -> int:
    def factory(**kw: object) -> Checker:
        return Checker(runner=fake, clock=fake.clock, caller_env={"PATH": "/bin"},
                       **kw)  # type: ignore[arg-type]
    return image.main(argv, checker_factory=factory)


def test_main_exits_0_and_prints_the_table(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(["check", str(sif(tmp_path))], FakeApptainer()) == 0
    out, err = capsys.readouterr()
    assert "Result: ok" in out and err == ""


def test_main_exits_1_and_names_each_failed_check_on_stderr(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeApptainer(test_rc=2, inside={**INSIDE, "LD_PRELOAD": "/usr/lib/x.so"})
    assert _main(["check", str(sif(tmp_path))], fake) == 1
    out, err = capsys.readouterr()
    assert "Result: FAILED (%test, loader variables)" in out
    assert err.splitlines()[0].startswith("provisioner image check: FAILED %test: ")
    assert err.splitlines()[1].startswith("provisioner image check: FAILED loader variables: ")


def test_main_json_has_stable_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(["check", str(sif(tmp_path)), "--json", "--unpacked", "--runs", "1"],
                 FakeApptainer(unpacked_bytes=2500)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"image", "kind", "ok", "checks", "environment", "startup_s",
                        "size_bytes", "unpacked_bytes", "unpacked_ratio"}
    assert doc["ok"] is True and doc["unpacked_ratio"] == 2.5
    assert doc["startup_s"] == {"runs": [0.25], "median": 0.25}
    assert [c["name"] for c in doc["checks"]] == list(image.CHECKS)


def test_main_passes_the_options_to_the_checker(tmp_path: Path) -> None:
    seen: dict[str, object] = {}

    def factory(**kw: object) -> Checker:
        seen.update(kw)
        return Checker(runner=FakeApptainer(), caller_env={}, **kw)  # type: ignore[arg-type]

    image.main(["check", str(sif(tmp_path)), "--apptainer", "/opt/bin/apptainer", "--env",
                "X", "--env", "Y", "--runs", "5", "--max-startup", "2.5", "--timeout", "9"],
               checker_factory=factory)
    assert seen == {"apptainer": "/opt/bin/apptainer", "timeout_s": 9.0, "runs": 5,
                    "max_startup_s": 2.5, "extra_vars": ("X", "Y"), "unpacked": False,
                    "tmpdir": None}


@pytest.mark.parametrize("args", [["--env", "1BAD"], ["--runs", "0"], ["--timeout", "0"]])
def test_main_refuses_bad_arguments(tmp_path: Path, args: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _main(["check", str(sif(tmp_path)), *args], FakeApptainer())
    assert exc.value.code == 2


def test_the_provisioner_command_reaches_image_check_without_a_configuration(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "none.sif")
    for argv in (["image", "check", missing, "--apptainer", str(tmp_path / "no-apptainer")],
                 ["-c", str(tmp_path / "no-config.yaml"), "image", "check", missing,
                  "--apptainer", str(tmp_path / "no-apptainer")]):
        assert cli.main(argv) == 1
        err = capsys.readouterr().err
        assert "FAILED apptainer: apptainer missing" in err
        assert "FAILED image: image missing" in err


# --- the real runner ------------------------------------------------------------------

def test_run_command_returns_output_and_status() -> None:
    proc = run_command([sys.executable, "-c", "import os,sys; print(os.environ['V']); "
                        "sys.exit(3)"], 10.0, {"V": "v w"})
    assert (proc.returncode, proc.stdout) == (3, "v w\n")


def test_run_command_kills_the_whole_group_on_timeout(tmp_path: Path) -> None:
    marker, pidfile = tmp_path / "child-survived", tmp_path / "child.pid"
    script = f"(sleep 2; touch {marker}) & echo $! >{pidfile}; wait"
    with pytest.raises(subprocess.TimeoutExpired):
        run_command(["sh", "-c", script], 0.3, {"PATH": os.environ["PATH"]})
    child = int(pidfile.read_text())
    # The child ends either killed with its group, or after touching the marker.
    deadline = time.monotonic() + 30
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)
    assert not marker.exists()


def _alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# --- the example payload definition ---------------------------------------------------

def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^%(\w+)[ \t]*$", text, flags=re.MULTILINE)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def test_the_payload_definition_declares_what_its_environment_sets_and_its_test_checks(
) -> None:
    text = (REPO / "images" / "payload.def").read_text()
    header = text.split("\n%", 1)[0]
    assert re.search(r"^Bootstrap: localimage$", header, re.MULTILINE)  # no registry
    sec = _sections(text)
    assert {"arguments", "post", "environment", "labels", "test", "help"} <= set(sec)
    labels = dict(line.strip().split(None, 1) for line in sec["labels"].strip().splitlines())
    declared = image.declared_variables(labels)
    exported = re.findall(r"^\s*export ([A-Z_]+)=", sec["environment"], re.MULTILINE)
    assert declared and set(declared) <= set(exported)
    assert all(v in sec["test"] for v in declared)
    # No loader hooks of its own (the caller's pass through anyway: the pilot drops them).
    assert not re.search(r"^\s*export (LD_AUDIT|LD_PRELOAD)=", sec["environment"],
                         re.MULTILINE)
    assert labels["org.htcondor-slurm-provisioner.role"] == "payload"
