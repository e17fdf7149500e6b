"""Pilot policies for the simulator: ours (`plan()`), and the two baselines sites use today.

- `PlanPolicy`: the service's decision core, `provisioner.decide.controller.Controller`, called
  exactly as the service calls it, through the same tick driver
  (`provisioner.service.ticker`): a cheap probe every `quick_check_s` (the pilots' ads
  every `join_check_s` while pilots join, asking for a negotiation when one joins while
  jobs wait), a full cycle when the controller says one is due, on a snapshot of the world.
- `PrototypePolicy`: the original loop. Every 300 s: if any job is idle, submit one
  whole-node pilot at the first site (by weight) below its pilot cap; idle pilots are flagged,
  and released in the next cycle if still idle.
- `CobaldPolicy`: a COBalD `LinearController` per site over a TARDIS-style pool of
  whole-node drones: every `tick_s`, demand += rate*tick if allocation > high_allocation,
  demand -= rate*tick if utilisation < low_utilisation; drones are spawned or drained to
  follow int(demand), between 0 and the site's pilot cap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.sim.entities import SimPilot, SiteModel
from bench.sim.world import World
from provisioner.config import Config
from provisioner.decide.cadence import Probe
from provisioner.decide.controller import Controller, QueueSize
from provisioner.model import Action, PilotState, Release, Snapshot, Submit
from provisioner.service.submitter import submit_all
from provisioner.service.ticker import decide, tick


@dataclass(frozen=True)
class WorldView:
    """What a full cycle of `PlanPolicy` observed (a `provisioner.service.ticker.Seen`)."""

    snapshot: Snapshot
    queue: QueueSize | None
    idle_ads: frozenset[str] | None = None  # the snapshot's idle pilots


class WorldSenses:
    """The simulated world as the tick sequence reads it (`provisioner.service.ticker.Senses`)."""

    def __init__(self, world: World) -> None:
        self.world = world

    def idle_pilots(self) -> frozenset[str]:
        return frozenset(p.key for p in self.world.pilots.values()
                         if p.booted and not p.draining and not p.jobs)

    def probe(self) -> Probe:
        return Probe(self.world.idle_jobs(), self.idle_pilots())

    def reschedule(self) -> None:
        self.world.reschedule()

    def observe(self, now: float, since: float | None) -> WorldView:
        snapshot = self.world.snapshot(arrivals_since=since)
        queue = QueueSize(*self.world.queue_size(since)) if since is not None else None
        return WorldView(snapshot, queue)


class PlanPolicy:
    """Ours: the service's controller on the simulated world."""

    def __init__(self, config: Config, name: str = "ours", learn: bool = True) -> None:
        self.name = name
        self.config = config
        #: SLURM's answers to sbatch go to the controller, as the service sends them
        #: (False: the world applies the submissions and the controller hears nothing)
        self.learn = learn
        self.planned: list[Action] = []  # the last cycle's actions, its Submits included
        self.controller = Controller(config)
        self._submitted = 0  # world.all_pilots already told to the controller

    @property
    def tick_s(self) -> float:
        """The service's timer: the quick check, or the join check while pilots join."""
        return self.controller.check_period()

    def tick(self, world: World, now: float) -> list[Action]:
        # As the service does right after sbatch: the circuit breaker follows new pilots
        # from their submission (one that starts and dies between two cycles counts).
        self.controller.submitted(p.key for p in world.all_pilots[self._submitted:])
        self._submitted = len(world.all_pilots)
        self.planned = []
        senses = WorldSenses(world)
        if not tick(self.controller, senses, now).reason:  # as the service's timer
            return []
        actions = list(decide(self.controller, senses, now).plan.actions)
        self.planned = actions
        if not self.learn:
            return actions
        submit_all(self.controller, [a for a in actions if isinstance(a, Submit)],
                   world.sbatch, now)
        return [a for a in actions if not isinstance(a, Submit)]


def _whole_node(site: SiteModel, count: int = 1) -> Submit:
    return Submit(site.name, count, site.cores_per_node, site.mem_per_node_mb,
                  site.config.pilot.walltime_s, reason="whole node",
                  gpus=min(site.gpus_per_node, site.config.pilot.gpus))


def _sites_by_weight(world: World) -> list[SiteModel]:
    return sorted(world.sites.values(), key=lambda s: (-s.config.weight, s.name))


@dataclass
class PrototypePolicy:
    """One whole-node pilot per cycle while jobs wait; flag idle, release next cycle."""

    name: str = "prototype"
    tick_s: float = 300.0
    flagged: set[str] = field(default_factory=set)

    def tick(self, world: World, now: float) -> list[Action]:
        snap = world.snapshot()
        actions: list[Action] = []
        if sum(d.idle for d in snap.demand) > 0:
            for site in _sites_by_weight(world):
                alive = sum(1 for p in snap.pilots if p.site == site.name)
                if alive < min(site.config.caps.max_pilots, site.nodes):
                    actions.append(_whole_node(site))
                    break
        flagged: set[str] = set()
        for p in snap.pilots:
            if p.state is PilotState.IDLE:
                if p.key in self.flagged:
                    actions.append(Release(p, "idle two cycles"))
                else:
                    flagged.add(p.key)
        self.flagged = flagged
        return actions


@dataclass
class _Controller:
    demand: float = 0.0


@dataclass
class CobaldPolicy:
    """COBalD LinearController per site on a TARDIS-style pool of whole-node drones."""

    name: str = "cobald"
    tick_s: float = 10.0
    low_utilisation: float = 0.5
    high_allocation: float = 0.9
    rate: float = 0.1  # drones per second of regulation interval (1 drone per 10 s tick)
    controllers: dict[str, _Controller] = field(default_factory=dict)

    def _pool(self, world: World, site: SiteModel) -> list[SimPilot]:
        return [p for p in world.pilots.values() if p.site is site and not p.draining]

    def tick(self, world: World, now: float) -> list[Action]:
        actions: list[Action] = []
        jobs_waiting = bool(world.queue)
        for site in _sites_by_weight(world):
            ctl = self.controllers.setdefault(site.name, _Controller())
            drones = self._pool(world, site)
            booted = [p for p in drones if p.booted]
            if booted:
                per_drone = [
                    (p.used_cpus / p.cpus, p.used_mem / p.memory_mb) for p in booted
                ]
                utilisation = sum(min(c, m) for c, m in per_drone) / len(booted)
                allocation = sum(max(c, m) for c, m in per_drone) / len(booted)
            elif drones:
                continue  # only booting drones: nothing to regulate on yet
            else:
                # An empty pool reports nothing; start it when jobs wait (generous to COBalD).
                utilisation = allocation = 1.0 if jobs_waiting else 0.0
            if utilisation < self.low_utilisation:
                ctl.demand -= self.rate * self.tick_s
            elif allocation > self.high_allocation:
                ctl.demand += self.rate * self.tick_s
            cap = min(site.config.caps.max_pilots, site.nodes)
            ctl.demand = min(max(ctl.demand, 0.0), float(cap))
            target = int(ctl.demand)
            if target > len(drones):
                actions.append(_whole_node(site, target - len(drones)))
            elif target < len(drones):
                # drain the least useful first: pending, booting, idle, least utilised
                def order(p: SimPilot) -> tuple[int, float]:
                    state = world.pilot_state(p)
                    rank = {PilotState.PENDING: 0, PilotState.STARTING: 1,
                            PilotState.IDLE: 2}.get(state, 3)
                    return rank, p.used_cpus / p.cpus
                for p in sorted(drones, key=order)[: len(drones) - target]:
                    actions.append(Release(world.model_pilot(p), "demand decreased"))
        return actions
