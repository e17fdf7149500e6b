"""The job wrapper, run for real (user and mount namespaces of this machine): a job
sees its own sandbox and nothing else of the node's scratch, /tmp or /dev/shm; in
particular no pilot's token, its own pilot's or another's on the same node."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from provisioner.pilot.wrapper import JOB_WRAPPER, PRIVATE_DIRS, covered_dirs

PROBE = """
cat "$OTHER/tokens.d/pilot" 2>/dev/null && echo LEAK-other-token
cat "$OWN/tokens.d/pilot" 2>/dev/null && echo LEAK-own-token
cat "$NEIGHBOUR/marker" 2>/dev/null && echo LEAK-other-sandbox
cat /tmp/tmp-marker 2>/dev/null && echo LEAK-tmp
cat marker && echo own-sandbox-ok
echo written >new-file && echo sandbox-writable
touch /tmp/x && echo tmp-writable
"""


def _node(tmp_path: Path) -> dict[str, Path]:
    """Two pilots' work directories in one scratch directory, a job sandbox in each."""
    scratch = tmp_path / "scratch"
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


def _run(tmp_path: Path, node: dict[str, Path], cover: list[str]) -> str:
    script = tmp_path / "job-wrapper.sh"
    script.write_text(JOB_WRAPPER.format(
        hide=" ".join(shlex.quote(str(node["own"] / d)) for d in PRIVATE_DIRS),
        cover=" ".join(shlex.quote(d) for d in cover)))
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
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"],
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


def test_covered_dirs() -> None:
    assert covered_dirs(Path("/tmp")) == ["/tmp", "/var/tmp", "/dev/shm"]
    assert covered_dirs(Path("/local/")) == ["/local", "/tmp", "/var/tmp", "/dev/shm"]
    assert covered_dirs(Path("/")) == ["/tmp", "/var/tmp", "/dev/shm"]
