"""SLURM's charge and grant of accounts (provisioner.sites.shares) on both backends, read
from the testbed's real output (tests/unit/data/):

- sshare-json-gsi.json: `sshare --json --accounts=alloc-a,alloc-b,nosuch` as pilot at
  gsi, after one job of alice charged to alloc-a (1 CPU, 1 GPU, 12 s);
- slurmrestd-shares-v0.0.40.json, -v0.0.42.json: frankfurt's slurmrestd GET /shares
  (compacted), after one job of alice charged to alloc-b (a whole node: 4 CPUs, 10 s).

The errors on the way (exit codes, HTTP) come from hand-written fakes; that the real
sshare and slurmrestd answer so is tests/integration/test_slurm_accounting.py's to show.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.config.allocations import SLURM_ACCOUNT_PATTERN
from provisioner.errors import Transient, Unreachable
from provisioner.sites.base import AccountCharge
from provisioner.sites.executor import CommandResult
from provisioner.sites.shares import SharesError, parse_shares, sshare_argv, wanted_accounts
from provisioner.sites.slurm_cli import SlurmCliBackend

from .test_site_gate import gate
from .test_slurm_rest import FakeServer, backend, reply

DATA = Path(__file__).parent / "data"


def doc(name: str) -> Any:
    return json.loads((DATA / name).read_text())


def test_sshare_at_gsi_gives_use_in_minutes_and_the_grant() -> None:
    charges = parse_shares(doc("sshare-json-gsi.json"), ["alloc-a", "alloc-b", "nosuch"])
    assert set(charges) == {"alloc-a", "alloc-b"}  # an unknown account is absent
    a = charges["alloc-a"]
    # 12 s on 1 CPU, 1 node, 1 GPU
    assert a.used_minutes == {"cpu": 0.2, "node": 0.2, "gres/gpu": 0.2}
    assert a.grant_minutes == {"cpu": 6000.0}
    b = charges["alloc-b"]
    assert b == AccountCharge("alloc-b", {"cpu": 0.0, "node": 0.0, "gres/gpu": 0.0},
                              {"cpu": 3000.0})


@pytest.mark.parametrize("version", ["v0.0.40", "v0.0.42"])
def test_slurmrestd_shares_at_frankfurt(version: str) -> None:
    report = doc(f"slurmrestd-shares-{version}.json")
    charges = parse_shares(report, ["alloc-b", "hpc-physics", "pilot", "alice"])
    # users' own records (type USER, named after the user) are not accounts
    assert set(charges) == {"alloc-b", "hpc-physics"}
    b = charges["alloc-b"]
    # a whole node, 4 CPUs, 10 s; frankfurt counts no GPUs
    assert b.used_minutes == pytest.approx({"cpu": 40 / 60, "node": 10 / 60})
    assert b.grant_minutes == {"cpu": 3000.0}
    assert charges["hpc-physics"].grant_minutes == {}  # no limit


def test_only_valid_account_names_are_asked_for_each_once_sorted() -> None:
    assert wanted_accounts(["alloc-b", "alloc-a", "alloc-b", "-M", "a,b", "", "x y"]) == \
        ["alloc-a", "alloc-b"]
    assert sshare_argv(["alloc-a", "alloc-b"]) == \
        ["sshare", "--json", "--accounts=alloc-a,alloc-b"]


def _account(name: str, usage: Any, minutes: Any) -> dict[str, Any]:
    return {"name": name, "type": ["ASSOCIATION"],
            "tres": {"usage": usage, "group_minutes": minutes}}


@pytest.mark.parametrize("report,field", [
    ({}, "shares.shares"),
    ({"shares": {"shares": "none"}}, "shares.shares"),
    ({"shares": {"shares": [{"name": "a", "type": ["ASSOCIATION"]}]}}, "no 'tres'"),
    ({"shares": {"shares": [_account("a", "x", [])]}}, "tres.usage is not a list"),
    ({"shares": {"shares": [_account("a", [{"name": "cpu", "value": "many"}], [])]}},
     r"tres.usage\[cpu\] is not a number"),
    ({"shares": {"shares": [_account("a", [], []), _account("a", [], [])]}}, "twice"),
])
def test_a_report_not_as_expected_names_the_field(report: Any, field: str) -> None:
    with pytest.raises(SharesError, match=field):
        parse_shares(report, ["a"])


def test_unset_and_infinite_grants_are_no_grant() -> None:
    minutes = [{"name": "cpu", "value": {"set": False, "infinite": True, "number": 0}},
               {"name": "node", "value": {"set": True, "infinite": True, "number": 0}},
               {"name": "gres/gpu", "value": {"set": True, "infinite": False, "number": 60}},
               {"name": "mem", "value": {"set": True, "infinite": False, "number": 9}}]
    (charge,) = parse_shares({"shares": {"shares": [_account("a", [], minutes)]}},
                             ["a"]).values()
    assert charge.grant_minutes == {"gres/gpu": 60.0}


# --- over sshare (the CLI backend) -------------------------------------------------

@dataclass
class Scripted:
    """An executor that answers every command with one result; records the argv."""

    result: CommandResult
    argvs: list[list[str]] = field(default_factory=list)

    def run(self, argv: Sequence[str], env: Mapping[str, str], stdin: str | None = None
            ) -> CommandResult:
        self.argvs.append(list(argv))
        return self.result

    def close(self) -> None:
        return None


def cli(result: CommandResult) -> tuple[SlurmCliBackend, Scripted]:
    ex = Scripted(result)
    return SlurmCliBackend("gsi", "testbed", ex, slurm_conf="/etc/slurm-gsi/slurm.conf"), ex  # type: ignore[arg-type]


def test_the_cli_backend_reads_all_accounts_in_one_sshare() -> None:
    out = (DATA / "sshare-json-gsi.json").read_text()
    b, ex = cli(CommandResult(0, out, ""))
    charges = b.account_charges(["alloc-b", "alloc-a", "nosuch"])
    assert ex.argvs == [["sshare", "--json", "--accounts=alloc-a,alloc-b,nosuch"]]
    assert charges["alloc-a"].grant_minutes == {"cpu": 6000.0}
    assert "nosuch" not in charges
    b, ex = cli(CommandResult(0, out, ""))
    assert b.account_charges([]) == {} and ex.argvs == []


@pytest.mark.parametrize("result,kind,words", [
    (CommandResult(1, "", "sshare: error: slurm_persist_conn_open_without_init: failed to "
                   "open persistent connection to host:gsi-login:6819: Connection refused"),
     Unreachable, "sshare at gsi failed"),
    (CommandResult(1, "", "sshare: error: Unable to contact slurm controller (connect "
                   "failure)"), (Unreachable, Transient), "sshare at gsi"),
    (CommandResult(1, "", "You are not running a supported priority plugin\n(priority/basic)."
                   "\nOnly 'priority/multifactor' is supported."), Unreachable,
     "priority/multifactor"),
    (CommandResult(0, "sshare: not JSON", ""), Unreachable, "sshare at gsi: Expecting value"),
    (CommandResult(0, '{"shares": {}}', ""), Unreachable, "shares.shares"),
])
def test_an_unreadable_sshare_raises_never_a_guess(
        result: CommandResult, kind: type[Exception] | tuple[type[Exception], ...],
        words: str) -> None:
    b, _ = cli(result)
    with pytest.raises(kind, match=words):
        b.account_charges(["alloc-a"])


# --- over slurmrestd (the REST backend) ----------------------------------------------

def test_the_rest_backend_reads_shares_and_picks_the_wanted_accounts(tmp_path: Path) -> None:
    report = doc("slurmrestd-shares-v0.0.42.json")
    server = FakeServer({"GET shares": lambda r: httpx.Response(200, json=report)})
    charges = backend(tmp_path, server).account_charges(["alloc-b", "nosuch"])
    assert set(charges) == {"alloc-b"}
    assert charges["alloc-b"].grant_minutes == {"cpu": 3000.0}
    (asked,) = [r for r in server.requests if r.url.path.endswith("/shares")]
    # the list comma-escaped: slurmrestd 24.11 refuses a bare comma in a query
    assert asked.url.query == b"accounts=alloc-b%2Cnosuch"


@pytest.mark.parametrize("answer,words", [
    (lambda r: reply(errors=[{"error": "Unable to contact slurm controller",
                              "error_number": 1007}], status=500),
     "GET shares failed: Unable to contact slurm controller"),
    (lambda r: httpx.Response(400, text="Unable to parse query."), "not JSON"),
    (lambda r: reply({"shares": {"shares": [{"name": "alloc-b", "type": ["ASSOCIATION"]}]}}),
     "GET shares: shares of account alloc-b: no 'tres'"),
    (lambda r: httpx.Response(403, json={}), "refused the token"),
])
def test_an_unreadable_shares_reply_raises(tmp_path: Path, answer: Any, words: str) -> None:
    server = FakeServer({"GET shares": answer})
    with pytest.raises((Unreachable, Transient), match=words):
        backend(tmp_path, server).account_charges(["alloc-b"])


# --- the request through the SSH gate ----------------------------------------------

GATE_CFG = {"ids": "testbed(-probe)?", "log_dir": "/var/log/pilots", "images": set(),
            "slurm_confs": {"/etc/slurm-gsi/slurm.conf"}, "log": "/dev/null",
            "path": "/usr/local/bin:/usr/bin:/bin"}
WORDS = st.text(alphabet="aZ09_.-,; $/=*", max_size=70)


@settings(max_examples=300, deadline=None)
@given(st.lists(WORDS, max_size=8))
def test_every_sshare_the_backend_sends_passes_the_gate(names: list[str]) -> None:
    wanted = wanted_accounts(names)
    if wanted:  # nothing is sent for no account
        assert gate.check(sshare_argv(wanted), GATE_CFG)[1] == sshare_argv(wanted)
        assert all(re.fullmatch(SLURM_ACCOUNT_PATTERN, a) for a in wanted)


@settings(max_examples=300, deadline=None)
@given(WORDS)
def test_the_gate_lets_through_only_lists_of_valid_account_names(listed: str) -> None:
    """Exactly what the configuration calls an account name (SLURM_ACCOUNT_PATTERN),
    comma-separated, passes; anything else in the word is refused."""
    valid = all(re.fullmatch(SLURM_ACCOUNT_PATTERN, a) for a in listed.split(","))
    argv = ["sshare", "--json", f"--accounts={listed}"]
    if valid:
        gate.check(argv, GATE_CFG)
    else:
        with pytest.raises(gate.Refused, match="sshare arguments outside the grammar"):
            gate.check(argv, GATE_CFG)
