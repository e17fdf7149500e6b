"""The job wrapper, run for real (user and mount namespaces of this machine): a job
sees its own sandbox and nothing else of the node's scratch, /tmp or /dev/shm; in
particular no pilot's token, its own pilot's or another's on the same node."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from provisioner.pilot.workfiles import (
    JOB_WRAPPER,
    JOB_WRAPPER_SETTINGS,
    PID_NAMESPACE,
    PRIVATE_DIRS,
    covered_dirs,
    job_wrapper_settings,
    source,
)

PROBE = """
cat "$OTHER/tokens.d/pilot" 2>/dev/null && echo LEAK-other-token
cat "$OWN/tokens.d/pilot" 2>/dev/null && echo LEAK-own-token
cat "$NEIGHBOUR/marker" 2>/dev/null && echo LEAK-other-sandbox
cat /tmp/tmp-marker 2>/dev/null && echo LEAK-tmp
cat marker && echo own-sandbox-ok
echo written >new-file && echo sandbox-writable
touch /tmp/x && echo tmp-writable
"""


def _node(tmp_path: Path, scratch_name: str = "scratch") -> dict[str, Path]:
    """Two pilots' work directories in one scratch directory, a job sandbox in each."""
    scratch = tmp_path / scratch_name
    dirs = {"own": scratch / "pilot-gsi-1", "other": scratch / "pilot-gsi-2"}
    for d in dirs.values():
        for sub in PRIVATE_DIRS:
            (d / sub).mkdir(parents=True)
        (d / "tokens.d" / "pilot").write_text("SECRET")
    sandbox = dirs["own"] / "local" / "execute" / "dir_1"
    neighbour = dirs["own"] / "local" / "execute" / "dir_2"
    for s in (sandbox, neighbour):
        s.mkdir(parents=True)
        (s / "marker").write_text("mine\n")
    return {"scratch": scratch, "sandbox": sandbox, "neighbour": neighbour, **dirs}


def _script(tmp_path: Path, node: dict[str, Path], cover: list[str],
            pid: bool = True) -> Path:
    """The job wrapper as the pilot installs it: the script, its settings beside it."""
    script = tmp_path / JOB_WRAPPER
    script.write_text(source(JOB_WRAPPER))
    (tmp_path / JOB_WRAPPER_SETTINGS).write_text(job_wrapper_settings(
        [str(node["own"] / d) for d in PRIVATE_DIRS], cover, pid_namespace=pid))
    return script


