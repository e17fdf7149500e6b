"""The pilot: what runs inside the SLURM job.

Started by the batch script (slurm_templates/) as the batch shell itself, so the
warning signal SLURM sends a margin before walltime (``--signal=B:TERM@margin``)
reaches it. It waits a bounded random delay (start-up storms), prepares a
private work directory on node-local scratch, writes the HTCondor configuration
of this one pilot, and runs ``condor_master`` (master + startd) inside the
Apptainer pilot image through spython. On TERM it asks the master for a graceful
shutdown (running jobs may retire until the walltime end); when the master ends
it copies the logs back and exits. On USR1 (the provisioner's release, sent
through SLURM) it drains its startd if, and only if, the startd is idle, then
shuts down. On USR2 (retire) it does the same as soon as its running jobs have
ended, taking jobs until then; CONT withdraws that order. Whichever way it ends,
its last act is its end record (provisioner.pilot.endrecord): when it started and
ended, and why.

Parameters come from ``PILOT_*`` environment variables set by the batch script
and from SLURM's own environment (job id, cores, memory, end time).
"""

from __future__ import annotations

import logging
import os
import random
import shlex
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner.pilot import endrecord, testcache
from provisioner.pilot.containers import (
    LOADER_VARIABLES,
    ContainerSupport,
    config_string,
    container_config,
    self_test,
    self_test_argv,
)
from provisioner.xcache import proxy_environment

log = logging.getLogger("provisioner.pilot")


#: SLURM sends its warning signal up to this much earlier than asked
#: (provisioner.pilot_view.SLURM_SIGNAL_SLOP_S; not imported: the pilot has no HTCondor
#: bindings).
SIGNAL_SLOP_S = 60
#: Retire and its withdrawal (provisioner.sites.slurm_cli.RETIRE_SIGNAL, UNRETIRE_SIGNAL).
RETIRE_SIGNAL = signal.SIGUSR2
UNRETIRE_SIGNAL = signal.SIGCONT
#: How often a retiring pilot looks (in /proc) whether its jobs have ended.
RETIRE_POLL_S = 1.0
STARTER = "condor_starter"
#: How often the wrapper looks whether its master has ended, and how long the
#: container may outlive it before the wrapper ends what is left: a batch job
#: whose master is gone holds the allocation for nothing until SLURM kills it.
MASTER_POLL_S = 1.0
CONTAINER_LINGER_S = 20.0


class PilotError(Exception):
    """The pilot cannot start; the message names the missing or bad setting."""


@dataclass(frozen=True)
class PilotParams:
    site: str
    provisioner_id: str
    collector: str
    uid_domain: str
    image: str
    token_file: Path
    condor_config: Path
    job_id: str
    cpus: int
    memory_mb: int
    walltime_end: int
    shutdown_margin_s: int
    noclaim_shutdown_s: int
    start_delay_max_s: int
    scratch: Path
    log_dir: Path | None
    xcache: str | None
    xcache_exclude: tuple[str, ...] = ()
    bind: tuple[str, ...] = ()
    containers: bool = False
    container_test_image: str = ""
    #: How long a passed start-up test counts on its node (0: it always runs).
    container_test_cache_s: int = testcache.DEFAULT_TTL_S
    payload_image: str = ""

    @property
    def name(self) -> str:
        """Daemon name of this pilot's master and startd (unique per site job)."""
        return f"pilot-{self.site}-{self.job_id}@{socket.gethostname()}"


def _env(env: dict[str, str], key: str) -> str:
    value = env.get(key, "")
    if not value:
        raise PilotError(f"environment variable {key} is not set")
    return value


def _int_env(env: dict[str, str], key: str, default: int | None = None) -> int:
    raw = env.get(key)
    if raw in (None, ""):
        if default is None:
            raise PilotError(f"environment variable {key} is not set")
        return default
    try:
        return int(raw)
    except ValueError:
        raise PilotError(f"environment variable {key}={raw!r} is not an integer") from None


