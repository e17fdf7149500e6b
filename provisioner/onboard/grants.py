"""`site discover`'s `allocations:` block: SLURM's grants (GrpTRESMins) on the accounts
the site's account may charge, each as an allocation of the configuration schema
(provisioner.config.allocations) with its unit, account and amount filled in and its
current use in a comment. Its `period` and `groups` are SLURM's to know not: they are
left empty, and the configuration refuses the block until the admin fills them in
(pure; the reads are provisioner.onboard.discover's and .restinfo's).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from provisioner.config.allocations import UNIT_SHORT, UNIT_TRES
from provisioner.sites.base import AccountCharge
from provisioner.sites.shares import SharesError, parse_shares, user_accounts

#: Where a site block's keys sit in discover's output (`sites:`, then "  - ").
INDENT = "    "


@dataclass(frozen=True)
class Grants:
    """The accounts the site's account may charge, as SLURM's accounting reports them
    (`error`: why it could not be read; then `charges` is empty)."""

    charges: Mapping[str, AccountCharge] = field(default_factory=dict)
    error: str = ""


def grants_from_shares(doc: Any, user: str | None) -> Grants:
    """The charges of every account `user` has an association with, from a fair-share
    report (``sshare --json``, slurmrestd's /shares)."""
    try:
        return Grants(parse_shares(doc, user_accounts(doc, user)))
    except SharesError as exc:
        return Grants(error=f"the fair-share report is not as expected: {exc}")


def allocation_name(account: str) -> str:
    """An allocation name (the schema's pattern) for a SLURM account."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", account).lstrip("_-")[:64]
    return name or "allocation"


def _hours(minutes: float) -> float | int:
    """Hours, rounded down to 1/1000 h (an amount never above SLURM's grant)."""
    hours = math.floor(minutes / 60 * 1000) / 1000
    return int(hours) if hours == int(hours) else hours


def allocation(charge: AccountCharge) -> tuple[dict[str, Any], str] | None:
    """The allocation of an account with a grant, and the comment line saying SLURM's
    figures; None if the account has no grant in a unit's TRES. An account with grants
    of several TRES gives the first unit's (core-, node-, then GPU-hours): an account
    serves one allocation."""
    units = [(u, t) for u, t in UNIT_TRES.items() if t in charge.grant_minutes]
    if not units:
        return None
    unit, tres = units[0]
    minutes = charge.grant_minutes[tres]
    used = charge.used_minutes.get(tres, 0.0) / 60
    said = ", ".join(f"{t}={m:g}" for t, m in charge.grant_minutes.items())
    comment = (f"{charge.account}: GrpTRESMins {said}; {used:.2f} {UNIT_SHORT[unit]} used "
               f"since SLURM last reset its use")
    entry = {"name": allocation_name(charge.account), "account": charge.account,
             "unit": unit, "amount": _hours(minutes), "period": None, "groups": []}
    return entry, comment


def render_allocations(grants: Grants | None) -> str:
    """The `allocations:` lines of a site block (indented as discover prints it), or a
    comment why there are none; "" when accounting was not asked for."""
    if grants is None:
        return ""
    if grants.error:
        return f"{INDENT}# No allocations: SLURM's accounting not readable ({grants.error}).\n"
    found = [a for c in sorted(grants.charges.values(), key=lambda c: c.account)
             if (a := allocation(c)) is not None]
    if not found:
        return (f"{INDENT}# No allocations: no account the pilots may charge has a "
                "GrpTRESMins grant.\n")
    head = ["SLURM's grants on the accounts the pilots may charge (amount: the grant,",
            "rounded down). Fill in each period (monthly, quarterly or",
            "{start: YYYY-MM-DD, end: YYYY-MM-DD}) and groups (the HTCondor accounting",
            "groups that may spend it), or remove the allocation; pace: asap (default)",
            "or even. A site has either `account:` or allocations."]
    lines = [f"{INDENT}# {line}" for line in head] + [f"{INDENT}allocations:"]
    for entry, comment in found:
        lines.append(f"{INDENT}# {comment}")
        body = yaml.safe_dump([entry], sort_keys=False, default_flow_style=False)
        body = body.replace("period: null\n", "period:\n")
        lines += [f"{INDENT}{line}" for line in body.splitlines()]
    return "\n".join(lines) + "\n"
