"""Where a backend's commands run: on this host, or on a site's login node over SSH.

An `Executor` runs one argv list with an environment and optional stdin and
returns its exit code and output; it raises `Unreachable` when the place the
command should run cannot be reached at all, `Transient` when the command did
not finish in time. A command that ran and failed is a normal result (the
backend classifies its message). No executor ever lets a shell on this host see
the argv; the SSH executor quotes every word for the remote shell.

Why OpenSSH's own client (ControlMaster) rather than an SSH library: it is what
site admins already trust and configure; it checks host keys against a
known_hosts file exactly as they do by hand; its multiplexing keeps one
authenticated connection per site that every command of every cycle reuses
(ControlPersist), and survives a restart of the service; and it adds no
dependency. The price is a subprocess per command (a few ms over a live master).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from provisioner.errors import Transient, Unreachable

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


class Executor(Protocol):
    """Contract: run `argv` (never through a local shell) with exactly `env` and
    `stdin`; return its result. Raises Unreachable (cannot get there) or Transient
    (timed out: the command may or may not have taken effect)."""

    def run(self, argv: Sequence[str], env: Mapping[str, str], stdin: str | None = None
            ) -> CommandResult: ...

    def close(self) -> None:
        """Release long-lived resources (connections). Idempotent."""
        ...


@dataclass
class LocalExecutor:
    """Runs commands on this host, optionally as another account (needs root)."""

    run_as: str | None = None
    timeout_s: float = 60.0
    calls: list[Sequence[str]] = field(default_factory=list, repr=False)

    def run(self, argv: Sequence[str], env: Mapping[str, str], stdin: str | None = None
            ) -> CommandResult:
        self.calls.append(list(argv))
        try:
            proc = subprocess.run(
                list(argv), input=stdin, capture_output=True, text=True,
                env=dict(env), timeout=self.timeout_s,
                user=self.run_as, group=self.run_as,
                extra_groups=[] if self.run_as else None,
                cwd="/" if self.run_as else None,
            )
        except subprocess.TimeoutExpired as exc:
            raise Transient(f"{argv[0]} timed out after {self.timeout_s:.0f} s") from exc
        except FileNotFoundError as exc:
            raise Unreachable(f"{argv[0]} not found: {exc}") from exc
        return CommandResult(proc.returncode, proc.stdout, proc.stderr)

    def close(self) -> None:
        return None


def remote_command(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """The one string the remote shell parses: `env NAME=value ... argv...`, every
    word quoted so that the remote shell sees each as one literal argument."""
    for name in env:
        if not _ENV_NAME.match(name):
            raise ValueError(f"not an environment variable name: {name!r}")
    return shlex.join(["env", *(f"{k}={v}" for k, v in env.items()), *argv])


#: ssh's own failures (exit 255), most specific first -> what to tell the admin.
_SSH_ERRORS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"REMOTE HOST IDENTIFICATION HAS CHANGED|Host key verification failed|"
                r"host key .* not known|No \S+ host key is known", re.I),
     "wrong or unknown host key of {host} (check known_hosts {known_hosts})"),
    (re.compile(r"Permission denied \(publickey", re.I),
     "login as {user}@{host} refused for key {key_file}"),
    (re.compile(r"Could not resolve hostname", re.I), "unknown host {host}"),
    (re.compile(r"Connection refused|No route to host|Network is unreachable|"
                r"Connection timed out|Operation timed out|Connection closed|"
                r"Connection reset|Broken pipe|timeout", re.I),
     "cannot connect to {host}:{port}"),
)


@dataclass
class SshExecutor:
    """Runs commands on a site's login node through OpenSSH: key authentication
    only, strict host key checking against `known_hosts`, one multiplexed
    connection per site (ControlMaster/ControlPersist) reused by every command."""

    site: str
    host: str
    user: str
    key_file: str
    known_hosts: str
    port: int = 22
    connect_timeout_s: float = 10.0
    command_timeout_s: float = 60.0
    control_persist_s: int = 600
    control_dir: str = "/run/provisioner"
    calls: list[Sequence[str]] = field(default_factory=list, repr=False)

    @property
    def control_path(self) -> str:
        # Short (a Unix socket path is limited to ~107 bytes), per site and local
        # user (a socket is usable by its owner only).
        return str(Path(self.control_dir) / f"ssh-{self.site}-{os.getuid()}")

    def ssh_argv(self, *extra: str) -> list[str]:
        """ssh's own argv up to and including the destination."""
        options = {
            "BatchMode": "yes", "IdentitiesOnly": "yes", "IdentityAgent": "none",
            "PasswordAuthentication": "no", "KbdInteractiveAuthentication": "no",
            "StrictHostKeyChecking": "yes", "UserKnownHostsFile": self.known_hosts,
            "GlobalKnownHostsFile": "/dev/null", "CheckHostIP": "no",
            "ConnectTimeout": str(max(1, round(self.connect_timeout_s))),
            "ServerAliveInterval": str(max(1, round(self.connect_timeout_s / 2))),
            "ServerAliveCountMax": "2",
            "ControlMaster": "auto", "ControlPath": self.control_path,
            "ControlPersist": str(self.control_persist_s) if self.control_persist_s else "no",
            "LogLevel": "ERROR", "ClearAllForwardings": "yes", "RequestTTY": "no",
        }
        argv = ["ssh", "-F", "none", "-i", self.key_file, "-p", str(self.port),
                "-l", self.user]
        for key, value in options.items():
            argv += ["-o", f"{key}={value}"]
        return [*argv, *extra, self.host]

    def _prepare(self) -> None:
        if not Path(self.key_file).is_file():
            raise Unreachable(f"site {self.site}: SSH key {self.key_file} is missing")
        if not Path(self.known_hosts).is_file():
            raise Unreachable(f"site {self.site}: known_hosts {self.known_hosts} is missing")
        Path(self.control_dir).mkdir(mode=0o700, parents=True, exist_ok=True)

    def run(self, argv: Sequence[str], env: Mapping[str, str], stdin: str | None = None
            ) -> CommandResult:
        self._prepare()
        full = [*self.ssh_argv(), remote_command(argv, env)]
        self.calls.append(list(argv))
        try:
            proc = subprocess.run(full, input=stdin or "", capture_output=True, text=True,
                                  timeout=self.command_timeout_s,
                                  env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                       "LANG": "C.UTF-8"})
        except subprocess.TimeoutExpired as exc:
            raise Transient(f"site {self.site}: {argv[0]} over SSH to {self.host} timed out "
                            f"after {self.command_timeout_s:.0f} s") from exc
        except FileNotFoundError as exc:
            raise Unreachable(f"site {self.site}: no ssh client: {exc}") from exc
        if proc.returncode == 255:
            raise Unreachable(f"site {self.site}: {self.describe_failure(proc.stderr)}")
        return CommandResult(proc.returncode, proc.stdout, proc.stderr)

    def describe_failure(self, stderr: str) -> str:
        """ssh's failure (exit 255) in the words an admin acts on."""
        text = " ".join(stderr.split())
        for pattern, message in _SSH_ERRORS:
            if pattern.search(text):
                what = message.format(host=self.host, port=self.port, user=self.user,
                                      key_file=self.key_file, known_hosts=self.known_hosts)
                return f"{what}: {text}"
        return f"ssh to {self.user}@{self.host}:{self.port} failed: {text or 'exit 255'}"

    def close(self) -> None:
        """Stop the master connection, if any (ssh -O exit), and wait (at most 2 s) for
        the master to remove its socket: it exits after answering."""
        socket = Path(self.control_path)
        if socket.exists():
            subprocess.run([*self.ssh_argv("-O", "exit")], capture_output=True, timeout=10,
                           check=False)
            deadline = time.monotonic() + 2.0
            while socket.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
