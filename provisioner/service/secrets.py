"""Secret files (the pool token, the pilots' signing key, SSH keys) must be private to
the service.

A token or key readable by others lets anyone act as the provisioner: the
service refuses to start with one, naming the file and its mode.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from provisioner.config import Config, SshExecutorConfig


def secret_files(config: Config) -> list[tuple[str, str]]:
    """(what, path) of every secret the configuration names."""
    out = [("pool.token_file", config.pool.token_file)] if config.pool.token_file else []
    for i, site in enumerate(config.sites):
        executor = getattr(site, "executor", None)
        if isinstance(executor, SshExecutorConfig):
            out.append((f"sites[{i}].executor.key_file", executor.key_file))
    return out


def check_secret_files(config: Config, uid: int | None = None) -> list[str]:
    """One problem per unusable secret file: missing, not a file, readable or
    writable by group or others, or owned by another account (root may use any)."""
    uid = os.geteuid() if uid is None else uid
    problems = []
    for what, path in secret_files(config):
        try:
            st = Path(path).stat()
        except OSError as exc:
            problems.append(f"{what}: {path}: {exc.strerror or exc}")
            continue
        if not stat.S_ISREG(st.st_mode):
            problems.append(f"{what}: {path} is not a regular file")
            continue
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            problems.append(f"{what}: {path} has mode {mode:04o}, must not be readable or "
                            f"writable by group or others (chmod 600 {path})")
        if uid != 0 and st.st_uid != uid:
            problems.append(f"{what}: {path} is owned by uid {st.st_uid}, not by the "
                            f"service's account (uid {uid})")
    # The pilots' signing key: a missing one stops submissions only (status names it);
    # one others can read may have been copied: refused, to be rotated.
    key = config.pilot_tokens.signing_key
    with contextlib.suppress(OSError):
        mode = stat.S_IMODE(Path(key).stat().st_mode)
        if mode & 0o077:
            problems.append(f"pilot_tokens.signing_key: {key} has mode {mode:04o}: whoever "
                            f"could read it can mint pilots; rotate it (docs/security.md) "
                            f"and chmod 600 the new one")
    return problems
