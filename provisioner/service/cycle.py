"""What one cycle saw, decided and did: the `Observation` the loop reads, and the
`CycleResult` the loop returns and `provisioner.service.cycle_text` puts into words."""

from __future__ import annotations

from dataclasses import dataclass, field

from provisioner.decide.controller import QueueSize
from provisioner.model import CycleMemory, Plan, Snapshot
from provisioner.pool.classads import PilotAd
from provisioner.pool.pilot_view import idle_ad_keys
from provisioner.sites.base import SiteJob


@dataclass
class Observation:
    """What one full cycle read: the `Snapshot` the decision takes, and what acting on
    it needs besides (the pilot ads, the sites' jobs, the startds running jobs)."""

    snapshot: Snapshot
    ads: dict[str, PilotAd]
    jobs: dict[str, list[SiteJob]]
    running_on: frozenset[str] = frozenset()
    queue: QueueSize | None = None  # None: the schedd could not be read

    @property
    def idle_ads(self) -> frozenset[str]:
        """The idle pilots as the quick check sees them (a ghost ad's included)."""
        return idle_ad_keys(self.ads)


@dataclass
class CycleResult:
    reason: str
    observation: Observation
    plan: Plan
    outcomes: list[tuple[str, str]] = field(default_factory=list)  # (action text, outcome)
    #: what the controller remembered beside the observation (the reserve's window, ...)
    memory: CycleMemory = field(default_factory=CycleMemory)
    timings: dict[str, float] = field(default_factory=dict)
