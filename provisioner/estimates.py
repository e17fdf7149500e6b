"""Per-site lead times learnt from what every cycle observes (pure).

A pilot's SLURM queue wait is its start minus its submission time (both from `squeue`,
so they are right even for pilots seen for the first time after a restart). Its boot
time is taken when it is first seen in the pool after having been seen pending or
starting (to the resolution of one cycle). Both are kept as exponential moving averages
per site and serialise to a plain dict, which the service persists in its journal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from provisioner.config import PlacementConfig
from provisioner.model import Pilot, PilotState, SiteEstimate

_UP = frozenset((PilotState.IDLE, PilotState.BUSY, PilotState.DRAINING))


@dataclass
class Estimates:
    """Learnt `SiteEstimate`s, updated by `observe()` once per cycle."""

    placement: PlacementConfig
    sites: dict[str, SiteEstimate] = field(default_factory=dict)
    _started: set[str] = field(default_factory=set)  # pilots whose queue wait is counted
    _booting: set[str] = field(default_factory=set)  # seen pending/starting, not yet up
    _up: set[str] = field(default_factory=set)

    def observe(self, pilots: Iterable[Pilot], now: float) -> None:
        """Learn from this cycle's pilots (of the sites read this cycle)."""
        present: set[str] = set()
        for p in pilots:
            present.add(p.key)
            if p.started_at is not None and p.key not in self._started:
                self._started.add(p.key)
                self._learn(p.site, wait=max(0.0, p.started_at - p.submitted_at))
            if p.state in (PilotState.PENDING, PilotState.STARTING):
                self._booting.add(p.key)
            elif p.state in _UP and p.key not in self._up:
                self._up.add(p.key)
                if p.key in self._booting and p.started_at is not None:
                    self._learn(p.site, boot=max(0.0, now - p.started_at))
        self._started &= present
        self._booting &= present
        self._up &= present

    def _learn(self, site: str, wait: float | None = None, boot: float | None = None) -> None:
        a = self.placement.smoothing
        old = self.sites.get(site)
        if old is None:
            old = SiteEstimate(self.placement.default_wait_s, self.placement.default_boot_s, 0)
        if wait is not None:
            w = wait if old.samples == 0 else (1 - a) * old.wait_s + a * wait
            self.sites[site] = SiteEstimate(w, old.boot_s, old.samples + 1)
        if boot is not None:
            old = self.sites.get(site, old)
            self.sites[site] = replace(old, boot_s=(1 - a) * old.boot_s + a * boot)

    def to_dict(self) -> dict[str, dict[str, float]]:
        """A JSON-able copy: site -> {wait_s, boot_s, samples}."""
        return {s: {"wait_s": e.wait_s, "boot_s": e.boot_s, "samples": e.samples}
                for s, e in sorted(self.sites.items())}

    def load(self, data: Mapping[str, Any]) -> None:
        """Restore what `to_dict()` wrote; malformed entries are skipped."""
        for site, e in data.items():
            try:
                self.sites[str(site)] = SiteEstimate(float(e["wait_s"]), float(e["boot_s"]),
                                                     int(e["samples"]))
            except (KeyError, TypeError, ValueError):
                continue
