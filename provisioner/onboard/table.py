"""The check table `provisioner site check` prints: one row per check (pure).

A row is passed (✔), passed with a warning (!, with what to do), failed (✗, with the
fix) or not checked (-, with why: an earlier check failed, or it was not asked for).
A site passes when no row failed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

PASS, FAIL, SKIP, WARN = "✔", "✗", "-", "!"


@dataclass(frozen=True)
class Check:
    """One check of a site. `ok` None: not checked (`found` says why)."""

    section: str  # "ssh", "slurm", "image", "probe"
    name: str
    ok: bool | None
    found: str
    fix: str = ""
    seconds: float | None = None
    warning: bool = False  # passed, but a site admin should act (`fix` says how)

    @property
    def mark(self) -> str:
        return SKIP if self.ok is None else (WARN if self.warning else PASS) if self.ok \
            else FAIL


def passed(name: str, found: str, section: str, seconds: float | None = None) -> Check:
    return Check(section, name, True, found, seconds=seconds)


def failed(name: str, found: str, fix: str, section: str,
           seconds: float | None = None) -> Check:
    return Check(section, name, False, found, fix, seconds)


def warned(name: str, found: str, fix: str, section: str) -> Check:
    """Passed (the site works) but unsafe: `fix` says what the site admin should do."""
    return Check(section, name, True, found, fix, warning=True)


def skipped(name: str, why: str, section: str) -> Check:
    return Check(section, name, None, why)


def site_ok(checks: Iterable[Check]) -> bool:
    return all(c.ok is not False for c in checks)


def _row(c: Check, width: int) -> list[str]:
    took = f" ({c.seconds:.1f} s)" if c.seconds is not None else ""
    lines = [f"  {c.mark} {c.name.ljust(width)}  {c.found}{took}"]
    if (c.ok is False or c.warning) and c.fix:
        lines.append(f"    {' ' * width}  fix: {c.fix}")
    return lines


def render(site: str, checks: Sequence[Check], seconds: float | None = None) -> str:
    """The table of one site, a header line saying whether it passed."""
    fails = sum(1 for c in checks if c.ok is False)
    took = f" in {seconds:.1f} s" if seconds is not None else ""
    verdict = "all checks passed" if not fails else f"{fails} check(s) failed"
    lines = [f"Site {site}: {verdict}{took}"]
    width = max((len(c.name) for c in checks), default=0)
    for c in checks:
        lines.extend(_row(c, width))
    return "\n".join(lines)


def as_json(results: dict[str, tuple[Sequence[Check], float]]) -> str:
    """{site: {"ok": bool, "seconds": s, "checks": [{section, name, ok, found, fix,
    seconds}]}} with stable keys."""
    doc = {site: {"ok": site_ok(checks), "seconds": round(took, 3),
                  "checks": [asdict(c) for c in checks]}
           for site, (checks, took) in results.items()}
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False)
