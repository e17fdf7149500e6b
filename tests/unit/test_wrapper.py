"""The pilot wrapper's pure parts: what it copies back from the node."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from provisioner.pilot import wrapper
from provisioner.pilot.params import params_from_env
from provisioner.pilot.procs import descendants, has_ended, process_table
from provisioner.pilot.wrapper import PilotRun

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
    PilotRun(params, workdir, workdir / "condor_config").copy_logs()
    copied = sorted(p.name for p in (tmp_path / "logs" / params.name).iterdir())
    assert copied == ["StartLog"]


def test_pilot_daemons_write_no_core_files() -> None:
    conf = (Path(__file__).parents[2] / "condor_config" / "pilot.conf").read_text()
    assert "\nCREATE_CORE_FILES = False\n" in conf


# -- a container that outlives its master -------------------------------------------
def _node_proc(tmp_path: Path, procs: dict[int, tuple[str, str, int]]) -> Path:
    for pid, (name, state, ppid) in procs.items():
        (tmp_path / str(pid)).mkdir(parents=True)
        (tmp_path / str(pid) / "stat").write_text(f"{pid} ({name}) {state} {ppid} {pid} 0\n")
    return tmp_path


def test_descendants_and_ended_processes_from_proc(tmp_path: Path) -> None:
    proc = _node_proc(tmp_path, {
        10: ("python3", "S", 1), 11: ("starter) (x", "S", 10), 12: ("condor_master", "Z", 11),
        13: ("squashfuse_ll", "S", 11), 14: ("sleep", "S", 13), 20: ("other", "S", 1)})
    table = process_table(proc)
    assert descendants(10, table) == [11, 12, 13, 14]
    assert descendants(20, table) == []
    assert has_ended(12, proc)  # a zombie has ended
    assert has_ended(99, proc)  # gone
    assert not has_ended(13, proc)


class _Node:
    """A real process tree standing in for the batch shell: a shell (the root) runs a
    "master" (sleep MASTER_S, its pid in the pidfile) and a process that outlives it."""

    def __init__(self, tmp_path: Path, master_s: float) -> None:
        self.pilot = PilotRun(params_from_env(ENV, 0.0), tmp_path / "work", tmp_path / "cfg")
        self.pilot.pidfile.parent.mkdir(parents=True)
        self.shell = subprocess.Popen(
            ["sh", "-c", f'sleep {master_s} & echo $! > "$1"; sleep 60 & wait', "node",
             str(self.pilot.pidfile)])
        self.pilot.root = self.shell.pid
        self.thread = threading.Thread(target=self.pilot.watch_container, daemon=True)

    def close(self) -> None:
        self.pilot.ended.set()
        self.thread.join(10)
        for pid in descendants(self.shell.pid, process_table()):
            os.kill(pid, signal.SIGKILL)
        self.shell.wait(10)


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wrapper, "MASTER_POLL_S", 0.05)
    monkeypatch.setattr(wrapper, "CONTAINER_LINGER_S", 0.5)


def test_what_outlives_the_master_is_ended_so_the_batch_job_ends(
        tmp_path: Path, quick: None, caplog: pytest.LogCaptureFixture) -> None:
    node = _Node(tmp_path, master_s=0.5)
    try:
        node.thread.start()
        # the leftover is killed: the shell's `wait` returns and the "batch job" ends
        assert node.shell.wait(10) == 0
        assert node.pilot.cleared
        assert "its container is still there" in caplog.text and "sleep" in caplog.text
    finally:
        node.close()


def test_a_container_that_ends_with_its_master_is_left_alone(
        tmp_path: Path, quick: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wrapper, "CONTAINER_LINGER_S", 30.0)
    node = _Node(tmp_path, master_s=0.3)
    try:
        node.thread.start()
        time.sleep(1.0)  # the master has ended; the container ends within the linger
        node.pilot.ended.set()
        node.thread.join(5)
        assert not node.thread.is_alive()
        assert node.pilot.cleared == [] and node.shell.poll() is None
    finally:
        node.close()


def test_a_master_pid_not_below_the_batch_shell_is_not_watched(
        tmp_path: Path, quick: None) -> None:
    # e.g. a pid from inside a PID namespace: its "end" must never end a live pilot
    node = _Node(tmp_path, master_s=0.3)
    try:
        while not (node.pilot.pidfile.exists() and node.pilot.pidfile.read_text().strip()):
            time.sleep(0.01)
        node.pilot.pidfile.write_text(f"{os.getpid()}\n")
        node.thread.start()
        node.thread.join(5)
        assert not node.thread.is_alive()
        time.sleep(1.0)
        assert node.pilot.cleared == [] and node.shell.poll() is None
    finally:
        node.close()
