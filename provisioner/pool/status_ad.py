"""The service's status ad in the collector: what `provisioner why` reads.

Once per full cycle the service advertises one generic ad (MyType `ProvisionerStatus`,
Name its provisioner id) with the time it was written, its cycle period and, per demand
shape (`provisioner.decide.explain.shape_key`), a reason code and its parameters: a few
hundred small nested ads at most, whatever the queue. Any user with the pool's READ
reads it (`status_argv`). Advertising a generic ad takes DAEMON at the collector
(`COLLECTOR.ALLOW_DAEMON` lists the provisioner's identity, and its token carries
`-authz DAEMON`); pilots hold DAEMON there too, so a reader takes only ads the collector
accepted from the provisioner's identity (`AuthenticatedIdentity`).

The ad lives a day in the collector (`ClassAdLifetime`): a stopped service's last word
stays readable, and `why` says how old it is.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from provisioner.decide.explain import GroupEntry, Report, ShapeEntry
from provisioner.decide.reasons import Reason, Why

log = logging.getLogger(__name__)

MY_TYPE = "ProvisionerStatus"
#: The identity the provisioner's token names, before "@" and the pool's UID_DOMAIN.
IDENTITY = "provisioner"
#: How long the collector keeps the ad without an update (seconds).
LIFETIME_S = 86400
#: The ad's layout; a reader skips ads of another.
SCHEMA = 1


def _why_ad(prefix: str, w: Why) -> dict[str, Any]:
    out: dict[str, Any] = {f"{prefix}Reason": w.reason.value}
    for k, v in w.params.items():
        if isinstance(v, (bool, int, float, str)):
            out[f"{prefix}{k}"] = v
    return out


def to_ad(report: Report) -> dict[str, Any]:
    """The report as a generic ad's attributes (nested ads for the shapes)."""
    shapes = []
    for e in report.shapes:
        ad = {"Key": e.key, "Idle": e.idle, "Unplaced": e.unplaced, **_why_ad("", e.why)}
        if e.then is not None:
            ad.update(_why_ad("Then", e.then))
        shapes.append(ad)
    return {"MyType": MY_TYPE, "Name": report.provisioner_id, "Schema": SCHEMA,
            "ProvisionerId": report.provisioner_id, "WrittenAt": int(report.written_at),
            "CycleSeconds": float(report.cycle_s), "PoolKnown": report.pool_known,
            "ShapesLeftOut": report.left_out, "ClassAdLifetime": LIFETIME_S,
            "Shapes": shapes,
            "Groups": [{"AcctGroup": g.group, "Waiting": g.jobs, **_why_ad("", g.why)}
                       for g in report.groups]}


_FIXED = {"Key", "Idle", "Unplaced", "AcctGroup", "Waiting"}


def _why_of(ad: Mapping[str, Any], prefix: str) -> Why | None:
    try:
        reason = Reason(str(ad[f"{prefix}Reason"]))
    except (KeyError, ValueError):
        return None
    params = {k[len(prefix):]: v for k, v in ad.items()
              if k.startswith(prefix) and k != f"{prefix}Reason" and k not in _FIXED
              and (prefix or not k.startswith("Then"))}
    return Why(reason, params)


def from_ad(ad: Mapping[str, Any]) -> Report | None:
    """A report from an ad `to_ad` wrote (None: not one, or of another schema); shape
    entries it cannot read are skipped."""
    try:
        if ad.get("MyType") != MY_TYPE or int(ad.get("Schema", 0)) != SCHEMA:
            return None
        shapes = []
        for s in ad.get("Shapes") or []:
            s = {str(k): v for k, v in dict(s).items()}
            why = _why_of(s, "")
            if why is None or "Key" not in s:
                continue
            shapes.append(ShapeEntry(str(s["Key"]), int(s.get("Idle", 0)), why,
                                     _why_of(s, "Then"), int(s.get("Unplaced", 0))))
        return Report(str(ad.get("ProvisionerId", ad.get("Name", ""))),
                      float(ad["WrittenAt"]), float(ad.get("CycleSeconds", 0.0)),
                      bool(ad.get("PoolKnown", True)), tuple(shapes),
                      int(ad.get("ShapesLeftOut", 0)), _groups_of(ad.get("Groups") or []))
    except (KeyError, TypeError, ValueError):
        return None


def _groups_of(ads: Iterable[Any]) -> tuple[GroupEntry, ...]:
    """The groups' entries `to_ad` wrote (where sites have allocations); entries it
    cannot read are skipped."""
    out = []
    for g in ads:
        g = {str(k): v for k, v in dict(g).items()}
        why = _why_of(g, "")
        if why is not None and "AcctGroup" in g:
            out.append(GroupEntry(str(g["AcctGroup"]), int(g.get("Waiting", 0)), why))
    return tuple(out)


def advertise(htcondor: Any, collector: str | None, report: Report) -> None:
    """Send the report to the collector (UPDATE_AD_GENERIC, over TCP). Raises what the
    bindings raise."""
    import classad2

    ad = classad2.ClassAd(to_ad(report))
    htcondor.Collector(collector).advertise([ad], "UPDATE_AD_GENERIC", True)


def constraint(uid_domain: str) -> str:
    """The collector query for status ads the provisioner's identity wrote."""
    if not uid_domain or any(c in uid_domain for c in '"\\'):
        return f'MyType == "{MY_TYPE}"  && false'
    return (f'MyType == "{MY_TYPE}" && '
            f'AuthenticatedIdentity == "{IDENTITY}@{uid_domain}"')


def status_argv(uid_domain: str) -> list[str]:
    """condor_status for the status ads (`constraint`), as any user may run it."""
    return ["condor_status", "-any", "-json", "-constraint", constraint(uid_domain)]


def reports_of(ads: Iterable[Any]) -> list[Report]:
    """The reports among `ads` (ClassAds or mappings); others are skipped."""
    out = []
    for ad in ads:
        report = from_ad({str(k): v for k, v in dict(ad).items()})
        if report is not None:
            out.append(report)
    return out