def params_from_env(env: dict[str, str], now: float) -> PilotParams:
    """Read the pilot's parameters from the batch script's and SLURM's environment."""
    cpus = _int_env(env, "SLURM_CPUS_ON_NODE", _int_env(env, "SLURM_CPUS_PER_TASK", 1))
    mem = _int_env(env, "SLURM_MEM_PER_NODE", 0)
    if mem <= 0:
        mem = cpus * _int_env(env, "SLURM_MEM_PER_CPU", 1024)
    walltime_end = _int_env(env, "SLURM_JOB_END_TIME", 0)
    if walltime_end <= 0:
        walltime_end = int(now) + _int_env(env, "PILOT_WALLTIME_S")
    log_dir = env.get("PILOT_LOG_DIR") or None
    return PilotParams(
        site=_env(env, "PILOT_SITE"),
        provisioner_id=_env(env, "PILOT_PROVISIONER_ID"),
        collector=_env(env, "PILOT_COLLECTOR"),
        uid_domain=_env(env, "PILOT_UID_DOMAIN"),
        image=_env(env, "PILOT_IMAGE"),
        token_file=Path(_env(env, "PILOT_TOKEN_FILE")),
        condor_config=Path(_env(env, "PILOT_CONDOR_CONFIG")),
        job_id=_env(env, "SLURM_JOB_ID"),
        cpus=cpus,
        memory_mb=mem,
        walltime_end=walltime_end,
        shutdown_margin_s=_int_env(env, "PILOT_SHUTDOWN_MARGIN_S", 120),
        noclaim_shutdown_s=_int_env(env, "PILOT_NOCLAIM_SHUTDOWN_S", 1200),
        start_delay_max_s=_int_env(env, "PILOT_START_DELAY_MAX_S", 0),
        scratch=Path(env.get("PILOT_SCRATCH") or env.get("TMPDIR") or "/tmp"),
        log_dir=Path(log_dir) if log_dir else None,
        xcache=env.get("PILOT_XCACHE") or None,
        xcache_exclude=tuple(d for d in env.get("PILOT_XCACHE_EXCLUDE", "").split(",") if d),
        bind=tuple(d for d in env.get("PILOT_BIND", "").split(",") if d),
        containers=env.get("PILOT_CONTAINERS", "0") == "1",
        container_test_image=env.get("PILOT_CONTAINER_TEST_IMAGE") or env.get("PILOT_IMAGE", ""),
        container_test_cache_s=_int_env(env, "PILOT_CONTAINER_TEST_CACHE_S",
                                        testcache.DEFAULT_TTL_S),
        payload_image=env.get("PILOT_PAYLOAD_IMAGE", ""),
    )


def local_config(p: PilotParams, workdir: Path) -> str:
    """The HTCondor settings of this one pilot (appended after pilot.conf)."""
    host = p.collector.rsplit(":", 1)[0]
    lines = {
        "CONDOR_HOST": host,
        "COLLECTOR_HOST": p.collector,
        "UID_DOMAIN": p.uid_domain,
        "TRUST_DOMAIN": p.uid_domain,
        # Jobs never share a file system with the submit host: transfer files.
        "FILESYSTEM_DOMAIN": p.name,
        "MASTER_NAME": p.name,
        "STARTD_NAME": p.name,
        "LOCAL_DIR": str(workdir / "local"),
        "LOG": str(workdir / "local" / "log"),
        "SPOOL": str(workdir / "local" / "spool"),
        "EXECUTE": str(workdir / "local" / "execute"),
        "LOCK": str(workdir / "local" / "lock"),
        "RUN": str(workdir / "local" / "run"),
        "SEC_TOKEN_DIRECTORY": str(workdir / "tokens.d"),
        "SEC_PASSWORD_DIRECTORY": str(workdir / "passwords.d"),
        # FS authentication between the pilot's own processes happens here, not
        # in /tmp, so that a payload (hidden from this directory) cannot use it.
        "FS_LOCAL_DIR": str(workdir / "fsauth"),
        "USER_JOB_WRAPPER": str(workdir / "job-wrapper.sh"),
        "NUM_CPUS": str(p.cpus),
        "MEMORY": str(p.memory_mb),
        "PILOT_SHUTDOWN_MARGIN": str(p.shutdown_margin_s),
        "PILOT_NOCLAIM_SHUTDOWN": str(p.noclaim_shutdown_s),
        "PilotSite": config_string(p.site),
        "PilotSlurmJobId": config_string(p.job_id),
        "PilotProvisionerId": config_string(p.provisioner_id),
        "PilotWalltimeEnd": str(p.walltime_end),
    }
    if p.xcache:
        # Every job reads root:// URLs through the site's cache (the XRootD client
        # proxy plugin), and so does HTCondor's own transfer of root:// input files.
        lines["PilotXCache"] = config_string(p.xcache)
        lines["STARTD_ATTRS"] = "$(STARTD_ATTRS) PilotXCache"
        env = proxy_environment(p.xcache, p.xcache_exclude)
        lines["STARTER_JOB_ENVIRONMENT"] = config_string(
            " ".join(f"{k}={v}" for k, v in env.items()))
    # root:// input files: xrdcp, through the cache where the site has one.
    lines["FILETRANSFER_PLUGINS"] = f"$(FILETRANSFER_PLUGINS) {workdir / TRANSFER_PLUGIN}"
    return "".join(f"{k} = {v}\n" for k, v in lines.items())


