"""The tick sequence, one driver for the service and the simulator.

At every tick of the timer (`Controller.check_period()` apart, or at once when the
schedd's event log shows a submit: `woken`), `tick` runs, in order:

1. ``controller.look(now)``: what to read: "probe" (the quick check: idle jobs and idle
   pilots), "join" (idle pilots only, while pilots join the pool) or nothing.
2. ``controller.reschedule_due(...)``: a pilot became idle while jobs wait: ask the
   schedd for a negotiation now (`Senses.reschedule`).
3. For a probe: ``controller.due(now, probe)``: whether a full cycle runs now, and why.

A full cycle is `decide`: ``controller.arrivals_since(now)`` (where the reserve's arrival
window starts), `Senses.observe` (the `Snapshot`: what this cycle sees), then
``controller.cycle(...)`` (the pure `plan()` with the controller's `CycleMemory` beside
the snapshot; what to remember is carried over). The caller acts on the plan.

`Senses` is all the sequence reads and asks for: HTCondor and SLURM in the service
(`provisioner.service.loop.Provisioner`), the virtual world in the simulator
(`bench.sim.policies.PlanPolicy`). Both run it through here, so they tick alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from provisioner.decide.cadence import Probe
from provisioner.decide.controller import Controller, QueueSize
from provisioner.model import CycleMemory, Plan, Snapshot


class Seen(Protocol):
    """One observation, as the controller takes it."""

    @property
    def snapshot(self) -> Snapshot: ...

    @property
    def queue(self) -> QueueSize | None:
        """The schedd's queue size (None: not read whole; the reserve's departures are
        then unknown)."""
        ...

    @property
    def idle_ads(self) -> frozenset[str] | None:
        """The idle pilots as the quick check sees them (None: the snapshot's)."""
        ...


S = TypeVar("S", bound=Seen, covariant=True)


class Senses(Protocol[S]):
    """What the tick sequence reads and asks for."""

    def probe(self) -> Probe | None:
        """The quick check: idle jobs and idle pilots; None: the pool could not be read."""
        ...

    def idle_pilots(self) -> frozenset[str] | None:
        """The join check: idle pilots only; None: they could not be read."""
        ...

    def reschedule(self) -> None:
        """Ask the schedd for a negotiation now."""
        ...

    def observe(self, now: float, since: float | None) -> S:
        """All a full cycle reads at `now`, the jobs submitted since `since` as the recent
        arrivals (None: the reserve is off, no arrivals read)."""
        ...


@dataclass(frozen=True)
class Tick:
    """What one tick did: what it read (`look`: "probe", "join" or "" for nothing) and
    why a full cycle is due (`reason`: "" none; None: not asked, no probe was read)."""

    look: str
    reason: str | None = None


def tick(controller: Controller, senses: Senses[Seen], now: float,
         woken: bool = False) -> Tick:
    """Steps 1-3 at `now`; `woken`: an early tick (a submit seen), always a probe. The
    full cycle, if `Tick.reason` says one is due, is the caller's (`decide`)."""
    look = "probe" if woken else controller.look(now)
    if look == "join":
        idle_pilots = senses.idle_pilots()
        if idle_pilots is not None and controller.reschedule_due(idle_pilots, None, now):
            senses.reschedule()
    if look != "probe":
        return Tick(look)
    probe = senses.probe()
    if probe is None:
        # the pool unreadable: a cycle only once the interval is up (it reports the pool
        # unknown, and so does nothing)
        mark = controller.mark
        if mark is not None and now - mark.at < controller.config.policy.interval_s:
            return Tick(look)
        probe = Probe(0, frozenset())
    elif controller.reschedule_due(probe.idle_pilots, probe.idle_jobs, now):
        senses.reschedule()
    return Tick(look, controller.due(now, probe))


@dataclass
class Decided(Generic[S]):
    """One full cycle's observation, the memory beside it, and the plan decided."""

    seen: S
    memory: CycleMemory
    plan: Plan
    timings: dict[str, float] = field(default_factory=dict)  # "observe", "plan" (s)


def decide(controller: Controller, senses: Senses[S], now: float,
           commit: bool = True) -> Decided[S]:
    """Step 4, a full cycle at `now` (the time the cycle began): observe, then decide
    with the controller's memory. With `commit=False` (a dry run) nothing is
    remembered."""
    t0 = time.monotonic()
    seen = senses.observe(now, controller.arrivals_since(now))
    t1 = time.monotonic()
    result = controller.cycle(seen.snapshot, now, seen.queue, commit=commit,
                              idle_ads=seen.idle_ads)
    t2 = time.monotonic()
    assert controller.planned is not None  # set by every cycle
    _snapshot, memory = controller.planned
    return Decided(seen, memory, result, {"observe": t1 - t0, "plan": t2 - t1})
