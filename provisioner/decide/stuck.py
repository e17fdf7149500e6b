"""Groups that match no pilot in practice (pure): idle beside a pilot that fits them.

The prototype (`provisioner.pool.prototype`) says which sites' pilots should match a shape; the
negotiator may still never match it (an attribute the prototype has and real pilots lack,
a START clause of the node, a pool policy). A shape whose jobs stay idle for
`policy.stuck_after_s` while the same fitting pilot stays unclaimed beside them is stuck:
reported once, and not provisioned for (its rows become unmatchable) until its shape
changes, fewer of its jobs are idle (one started, or the user removed some) or
`policy.stuck_retry_s` has passed. Without this, a pilot is kept for it, and when the
pilot's no-claim shutdown ends it a new one is started, for ever. The retry keeps a shape
from being stranded by a cause that goes away (a negotiator down for longer than
stuck_after_s, a node attribute an admin fixes): at worst one pilot per retry period is
spent on a shape that is still stuck.

Jobs whose last start failed (`Snapshot.failing`, `provisioner.decide.failed_starts`) are not
idle for this: they were matched, and their cause is known. Their shape is reported
once, with the starter's error, while it has such jobs (again only after none was seen
for `retry_s`); a matched-again, failed-again job changes nothing in the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from provisioner.config import Config, SiteBase
from provisioner.decide.failed_starts import describe_failing
from provisioner.decide.matching import item_of, matched_sites
from provisioner.decide.reasons import STUCK_TEXT
from provisioner.model import Demand, FailingStarts, JobShape, Pilot, PilotState, Snapshot

#: The reason a stuck shape's report starts with (the vocabulary's, `Reason.STUCK`).
STUCK = STUCK_TEXT


@dataclass
class Waiting:
    """A shape seen idle beside fitting unclaimed pilots since `since`; `pilots` are the
    ones that stayed unclaimed all along, `idle` its idle jobs at the last look."""

    since: float
    idle: int
    pilots: frozenset[str]


@dataclass
class Stuck:
    """A stuck shape: its idle jobs at the last look, the reason shown, found when."""

    idle: int
    reason: str
    at: float


@dataclass
class StuckGroups:
    after_s: float
    #: a stuck shape is provisioned for again this long after it was found stuck
    retry_s: float = 3600.0
    waiting: dict[JobShape, Waiting] = field(default_factory=dict)
    stuck: dict[JobShape, Stuck] = field(default_factory=dict)
    #: shapes reported with failed starts -> when such jobs were last seen
    failing: dict[JobShape, float] = field(default_factory=dict)

    def observe(self, snapshot: Snapshot, config: Config, now: float) -> list[str]:
        """Follow this cycle's idle shapes and unclaimed pilots; returns what changed, in
        words (newly stuck, no longer stuck, retried, failing at start)."""
        if not snapshot.pool_known:
            return []
        out = self.observe_failing(snapshot.failing, now)
        # jobs that failed to start are in `demand` unless cooling down: not counted
        idle: dict[JobShape, int] = {}
        for g in snapshot.failing:
            idle[g.shape] = idle.get(g.shape, 0) - (g.jobs - g.cooling)
        first: dict[JobShape, Demand] = {}
        for d in snapshot.demand:
            if d.idle > 0:
                idle[d.shape] = idle.get(d.shape, 0) + d.idle
                first.setdefault(d.shape, d)
        idle = {shape: n for shape, n in idle.items() if n > 0 and shape in first}
        for shape, st in list(self.stuck.items()):
            if idle.get(shape, 0) < st.idle:
                del self.stuck[shape]
                out.append(f"no longer stuck (fewer idle jobs): {describe(shape)}")
            elif now - st.at >= self.retry_s:
                del self.stuck[shape]
                out.append(f"stuck for {now - st.at:.0f} s, provisioned for again (a pilot "
                           f"is tried once more): {describe(shape)}")
            else:
                st.idle = idle[shape]
        known = {v.name for v in snapshot.sites if v.known}
        unclaimed = [p for p in snapshot.pilots
                     if p.state is PilotState.IDLE and p.site in known]
        for shape in list(self.waiting):
            if shape not in idle:
                del self.waiting[shape]
        if not unclaimed or self.after_s <= 0:
            self.waiting.clear()
            return out
        for shape, n in idle.items():
            if shape in self.stuck:
                continue
            beside = fitting_pilots(first[shape], unclaimed, config.sites, now)
            w = self.waiting.get(shape)
            if not beside:
                self.waiting.pop(shape, None)
            elif w is None or n < w.idle or not w.pilots & beside:
                self.waiting[shape] = Waiting(now, n, beside)
            else:
                w.pilots &= beside
                w.idle = n
                if now - w.since >= self.after_s:
                    pilot = min(w.pilots)
                    why = (f"{STUCK} (idle {now - w.since:.0f} s while pilot {pilot} stayed "
                           "unclaimed)")
                    self.stuck[shape] = Stuck(n, why, now)
                    del self.waiting[shape]
                    out.append(f"{n} idle jobs {why}: {describe(shape)}; not provisioned "
                               "for until their shape changes, one of them starts or "
                               f"{self.retry_s:.0f} s have passed")
        return out

    def observe_failing(self, failing: Sequence[FailingStarts], now: float) -> list[str]:
        """Report each shape with jobs that failed to start once (again only after none
        was seen for `retry_s`), with the starter's error."""
        out = []
        for g in failing:
            if g.shape not in self.failing:
                out.append(f"{describe_failing(g)}: {describe(g.shape)}; not stuck: the "
                           "pool holds a job after its third failed start, its pilots are "
                           "released then")
            self.failing[g.shape] = now
        for shape, seen in list(self.failing.items()):
            if now - seen >= self.retry_s:
                del self.failing[shape]
        return out

    def to_list(self) -> list[dict[str, Any]]:
        """The stuck shapes, JSON-able: a restarted service keeps them (it would otherwise
        start a pilot for them once more) and `provisioner status` shows them."""
        return [{"shape": asdict(shape), "idle": st.idle, "reason": st.reason, "at": st.at}
                for shape, st in sorted(self.stuck.items(), key=lambda kv: repr(kv[0]))]

    def load(self, data: Sequence[Any]) -> None:
        """Restore what `to_list()` wrote; malformed entries are skipped."""
        for e in data:
            try:
                d = dict(e["shape"])
                d["desired_sites"] = tuple(d.get("desired_sites") or ())
                d["match_attrs"] = tuple((str(k), str(v)) for k, v in d.get("match_attrs") or ())
                self.stuck[JobShape(**d)] = Stuck(int(e["idle"]), str(e["reason"]),
                                                  float(e.get("at", 0.0)))
            except (KeyError, TypeError, ValueError):
                continue

    def mark(self, rows: Sequence[Demand]) -> tuple[Demand, ...]:
        """`rows` with every stuck shape matching no site, the reason attached."""
        if not self.stuck:
            return tuple(rows)
        return tuple(replace(d, sites=frozenset(), mismatch=self.stuck[d.shape].reason)
                     if d.shape in self.stuck else d for d in rows)