#: The pilot's private directories: its token, signing-key dir (empty) and FS
#: authentication dir. Payloads run as the same account, so they are hidden from
#: them by the job wrapper below.
PRIVATE_DIRS = ("tokens.d", "passwords.d", "fsauth")

#: USER_JOB_WRAPPER: runs every payload in a user+mount+PID namespace where
#: - an empty tmpfs covers the pilot's private directories, and
#: - empty tmpfs cover the node's scratch directory (where every pilot of the
#:   site account keeps its work directory: tokens, other jobs' sandboxes), /tmp,
#:   /var/tmp and /dev/shm; the job's own sandbox is mounted back in place,
#: - /proc shows the job's own processes only (its own PID namespace: it can
#:   neither list nor signal another job's processes),
#: then drops into a nested user namespace. Mounts made in the outer namespace
#: are locked in the inner one, so the payload cannot unmount them to reveal what
#: they cover. Fails closed: if a namespace or a mount cannot be made, the job
#: does not run.
#: Signals: the starter signals this script (the job's top process); it forwards
#: them to the namespace's first process (a shell with traps: PID 1 ignores what it
#: has no handler for), which forwards them to the payload. A payload killed by a
#: signal ends this script by the same signal (exit status 128+N is read as that).
#: `wait` returns early when a trap ran (`woken`): it is called again for the real
#: status (127 then means the status was the one already seen).
#: `{pid}` is "--pid --fork --mount-proc" (or empty: the PID namespace off).
JOB_WRAPPER = """#!/bin/sh
set -e
# A job that asked for it (+WantXCache = false) reads root:// URLs directly.
if [ -n "${{_CONDOR_JOB_AD:-}}" ] && grep -qix 'WantXCache = false' "$_CONDOR_JOB_AD" 2>/dev/null
then
    unset XRD_PLUGIN XROOT_PROXY XROOT_PROXY_EXCL_DOMAINS
fi
sandbox=${{_CONDOR_SCRATCH_DIR:-$PWD}}
ns=; pending=
forward() {{
    woken=1
    if [ -z "$ns" ]; then pending=$1; return; fi
    kill -s "$1" $(cat /proc/$ns/task/$ns/children 2>/dev/null) 2>/dev/null
}}
for sig in TERM INT HUP QUIT USR1 USR2 ALRM; do trap "forward $sig" $sig; done
set +e
unshare --user --map-root-user --mount {pid} -- /bin/sh -c '
job=; pending=
fwd() {{ woken=1; if [ -n "$job" ]; then kill -s "$1" "$job" 2>/dev/null; else pending=$1; fi; }}
for sig in TERM INT HUP QUIT USR1 USR2 ALRM; do trap "fwd $sig" $sig; done
set -e
uid=$1; gid=$2; sandbox=$3; shift 3
while [ "$1" != -- ]; do mount -t tmpfs -o size=4k,mode=0700 pilot-private "$1"; shift; done
shift
mount -t tmpfs -o size=4k,mode=0700 job-stash /mnt
mkdir /mnt/sandbox
mount --rbind "$sandbox" /mnt/sandbox
while [ "$1" != -- ]; do
    if [ -d "$1" ]; then mount -t tmpfs -o mode=1777 job-private "$1"; fi
    shift
done
shift
mkdir -p "$sandbox"
mount --move /mnt/sandbox "$sandbox"
umount /mnt
cd "$sandbox"
set +e
unshare --user --map-user="$uid" --map-group="$gid" -- "$@" &
job=$!
if [ -n "$pending" ]; then kill -s "$pending" $job 2>/dev/null; fi
rc=
while :; do
    woken=; wait $job; s=$?
    if [ $s -eq 127 ] && [ -n "$rc" ]; then break; fi
    rc=$s; [ -n "$woken" ] || break
done
exit $rc
' job-wrapper "$(id -u)" "$(id -g)" "$sandbox" {hide} -- {cover} -- "$@" &
ns=$!
if [ -n "$pending" ]; then forward "$pending"; fi
rc=
while :; do
    woken=; wait $ns; s=$?
    if [ $s -eq 127 ] && [ -n "$rc" ]; then break; fi
    rc=$s; [ -n "$woken" ] || break
done
if [ $rc -gt 128 ] && [ $rc -lt 160 ]; then
    sig=$(kill -l $((rc - 128)))
    trap - "$sig"
    kill -s "$sig" $$
fi
exit $rc
"""

