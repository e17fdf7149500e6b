"""The login node's forced-command gate (deploy/site-gate/provisioner-gate): it lets
through every request the SLURM backend, the probe and `site check` make, and nothing
else; each refusal is logged with its reason."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

import pytest

from provisioner.onboard import check as site_check
from provisioner.onboard.discover import read_grants
from provisioner.onboard.probe import NO_TOKEN
from provisioner.sites.base import PilotRequest
from provisioner.sites.executor import CommandResult, remote_command
from provisioner.sites.slurm_cli import SlurmCliBackend

GATE = Path(__file__).resolve().parents[2] / "deploy" / "site-gate" / "provisioner-gate"
INI = """[gate]
provisioner_ids = testbed
log_dir = /var/log/pilots
images = /opt/images/pilot.sif
slurm_confs = /etc/slurm-gsi/slurm.conf
log = {log}
"""


def load_gate() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("provisioner_gate", str(GATE))
    spec = importlib.util.spec_from_loader("provisioner_gate", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


gate = load_gate()


class Recorder:
    """An executor that records the remote command line and answers success."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def run(self, argv: Sequence[str], env: Mapping[str, str], stdin: str | None = None
            ) -> CommandResult:
        self.lines.append(remote_command(argv, env))
        out = {"sbatch": "42\n", "squeue": '{"jobs": []}',
               "sshare": '{"shares": {"shares": []}}'}.get(argv[0], "")
        return CommandResult(0, out, "")

    def close(self) -> None:
        return None


@pytest.fixture
def cfg(tmp_path: Path) -> dict[str, object]:
    ini = tmp_path / "gate.ini"
    ini.write_text(INI.format(log=tmp_path / "gate.log"))
    return gate.settings(str(ini))  # type: ignore[no-any-return]


def backend_requests() -> list[str]:
    rec = Recorder()
    clock = iter(range(0, 10**9, 10**6))
    b = SlurmCliBackend("gsi", "testbed", rec, slurm_conf="/etc/slurm-gsi/slurm.conf",  # type: ignore[arg-type]
                        partition="main", account="hpc-physics", qos="normal",
                        output_dir="/var/log/pilots", log_dir="/var/log/pilots",
                        gpu_type="a100", clock=lambda: float(next(clock)))
    b.submit(PilotRequest(4, 7800, 3600, 120, "#!/bin/bash\n", gpus=2, deadline_s=90000))
    b.submit(PilotRequest(1, 1950, 600, 120, "#!/bin/bash\n"))
    b.list_pilots()
    b.release("42")
    b.retire("42")
    b.retire("42", retire=False)
    b.cancel("42")
    b.cancel("42", only_pending=True)
    b.end_records(["42", "43"])
    b.account_charges(["alloc-b", "alloc-a", "alloc-a"])
    argv = b.sbatch_argv(PilotRequest(4, 7800, 3600, 120, "x"))
    argv.insert(1, "--test-only")
    rec.run(argv, b._env(), stdin="x")
    probe = SlurmCliBackend("gsi", "testbed-probe", rec, slurm_conf="/etc/slurm-gsi/slurm.conf",  # type: ignore[arg-type]
                            output_dir="/var/log/pilots", log_dir="/var/log/pilots")
    probe.submit(PilotRequest(1, 1950, 600, 120, NO_TOKEN))
    probe.list_pilots()
    rec.run(["squeue", "--noheader", "--jobs=42", "--format=%T|%r"], b._env())
    rec.run(["head", "-c", "200000", "--",
             "/var/log/pilots/htcpilot-testbed-probe-gsi-42.out"], b._env())
    site_check.commands_check(rec)  # type: ignore[arg-type]
    rec.run(["id", "-un"], {"PATH": "/usr/bin:/bin"})
    rec.run(["stat", "-L", "-c", "%F, %s bytes, owner %U, mode %a", "--",
             "/opt/images/pilot.sif"], {"PATH": "/usr/bin:/bin"})
    rec.run(["test", "-r", "/opt/images/pilot.sif"], {"PATH": "/usr/bin:/bin"})
    for cmd in (["scontrol", "show", "config"], ["scontrol", "show", "partition", "-o"],
                ["scontrol", "show", "node", "-o"]):
        rec.run(cmd, b._env())
    assert read_grants(rec, "/etc/slurm-gsi/slurm.conf", "pilot").error == ""  # type: ignore[arg-type]
    return rec.lines


