"""What one cycle saw, decided and did: the `Observation` the loop reads, and the
`CycleResult` the loop returns and `provisioner.service.cycle_text` puts into words."""

from __future__ import annotations

from dataclasses import dataclass, field

from provisioner.decide.controller import QueueSize
from provisioner.model import Plan, Snapshot
from provisioner.pool.condor import PilotAd
from provisioner.sites.base import SiteJob


@dataclass
class Observation:
    snapshot: Snapshot
    ads: dict[str, PilotAd]
    jobs: dict[str, list[SiteJob]]
    running_on: frozenset[str] = frozenset()
    queue: QueueSize | None = None  # None: the schedd could not be read


@dataclass
class CycleResult:
    reason: str
    observation: Observation
    plan: Plan
    outcomes: list[tuple[str, str]] = field(default_factory=list)  # (action text, outcome)
    timings: dict[str, float] = field(default_factory=dict)