#: The job wrapper's PID namespace options (empty switches it off: tests only).
PID_NAMESPACE = "--pid --fork --mount-proc"

#: Covered for every job besides the node's scratch directory.
SHARED_TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


def covered_dirs(scratch: Path) -> list[str]:
    """What the job wrapper covers: the scratch directory, then the shared
    temporary directories (each once; never "/")."""
    out: list[str] = []
    for d in (str(scratch), *SHARED_TMP_DIRS):
        d = d.rstrip("/") or "/"
        if d != "/" and d not in out:
            out.append(d)
    return out


#: HTCondor file transfer plugin for root:// URLs (single-file protocol: `-classad`,
#: or SOURCE DEST). The cache comes from the environment the pilot gives its
#: daemons; a job with `+WantXCache = false` reads from the origin.
TRANSFER_PLUGIN = "xrootd-transfer"
TRANSFER_PLUGIN_SCRIPT = """#!/bin/sh
set -eu
if [ "${1:-}" = -classad ]; then
    printf '%s\\n' 'PluginVersion = "0.1"' 'PluginType = "FileTransfer"' 'SupportedMethods = "root"'
    exit 0
fi
[ $# -eq 2 ] || { echo "usage: $0 -classad | SOURCE DEST" >&2; exit 1; }
if [ -n "${_CONDOR_JOB_AD:-}" ] && grep -qix 'WantXCache = false' "$_CONDOR_JOB_AD" 2>/dev/null
then
    unset XRD_PLUGIN XROOT_PROXY XROOT_PROXY_EXCL_DOMAINS
fi
exec xrdcp --nopbar --force "$1" "$2"
"""


