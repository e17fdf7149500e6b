"""`provisioner site check [NAME...] [--json] [--no-probe]`: is each site usable?

Per site, in order (a failed step skips those that need it): SSH (login host
resolves, key and known_hosts files, host key known, host reachable, host key
matches, key accepted, the pilot account, the remote commands), SLURM (partition,
MaxTime, account, a node that fits the pilot, pilot shape: provisioner.onboard.fit;
``sbatch --test-only`` with the rendered batch script and the real options), the
image on the login node, then the probe pilot (provisioner.onboard.probe). Every
remote command is an argv list through the site's Executor.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from provisioner.config import Config, SiteConfig, SshExecutorConfig
from provisioner.errors import BackendError
from provisioner.onboard.discover import slurm_env
from provisioner.onboard.table import Check, failed, passed, skipped, warned
from provisioner.pilot.script import TemplateError, render_pilot_script
from provisioner.service.secrets import check_secret_files
from provisioner.sites import make_executor
from provisioner.sites.base import PilotRequest
from provisioner.sites.executor import Executor, SshExecutor
from provisioner.sites.slurm_cli import SlurmCliBackend

#: What the service runs on a login node (slurm_cli: sbatch, squeue, scancel, head,
#: find) and what this check uses there (scontrol, stat; and test, id).
REMOTE_COMMANDS = ("sbatch", "squeue", "scancel", "scontrol", "head", "find", "stat")
_HOST_KEY = re.compile(r"host key|host identification", re.I)
_KEY_REFUSED = re.compile(r"refused for key|Permission denied", re.I)


def ssh_file_checks(index: int, config: Config, ex: SshExecutorConfig) -> list[Check]:
    f = f"sites[{index}].executor"
    rows = []
    try:
        socket.getaddrinfo(ex.host, ex.port)
        rows.append(passed("login host resolves", ex.host, "ssh"))
    except OSError as exc:
        rows.append(failed("login host resolves", f"{ex.host}: {exc.strerror or exc}",
                           f"correct {f}.host (or its DNS entry)", "ssh"))
    key_problems = [p for p in check_secret_files(config) if p.startswith(f"{f}.key_file")]
    rows.append(failed("SSH key file", "; ".join(key_problems), f"fix {f}.key_file as said",
                       "ssh") if key_problems else
                passed("SSH key file", f"{ex.key_file} (private)", "ssh"))
    entry = ex.host if ex.port == 22 else f"[{ex.host}]:{ex.port}"
    known = Path(ex.known_hosts).is_file() and shutil.which("ssh-keygen") and \
        subprocess.run(["ssh-keygen", "-F", entry, "-f", ex.known_hosts],
                       capture_output=True, check=False).returncode == 0
    rows.append(passed("host key known", f"{entry} in {ex.known_hosts}", "ssh") if known else
                failed("host key known", f"no key of {entry} in {ex.known_hosts}",
                       f"ssh-keyscan -p {ex.port} {ex.host} > /tmp/{ex.host}.keys; check its "
                       f"fingerprint (ssh-keygen -lf) with the site; append it to "
                       f"{ex.known_hosts} ({f}.known_hosts)", "ssh"))
    return rows


def login_checks(index: int, site: SiteConfig, executor: Executor) -> list[Check]:
    """Connect (reachable, host key, key) and who we are there; Unreachable -> rows."""
    f = f"sites[{index}].executor"
    names = ("host reachable", "host key matches", "key accepted")
    t0 = time.monotonic()
    try:
        result = executor.run(["id", "-un"], {"PATH": "/usr/bin:/bin"})
    except BackendError as exc:
        text = str(exc)
        if _HOST_KEY.search(text):
            at = 1
            fix = f"the login node's key differs from {f}.known_hosts: ask the site"
        elif _KEY_REFUSED.search(text):
            at = 2
            fix = f"ask the site to add the public key of {f}.key_file to the account's " \
                  "authorized_keys (prefixed with `restrict`)"
        else:
            at = 0
            fix = f"check {f}.host/port and that this host may reach it"
        rows = [passed(n, "yes", "ssh") for n in names[:at]]
        rows.append(failed(names[at], text, fix, "ssh", time.monotonic() - t0))
        return rows + [skipped(n, "earlier step failed", "ssh") for n in names[at + 1:]]
    took = time.monotonic() - t0
    rows = [passed(n, "yes", "ssh") for n in names[:2]]
    rows.append(passed("key accepted", "logged in", "ssh", took))
    return [*rows, account_check(index, site, result.returncode, result.stdout)]


def account_check(index: int, site: SiteConfig, rc: int, stdout: str) -> Check:
    ex = site.executor
    want = ex.user if isinstance(ex, SshExecutorConfig) else ex.run_as
    got = stdout.strip()
    if rc != 0 or (want and got != want):
        field = "user" if isinstance(ex, SshExecutorConfig) else "run_as"
        return failed("pilot account", f"commands run as {got or '?'}, not {want}",
                      f"set sites[{index}].executor.{field}", "ssh")
    return passed("pilot account", got, "ssh")


def commands_check(executor: Executor) -> Check:
    """Each command the service runs there answers `--version` (no shell is asked for:
    a forced-command gate allows exactly these)."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    missing = [c for c in REMOTE_COMMANDS
               if executor.run([c, "--version"], env).returncode != 0]
    if missing:
        return failed("remote commands", f"missing or refused: {' '.join(missing)}",
                      "install the SLURM client commands on the login node (and allow "
                      "`--version` in its forced-command gate)", "ssh")
    return passed("remote commands", " ".join(REMOTE_COMMANDS), "ssh")