def test_every_request_of_the_backend_probe_and_site_check_is_allowed(
        cfg: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    me = __import__("pwd").getpwuid(os.getuid()).pw_name
    monkeypatch.setattr(gate, "job_owner", lambda job, env, cfg: me)
    lines = backend_requests()
    kinds = {next(w for w in shlex.split(line)[1:] if "=" not in w) for line in lines}
    assert {"sbatch", "squeue", "scancel", "head", "find", "scontrol", "stat", "test",
            "id", "sshare"} <= kinds
    for line in lines:
        env, argv = gate.check(shlex.split(line), cfg)
        assert argv[0] in kinds and env["PATH"] == "/usr/local/bin:/usr/bin:/bin"


@pytest.mark.parametrize("line,reason", [
    ("bash", "not allowed"),
    ("env PATH=/usr/bin:/bin cat /etc/passwd", "not allowed"),
    ("sh -c 'id'", "not allowed"),
    ("env LD_PRELOAD=/tmp/x.so squeue --json --name=htcpilot-testbed", "LD_PRELOAD"),
    ("env SLURM_CONF=/tmp/evil.conf squeue --json --name=htcpilot-testbed", "SLURM_CONF"),
    ("squeue --json --name=htcpilot-someone-else", "outside the grammar"),
    ("squeue --json", "outside the grammar"),
    ("sbatch --parsable --wrap=id", "outside the grammar"),
    ("sbatch --parsable --job-name=htcpilot-testbed /tmp/script.sh", "outside the grammar"),
    ("scancel --signal=KILL 42", "outside the grammar"),
    ("scancel --user=alice", "not a job id"),
    ("scancel 42;id", "not a job id"),
    ("head -c 4096 -- /etc/shadow", "outside the grammar"),
    ("head -v -c 4096 -- /var/log/pilots/end/../../../etc/passwd", "outside the grammar"),
    ("find / -delete", "outside the grammar"),
    ("stat -L -c %F -- /etc/shadow", "not allowed"),
    ("test -r /etc/shadow", "not a configured image"),
    ("scontrol update jobid=42 timelimit=99999", "not allowed"),
    # sshare: exactly `sshare --json [--accounts=A[,B...]]`, nothing else it can say
    ("sshare", "sshare arguments outside the grammar"),
    ("sshare -l", "sshare arguments outside the grammar"),
    ("sshare --json --json", "sshare arguments outside the grammar"),
    ("sshare -l -P --accounts=alloc-a", "sshare arguments outside the grammar"),
    ("sshare --accounts=alloc-a --json", "sshare arguments outside the grammar"),
    ("sshare --json=v0.0.40 --accounts=alloc-a", "sshare arguments outside the grammar"),
    ("sshare --json --all", "sshare arguments outside the grammar"),
    ("sshare --json --users=alice", "sshare arguments outside the grammar"),
    ("sshare --json --accounts=alloc-a --all", "sshare arguments outside the grammar"),
    ("sshare --json --accounts=alloc-a -M all", "sshare arguments outside the grammar"),
    ("sshare --json --accounts=", "sshare arguments outside the grammar"),
    ("sshare --json --accounts=alloc-a,,alloc-b", "sshare arguments outside the grammar"),
    ("sshare --json --accounts=-M,all", "sshare arguments outside the grammar"),
    ("sshare --json '--accounts=alloc-a;id'", "sshare arguments outside the grammar"),
    ("sshare --json '--accounts=alloc-a alloc-b'", "sshare arguments outside the grammar"),
])
def test_anything_else_is_refused_with_its_reason(cfg: dict[str, object], line: str,
                                                  reason: str) -> None:
    with pytest.raises(gate.Refused, match=reason):
        gate.check(shlex.split(line), cfg)


def test_sbatch_with_an_option_outside_the_grammar_is_refused(cfg: dict[str, object]
                                                              ) -> None:
    line = backend_requests()[0]
    gate.check(shlex.split(line), cfg)
    for extra in ("--uid=0", "--export=ALL,LD_PRELOAD=/tmp/x", "--chdir=/home/pilot",
                  "--output=/home/pilot/.bashrc", "--mem=1M --mem=2M"):
        with pytest.raises(gate.Refused):
            gate.check(shlex.split(line) + extra.split(), cfg)


def test_scancel_of_another_accounts_job_is_refused(cfg: dict[str, object],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gate, "job_owner", lambda job, env, cfg: "alice")
    with pytest.raises(gate.Refused, match="of account alice"):
        gate.check(["scancel", "42"], cfg)
    monkeypatch.setattr(gate, "job_owner", lambda job, env, cfg: None)  # already gone
    gate.check(["scancel", "42"], cfg)


def test_a_refusal_is_logged_and_nothing_runs(tmp_path: Path) -> None:
    ini = tmp_path / "gate.ini"
    ini.write_text(INI.format(log=tmp_path / "gate.log"))
    marker = tmp_path / "ran"
    for request in (f"touch {marker}", None):
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
        if request is not None:
            env["SSH_ORIGINAL_COMMAND"] = request
        proc = subprocess.run([sys.executable, "-I", str(GATE), str(ini)], env=env,
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 126 and "refused" in proc.stderr
    assert not marker.exists()
    logged = (tmp_path / "gate.log").read_text().splitlines()
    assert "refused (command 'touch' not allowed)" in logged[0]
    assert "a login shell is not allowed" in logged[1]
    assert (tmp_path / "gate.log").stat().st_mode & 0o777 == 0o600
