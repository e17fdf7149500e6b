"""The shell scripts a pilot puts in its work directory for its startd.

All are package data (``provisioner/pilot/files/``), shell tested as shell: the job
wrapper (``USER_JOB_WRAPPER``: every payload in its own namespaces, the pilot's and
the node's private directories covered), the root:// file transfer plugin, and the
``STARTER`` that answers the startd's capability query from the node's record
(provisioner/pilot/testcache.py). The pilot writes them into its work directory with
the job wrapper's settings beside it: what to hide and cover, as data (one setting a
line), never as shell.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path

#: The work directory's names of the scripts, and the package files they come from.
JOB_WRAPPER = "job-wrapper.sh"
TRANSFER_PLUGIN = "xrootd-transfer"
STARTER = "starter"
SOURCES = {JOB_WRAPPER: "job_wrapper.sh", TRANSFER_PLUGIN: "xrootd_transfer.sh",
           STARTER: "starter.sh"}
#: Beside STARTER: the capability answer it gives (from the node's record), and the
#: one the real starter gave (for the record). Names fixed in starter.sh.
STARTER_CLASSAD = "starter-classad"
STARTER_CLASSAD_NEW = "starter-classad.new"
#: The job wrapper's settings, beside it (the name is fixed in job_wrapper.sh).
JOB_WRAPPER_SETTINGS = "job-wrapper.conf"

#: The pilot's private directories: its token, signing-key dir (empty) and FS
#: authentication dir. Payloads run as the same account, so the job wrapper hides
#: them.
PRIVATE_DIRS = ("tokens.d", "passwords.d", "fsauth")
#: Covered for every job besides the node's scratch directory.
SHARED_TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
#: The options the job wrapper gives unshare for the job's own PID namespace.
PID_NAMESPACE = "--pid --fork --mount-proc"


def source(name: str) -> str:
    """The text of the script the work directory names `name` (JOB_WRAPPER,
    TRANSFER_PLUGIN), from the installed package."""
    return (resources.files("provisioner.pilot") / "files" / SOURCES[name]).read_text()


def covered_dirs(scratch: Path) -> list[str]:
    """What the job wrapper covers: the scratch directory, then the shared
    temporary directories (each once; never "/")."""
    out: list[str] = []
    for d in (str(scratch), *SHARED_TMP_DIRS):
        d = d.rstrip("/") or "/"
        if d != "/" and d not in out:
            out.append(d)
    return out


def job_wrapper_settings(hide: Sequence[str], cover: Sequence[str],
                         pid_namespace: bool = True) -> str:
    """The job wrapper's settings file: `hide` private directories, `cover` shared
    ones; the PID namespace off only where a test says so. ValueError for a
    directory name the line format cannot hold (a newline)."""
    lines = [f"pid-namespace {'on' if pid_namespace else 'off'}",
             *(f"hide {d}" for d in hide), *(f"cover {d}" for d in cover)]
    for line in lines:
        if "\n" in line:
            raise ValueError(f"a directory name holds a line break: {line!r}")
    return "".join(f"{line}\n" for line in lines)


def install(workdir: Path, scratch: Path) -> None:
    """Write the scripts (executable) and the job wrapper's settings into the pilot's
    work directory; what the wrapper hides and covers follows from `workdir` and
    the node's `scratch`."""
    settings = job_wrapper_settings([str(workdir / d) for d in PRIVATE_DIRS],
                                    covered_dirs(scratch))
    (workdir / JOB_WRAPPER_SETTINGS).write_text(settings)
    for name in SOURCES:
        script = workdir / name
        script.write_text(source(name))
        script.chmod(0o755)
