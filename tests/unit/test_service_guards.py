"""Guards at start: private secret files, one service per provisioner id."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provisioner.config import parse_config
from provisioner.service.lock import AlreadyRunning, ServiceLock
from provisioner.service.secrets import check_secret_files

SITE = """
  - name: gsi
    max_walltime_s: 7200
    template: gsi.sh.j2
    image: /i.sif
    pilot: {{cpus: 4, memory_mb: 8000, walltime_s: 3600}}
    executor: {{type: ssh, host: gsi-login, user: pilot, key_file: {key}, known_hosts: /k}}
"""


def config(tmp_path: Path, mode: int = 0o600) -> tuple[object, Path, Path]:
    token, key = tmp_path / "token", tmp_path / "key"
    for f in (token, key):
        f.write_text("secret")
        f.chmod(mode)
    text = f"pool: {{token_file: {token}}}\nsites:{SITE.format(key=key)}"
    return parse_config(text), token, key


def test_private_secret_files_pass(tmp_path: Path) -> None:
    cfg, _, _ = config(tmp_path)
    assert check_secret_files(cfg, uid=os.geteuid()) == []  # type: ignore[arg-type]


def test_secret_files_readable_by_others_are_refused_by_name(tmp_path: Path) -> None:
    cfg, token, key = config(tmp_path, 0o644)
    problems = check_secret_files(cfg, uid=os.geteuid())  # type: ignore[arg-type]
    assert any(f"pool.token_file: {token} has mode 0644" in p for p in problems)
    assert any(f"sites[0].executor.key_file: {key} has mode 0644" in p for p in problems)


def test_secret_file_of_another_account_or_missing_is_refused(tmp_path: Path) -> None:
    cfg, token, _ = config(tmp_path)
    problems = check_secret_files(cfg, uid=os.geteuid() + 4242)  # type: ignore[arg-type]
    assert any("not by the service's account" in p for p in problems)
    token.unlink()
    assert any("No such file" in p for p in check_secret_files(cfg))  # type: ignore[arg-type]


def test_second_service_is_refused_naming_lock_and_holder(tmp_path: Path) -> None:
    first = ServiceLock(tmp_path / "t.lock")
    first.acquire()
    with pytest.raises(AlreadyRunning, match=f"{tmp_path}/t.lock .pid {os.getpid()}"):
        ServiceLock(tmp_path / "t.lock").acquire()
    first.release()
    ServiceLock(tmp_path / "t.lock").acquire()


def test_lock_of_a_killed_holder_never_blocks(tmp_path: Path) -> None:
    path = tmp_path / "t.lock"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, sys.argv[2])\n"
        "from provisioner.service.lock import ServiceLock\n"
        "ServiceLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(60)"),
        str(path), str(Path(__file__).resolve().parents[2])], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    with pytest.raises(AlreadyRunning):
        ServiceLock(path).acquire()
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    time.sleep(0.05)
    ServiceLock(path).acquire()  # the file is still there; the lock is not
    assert path.exists()
