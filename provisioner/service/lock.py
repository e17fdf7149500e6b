"""One running service per provisioner id on a host: an exclusive `flock`.

The kernel drops the lock when the holder exits however it exits (kill -9
included), so a stale lock file never blocks a restart. Two services on
different hosts are not covered by this lock: run one per provisioner id.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class AlreadyRunning(Exception):
    """Another process holds the lock; the message names the file and its pid."""


class ServiceLock:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise AlreadyRunning; records this process's pid in the file."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise AlreadyRunning(f"another provisioner service holds {self.path} "
                                 f"(pid {holder}); stop it first") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def lock_path(journal: str, provisioner_id: str) -> Path:
    """Next to the journal when there is one, else in the temporary directory."""
    if journal:
        return Path(journal).parent / f"{provisioner_id}.lock"
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"provisioner-{provisioner_id}.lock"
