"""What `provisioner image check` reports: each check's result, the measurements, and
the report as a table or JSON (`provisioner.data.image` runs the checks)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

OK, FAIL, SKIPPED = "ok", "FAIL", "skipped"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # OK, FAIL or SKIPPED
    detail: str


@dataclass
class Report:
    image: str
    kind: str = ""
    checks: list[Check] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    startup_s: list[float] = field(default_factory=list)
    size_bytes: int | None = None
    unpacked_bytes: int | None = None

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.status != FAIL for c in self.checks)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    @property
    def startup_median_s(self) -> float | None:
        return statistics.median(self.startup_s) if self.startup_s else None

    @property
    def ratio(self) -> float | None:
        if self.size_bytes and self.unpacked_bytes is not None:
            return self.unpacked_bytes / self.size_bytes
        return None

    def add(self, name: str, status: str, detail: str) -> None:
        self.checks.append(Check(name, status, detail))

    def as_json(self) -> dict[str, Any]:
        median = self.startup_median_s
        return {
            "image": self.image, "kind": self.kind, "ok": self.ok,
            "checks": [{"name": c.name, "status": c.status, "detail": c.detail}
                       for c in self.checks],
            "environment": dict(sorted(self.environment.items())),
            "startup_s": {"runs": [round(s, 4) for s in self.startup_s],
                          "median": None if median is None else round(median, 4)},
            "size_bytes": self.size_bytes, "unpacked_bytes": self.unpacked_bytes,
            "unpacked_ratio": None if self.ratio is None else round(self.ratio, 2),
        }


def human(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def render(report: Report) -> str:
    """The report as a table: one row per check."""
    width = max(len(c.name) for c in report.checks) if report.checks else 5
    lines = [f"Image {report.image}" + (f" ({report.kind})" if report.kind else ""),
             f"  {'check':<{width}}  {'result':<7}  detail"]
    lines += [f"  {c.name:<{width}}  {c.status:<7}  {c.detail}" for c in report.checks]
    lines.append("Result: ok" if report.ok else
                 f"Result: FAILED ({', '.join(c.name for c in report.failed)})")
    return "\n".join(lines)
