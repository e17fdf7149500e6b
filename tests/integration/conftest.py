"""Integration tests run inside the testbed (deploy/testbed), against real daemons.

They are started by `make integration` through `testbed exec`. Outside the
testbed they fail at once with the command to use: they never skip.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from provisioner.config import Config, load_config

# The tests' own reads through the bindings use the provisioner's read-only
# token, as the service does. (Root on the central manager could otherwise mint
# itself a token from the pool's signing key, "condor@password", which the pool
# rightly does not authorise.) HTCondor reads a token only from a file its
# reader owns: root's copy is in root's own token directory.
ROOT_TOKEN_DIR = "/root/.condor/tokens.d"
os.environ.setdefault("_CONDOR_SEC_CLIENT_AUTHENTICATION_METHODS", "IDTOKENS")
os.environ.setdefault("_CONDOR_SEC_TOKEN_DIRECTORY", ROOT_TOKEN_DIR)

TESTBED_MARK = Path("/etc/testbed-rootfs-key")
REPO = Path("/src")
SITES = ("gsi", "frankfurt")
#: The service's configuration in the testbed (the service runs as "provisioner").
CONFIG = "/src/deploy/testbed/provisioner.yaml"
ON = "/src/deploy/testbed/inside/on"


def _hosts() -> dict[str, tuple[str, str, str]]:
    """name -> (address, site, role) from the testbed's host table."""
    out = {}
    for line in (REPO / "deploy/testbed/etc/hosts.tsv").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, addr, site, role = line.split(None, 3)
            out[name] = (addr, site, role)
    return out


#: The testbed's hosts; the tests themselves run on "cm" (the submit host).
HOSTS = _hosts()
LOGIN = {site: next(h for h, (_, s, role) in HOSTS.items() if s == site and
                    role.startswith("login")) for site in SITES}
WORKERS = {site: [h for h, (_, s, role) in HOSTS.items() if s == site and
                  role.startswith("worker")] for site in SITES}


def split_startd(startd: str) -> tuple[str, str]:
    """A pilot startd's name -> (pilot name, host): "pilot-gsi-7@pilot-gsi-<serial>.gsi-n1"
    (the pilot's token identity before its host, provisioner.pilot.params) ->
    ("pilot-gsi-7", "gsi-n1")."""
    name, host = startd.split("@", 1)
    if host.startswith("pilot-") and "." in host:
        host = host.split(".", 1)[1]
    return name, host


def drop_output(host: str, rules: str | None, table: str = "testfault") -> None:
    """A nftables table of its own in testbed host `host`'s network namespace whose
    output chain applies `rules` (e.g. "ip daddr 10.10.0.10 drop"); None removes it."""
    text = f"table inet {table}\ndelete table inet {table}\n"
    if rules is not None:
        text += (f"table inet {table} {{\n chain output {{\n  type filter hook output "
                 f"priority 0; policy accept;\n  {rules}\n }}\n}}\n")
    subprocess.run(["ip", "netns", "exec", host, "nft", "-f", "-"], input=text, text=True,
                   check=True)


def pilot_processes(host: str) -> Iterator[int]:
    """Pids of the pilot account's processes on `host` (found by its network
    namespace): wrappers, containers, startds, starters and payloads."""
    want = os.stat(f"/run/netns/{host}")
    uid = pwd.getpwnam("pilot").pw_uid
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ns = os.stat(entry / "ns" / "net")
            owner = entry.stat().st_uid
        except OSError:
            continue
        if (ns.st_dev, ns.st_ino) == (want.st_dev, want.st_ino) and owner == uid:
            yield int(entry.name)


def pilot_process_count(host: str) -> int:
    return sum(1 for _ in pilot_processes(host))


def kill_pilot_processes(host: str) -> int:
    """kill -9 every process of the pilot account on `host`; how many there were."""
    killed = 0
    for pid in pilot_processes(host):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed


def run(
    argv: Sequence[str],
    user: str | None = None,
    env: dict[str, str] | None = None,
    check: bool = True,
    timeout: float = 120,
    cwd: str | None = None,
    host: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run argv (as `user` when given; on testbed `host` when given, else here on
    cm) and return the completed process."""
    full_env = {"PATH": "/opt/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    if user:
        full_env["HOME"] = f"/home/{user}"
        full_env["USER"] = user
        pairs = [f"{k}={v}" for k, v in {**full_env, **(env or {})}.items()]
        argv = ["runuser", "-u", user, "--", "env", *pairs, *argv]
    else:
        full_env.update(env or {})
    if host:
        argv = [ON, host, "--", *argv]
    proc = subprocess.run(list(argv), env=full_env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}\n"
                             f"stdout: {proc.stdout}\nstderr: {proc.stderr}")
    return proc


def service_config(path: str = CONFIG) -> Config:
    """The testbed's configuration for a provisioner run by the tests as root:
    the same, with root's copy of the provisioner token and a journal of its own
    in memory (a root-owned file in the service's journal directory would lock
    the real service out of it)."""
    config = load_config(path)
    pool = config.pool.model_copy(update={"token_file": f"{ROOT_TOKEN_DIR}/provisioner"})
    return config.model_copy(update={"pool": pool, "journal": "", "lock_file": ""})


def slurm_env(site: str) -> dict[str, str]:
    return {"SLURM_CONF": f"/etc/slurm-{site}/slurm.conf"}


def slurm(site: str, argv: Sequence[str], user: str | None = None, check: bool = True,
          timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """A SLURM command on the site's login node (the only host that reaches its
    controller, besides the site's own nodes)."""
    return run(argv, user=user, env=slurm_env(site), check=check, timeout=timeout,
               host=LOGIN[site])


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
