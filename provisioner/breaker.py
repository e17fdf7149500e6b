"""Per-site circuit breaker (pure): a site whose pilots start but never join the pool, or
join and exit within `early_exit_s` without running a job, is a black hole; after
`failures` of them in a row it gets no new pilots for a back-off that doubles at every
reopening (see `provisioner.config.BreakerConfig`).

States: ``closed`` (normal), ``open`` (no submissions until `until`), ``half-open`` (one
probe pilot allowed; it closes the breaker when it joins, reopens it when it fails).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from provisioner.config import BreakerConfig
from provisioner.model import Pilot, PilotState

_UP = frozenset((PilotState.IDLE, PilotState.BUSY, PilotState.DRAINING))


@dataclass
class SiteBreaker:
    state: str = "closed"  # closed | open | half-open
    failures: int = 0  # consecutive failed pilots
    until: float = 0.0  # open: no submissions before this
    backoff_s: float = 0.0  # the last back-off (0: never opened)
    reason: str = ""


@dataclass
class _Track:
    site: str
    started_at: float | None
    joined: bool = False
    busy: bool = False


@dataclass
class Breakers:
    """The breakers of all sites, fed once per cycle with the pilots of the sites read."""

    config: BreakerConfig
    sites: dict[str, SiteBreaker] = field(default_factory=dict)
    _track: dict[str, _Track] = field(default_factory=dict)

    def observe(self, pilots: Iterable[Pilot], known: Iterable[str], now: float,
                ours: Iterable[str] = ()) -> list[str]:
        """Learn from this cycle's pilots; `known`: the sites read this cycle; `ours`:
        pilots that left because the provisioner released them. Returns one line per
        state change."""
        known = set(known)
        ours = set(ours)
        changes: list[str] = []
        present: set[str] = set()
        for p in pilots:
            present.add(p.key)
            t = self._track.get(p.key)
            if t is None:
                t = self._track[p.key] = _Track(p.site, p.started_at)
            t.started_at = p.started_at if p.started_at is not None else t.started_at
            if p.state in _UP and not t.joined:
                t.joined = True
                changes += self._success(p.site, p.key)
            t.busy = t.busy or p.state is PilotState.BUSY
        for key, t in list(self._track.items()):
            if key in present or t.site not in known:
                continue
            del self._track[key]
            if t.started_at is None:
                continue  # left while pending: cancelled, not a failure of the site
            if not t.joined:
                changes += self._failure(t.site, now, f"pilot {key} never joined the pool")
            elif (not t.busy and key not in ours
                  and now - t.started_at < self.config.early_exit_s):
                changes += self._failure(t.site, now, f"pilot {key} exited early, no job run")
        for site, b in self.sites.items():
            if b.state == "open" and now >= b.until:
                b.state = "half-open"
                changes.append(f"site {site}: circuit breaker half-open, one probe pilot")
        return changes

    def _success(self, site: str, key: str) -> list[str]:
        b = self.sites.setdefault(site, SiteBreaker())
        b.failures = 0
        if b.state == "closed":
            return []
        b.state, b.backoff_s, b.reason = "closed", 0.0, ""
        return [f"site {site}: circuit breaker closed, pilot {key} joined the pool"]

    def _failure(self, site: str, now: float, why: str) -> list[str]:
        b = self.sites.setdefault(site, SiteBreaker())
        b.failures += 1
        if b.state == "half-open" or (b.state == "closed"
                                      and b.failures >= self.config.failures):
            b.backoff_s = min(self.config.max_backoff_s,
                              b.backoff_s * 2 if b.backoff_s else self.config.backoff_s)
            b.state, b.until, b.reason = "open", now + b.backoff_s, why
            return [f"site {site}: circuit breaker open for {b.backoff_s:.0f} s after "
                    f"{b.failures} failed pilots ({why})"]
        return []

    def limits(self, in_flight: Mapping[str, int]) -> dict[str, int]:
        """Most new pilots per site this cycle: 0 while open; while half-open 1 if no
        pilot is pending or starting there (`in_flight`), else 0. Closed sites absent."""
        out = {}
        for site, b in self.sites.items():
            if b.state == "open":
                out[site] = 0
            elif b.state == "half-open":
                out[site] = 0 if in_flight.get(site, 0) else 1
        return out

    def status(self) -> dict[str, dict[str, Any]]:
        """A JSON-able view for `provisioner status`: site -> state, failures, until,
        backoff_s, reason (closed sites without failures omitted)."""
        return {site: {"state": b.state, "failures": b.failures, "until": b.until,
                       "backoff_s": b.backoff_s, "reason": b.reason}
                for site, b in sorted(self.sites.items())
                if b.state != "closed" or b.failures}

    def load(self, data: Mapping[str, Any]) -> None:
        """Restore what `status()` wrote; malformed entries are skipped."""
        for site, e in data.items():
            try:
                self.sites[str(site)] = SiteBreaker(
                    str(e["state"]), int(e["failures"]), float(e["until"]),
                    float(e["backoff_s"]), str(e.get("reason", "")))
            except (KeyError, TypeError, ValueError):
                continue