def fitting_pilots(d: Demand, unclaimed: Sequence[Pilot], sites: Sequence[SiteBase],
                   now: float) -> frozenset[str]:
    """The unclaimed pilots that could start a job of row `d` now: at a site it matches,
    with the free resources, and the walltime left for its stated runtime."""
    item = item_of(d.shape)
    where = set(matched_sites(d, sites, item)[0])
    by_name = {s.name: s for s in sites}
    out = set()
    for p in unclaimed:
        if (p.site not in where or p.free_cpus < item.cpus or p.free_memory_mb < item.memory_mb
                or p.free_gpus < item.gpus):
            continue
        site = by_name[p.site].pilot
        end = p.walltime_end
        if end is None:
            end = (p.started_at if p.started_at is not None else now) + site.walltime_s
        if end - site.shutdown_margin_s > now + (item.runtime_s or 0):
            out.add(p.key)
    return frozenset(out)


def describe(shape: JobShape) -> str:
    """A shape in a few words (its Requirements shortened)."""
    text = f"{shape.cpus} cores, {shape.memory_mb} MB"
    if shape.runtime_s is not None:
        text += f", {shape.runtime_s} s"
    if shape.requirements:
        req = shape.requirements
        text += f", Requirements {req[:160] + '...' if len(req) > 160 else req}"
    return text
