"""The pilot wrapper leaves its end record on every way out, naming how it ended.

`main()` runs for real in this process (signals included); only the container is a
fake: a stand-in for spython's Client whose `condor_master` run is a script of what
happens while it runs (a signal from SLURM or the provisioner, a failure, a clean
end)."""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioner.pilot import wrapper


class MasterFailed(Exception):
    returncode = 3


class FakeClient:
    """spython.main.Client: `execute(stream=True)` runs `master`; the pilot's own
    condor_drain (`return_result=True`) succeeds (the startd was idle)."""

    quiet = True
    master: Callable[[], None] = staticmethod(lambda: None)
    drains: list[list[str]] = []

    @classmethod
    def execute(cls, image: str, argv: list[str], stream: bool = False,
                return_result: bool = False, **_kw: Any) -> Any:
        if return_result:
            cls.drains.append(argv)
            return {"return_code": 0, "message": ""}
        return cls._stream()

    @classmethod
    def _stream(cls) -> Iterator[str]:
        yield "master starting\n"
        cls.master()
        yield "master done\n"


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A worker node: the batch script's environment, its files, a fake container;
    the signal handlers main() installs are put back afterwards."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT,
                                                  signal.SIGUSR1)}
    payload = base64.urlsafe_b64encode(json.dumps(
        {"sub": "pilot-gsi-0123456789ab@t", "jti": "ab" * 16}).encode()).decode().rstrip("=")
    read, write = os.pipe()
    os.write(write, f"aGVhZA.{payload}.c2ln\n".encode())
    os.close(write)
    (tmp_path / "pilot.conf").write_text("# pilot\n")
    for key in [k for k in os.environ if k.startswith(("PILOT_", "SLURM_"))]:
        monkeypatch.delenv(key)
    env = {
        "PILOT_SITE": "gsi", "PILOT_PROVISIONER_ID": "prov1", "PILOT_COLLECTOR": "cm:9618",
        "PILOT_UID_DOMAIN": "t", "PILOT_IMAGE": "/i.sif",
        "PILOT_TOKEN_FD": str(read),
        "PILOT_CONDOR_CONFIG": str(tmp_path / "pilot.conf"),
        "PILOT_WALLTIME_S": "3600", "PILOT_SHUTDOWN_MARGIN_S": "120",
        "PILOT_START_DELAY_MAX_S": "0", "PILOT_SCRATCH": str(tmp_path / "scratch"),
        "PILOT_LOG_DIR": str(tmp_path / "logs"), "SLURM_JOB_ID": "42",
        "SLURM_CPUS_ON_NODE": "4",
        "SLURM_JOB_END_TIME": str(int(time.time()) + 3600),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    spython = types.ModuleType("spython")
    main = types.ModuleType("spython.main")
    main.Client = FakeClient  # type: ignore[attr-defined]
    spython.main = main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "spython", spython)
    monkeypatch.setitem(sys.modules, "spython.main", main)
    monkeypatch.setattr(FakeClient, "master", staticmethod(lambda: None))
    monkeypatch.setattr(FakeClient, "drains", [])
    monkeypatch.chdir(tmp_path)  # the pilot changes into its work directory
    try:
        yield tmp_path
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def end_record(node: Path) -> dict[str, Any]:
    files = sorted((node / "logs" / "end").iterdir())
    assert [f.name for f in files] == ["gsi-42.json"]
    doc = json.loads(files[0].read_text())
    assert (doc["job_id"], doc["site"], doc["provisioner_id"], doc["cores"]) == \
        ("42", "gsi", "prov1", 4)
    assert 0 < doc["start"] <= doc["end"] <= time.time()
    assert "TOKEN" not in files[0].read_text()
    return doc


def master_gets(sig: int) -> Callable[[], None]:
    return lambda: os.kill(os.getpid(), sig)


def test_released_while_idle(node: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(FakeClient, "master", staticmethod(master_gets(signal.SIGUSR1)))
    assert wrapper.main() == 0
    assert FakeClient.drains and FakeClient.drains[0][0] == "condor_drain"
    assert end_record(node)["reason"] == "released"


def test_slurm_warning_signal_near_the_walltime_end(node: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # SLURM sends TERM shutdown_margin_s (120 s) before the end: here 100 s before it.
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(int(time.time()) + 100))
    monkeypatch.setattr(FakeClient, "master", staticmethod(master_gets(signal.SIGTERM)))
    assert wrapper.main() == 0
    assert end_record(node)["reason"] == "walltime-drain"


def test_terminated_long_before_the_walltime_end(node: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(FakeClient, "master", staticmethod(master_gets(signal.SIGTERM)))
    assert wrapper.main() == 0
    assert end_record(node)["reason"] == "terminated"


def test_master_ends_by_itself_before_the_stop_time(node: Path) -> None:
    assert wrapper.main() == 0
    assert end_record(node)["reason"] == "noclaim-shutdown"


def test_master_ends_by_itself_after_the_stop_time(node: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(int(time.time()) + 60))
    assert wrapper.main() == 0
    assert end_record(node)["reason"] == "walltime-drain"


def test_master_failed(node: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail() -> None:
        raise MasterFailed("container exited 3")

    monkeypatch.setattr(FakeClient, "master", staticmethod(fail))
    assert wrapper.main() == 3
    assert end_record(node)["reason"] == "master-failed"


@pytest.mark.parametrize(("sig", "reason"), [(signal.SIGUSR1, "released-before-start"),
                                             (signal.SIGTERM, "terminated-before-start")])
def test_signalled_during_the_start_delay(node: Path, monkeypatch: pytest.MonkeyPatch,
                                          sig: int, reason: str) -> None:
    monkeypatch.setenv("PILOT_START_DELAY_MAX_S", "3600")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    real_sleep = time.sleep
    monkeypatch.setattr(wrapper.time, "sleep", lambda s: (os.kill(os.getpid(), sig),
                                                          real_sleep(0.01)))
    assert wrapper.main() == 0
    assert end_record(node)["reason"] == reason
    assert not (node / "scratch").exists()  # it never prepared its work directory


def test_prepare_failed(node: Path) -> None:
    (node / "pilot.conf").unlink()
    assert wrapper.main() == 2
    assert end_record(node)["reason"] == "prepare-failed"


def test_bad_environment(node: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PILOT_COLLECTOR")
    assert wrapper.main() == 2
    assert end_record(node)["reason"] == "bad-environment"


def test_an_unexpected_error_still_leaves_a_record(node: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(_params: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(wrapper, "prepare", broken)
    with pytest.raises(RuntimeError, match="bug"):
        wrapper.main()
    assert end_record(node)["reason"] == "wrapper-error"


def test_no_log_directory_no_record_and_the_same_exit(node: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PILOT_LOG_DIR", "")
    assert wrapper.main() == 0
    assert not (node / "logs").exists()