def _under(path: str, dirs: tuple[str, ...]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def container_env(p: PilotParams) -> dict[str, str]:
    """Environment of the pilot's daemons in the container (besides CONDOR_CONFIG):
    the cache's proxy settings, which the root:// transfer plugin inherits."""
    return proxy_environment(p.xcache, p.xcache_exclude) if p.xcache else {}


def prepare(p: PilotParams) -> tuple[Path, Path]:
    """Create the private work directory; returns (workdir, condor_config file)."""
    if not p.token_file.is_file():
        raise PilotError(f"pilot token file {p.token_file} is missing")
    if not p.condor_config.is_file():
        raise PilotError(f"pilot HTCondor configuration {p.condor_config} is missing")
    workdir = p.scratch / f"pilot-{p.site}-{p.job_id}"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(mode=0o700, parents=True)
    for sub in ("local/log", "local/spool", "local/execute", "local/lock", "local/run",
                *PRIVATE_DIRS):
        (workdir / sub).mkdir(mode=0o700, parents=True)
    wrapper = workdir / "job-wrapper.sh"
    wrapper.write_text(JOB_WRAPPER.format(
        pid=PID_NAMESPACE, hide=" ".join(shlex.quote(str(workdir / d)) for d in PRIVATE_DIRS),
        cover=" ".join(shlex.quote(d) for d in covered_dirs(p.scratch))))
    wrapper.chmod(0o755)
    plugin = workdir / TRANSFER_PLUGIN
    plugin.write_text(TRANSFER_PLUGIN_SCRIPT)
    plugin.chmod(0o755)
    token = workdir / "tokens.d" / "pilot"
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(p.token_file.read_bytes())
    config = workdir / "condor_config"
    config.write_text(p.condor_config.read_text() + "\n# --- this pilot ---\n"
                      + local_config(p, workdir))
    return workdir, config


@dataclass(frozen=True)
class Proc:
    """One process as /proc/PID/stat tells it."""

    name: str
    state: str  # R, S, D, Z (zombie), X (dead), ...
    ppid: int


def read_stat(stat: str) -> Proc | None:
    """A /proc/PID/stat line; None if it cannot be read."""
    close = stat.rfind(")")  # the command name may hold spaces and parentheses
    fields = stat[close + 2:].split()
    if close < 0 or len(fields) < 2 or not fields[1].isdigit():
        return None
    return Proc(stat[stat.find("(") + 1:close], fields[0], int(fields[1]))


def process_table(proc: Path = Path("/proc")) -> dict[int, Proc]:
    """Every process in /proc (the pilot's container shares the node's PID namespace)."""
    table: dict[int, Proc] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            found = read_stat((entry / "stat").read_text())
        except OSError:  # ended meanwhile
            continue
        if found is not None:
            table[int(entry.name)] = found
    return table


def _below(pid: int, root: int, table: dict[int, Proc]) -> bool:
    seen: set[int] = set()
    pid = table[pid].ppid if pid in table else 0
    while pid not in (0, 1, root) and pid not in seen:
        seen.add(pid)
        pid = table[pid].ppid if pid in table else 0
    return pid == root


def descendants(root: int, table: dict[int, Proc]) -> list[int]:
    """The processes below `root` (not `root` itself)."""
    return sorted(pid for pid in table if pid != root and _below(pid, root, table))


def starters_below(root: int, proc: Path = Path("/proc")) -> int:
    """How many condor_starter processes (one per running job) descend from process
    `root`."""
    table = process_table(proc)
    return sum(1 for pid, p in table.items() if p.name == STARTER and _below(pid, root, table))


def has_ended(pid: int, proc: Path = Path("/proc")) -> bool:
    """Whether process `pid` has ended: gone, or a zombie its parent has not reaped."""
    try:
        found = read_stat((proc / str(pid) / "stat").read_text())
    except OSError:
        return True
    return found is None or found.state in ("Z", "X")


class Pilot:
    """Runs the master in the container and reacts to SLURM's signals."""

    def __init__(self, params: PilotParams, workdir: Path, config: Path) -> None:
        self.p = params
        self.workdir = workdir
        self.config = config
        self.pidfile = workdir / "local" / "run" / "master.pid"
        self.stopping = False
        self.reason: str | None = None  # why it is stopping (endrecord.REASONS)
        self.clock: Callable[[], float] = time.time
        self.retiring = False
        self._leaving = threading.Lock()  # one idle check at a time
        self._watcher: threading.Thread | None = None
        self._unsure = False  # warned that running jobs cannot be told
        self.ended = threading.Event()  # the master has ended
        self.proc = Path("/proc")
        self.root = os.getpid()  # the batch shell: the container runs below it
        self.cleared: list[int] = []  # what outlived the master and was ended

    @property
    def stop_at(self) -> float:
        """From here on the pilot is ending because of its walltime (the startd takes
        no new job; SLURM's warning signal is due)."""
        return float(self.p.walltime_end - self.p.shutdown_margin_s)

    def end_reason(self, rc: int) -> str:
        """Why the pilot ended, once its master has (`rc`: what `run` returned)."""
        if self.reason:
            return self.reason
        if rc != 0:
            return "master-failed"
        # The master ended by itself: the startd's own shutdown, after the stop time
        # (STARTD.DAEMON_SHUTDOWN) or before it (STARTD_NOCLAIM_SHUTDOWN).
        return "walltime-drain" if self.clock() >= self.stop_at else "noclaim-shutdown"

    def _master_pid(self) -> int:
        return int(self.pidfile.read_text().strip())

    def _signal_master(self, sig: int) -> None:
        try:
            os.kill(self._master_pid(), sig)
        except (OSError, ValueError) as exc:
            log.warning("could not signal the master: %s", exc)

    def _in_container(self, argv: list[str]) -> tuple[int, str]:
        from spython.main import Client

        result = Client.execute(self.p.image, argv, bind=self._binds(),
                                options=self._options(), return_result=True, quiet=True)
        if isinstance(result, dict):
            return int(result.get("return_code", 1)), str(result.get("message", ""))
        return 0, str(result)

    def _binds(self) -> list[str]:
        """The pilot's own directory, and the site's shared directories read-only."""
        images = [i for i in {self.p.container_test_image, self.p.payload_image}
                  if i and self.p.containers and not _under(i, self.p.bind)]
        return [str(self.workdir), *(f"{d}:{d}:ro" for d in self.p.bind),
                *(f"{i}:{i}:ro" for i in sorted(images))]

    def enable_containers(self) -> ContainerSupport | None:
        """Test nested Apptainer on this node; configure the startd by the outcome."""
        if not self.p.containers:
            return None
        support = self._container_test()
        if not support.ok:
            log.warning("no container support on this node: %s", support.detail)
        settings = container_config(support, self.p.payload_image)
        with self.config.open("a") as f:
            f.write("# --- container support (start-up test) ---\n")
            f.writelines(f"{k} = {v}\n" for k, v in settings.items())
        return support

    def _container_test(self) -> ContainerSupport:
        """The start-up test's outcome: a pass of this node's cache (testcache), or the
        test itself, whose pass is then cached."""
        image = self.p.container_test_image
        ttl = self.p.container_test_cache_s
        cache = testcache.cache_file(self.p.scratch)
        key = None
        if ttl > 0 and image:
            try:
                key = testcache.node_key(image, self.p.image, self_test_argv(image))
            except OSError as exc:
                log.info("container test cache not used: %s", exc)
        if key is not None:
            cached = testcache.lookup(testcache.read_record(cache), key, self.clock(), ttl,
                                      image)
            if cached is not None:
                log.info("container support (start-up test skipped, cached): %s",
                         cached.detail)
                return cached
        support = self_test(self._in_container, image)
        if support.ok:
            log.info("container support: %s", support.detail)
        if support.ok and key is not None:
            try:
                testcache.write_record(cache, testcache.new_record(key, self.clock(),
                                                                   support.seconds))
            except OSError as exc:
                log.warning("could not cache the container test in %s: %s", cache, exc)
        return support

    def _options(self) -> list[str]:
        # --no-home: the pilot account's home (where sites often keep the pilot
        # token) is not visible to payloads; nor is the directory the pilot was
        # started in (Apptainer mounts the working directory by default, and a
        # job submitted over SSH starts in that home).
        options = ["--cleanenv", "--no-home", "--no-mount", "cwd", "--pwd", str(self.workdir),
                   "--env", f"CONDOR_CONFIG={self.config}", "--env", "LANG=C.UTF-8"]
        for key, value in container_env(self.p).items():
            options += ["--env", f"{key}={value}"]
        return options

    def leave_if_idle(self, reason: str, why: str) -> bool:
        """Drain with an atomic idle check and stop; False if not idle (or already busy
        leaving). The startd evaluates the check and stops matching in one step, so a
        job that arrived since anyone looked keeps its slot and we stay."""
        if not self._leaving.acquire(blocking=False):
            return False
        try:
            if self.stopping:
                return False
            rc, out = self._in_container([
                "condor_drain", "-graceful", "-exit-on-completion",
                "-check", 'State == "Unclaimed"', "-start", "false",
                "-reason", why, self.p.name])
            if rc != 0:
                log.info("%s refused (not idle): %s", reason, out.strip())
                return False
            log.info("%s: drained while idle; shutting down", reason)
            self.stopping = True
            self.reason = reason
            self._signal_master(signal.SIGTERM)
            return True
        finally:
            self._leaving.release()

    def on_release(self, signum: int, _frame: Any) -> None:
        """The provisioner asks us to leave if idle."""
        self.leave_if_idle("released", "released by the provisioner: idle")

    def on_retire(self, signum: int, _frame: Any) -> None:
        """The provisioner asks us to leave once our running jobs have ended; a thread
        watches for that (new jobs may still start meanwhile)."""
        if self.stopping or self.retiring:
            return
        log.info("retire: leaving as soon as the running jobs end")
        self.retiring = True
        if self._watcher is None:
            self._watcher = threading.Thread(target=self.watch_retirement, name="retire",
                                             daemon=True)
            self._watcher.start()

    def on_unretire(self, signum: int, _frame: Any) -> None:
        if self.retiring and not self.stopping:
            log.info("retire withdrawn: staying when the running jobs end")
            self.retiring = False

    def jobs_running(self) -> bool:
        """Whether a job (a condor_starter) runs; True when that cannot be told, so that
        a retiring pilot never drains on a guess (the provisioner's release remains)."""
        try:
            return starters_below(self._master_pid(), self.proc) > 0
        except (OSError, ValueError) as exc:
            if not self._unsure:
                log.warning("cannot tell whether jobs run (retiring waits for the "
                            "provisioner's release instead): %s", exc)
                self._unsure = True
            return True

    def watch_retirement(self) -> None:
        """While retiring, leave at the first poll (every `RETIRE_POLL_S`) with no job
        running and the startd idle; until the pilot stops or its master ends."""
        while not self.ended.wait(RETIRE_POLL_S) and not self.stopping:
            if self.retiring and not self.jobs_running():
                self.leave_if_idle("retired", "retired by the provisioner: its jobs are done")

    def watch_container(self) -> None:
        """Once the master has ended, give the container `CONTAINER_LINGER_S` to end
        too; then say what is left below the batch shell and kill it, so the batch
        job ends (and frees the allocation) instead of waiting for SLURM's kill at
        the walltime."""
        master = None
        while not self.ended.wait(MASTER_POLL_S):
            if master is None:
                try:
                    master = self._master_pid()
                except (OSError, ValueError):  # not written yet
                    continue
                table = process_table(self.proc)
                if master not in table or not _below(master, self.root, table):
                    # Not a process of this node's view below us (a PID namespace?):
                    # watching it could end a live pilot. The walltime kill remains.
                    log.info("master pid %d not found below the batch shell: "
                             "its end is not watched", master)
                    return
            if has_ended(master, self.proc):
                break
        else:
            return
        if self.ended.wait(CONTAINER_LINGER_S):
            return
        table = process_table(self.proc)
        left = descendants(self.root, table)
        log.warning("the master ended but its container is still there %.0f s later: "
                    "ending what is left (%s)", CONTAINER_LINGER_S,
                    ", ".join(f"{pid} {table[pid].name} {table[pid].state}" for pid in left)
                    or "nothing below the batch shell")
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                self.cleared.append(pid)
            except OSError as exc:
                log.info("process %d: %s", pid, exc)

    def on_term(self, signum: int, _frame: Any) -> None:
        """Graceful: the master stops the startd, which lets running jobs retire."""
        if not self.stopping:
            log.info("signal %d: graceful shutdown of the pilot", signum)
            self.stopping = True
            near_end = self.clock() >= self.stop_at - SIGNAL_SLOP_S
            self.reason = "walltime-drain" if near_end else "terminated"
            self._signal_master(signal.SIGTERM)
        else:
            log.info("signal %d again: fast shutdown", signum)
            self._signal_master(signal.SIGQUIT)

    def run(self) -> int:
        from spython.main import Client  # imported here: only the node needs it

        Client.quiet = True
        os.chdir(self.workdir)
        argv = ["condor_master", "-f", "-pidfile", str(self.pidfile)]
        options = self._options()
        log.info("starting %s in %s (%d cores, %d MB, walltime end %d)", self.p.name,
                 self.p.image, self.p.cpus, self.p.memory_mb, self.p.walltime_end)
        rc = 0
        watchdog = threading.Thread(target=self.watch_container, name="container",
                                    daemon=True)
        watchdog.start()
        try:
            for line in Client.execute(self.p.image, argv, bind=self._binds(),
                                       options=options, stream=True, quiet=True):
                log.info("master: %s", line.rstrip())
        except Exception as exc:  # the container's exit status, or spython's error
            # A container ended by the watchdog had ended its master already.
            rc = 0 if self.cleared else getattr(exc, "returncode", 1) or 1
            if not self.stopping and not self.cleared:
                log.error("the pilot container ended: %s", exc)
        self.ended.set()
        log.info("pilot %s ended (rc %d)", self.p.name, rc)
        return 0 if self.stopping else rc

    def copy_logs(self) -> None:
        if self.p.log_dir is None:
            return
        dest = self.p.log_dir / self.p.name
        try:
            # A core dump holds the daemon's memory, token included: never copied.
            shutil.copytree(self.workdir / "local" / "log", dest, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("core", "core.*"))
        except OSError as exc:
            log.warning("could not copy logs to %s: %s", dest, exc)


@dataclass
class Ending:
    """Why the wrapper is leaving (endrecord.REASONS): an unexpected error until a
    known way out says otherwise."""

    reason: str = "wrapper-error"


def main() -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s pilot %(levelname)s %(message)s")
    started = time.time()
    ending = Ending()
    try:
        return run_pilot(ending)
    finally:
        endrecord.write_from_env(dict(os.environ), started, time.time(), ending.reason)


def run_pilot(ending: Ending) -> int:
    """Everything the pilot does; every return notes in `ending` why it left."""
    for key in LOADER_VARIABLES:
        os.environ.pop(key, None)
    try:
        params = params_from_env(dict(os.environ), time.time())
    except PilotError as exc:
        log.error("%s", exc)
        ending.reason = "bad-environment"
        return 2
    pilot: Pilot | None = None
    stop_early: int | None = None

    def early_term(signum: int, _frame: Any) -> None:
        nonlocal stop_early
        stop_early = signum

    signal.signal(signal.SIGTERM, early_term)
    signal.signal(signal.SIGUSR1, early_term)  # released before it started: just leave
    signal.signal(RETIRE_SIGNAL, signal.SIG_IGN)  # no job can run yet: nothing to retire
    signal.signal(UNRETIRE_SIGNAL, signal.SIG_IGN)
    delay = random.Random(params.job_id).uniform(0, params.start_delay_max_s)
    deadline = time.time() + delay
    while time.time() < deadline and stop_early is None:
        time.sleep(min(0.5, max(0.0, deadline - time.time())))
    if stop_early is not None:
        log.info("terminated before start")
        ending.reason = ("released-before-start" if stop_early == signal.SIGUSR1
                         else "terminated-before-start")
        return 0
    try:
        workdir, config = prepare(params)
    except (PilotError, OSError) as exc:
        log.error("%s", exc)
        ending.reason = "prepare-failed"
        return 2
    pilot = Pilot(params, workdir, config)
    pilot.enable_containers()
    signal.signal(signal.SIGTERM, pilot.on_term)
    signal.signal(signal.SIGINT, pilot.on_term)
    signal.signal(signal.SIGUSR1, pilot.on_release)
    signal.signal(RETIRE_SIGNAL, pilot.on_retire)
    signal.signal(UNRETIRE_SIGNAL, pilot.on_unretire)
    try:
        rc = pilot.run()
        ending.reason = pilot.end_reason(rc)
        return rc
    finally:
        pilot.copy_logs()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
