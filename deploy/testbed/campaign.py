"""`make campaign`: a benchmark campaign on the local mini-grid (inside the testbed, as
root on cm).

Creates the campaign's files at the origin (its `prepare` command, as root: the
origin's directory is not alice's), starts the provisioner service as its own
account with the testbed configuration, runs `provisioner campaign run` as alice,
waits (at most 3 min) for the service to release the pilots, stops the service,
and copies the result directory to /src/build/campaigns/<campaign file stem> (the
repository's build/ on the host, where `make campaign` renders the plots again).

    python /src/deploy/testbed/campaign.py [CAMPAIGN.yaml]

Exit status: the campaign's (0 ok, 1 a step failed, 2 bad file).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from provisioner.data.campaign.spec import CampaignError, load_campaign, substitute

DEFAULT = "/src/deploy/testbed/campaigns/cache-modes.yaml"
CONFIG = "/src/deploy/testbed/provisioner.yaml"
RESULTS = Path("/src/build/campaigns")
ON = "/src/deploy/testbed/inside/on"
CACHE_MODE = "/src/deploy/testbed/inside/cache-mode"
SITES = {"gsi": ("gsi-login", "/etc/slurm-gsi/slurm.conf"),
         "frankfurt": ("fra-login", "/etc/slurm-frankfurt/slurm.conf")}
PATH = "/opt/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def pilots() -> int:
    total = 0
    for login, conf in SITES.values():
        out = subprocess.run([ON, login, "--", "squeue", "-h", "-u", "pilot", "-o", "%i"],
                             capture_output=True, text=True, check=False,
                             env={"SLURM_CONF": conf, "PATH": PATH})
        total += len(out.stdout.split())
    return total


def start_service(directory: Path) -> subprocess.Popen[bytes]:
    """`provisioner run` as the provisioner account, journal and log in `directory`."""
    data = yaml.safe_load(Path(CONFIG).read_text())
    data["journal"] = str(directory / "journal.sqlite")
    config = directory / "provisioner.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    subprocess.run(["chown", "-R", "provisioner:", str(directory)], check=True)
    directory.chmod(0o755)
    log = (directory / "service.log").open("ab")
    return subprocess.Popen(["runuser", "-u", "provisioner", "--", "/opt/venv/bin/provisioner",
                             "-c", str(config), "run"], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def main(argv: list[str]) -> int:
    spec_file = Path(argv[0] if argv else DEFAULT)
    try:
        spec = load_campaign(spec_file)
    except CampaignError as exc:
        print(exc, file=sys.stderr)
        return 2
    for scenario in spec.scenarios:
        for cmd in scenario.setup:
            if cmd[0].startswith("/") and not os.access(cmd[0], os.X_OK):
                print(f"campaign: scenario {scenario.name}: setup needs {cmd[0]}, which this "
                      "testbed does not have", file=sys.stderr)
                return 2
    if spec.files and spec.files.prepare:
        values = {"prefix": spec.files.prefix, "count": str(spec.files.count),
                  "size": spec.files.size}
        subprocess.run(substitute(spec.files.prepare, values), check=True)
    if pilots():
        print("campaign: pilots from earlier are still running; they will take jobs too")
    work = Path("/home/alice/campaigns")
    work.mkdir(parents=True, exist_ok=True)
    out = work / f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    subprocess.run(["chown", "-R", "alice:alice", str(work)], check=True)
    service_dir = Path(tempfile.mkdtemp(prefix="service.campaign.", dir="/var/tmp"))
    service = start_service(service_dir)
    print(f"campaign: provisioner service started (log {service_dir / 'service.log'})",
          flush=True)
    try:
        code = subprocess.run(
            ["runuser", "-u", "alice", "--", "env", f"PATH={PATH}", "HOME=/home/alice",
             "USER=alice", "LANG=C.UTF-8", "provisioner", "campaign", "run", str(spec_file),
             "--out", str(out)], cwd=str(work), check=False).returncode
        deadline = time.time() + 180
        while pilots() and time.time() < deadline and service.poll() is None:
            time.sleep(5)
    finally:
        if service.poll() is None:
            os.killpg(service.pid, signal.SIGTERM)
            service.wait(timeout=60)
        # Scenarios switch the Frankfurt cache host's mode: leave it in the testbed's
        # default (the demo and the tests read through a plain XCache).
        subprocess.run([CACHE_MODE, "xcache"], capture_output=True, check=False)
    left = pilots()
    if left:
        print(f"campaign: {left} pilot(s) still in SLURM; they stop when idle "
              "(STARTD_NOCLAIM_SHUTDOWN), or `make clean-testbed`")
    if out.is_dir():
        target = RESULTS / spec_file.stem
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(out, target)
        print(f"campaign: results in {out} (in the testbed) and build/campaigns/"
              f"{spec_file.stem} (in the repository)")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
