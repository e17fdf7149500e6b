"""The provisioner as a real service in the testbed, for fault tests: started as
its own unprivileged account on cm, killed, restarted; plus watchers that record
what the sites and the pool did meanwhile."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import htcondor2 as htcondor
import yaml
from conftest import CONFIG, SITES, slurm

SERVICE_USER = "provisioner"


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
    out = slurm(site, ["squeue", "-h", "-u", "pilot", "-o", "%i"], check=False)
    return out.stdout.split() if out.returncode == 0 else []


def pilot_ads() -> list[str]:
    ads = htcondor.Collector().query(htcondor.AdType.Startd,
                                     constraint='PilotProvisionerId =?= "testbed"',
                                     projection=["Name"])
    return [ad["Name"] for ad in ads]


class SiteWatch:
    """Samples every site's pilot jobs about once a second in the background:
    the most seen at once per site, and every job id ever seen."""

    def __init__(self) -> None:
        self.most = {site: 0 for site in SITES}
        self.seen: dict[str, set[str]] = {site: set() for site in SITES}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for site in SITES:
                ids = pilot_ids(site)
                self.most[site] = max(self.most[site], len(ids))
                self.seen[site].update(ids)
            self._stop.wait(1.0)

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
