"""The provisioner's SSH key at the login nodes, behind the forced-command gate
(deploy/site-gate/provisioner-gate, installed by deploy/testbed/inside/configure.sh at
both sites): what the service needs runs, anything else is refused and logged. The
service reaches frankfurt through slurmrestd only, so the key is tried where it is used:
at the sites the service's configuration reaches over SSH."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from conftest import CONFIG, LOGIN, run, service_config, slurm

from provisioner.config import load_config
from provisioner.onboard.check import gate_check
from provisioner.service.loop import Provisioner
from provisioner.sites.executor import SshExecutor

KEY = "/etc/provisioner/ssh/id_ed25519"
KNOWN = "/etc/provisioner/ssh/known_hosts"
GATE_LOG = Path("/var/log/provisioner-gate/gate.log")
#: The sites the service reaches over SSH (the others through slurmrestd).
SSH_SITES = tuple(s.name for s in load_config(CONFIG).sites
                  if getattr(getattr(s, "executor", None), "type", None) == "ssh")


def through_key(site: str, command: list[str], stdin: str = "") -> tuple[int, str, str]:
    """`command` sent with the provisioner's key, as the service's account sends it."""
    proc = run(["ssh", "-F", "none", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                "-i", KEY, "-o", "StrictHostKeyChecking=yes", "-o",
                f"UserKnownHostsFile={KNOWN}", "-o", "ConnectTimeout=5",
                f"pilot@{LOGIN[site]}", *command], user="provisioner", check=False)
    return proc.returncode, proc.stdout, proc.stderr


def gate_log() -> str:
    return run(["cat", str(GATE_LOG)]).stdout if GATE_LOG.exists() else ""


def wait_for_log(text: str, timeout: float = 10.0) -> str:
    """The gate's log once it holds `text` (the gate writes it as it refuses, before
    ssh returns, but through its own file buffer); on time-out, the log as it is."""
    end = time.monotonic() + timeout
    log = gate_log()
    while text not in log and time.monotonic() < end:
        time.sleep(0.1)
        log = gate_log()
    return log


@pytest.mark.parametrize("site", SSH_SITES)
def test_the_key_runs_what_the_service_needs_and_refuses_a_shell(site: str) -> None:
    conf = f"SLURM_CONF=/etc/slurm-{site}/slurm.conf"
    rc, out, err = through_key(site, ["env", conf, "squeue", "--json",
                                      "--name=htcpilot-testbed"])
    assert rc == 0 and '"jobs"' in out, err
    mark = uuid.uuid4().hex[:8]
    for command in (["bash"], ["cat", "/etc/passwd"], ["sh", "-c", f"echo {mark}"],
                    ["env", "PATH=/usr/bin:/bin", "bash", "-c", "id"], []):
        rc, out, err = through_key(site, command)
        assert rc == 126 and "provisioner-gate: refused" in err, (command, rc, out, err)
        assert "root:" not in out and mark not in out
    log = gate_log()
    assert "refused (command 'bash' not allowed): 'bash'" in log
    assert "refused (command 'cat' not allowed): 'cat /etc/passwd'" in log
    assert "a login shell is not allowed" in log


def test_sbatch_outside_the_grammar_and_scancel_of_alices_job_are_refused() -> None:
    site = "gsi"
    conf = f"SLURM_CONF=/etc/slurm-{site}/slurm.conf"
    job = slurm(site, ["sbatch", "--parsable", "--hold", "--wrap=sleep 600"],
                user="alice").stdout.strip().split(";")[0]
    try:
        rc, _out, err = through_key(site, ["env", conf, "scancel", job])
        assert rc == 126 and f"scancel of job {job} of account alice" in err, err
        state = slurm(site, ["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip()
        assert state == "PENDING"  # alice's job is untouched
        rc, _out, err = through_key(site, [
            "env", conf, "sbatch", "--parsable", "--job-name=htcpilot-testbed",
            "--wrap=id"])
        assert rc == 126 and "outside the grammar" in err, err
        rc, _out, err = through_key(site, [
            "env", conf, "sbatch", "--parsable", "--uid=0", "/tmp/x.sh"])
        assert rc == 126 and "outside the grammar" in err, err
        log = wait_for_log("sbatch argument '--wrap=id' outside the grammar")
        assert f"of account alice, not pilot): 'env {conf} scancel {job}'" in log
        assert "sbatch argument '--wrap=id' outside the grammar" in log
    finally:
        slurm(site, ["scancel", job], user="alice", check=False)


@pytest.mark.parametrize("site", SSH_SITES)
def test_site_check_sees_the_key_restricted(site: str) -> None:
    ctl = f"/run/provisioner-gate-test-{uuid.uuid4().hex[:8]}"
    run(["install", "-d", "-o", "provisioner", "-m", "0700", ctl])
    proc = run(["python3", "-c", (
        "import sys; from provisioner.sites.executor import SshExecutor\n"
        "from provisioner.onboard.check import gate_check\n"
        f"ex = SshExecutor(site={site!r}, host={LOGIN[site]!r}, user='pilot', "
        f"key_file={KEY!r}, known_hosts={KNOWN!r}, control_dir={ctl!r})\n"
        "row = gate_check(ex); ex.close(); print(row.ok, row.warning, row.found)")],
        user="provisioner")
    run(["rm", "-rf", ctl])
    assert proc.stdout.startswith("True False an arbitrary command is refused"), proc.stdout
    assert gate_check and SshExecutor  # the same code, run as the service's account


def test_a_gate_that_refuses_what_the_backend_needs_is_named_and_the_other_site_goes_on(
        ) -> None:
    """As an older gate at one site would: gsi's SLURM configuration is no longer
    allowed. site check and the service name the refusal; frankfurt goes on."""
    ini = Path("/etc/provisioner-gate.ini")
    saved = ini.read_text()
    ini.write_text(saved.replace(" /etc/slurm-gsi/slurm.conf", ""))
    try:
        prov = Provisioner(service_config())
        views = {v.name: v for v in prov.observe().snapshot.sites}
        assert views["frankfurt"].known, views
        assert not views["gsi"].known and "provisioner-gate: refused" in \
            views["gsi"].error, views
        checked = run(["provisioner", "-c", CONFIG, "site", "check", "--no-probe"],
                      user="provisioner", check=False)
        print(checked.stdout)
        assert checked.returncode == 1
        gsi, frankfurt = checked.stdout.split("Site gsi:", 1)[1].split("Site frankfurt:", 1)
        assert "✗" not in frankfurt, frankfurt
        assert "✗" in gsi and "provisioner-gate: refused" in gsi, gsi
    finally:
        ini.write_text(saved)
