"""Integration tests run inside the testbed (deploy/testbed), against real daemons.

They are started by `make integration` through `testbed exec`. Outside the
testbed they fail at once with the command to use: they never skip.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

# The tests' own reads through the bindings use the provisioner's read-only
# token, as the service does. (Root on the central manager could otherwise mint
# itself a token from the pool's signing key, "condor@password", which the pool
# rightly does not authorise.)
os.environ.setdefault("_CONDOR_SEC_CLIENT_AUTHENTICATION_METHODS", "IDTOKENS")
os.environ.setdefault("_CONDOR_SEC_TOKEN_DIRECTORY", "/etc/provisioner/tokens.d")

TESTBED_MARK = Path("/etc/testbed-rootfs-key")
REPO = Path("/src")
SITES = ("gsi", "frankfurt")


def run(
    argv: Sequence[str],
    user: str | None = None,
    env: dict[str, str] | None = None,
    check: bool = True,
    timeout: float = 120,
    cwd: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run argv (as `user` when given) and return the completed process."""
    full_env = {"PATH": "/opt/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    if user:
        full_env["HOME"] = f"/home/{user}"
        full_env["USER"] = user
        pairs = [f"{k}={v}" for k, v in {**full_env, **(env or {})}.items()]
        argv = ["runuser", "-u", user, "--", "env", *pairs, *argv]
    else:
        full_env.update(env or {})
    proc = subprocess.run(list(argv), env=full_env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}\n"
                             f"stdout: {proc.stdout}\nstderr: {proc.stderr}")
    return proc


def slurm_env(site: str) -> dict[str, str]:
    return {"SLURM_CONF": f"/etc/slurm-{site}/slurm.conf"}


@pytest.fixture(scope="session", autouse=True)
def testbed() -> None:
    """Fail loudly unless running inside a healthy testbed."""
    if not TESTBED_MARK.exists():
        pytest.fail("not inside the testbed: run `make integration` (or `deploy/testbed/"
                    "testbed exec -- pytest /src/tests/integration`)", pytrace=False)
    proc = subprocess.run(["/src/deploy/testbed/inside/wait-healthy.sh"], capture_output=True,
                          text=True, env={**os.environ, "TESTBED_UP_TIMEOUT": "120"},
                          check=False)
    if proc.returncode != 0:
        pytest.fail(f"the testbed is not healthy:\n{proc.stderr}", pytrace=False)
