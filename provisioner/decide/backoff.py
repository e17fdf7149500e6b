"""Back-off of a site that cannot be read (pure: the caller passes `now`).

A site whose `squeue` (or SSH connection) fails is unknown for that cycle. If it
keeps failing, asking it every cycle only adds the command's timeout to every
cycle: it is asked again after ``base_s * 2**(failures-1)`` seconds, at most
``max_s``. While it is backed off the site stays unknown (its last-known pilots
still count; nothing is decided there). One success resets it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SiteBackoff:
    base_s: float = 20.0
    max_s: float = 300.0
    failures: dict[str, int] = field(default_factory=dict)
    retry_at: dict[str, float] = field(default_factory=dict)

    def due(self, site: str, now: float) -> bool:
        """The site may be asked now."""
        return now >= self.retry_at.get(site, 0.0)

    def failed(self, site: str, now: float) -> float:
        """Record a failure; returns the seconds until the next try."""
        n = self.failures.get(site, 0) + 1
        self.failures[site] = n
        delay = float(min(self.max_s, self.base_s * 2.0 ** (n - 1)))
        self.retry_at[site] = now + delay
        return delay

    def succeeded(self, site: str) -> bool:
        """Record a success; True if the site had been failing (it recovered)."""
        self.retry_at.pop(site, None)
        return self.failures.pop(site, 0) > 0
