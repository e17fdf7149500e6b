"""SLURM's charge and grant of accounts, from its fair-share report: ``sshare --json``
on the login node or slurmrestd's ``/shares`` (the same records in data_parser v0.0.40,
v0.0.41 and v0.0.42), turned into `AccountCharge` records (pure).

The report has one record per association: an account's own (``type`` ASSOCIATION,
``name`` the account) and one per user under it (``type`` USER, ``parent`` the
account). An account's record carries what every job charged to the account used,
whoever ran it, and the account's limits:

- ``tres.usage``: TRES-seconds used since the last reset (PriorityUsageResetPeriod;
  with a decay half-life the used value decays too), running jobs included up to the
  controller's last usage pass (PriorityCalcPeriod), a plain number per TRES;
- ``tres.group_minutes``: GrpTRESMins, ``{"set", "infinite", "number"}`` per TRES,
  unset or infinite where the account has no such limit.

Only the TRES an allocation's unit counts are read (`UNIT_TRES`: cpu, node, gres/gpu).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from provisioner.config.allocations import SLURM_ACCOUNT_PATTERN, UNIT_TRES
from provisioner.sites.base import AccountCharge

#: The TRES read of each account: those an allocation's unit counts.
TRES = tuple(dict.fromkeys(UNIT_TRES.values()))
_ACCOUNT = re.compile(SLURM_ACCOUNT_PATTERN)


class SharesError(ValueError):
    """The report is not as expected; the message names the field."""


def wanted_accounts(accounts: Iterable[str]) -> list[str]:
    """The accounts to ask for, sorted, each once; a name SLURM cannot have (not a valid
    account name) is left out: it is an account SLURM does not know."""
    return sorted({a for a in accounts if _ACCOUNT.match(a)})


#: `sshare --json` alone: the calling user's own associations (and their accounts).
SSHARE_MINE = ("sshare", "--json")


def user_accounts(doc: Any, user: str | None) -> list[str]:
    """The accounts `user` may charge (those holding a USER record of theirs), sorted;
    with `user` None every USER record's (sshare alone shows the caller's only)."""
    return sorted({str(r.get("parent")) for r in _records(doc)
                   if not _is_account(r) and r.get("parent")
                   and (user is None or r.get("name") == user)})


def sshare_argv(accounts: Sequence[str]) -> list[str]:
    """The one sshare command that reads `accounts` (valid names, as from
    `wanted_accounts`): the form the site's SSH gate allows."""
    return ["sshare", "--json", f"--accounts={','.join(accounts)}"]


def _number(value: Any, where: str) -> float | None:
    """A plain number, or slurm's {"set", "infinite", "number"}; None if unset or
    infinite."""
    if isinstance(value, dict):
        if not value.get("set", False) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SharesError(f"{where} is not a number: {value!r}")
    return float(value)


def _by_tres(entries: Any, where: str) -> dict[str, float]:
    """[{"name": TRES, "value": n}, ...] -> {TRES: n} for the TRES read, set ones only."""
    if not isinstance(entries, list):
        raise SharesError(f"{where} is not a list")
    out: dict[str, float] = {}
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("name") not in TRES:
            continue
        value = _number(entry.get("value"), f"{where}[{entry['name']}]")
        if value is not None:
            out[entry["name"]] = value
    return out


def _is_account(record: Mapping[str, Any]) -> bool:
    kinds = record.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    return "ASSOCIATION" in kinds


def _records(doc: Any) -> list[Mapping[str, Any]]:
    shares = doc.get("shares") if isinstance(doc, dict) else None
    records = shares.get("shares") if isinstance(shares, dict) else None
    if not isinstance(records, list):
        raise SharesError("no 'shares.shares' list")
    return [r for r in records if isinstance(r, dict)]


def parse_shares(doc: Any, accounts: Iterable[str]) -> dict[str, AccountCharge]:
    """The charge and grant of each of `accounts` in a fair-share report, by account; an
    account the report does not show is absent. TRES-seconds become minutes."""
    wanted = set(accounts)
    out: dict[str, AccountCharge] = {}
    for record in _records(doc):
        name = record.get("name")
        if name not in wanted or not _is_account(record):
            continue
        where = f"shares of account {name}"
        if name in out:
            raise SharesError(f"{where}: the report shows the account twice")
        tres = record.get("tres")
        if not isinstance(tres, dict):
            raise SharesError(f"{where}: no 'tres'")
        used = _by_tres(tres.get("usage"), f"{where}: tres.usage")
        grant = _by_tres(tres.get("group_minutes"), f"{where}: tres.group_minutes")
        out[name] = AccountCharge(account=name,
                                  used_minutes={t: s / 60 for t, s in used.items()},
                                  grant_minutes=grant)
    return out
