"""Per-site lead times learnt from what every cycle observes (pure).

A pilot's SLURM queue wait is its start minus its submission time (both from `squeue`,
so they are right even for pilots seen for the first time after a restart). Its boot
time (SLURM start -> startd) is taken when it is first seen in the pool: from the
startd's `DaemonStartTime` in its ad, or, without one, as the time it was first seen up
if a cycle saw it pending or starting before (to the resolution of one cycle; fast
queues start pilots between two full cycles, so the ad's time is what usually counts).
Each pilot is learnt once: the pilots counted are persisted beside the estimates, so a
restarted service does not learn its running pilots again, and so are the pilots seen
booting and not yet up, so a restarted service still learns the boot of a pilot that
came up while it was down (from the ad's `DaemonStartTime`). Both are kept as exponential
moving averages per site and serialise to a plain dict, which the service persists in
its journal.
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

    def observe(self, pilots: Iterable[Pilot], now: float,
                sites: Iterable[str] | None = None) -> None:
        """Learn from this cycle's pilots, those of the `sites` read this cycle (all of
        the pilots' sites if None). A pilot of a site not read this cycle stays counted:
        a site unreachable for a while does not have its pilots' queue waits learnt
        again when it is back."""
        pilots = list(pilots)
        read = set(sites) if sites is not None else {p.site for p in pilots}
        present = {k for k in self._started | self._booting | self._up
                   if k.split("/", 1)[0] not in read}
        for p in pilots:
            present.add(p.key)
            new_start = p.started_at is not None and p.key not in self._started
            if new_start:
                self._started.add(p.key)
                self._learn(p.site, wait=max(0.0, (p.started_at or 0.0) - p.submitted_at))
            if p.state in (PilotState.PENDING, PilotState.STARTING):
                self._booting.add(p.key)
            elif p.state in _UP and p.key not in self._up:
                self._up.add(p.key)
                boot = self._boot(p, now, new_start)
                if boot is not None:
                    self._learn(p.site, boot=boot)
        self._started &= present
        self._booting &= present
        self._up &= present

    def _boot(self, p: Pilot, now: float, new_start: bool) -> float | None:
        """A pilot's boot time, SLURM start -> its startd, when first seen up: from its
        startd's own start time if the ad has it, else the time it was first seen up
        if the cycle before saw it booting (to one cycle). None for a pilot whose boot
        this service did not see (started before a restart, counted then)."""
        if p.started_at is None or not (new_start or p.key in self._booting):
            return None
        upper = max(0.0, now - p.started_at)
        if p.joined_at is not None:
            return min(max(0.0, p.joined_at - p.started_at), upper)
        return upper if p.key in self._booting else None

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

    def counted(self) -> list[str]:
        """The pilots whose queue wait is learnt already (persisted beside `to_dict()`, so
        a restarted service does not learn the running pilots' waits a second time)."""
        return sorted(self._started)

    def load_counted(self, keys: Iterable[Any]) -> None:
        """Restore what `counted()` returned; anything but a pilot key is skipped."""
        self._started |= _pilot_keys(keys)

    def booting(self) -> list[str]:
        """The pilots seen pending or starting and not yet up: their boot is still to be
        learnt (persisted, so a restarted service learns it when it sees them up)."""
        return sorted(self._booting - self._up)

    def load_booting(self, keys: Iterable[Any]) -> None:
        """Restore what `booting()` returned; anything but a pilot key is skipped."""
        self._booting |= _pilot_keys(keys)

    def load(self, data: Mapping[str, Any]) -> None:
        """Restore what `to_dict()` wrote; malformed entries are skipped."""
        for site, e in data.items():
            try:
                self.sites[str(site)] = SiteEstimate(float(e["wait_s"]), float(e["boot_s"]),
                                                     int(e["samples"]))
            except (KeyError, TypeError, ValueError):
                continue


def _pilot_keys(keys: Iterable[Any]) -> set[str]:
    return {k for k in keys if isinstance(k, str) and "/" in k}