def _run(tmp_path: Path, node: dict[str, Path], cover: list[str]) -> str:
    script = _script(tmp_path, node, cover)
    Path("/tmp/tmp-marker").write_text("x")
    env = {"PATH": "/usr/bin:/bin", "_CONDOR_SCRATCH_DIR": str(node["sandbox"]),
           "OWN": str(node["own"]), "OTHER": str(node["other"]),
           "NEIGHBOUR": str(node["neighbour"])}
    proc = subprocess.run(["/bin/sh", str(script), "/bin/sh", "-c", PROBE], env=env,
                          cwd=node["sandbox"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture
def node(tmp_path: Path) -> dict[str, Path]:
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount",
                            *PID_NAMESPACE.split(), "true"],
                           capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.fail("this machine cannot make user namespaces: the job wrapper cannot be "
                    f"tested here ({probe.stderr.decode().strip()})")
    return _node(tmp_path)


def test_a_job_sees_its_sandbox_and_nothing_else(tmp_path: Path,
                                                 node: dict[str, Path]) -> None:
    out = _run(tmp_path, node, covered_dirs(node["scratch"]))
    assert "LEAK" not in out, out
    assert out.split() == ["mine", "own-sandbox-ok", "sandbox-writable", "tmp-writable"]
    assert (node["sandbox"] / "new-file").read_text() == "written\n"  # the real sandbox


def test_without_the_cover_the_other_pilots_token_leaks(tmp_path: Path,
                                                        node: dict[str, Path]) -> None:
    """The safeguard switched off: the test above would catch the leak."""
    out = _run(tmp_path, node, [])
    assert "LEAK-other-token" in out and "LEAK-other-sandbox" in out, out
    assert "LEAK-own-token" not in out  # the pilot's own directories stay hidden


def test_directory_names_with_spaces_and_wildcards_are_covered(
        tmp_path: Path, node: dict[str, Path]) -> None:
    """The settings are data: a name is one directory, whatever it holds."""
    odd = _node(tmp_path / "odd", "scr atch * [x]")
    out = _run(tmp_path / "odd", odd, covered_dirs(odd["scratch"]))
    assert "LEAK" not in out, out
    assert out.split() == ["mine", "own-sandbox-ok", "sandbox-writable", "tmp-writable"]


def test_covered_dirs() -> None:
    assert covered_dirs(Path("/tmp")) == ["/tmp", "/var/tmp", "/dev/shm"]
    assert covered_dirs(Path("/local/")) == ["/local", "/tmp", "/var/tmp", "/dev/shm"]
    assert covered_dirs(Path("/")) == ["/tmp", "/var/tmp", "/dev/shm"]


# -- the job's own PID namespace --------------------------------------------------------------
PS_PROBE = """
[ -e /proc/$OTHER_PID ] && echo LEAK-sees-pid
kill -0 $OTHER_PID 2>/dev/null && echo LEAK-can-signal
echo procs=$(ls -d /proc/[0-9]* | wc -l)
"""


def _job(tmp_path: Path, node: dict[str, Path], payload: str, pid: bool = True,
         **env: str) -> subprocess.Popen[str]:
    script = _script(tmp_path, node, covered_dirs(node["scratch"]), pid)
    return subprocess.Popen(["/bin/sh", str(script), "/bin/sh", "-c", payload],
                            env={"PATH": "/usr/bin:/bin", "_CONDOR_SCRATCH_DIR":
                                 str(node["sandbox"]), **env},
                            cwd=node["sandbox"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("pid", [True, False], ids=["pid-namespace", "switched-off"])
def test_a_job_can_neither_see_nor_signal_another_jobs_process(
        tmp_path: Path, node: dict[str, Path], pid: bool) -> None:
    """Another job's process of the same account: invisible with the PID namespace;
    with it switched off the probe sees and could signal it (the test can fail)."""
    other = subprocess.Popen(["sleep", "60"])
    try:
        proc = _job(tmp_path, node, PS_PROBE, pid, OTHER_PID=str(other.pid))
        out, err = proc.communicate(timeout=30)
    finally:
        other.kill()
        other.wait()
    assert proc.returncode == 0, err
    if pid:
        assert "LEAK" not in out and "procs=" in out, out
        assert int(out.split("procs=")[1].split()[0]) <= 5, out  # its own few processes
    else:
        assert "LEAK-sees-pid" in out and "LEAK-can-signal" in out, out


def test_the_payloads_exit_status_passes_through(tmp_path: Path,
                                                 node: dict[str, Path]) -> None:
    proc = _job(tmp_path, node, "echo out; exit 3")
    out, _ = proc.communicate(timeout=30)
    assert (proc.returncode, out) == (3, "out\n")


def _started(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    assert proc.stdout.readline() == "started\n"


def test_a_soft_kill_reaches_the_payload(tmp_path: Path, node: dict[str, Path]) -> None:
    """HTCondor signals the wrapper (the job's top process): the payload's handler runs."""
    proc = _job(tmp_path, node, 'trap "echo got-TERM; exit 7" TERM; echo started; '
                                "sleep 60 & wait")
    _started(proc)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=15)
    assert (proc.returncode, out) == (7, "got-TERM\n")


def test_a_payload_killed_by_a_signal_ends_the_wrapper_by_it(tmp_path: Path,
                                                             node: dict[str, Path]) -> None:
    proc = _job(tmp_path, node, "echo started; exec sleep 60")
    _started(proc)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=15)
    assert proc.returncode == -signal.SIGTERM


# -- an executable that cannot be run ----------------------------------------------------------
def _start(tmp_path: Path, node: dict[str, Path], *command: str
           ) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The wrapper started by HTCondor's starter: its error file named in the
    environment (in the sandbox, where the starter looks for it), not there yet."""
    script = _script(tmp_path, node, covered_dirs(node["scratch"]))
    error_file = node["sandbox"] / ".job_wrapper_failure"
    proc = subprocess.run(["/bin/sh", str(script), *command],
                          env={"PATH": "/usr/bin:/bin", "_CONDOR_SCRATCH_DIR":
                               str(node["sandbox"]), "_CONDOR_WRAPPER_ERROR_FILE":
                               str(error_file)},
                          cwd=node["sandbox"], capture_output=True, text=True, timeout=30)
    return proc, error_file


def test_a_missing_executable_is_reported_in_the_error_file_naming_it(
        tmp_path: Path, node: dict[str, Path]) -> None:
    """transfer_executable = false and the file is not on the worker: the starter
    reads the error file and fails the start with the message (the job is held for
    it); without it the job would just end with exit status 127."""
    gone = tmp_path / "home" / "alice" / "gone.sh"
    proc, error_file = _start(tmp_path, node, str(gone), "arg")
    assert proc.returncode == 127, proc
    assert error_file.read_text() == f"executable {gone} does not exist on this worker node\n"
    assert f"job-wrapper: executable {gone} does not exist" in proc.stderr


def test_an_executable_the_namespaces_hide_does_not_exist_for_the_job(
        tmp_path: Path, node: dict[str, Path]) -> None:
    """Checked where the exec happens: a program in a directory the wrapper hides
    exists on the node but not for the job."""
    hidden = node["own"] / PRIVATE_DIRS[0] / "run.sh"
    hidden.write_text("#!/bin/sh\necho ran\n")
    hidden.chmod(0o755)
    proc, error_file = _start(tmp_path, node, str(hidden))
    assert (proc.returncode, proc.stdout) == (127, ""), proc
    assert error_file.read_text() == f"executable {hidden} does not exist on this worker node\n"


def test_a_directory_or_a_file_without_execute_permission_is_reported(
        tmp_path: Path, node: dict[str, Path]) -> None:
    plain = node["sandbox"] / "job.sh"
    plain.write_text("#!/bin/sh\necho ran\n")
    plain.chmod(0o644)
    proc, error_file = _start(tmp_path, node, str(plain))
    assert (proc.returncode, proc.stdout) == (126, ""), proc
    assert error_file.read_text() == (f"executable {plain} is not executable by the user "
                                      "the job runs as\n")
    error_file.unlink()
    directory = node["sandbox"] / "bin"
    directory.mkdir()
    proc, error_file = _start(tmp_path, node, str(directory))
    assert proc.returncode == 126, proc
    assert error_file.read_text() == f"executable {directory} is a directory\n"


def test_a_payload_that_starts_leaves_no_error_file_whatever_its_exit_status(
        tmp_path: Path, node: dict[str, Path]) -> None:
    """Only a start that fails is the wrapper's failure: the payload's own 127 is its
    exit status, and the payload sees its arguments and name as before."""
    proc, error_file = _start(tmp_path, node, "/bin/sh", "-c", 'echo "$0 $1"; exit 127',
                              "me", "a b")
    assert (proc.returncode, proc.stdout) == (127, "me a b\n"), proc
    assert not error_file.exists()
    script = node["sandbox"] / "job.sh"
    script.write_text("#!/bin/sh\necho \"ran $*\"\n")
    script.chmod(0o755)
    proc, error_file = _start(tmp_path, node, str(script), "x")
    assert (proc.returncode, proc.stdout) == (0, "ran x\n"), proc
    assert not error_file.exists()
