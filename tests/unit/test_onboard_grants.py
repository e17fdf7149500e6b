"""`site discover`'s allocations (provisioner.onboard.grants) from the testbed's real
fair-share reports (tests/unit/data/): `sshare --json` as pilot at gsi (its own
associations), and frankfurt's slurmrestd GET /shares (every association). Each grant
becomes an allocation with its unit and amount; the configuration refuses the block
until the admin fills in its period and groups."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.config import ConfigError, parse_config
from provisioner.onboard.discover import Access, Live, discover
from provisioner.onboard.grants import Grants, allocation, allocation_name, grants_from_shares
from provisioner.onboard.slurminfo import parse_nodes, parse_partitions
from provisioner.sites.base import AccountCharge

from .test_onboard_slurm import GSI_NODES, GSI_PARTITIONS

DATA = Path(__file__).parent / "data"
ACCESS = Access(host="gsi-login", user="pilot", slurm_conf="/etc/slurm-gsi/slurm.conf")


def doc(name: str) -> Any:
    return json.loads((DATA / name).read_text())


def gsi(grants: Grants | None) -> str:
    live = Live("gsi", tuple(parse_partitions(GSI_PARTITIONS)), tuple(parse_nodes(GSI_NODES)),
                grants)
    return discover(live, None, ACCESS, "/opt/images/pilot.sif", None, None, "pilot@gsi-login")


def test_the_accounts_the_pilot_may_charge_are_read_from_its_associations() -> None:
    mine = grants_from_shares(doc("sshare-json-mine-gsi.json"), "pilot")
    assert sorted(mine.charges) == ["alloc-a", "alloc-b", "hpc-physics"]  # not root
    every = grants_from_shares(doc("slurmrestd-shares-v0.0.42.json"), "pilot")
    assert sorted(every.charges) == ["alloc-a", "alloc-b", "hpc-physics"]
    assert grants_from_shares(doc("slurmrestd-shares-v0.0.42.json"), "nobody").charges == {}
    assert "not as expected" in grants_from_shares({"shares": 1}, "pilot").error


def test_discover_prints_each_grant_as_an_allocation_the_admin_must_complete() -> None:
    text = gsi(grants_from_shares(doc("sshare-json-mine-gsi.json"), "pilot"))
    (site,) = yaml.safe_load(text)["sites"]
    assert site["allocations"] == [
        {"name": "alloc-a", "account": "alloc-a", "unit": "core-hours", "amount": 100,
         "period": None, "groups": []},
        {"name": "alloc-b", "account": "alloc-b", "unit": "core-hours", "amount": 50,
         "period": None, "groups": []}]
    assert "# alloc-a: GrpTRESMins cpu=6000; 0.00 core-h used since SLURM" in text
    assert "hpc-physics" not in text  # no grant, no allocation
    with pytest.raises(ConfigError) as refused:
        parse_config(text)
    for field in ("allocations.0.period", "allocations.0.groups", "allocations.1.period"):
        assert field in str(refused.value).replace("[", ".").replace("]", ""), refused.value
    # filled in as the comment asks, the block is a valid configuration (with the journal
    # that holds an allocation's ledger)
    filled = "journal: /var/lib/provisioner/journal.sqlite\n" + text.replace(
        "  period:\n", "  period: monthly\n").replace("groups: []", "groups: [physics]")
    config = parse_config(filled)
    assert [(a.name, a.account, a.unit, a.amount, a.period) for a in
            config.site("gsi").allocations] == [
        ("alloc-a", "alloc-a", "core-hours", 100.0, "monthly"),
        ("alloc-b", "alloc-b", "core-hours", 50.0, "monthly")]


def test_no_grants_no_block_and_an_unreadable_accounting_is_said() -> None:
    assert "allocations" not in gsi(None)
    none = gsi(Grants({"hpc-physics": AccountCharge("hpc-physics", {"cpu": 1.0}, {})}))
    assert "# No allocations: no account the pilots may charge has a GrpTRESMins" in none
    broken = gsi(Grants(error="sshare: error: Unable to contact slurm controller"))
    assert "# No allocations: SLURM's accounting not readable (sshare: error: Unable" in broken
    for text in (none, broken):
        parse_config(text)  # comments only: still a valid block


@pytest.mark.parametrize("grant,unit,amount", [
    ({"cpu": 1234.0}, "core-hours", 20.566),  # rounded down: never above SLURM's grant
    ({"node": 600.0}, "node-hours", 10),
    ({"gres/gpu": 90.0}, "gpu-hours", 1.5),
    ({"gres/gpu": 90.0, "cpu": 6000.0}, "core-hours", 100),  # one unit per account
])
def test_the_unit_is_the_grants_tres(grant: dict[str, float], unit: str,
                                     amount: float) -> None:
    found = allocation(AccountCharge("proj.x", {"cpu": 120.0}, grant))
    assert found is not None
    entry, comment = found
    assert (entry["name"], entry["unit"], entry["amount"]) == ("proj-x", unit, amount)
    assert comment.startswith("proj.x: GrpTRESMins ")
    assert allocation(AccountCharge("a", {}, {})) is None
    assert allocation_name("_.x") == "x" and allocation_name("...") == "allocation"