#: A command the service never runs: if it runs, the key is not behind a gate.
GATE_PROBE = ("echo", "provisioner-gate-probe")


def gate_check(executor: Executor) -> Check:
    """Whether the SSH key runs anything (a warning: a key that runs any command is the
    pilot account at the site for whoever takes it; deploy/site-gate/ narrows it)."""
    result = executor.run(list(GATE_PROBE), {"PATH": "/usr/bin:/bin"})
    if result.returncode == 0 and result.stdout.strip() == GATE_PROBE[1]:
        return warned("key restricted", "the key runs any command as the pilot account "
                      "(a shell, `cat`, anything)", "have the site install "
                      "deploy/site-gate/provisioner-gate as the key's forced command "
                      "(docs/security.md)", "ssh")
    return passed("key restricted", "an arbitrary command is refused: "
                  + (" ".join(result.stderr.split())[:120] or f"exit {result.returncode}"),
                  "ssh")


_SBATCH_FIXES = (
    (re.compile(r"account", re.I), "sites[{i}].account"),
    (re.compile(r"qos", re.I), "sites[{i}].qos"),
    (re.compile(r"partition", re.I), "sites[{i}].partition"),
    (re.compile(r"time limit", re.I), "sites[{i}].pilot.walltime_s"),
    (re.compile(r"node configuration|memory|cpu|gres|gpu", re.I),
     "sites[{i}].pilot (cpus, memory_mb, gpus)"),
)


def sbatch_check(index: int, config: Config, site: SiteConfig,
                 backend: SlurmCliBackend) -> Check:
    """``sbatch --test-only`` of a full-size pilot: SLURM's own verdict, no job made."""
    name = "sbatch --test-only"
    try:
        script = render_pilot_script(config, site, site.pilot.walltime_s, site.pilot.gpus)
    except (TemplateError, OSError, ValueError) as exc:
        return failed(name, f"the batch script does not render: {exc}",
                      f"fix sites[{index}].template", "slurm")
    request = PilotRequest(cpus=site.pilot.cpus, memory_mb=site.pilot.memory_mb,
                           walltime_s=site.pilot.walltime_s, gpus=site.pilot.gpus,
                           shutdown_margin_s=site.pilot.shutdown_margin_s, script=script)
    argv = backend.sbatch_argv(request)
    argv.insert(1, "--test-only")
    result = backend.executor.run(argv, slurm_env(site.slurm_conf), stdin=script)
    text = " ".join((result.stderr or result.stdout).split())
    if result.returncode == 0:
        return passed(name, text.removeprefix("sbatch: ") or "accepted", "slurm")
    field = next((f.format(i=index) for p, f in _SBATCH_FIXES if p.search(text)),
                 f"sites[{index}]")
    return failed(name, text or f"exit {result.returncode}",
                  f"SLURM refuses the pilot: check {field}", "slurm")


def image_check(index: int, site: SiteConfig, executor: Executor) -> Check:
    """The image is a readable file (or directory) on the login node, for the account."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    stat = executor.run(["stat", "-L", "-c", "%F, %s bytes, owner %U, mode %a", "--",
                         site.image], env)
    readable = executor.run(["test", "-r", site.image], env).returncode == 0
    fix = f"publish the pilot image at sites[{index}].image ({site.image}), readable " \
          "by the pilot account on the login and worker nodes"
    if stat.returncode != 0:
        return failed("image on the login node", " ".join(stat.stderr.split())
                      or f"no {site.image}", fix, "image")
    if not readable:
        return failed("image on the login node", f"{site.image}: {stat.stdout.strip()}, "
                      "not readable by the account", fix, "image")
    return passed("image on the login node", f"{site.image}: {stat.stdout.strip()}", "image")


def site_executor(site: SiteConfig, control_dir: str) -> Executor:
    """The site's executor, with SSH sockets in a private directory of this run."""
    executor = make_executor(site.name, site.executor)
    if isinstance(executor, SshExecutor):
        executor = replace(executor, control_dir=control_dir, control_persist_s=60)
    return executor


def private_dir() -> str:
    return tempfile.mkdtemp(prefix="pc-")  # short: a socket path has ~107 bytes
