"""What earlier pilots of the account left on this node: their work directories.

A pilot killed outright (a node crash, an OOM kill, SIGKILL at the walltime) cannot
remove its work directory, which holds its token and its jobs' sandboxes. The next
pilot of the same account and site on the node removes the directories of pilots
SLURM no longer lists (``squeue --me``); if SLURM cannot be asked, it removes nothing.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger("provisioner.pilot")


def live_job_ids(env: dict[str, str], timeout_s: float = 30.0) -> set[str] | None:
    """The account's jobs SLURM lists at this site; None when squeue fails."""
    try:
        proc = subprocess.run(["squeue", "--me", "--noheader", "--format=%i"],
                              capture_output=True, text=True, env=env, timeout=timeout_s,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("left-over pilot directories kept: squeue failed: %s", exc)
        return None
    if proc.returncode != 0:
        log.warning("left-over pilot directories kept: squeue failed: %s",
                    " ".join(proc.stderr.split()))
        return None
    return {line.strip().split("_")[0] for line in proc.stdout.splitlines() if line.strip()}


def remove_stale(scratch: Path, site: str, own_job: str, live: set[str]) -> list[str]:
    """Remove this account's ``pilot-<site>-<job>`` directories in `scratch` whose job
    is not `own_job` and not in `live`; returns the names removed."""
    pattern = re.compile(rf"^pilot-{re.escape(site)}-([0-9]+)$")
    removed = []
    try:
        entries = list(os.scandir(scratch))
    except OSError:
        return removed
    for entry in entries:
        found = pattern.match(entry.name)
        if not found or found.group(1) == own_job or found.group(1) in live:
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(
                    follow_symlinks=False).st_uid != os.getuid():
                continue
        except OSError:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        log.info("removed %s, left by pilot %s that SLURM no longer lists", entry.path,
                 found.group(1))
        removed.append(entry.name)
    return removed
