"""The provisioner as a real service in the testbed, for fault tests: started as
its own unprivileged account on cm, killed, restarted; plus watchers that record
what the sites and the pool did meanwhile."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import htcondor2 as htcondor
import yaml
from conftest import CONFIG, SITES, WORKERS, slurm

SERVICE_USER = "provisioner"


#: Every testbed host shares /usr/local/bin, first on the PATH the SSH executor sets: an
#: sbatch there stands in front of SLURM's own.
SBATCH_HOOK = Path("/usr/local/bin/sbatch")


@contextlib.contextmanager
def sbatch_hook(body: str) -> Iterator[None]:
    """While the block runs, every sbatch at every site first runs `body` (sh; it may
    exit to refuse or wait), then SLURM's own sbatch."""
    SBATCH_HOOK.write_text(f"#!/bin/sh\n{body}\nexec /usr/bin/sbatch \"$@\"\n")
    SBATCH_HOOK.chmod(0o755)
    try:
        yield
    finally:
        SBATCH_HOOK.unlink(missing_ok=True)


@contextlib.contextmanager
def submissions_busy(site: str) -> Iterator[None]:
    """While the block runs, the site's controller refuses every job as busy
    ("Resource temporarily unavailable", its job_submit.lua): over sbatch and over
    slurmrestd alike."""
    switch = Path(f"/etc/slurm-{site}/submit-busy")
    switch.touch()
    try:
        yield
    finally:
        switch.unlink(missing_ok=True)


@contextlib.contextmanager
def workers_drained() -> Iterator[None]:
    """Every worker node drained: pilots submitted meanwhile stay pending."""
    for site in SITES:
        for node in WORKERS[site]:
            slurm(site, ["scontrol", "update", f"nodename={node}", "state=drain",
                         "reason=test-drained"])
    try:
        yield
    finally:
        for site in SITES:
            for node in WORKERS[site]:
                slurm(site, ["scontrol", "update", f"nodename={node}", "state=resume"])


def service_dir() -> Path:
    """A fresh directory the service's account owns (pytest's own are root's only)."""
    directory = Path(tempfile.mkdtemp(prefix="service.", dir="/var/tmp"))
    directory.chmod(0o755)
    return directory


def write_config(directory: Path, edit: Callable[[dict], None] | None = None) -> Path:
    """A copy of the testbed configuration in `directory` (journal and lock there),
    readable by the service's account; `edit` may change the parsed YAML first."""
    data = yaml.safe_load(Path(CONFIG).read_text())
    data["journal"] = str(directory / "journal.sqlite")
    if edit:
        edit(data)
    path = directory / "provisioner.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    subprocess.run(["chown", "-R", f"{SERVICE_USER}:", str(directory)], check=True)
    directory.chmod(0o755)
    return path


class Service:
    """`provisioner run` as the service account; output appended to one log file."""

    def __init__(self, config: Path, log: Path) -> None:
        self.config, self.log = config, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("a") as f:
            self.proc = subprocess.Popen(
                ["runuser", "-u", SERVICE_USER, "--", "/opt/venv/bin/provisioner", "-c",
                 str(self.config), "run"], stdout=f, stderr=subprocess.STDOUT,
                start_new_session=True)

    def _signal(self, sig: int) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=60)

    def kill9(self) -> None:
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def cycles(self) -> list[str]:
        return [line for line in self.text().splitlines() if " cycle " in line]


def pilot_ids(site: str) -> list[str]:
    return list(pilot_states(site))


def pilot_states(site: str) -> dict[str, str]:
    """The site's pilot jobs: SLURM job id -> squeue's compact state (PD, R, CG...).
    A site that cannot be read raises (never "no pilots")."""
    out = slurm(site, ["squeue", "-h", "-u", "pilot", "-o", "%i %t"], timeout=30)
    return dict(line.split(None, 1) for line in out.stdout.splitlines() if " " in line)


def pilot_ads() -> list[str]:
    ads = htcondor.Collector().query(htcondor.AdType.Startd,
                                     constraint='PilotProvisionerId =?= "testbed"',
                                     projection=["Name"])
    return [ad["Name"] for ad in ads]


class SiteWatch:
    """Samples every site's pilot jobs about once a second in the background:
    the most seen at once per site, every job id ever seen, and when each one's
    SLURM state changed (`story`, for a failing test's message).

    A site that cannot be read (a fault a test injects) is a gap, recorded; the
    figures hold only for the samples taken, so `checked()` fails unless the watch
    is still running and has read every site since its last gap."""

    def __init__(self) -> None:
        self.most = {site: 0 for site in SITES}
        self.seen: dict[str, set[str]] = {site: set() for site in SITES}
        self._last: dict[str, dict[str, str]] = {}  # site -> job -> state last sampled
        self.changes: list[tuple[float, str, str]] = []  # (time, "site/job", state)
        self.samples = {site: 0 for site in SITES}  # successful reads
        self.failed: dict[str, str] = {}  # site -> the last read's error, while failing
        self.crashed: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                now = time.time()
                for site in SITES:
                    self._sample(now, site)
                self._stop.wait(1.0)
        except BaseException as exc:  # reported by checked(), never lost with the thread
            self.crashed = exc
            raise

    def _sample(self, now: float, site: str) -> None:
        try:
            states = pilot_states(site)
        except (AssertionError, subprocess.TimeoutExpired) as exc:
            self.failed[site] = str(exc).splitlines()[0] if str(exc) else repr(exc)
            return
        self.failed.pop(site, None)
        self.samples[site] += 1
        self.most[site] = max(self.most[site], len(states))
        self.seen[site].update(states)
        self._note(now, site, states)

    def checked(self) -> SiteWatch:
        """Self, once sure the figures mean something: the thread has not crashed and
        every site was read, the last time without error."""
        assert self.crashed is None, f"the site watch crashed: {self.crashed!r}"
        assert self._thread.is_alive() or self._stop.is_set(), "the site watch ended early"
        assert all(self.samples.values()), f"a site never read: {self.samples} {self.failed}"
        assert not self.failed, f"the site watch cannot read: {self.failed}"
        return self

    def _note(self, now: float, site: str, states: dict[str, str]) -> None:
        last = self._last.get(site, {})
        self.changes += [(now, f"{site}/{job}", "gone") for job in last.keys() - states.keys()]
        self.changes += [(now, f"{site}/{job}", state) for job, state in states.items()
                         if last.get(job) != state]
        self._last[site] = states

    def story(self) -> str:
        """Every pilot job's SLURM states with the local time each was first seen."""
        return "; ".join(f"{time.strftime('%H:%M:%S', time.localtime(t))} {key} {state}"
                         for t, key, state in self.changes)

    def __enter__(self) -> SiteWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def job_events(logfile: Path) -> list[str]:
    """Event codes of an HTCondor job event log, in order."""
    return [line[:3] for line in logfile.read_text().splitlines()
            if re.match(r"^\d{3} \(", line)]
