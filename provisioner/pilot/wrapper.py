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

Its parts: the parameters and this pilot's HTCondor configuration
(provisioner.pilot.params), the scripts it writes for its startd, job wrapper and
root:// transfer plugin (provisioner.pilot.workfiles, shell in pilot/files/), its
container support, tested before the master or beside it (provisioner.pilot.nested),
and its process watcher (provisioner.pilot.procs).
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from provisioner.pilot import boot, endrecord, leftovers, workfiles
from provisioner.pilot.containers import LOADER_VARIABLES
from provisioner.pilot.nested import ContainerSteps
from provisioner.pilot.params import (
    PilotError,
    PilotParams,
    container_env,
    local_config,
    params_from_env,
    read_token,
)
from provisioner.pilot.procs import end_all_below, has_ended, starters_below, watchable

log = logging.getLogger("provisioner.pilot")


#: SLURM sends its warning signal up to this much earlier than asked
#: (provisioner.pool.pilot_view.SLURM_SIGNAL_SLOP_S; not imported: the pilot has no HTCondor
#: bindings).
SIGNAL_SLOP_S = 60
#: Retire and its withdrawal (provisioner.sites.slurm_jobs.RETIRE_SIGNAL, UNRETIRE_SIGNAL).
RETIRE_SIGNAL = signal.SIGUSR2
UNRETIRE_SIGNAL = signal.SIGCONT
#: How often a retiring pilot looks (in /proc) whether its jobs have ended.
RETIRE_POLL_S = 1.0
#: How often the wrapper looks whether its master has ended, and how long the
#: container may outlive it before the wrapper ends what is left: a batch job
#: whose master is gone holds the allocation for nothing until SLURM kills it.
MASTER_POLL_S = 1.0
CONTAINER_LINGER_S = 20.0


def _under(path: str, dirs: tuple[str, ...]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def prepare(p: PilotParams) -> tuple[Path, Path]:
    """Create the private work directory; returns (workdir, condor_config file)."""
    if not p.token:
        raise PilotError("the pilot has no token")
    if not p.condor_config.is_file():
        raise PilotError(f"pilot HTCondor configuration {p.condor_config} is missing")
    live = leftovers.live_job_ids(dict(os.environ))
    if live is not None:
        leftovers.remove_stale(p.scratch, p.site, p.job_id, live)
    workdir = p.scratch / f"pilot-{p.site}-{p.job_id}"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(mode=0o700, parents=True)
    for sub in ("local/log", "local/spool", "local/execute", "local/lock", "local/run",
                *workfiles.PRIVATE_DIRS):
        (workdir / sub).mkdir(mode=0o700, parents=True)
    try:
        workfiles.install(workdir, p.scratch)
    except ValueError as exc:
        raise PilotError(str(exc)) from None
    token = workdir / "tokens.d" / "pilot"
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(p.token + "\n")
    config = workdir / "condor_config"
    config.write_text(p.condor_config.read_text() + "\n# --- this pilot ---\n"
                      + local_config(p, workdir))
    return workdir, config


class PilotRun(ContainerSteps):
    """Runs the master in the container and reacts to SLURM's signals; its container
    support is `ContainerSteps`'."""

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
        self._test_key: dict[str, Any] | None = None  # the node's record key (testcache)
        self._starter_digest = ""  # the configuration the starter's answer is for
        self._keep_answer = False  # the real starter answers: keep that in the record

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
                if not watchable(master, self.root, self.proc):
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
        end_all_below(self.root, "the master ended but its container is still there "
                      f"{CONTAINER_LINGER_S:.0f} s later", self.cleared, self.proc)

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
        if self._keep_answer:
            threading.Thread(target=self.keep_starter_answer, name="starter-answer",
                             daemon=True).start()
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
        return run_pilot(ending, started)
    finally:
        endrecord.write_from_env(dict(os.environ), started, time.time(), ending.reason)


def run_pilot(ending: Ending, started: float) -> int:
    """Everything the pilot does (its wrapper `started` then); every return notes in
    `ending` why it left."""
    for key in LOADER_VARIABLES:
        os.environ.pop(key, None)
    try:
        params = params_from_env(dict(os.environ), time.time())
        params = replace(params, token=read_token(dict(os.environ)))
    except PilotError as exc:
        log.error("%s", exc)
        ending.reason = "bad-environment"
        return 2
    pilot: PilotRun | None = None
    stop_early: int | None = None

    def early_term(signum: int, _frame: Any) -> None:
        nonlocal stop_early
        stop_early = signum

    signal.signal(signal.SIGTERM, early_term)
    signal.signal(signal.SIGUSR1, early_term)  # released before it started: just leave
    signal.signal(RETIRE_SIGNAL, signal.SIG_IGN)  # no job can run yet: nothing to retire
    signal.signal(UNRETIRE_SIGNAL, signal.SIG_IGN)
    marks = {"PilotBootWrapperStart": started}
    if params.slurm_start:
        marks["PilotBootSlurmStart"] = params.slurm_start
    delay = boot.start_delay(params.start_delay_max_s, params.start_slot,
                             params.start_slots, random.Random(params.job_id))
    deadline = time.time() + delay
    while time.time() < deadline and stop_early is None:
        time.sleep(min(0.5, max(0.0, deadline - time.time())))
    if stop_early is not None:
        log.info("terminated before start")
        ending.reason = ("released-before-start" if stop_early == signal.SIGUSR1
                         else "terminated-before-start")
        return 0
    marks["PilotBootDelayEnd"] = time.time()
    try:
        workdir, config = prepare(params)
    except (PilotError, OSError) as exc:
        log.error("%s", exc)
        ending.reason = "prepare-failed"
        return 2
    marks["PilotBootPrepared"] = time.time()
    pilot = PilotRun(params, workdir, config)
    later = pilot.test_later()
    if not later:
        pilot.enable_containers()
        marks["PilotBootTested"] = time.time()
    marks["PilotBootMasterStart"] = time.time()
    with config.open("a") as f:  # the boot's steps, in the startd's ad
        f.write("# --- boot (provisioner.pilot.boot) ---\n" + boot.config_lines(marks))
    log.info("boot: %s", ", ".join(f"{k[len('PilotBoot'):]} {v - started:+.2f} s"
                                   for k, v in marks.items()))
    signal.signal(signal.SIGTERM, pilot.on_term)
    signal.signal(signal.SIGINT, pilot.on_term)
    signal.signal(signal.SIGUSR1, pilot.on_release)
    signal.signal(RETIRE_SIGNAL, pilot.on_retire)
    signal.signal(UNRETIRE_SIGNAL, pilot.on_unretire)
    if later:
        threading.Thread(target=pilot.enable_containers_later, name="container-test",
                         daemon=True).start()
    try:
        rc = pilot.run()
        ending.reason = pilot.end_reason(rc)
        return rc
    finally:
        pilot.copy_logs()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
