"""The decision core: `plan(snapshot, config, now) -> Plan`. Pure: no I/O, no clock.

One cycle:

1. Match every demand shape to the sites whose largest pilot can run it (cpus, memory rounded
   like the startd, gpus, stated runtime vs. usable walltime, DesiredSites). Shapes no site
   can run are reported as `Unmatchable` and never cause a pilot.
2. Pack the matchable demand (by counts, first-fit-decreasing) into capacity that exists:
   free resources of BUSY then IDLE pilots that can still take work, then the whole shape of
   STARTING and PENDING pilots.
3. Pack what is left into new pilots, site by site in decreasing weight, each site limited by
   its caps and the global per-cycle cap; what a capped or unknown site cannot take spills to
   the next. New pilots are sized down to what they hold (between min_cpus and cpus).
   After the real demand, the predictive reserve (`policy.reserve`, sized from
   `Snapshot.recent_arrivals`) is packed the same way as idle jobs of the recently arrived
   shapes: into free existing capacity first, then into new pilots within what the caps
   leave. Real demand always goes first, at every site and for the global cap.
4. Pilots: IDLE without assigned demand (or reserve) are flagged, and released once
   observed idle for `idle_release_cycles` consecutive cycles (minimum lifetime and
   keep_warm permitting); flagged pilots that are busy again or received demand are
   unflagged; PENDING pilots without assigned demand are cancelled (keep_warm permitting).

If the pool is unknown nothing happens; at an unknown site nothing happens, but its pilots'
capacity still counts.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from provisioner.config import Config, SiteConfig
from provisioner.model import (
    Action,
    Cancel,
    Demand,
    Flag,
    JobShape,
    Pilot,
    PilotState,
    Plan,
    Release,
    SiteSummary,
    Snapshot,
    Submit,
    Unflag,
    Unmatchable,
    round_memory,
)
from provisioner.packing import INF, BinGroup, CapacityIndex, Item, NewPilots

# Existing capacity is used in this order: fill pilots already working first, so idle ones
# can be released and pending ones cancelled.
_TIERS: tuple[PilotState, ...] = (
    PilotState.BUSY,
    PilotState.IDLE,
    PilotState.STARTING,
    PilotState.PENDING,
)
_WARM = frozenset((PilotState.IDLE, PilotState.STARTING, PilotState.PENDING))


def item_of(shape: JobShape) -> Item:
    """The packer's view of a shape: at least one cpu, memory rounded like the startd."""
    return Item(
        cpus=max(1, shape.cpus),
        memory_mb=round_memory(shape.memory_mb),
        gpus=max(0, shape.gpus),
        runtime_s=shape.runtime_s,
    )


def site_rejects(shape: JobShape, site: SiteConfig, item: Item | None = None) -> str:
    """Why `site`'s largest pilot cannot run `shape`, or "" if it can."""
    if shape.desired_sites and site.name not in shape.desired_sites:
        return f"DesiredSites {','.join(shape.desired_sites)} excludes {site.name}"
    p = site.pilot
    item = item or item_of(shape)
    if item.cpus > p.cpus:
        return f"RequestCpus {item.cpus} > {site.name} pilot {p.cpus} cores"
    if item.memory_mb > p.memory_mb:
        return f"RequestMemory {shape.memory_mb} MB > {site.name} pilot {p.memory_mb} MB"
    if item.gpus > p.gpus:
        return f"RequestGPUs {item.gpus} > {site.name} pilot {p.gpus} GPUs"
    if shape.runtime_s is not None and shape.runtime_s > p.usable_s:
        return (
            f"runtime {shape.runtime_s} s > {site.name} usable pilot walltime {p.usable_s} s"
        )
    return ""


def unmatchable_reason(shape: JobShape, sites: Sequence[SiteConfig]) -> str:
    """One readable reason naming the field and the numbers, for a shape no site can run."""
    if shape.desired_sites:
        known = [s for s in sites if s.name in shape.desired_sites]
        if not known:
            return f"DesiredSites {','.join(shape.desired_sites)} names no configured site"
        sites = known
    item = item_of(shape)
    checks = (
        ("RequestCpus", item.cpus, max(s.pilot.cpus for s in sites), "cores"),
        ("RequestMemory", shape.memory_mb, max(s.pilot.memory_mb for s in sites), "MB"),
        ("RequestGPUs", item.gpus, max(s.pilot.gpus for s in sites), "GPUs"),
    )
    for what, asked, largest, unit in checks:
        if (item.memory_mb if what == "RequestMemory" else asked) > largest:
            return f"{what} {asked} {unit} > largest pilot {largest} {unit}"
    if shape.runtime_s is not None:
        longest = max(s.pilot.usable_s for s in sites)
        if shape.runtime_s > longest:
            return f"runtime {shape.runtime_s} s > longest usable pilot walltime {longest} s"
    return "no single site fits: " + "; ".join(site_rejects(shape, s) for s in sites)


def _deadline(p: Pilot, site: SiteConfig, now: float) -> float | None:
    """When SLURM ends pilot `p` (INF while pending), or None if `p` takes no new work:
    within the shutdown margin of its end, the pilot stops starting jobs."""
    if p.state is PilotState.PENDING:
        return INF  # gets a full walltime when it starts; runtime fit was checked per site
    end = p.walltime_end
    if end is None:
        start = p.started_at if p.started_at is not None else now
        end = start + site.pilot.walltime_s
    if end - site.pilot.shutdown_margin_s <= now:
        return None
    return end


def _existing_bins(
    pilots: Iterable[Pilot], config: Config, now: float, registry: list[BinGroup]
) -> dict[str, list[CapacityIndex]]:
    """Capacity that exists, as identical-bin groups per site, one list per tier in order."""
    raw: dict[tuple[str, int], dict[tuple[int, int, int], list[tuple[float, Pilot]]]] = (
        defaultdict(lambda: defaultdict(list))
    )
    by_name = {s.name: s for s in config.sites}
    tier_of = {state: i for i, state in enumerate(_TIERS)}
    whole = (PilotState.PENDING, PilotState.STARTING)
    for p in pilots:
        tier = tier_of.get(p.state)
        site = by_name.get(p.site)
        if site is None or tier is None:
            continue
        if p.state in whole:
            free = (p.cpus, p.memory_mb, p.gpus)
        elif p.free_cpus > 0:
            free = (p.free_cpus, p.free_memory_mb, p.free_gpus)
        else:
            continue
        end = _deadline(p, site, now)
        if end is None:
            continue  # within the shutdown margin: not capacity any more
        raw[(p.site, tier)][free].append((end, p))
    out: dict[str, list[CapacityIndex]] = defaultdict(list)
    for (site_name, _tier), by_free in sorted(raw.items()):
        groups = []
        for (c, m, g), members in by_free.items():
            members.sort(key=_latest_first)  # stable: equal ends keep snapshot order
            untils = [u for u, _p in members]
            groups.append(BinGroup(c, m, g, untils[0], len(members),
                                   [p for _u, p in members], untils=untils))
        out[site_name].append(CapacityIndex(groups, registry))
    return out


def _latest_first(member: tuple[float, Pilot]) -> float:
    return -member[0]


@dataclass
class _SiteCounts:
    alive: int = 0  # non-ENDING pilots (what max_pilots counts)
    pending: int = 0


def _site_counts(pilots: Iterable[Pilot]) -> dict[str, _SiteCounts]:
    counts: dict[str, _SiteCounts] = defaultdict(_SiteCounts)
    for p in pilots:
        c = counts[p.site]
        if p.state is not PilotState.ENDING:
            c.alive += 1
        if p.state is PilotState.PENDING:
            c.pending += 1
    return counts


def _size_new_pilot(site: SiteConfig, used_cpus: int, used_mem: int) -> tuple[int, int]:
    """(cpus, memory_mb) of a new pilot holding the given jobs."""
    p = site.pilot
    cpus = min(p.cpus, max(p.min_cpus, used_cpus))
    memory = min(p.memory_mb, max(p.memory_per_cpu_mb * cpus, used_mem))
    return cpus, memory


def reserve_size(matchable_arrivals: int, window_s: float, config: Config,
                 departures: int | None = None) -> int:
    """Job slots to keep free for jobs about to arrive (see `ReserveConfig`): base-stock
    sizing over one lead time, ``growth + factor * sqrt(a + d)`` with ``a`` and ``d`` the
    arrivals and departures expected in one lead time, departures counted at most up to
    the arrivals (unknown: ``d = a``), and ``growth = max(0, a - d - noise)`` where
    ``noise`` is one standard deviation of the estimate ``a - d``; capped at
    ``max_jobs``. No recent arrivals means no reserve."""
    r = config.policy.reserve
    if not r.enabled or window_s <= 0 or matchable_arrivals <= 0 or r.max_jobs <= 0:
        return 0
    arrived = matchable_arrivals
    left = arrived if departures is None else min(arrived, max(0.0, departures))
    scale = r.lead_s / window_s  # window counts -> one lead time
    a, d = arrived * scale, left * scale
    # growth counts only beyond its own sampling noise (one standard deviation of the
    # difference of two Poisson counts over the window): a steady queue adds nothing
    noise = math.sqrt(arrived + left) * scale
    want = max(0.0, a - d - noise) + r.factor * math.sqrt(a + d)
    return max(0, min(r.max_jobs, math.ceil(want - 1e-9)))


Row = tuple[Item, JobShape, int, list[str]]


def _reserve_rows(snapshot: Snapshot, config: Config, sites: Sequence[SiteConfig]) -> list[Row]:
    """The reserve as rows of (item, shape, slots, fitting sites).

    Recently arrived matchable jobs are grouped by (cpus, gpus, DesiredSites); a group's
    reserve slot takes the largest memory seen in it and no stated runtime, so one slot
    fits any recent job of that group. The reserve is split over the groups in proportion
    to the square root of their arrivals (largest remainder)."""
    counts: Counter[tuple[int, int, tuple[str, ...]]] = Counter()
    memory: dict[tuple[int, int, tuple[str, ...]], int] = {}
    for d in snapshot.recent_arrivals:
        if d.idle <= 0:
            continue
        shape = d.shape
        item = item_of(shape)
        if not any(not site_rejects(shape, s, item) for s in sites):
            continue  # unmatchable arrivals never cause a reserve
        key = (item.cpus, item.gpus, shape.desired_sites)
        counts[key] += d.idle
        memory[key] = max(memory.get(key, 0), shape.memory_mb)
    total = sum(counts.values())
    size = reserve_size(total, snapshot.arrival_window_s, config, snapshot.recent_departures)
    if size == 0:
        return []
    order = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    # square-root split: each group's share follows the spread of its own arrivals, so a
    # rare shape gets relatively more than its count (largest remainder rounding)
    roots = {key: math.sqrt(n) for key, n in order}
    norm = sum(roots.values())
    exact = {key: size * roots[key] / norm for key, _n in order}
    quota = {key: int(exact[key]) for key, _n in order}
    rest = size - sum(quota.values())
    by_remainder = sorted(order, key=lambda kv: (-(exact[kv[0]] - quota[kv[0]]), -kv[1], kv[0]))
    for key, _n in by_remainder[:rest]:
        quota[key] += 1
    rows: list[Row] = []
    for key, _n in order:
        if quota[key] <= 0:
            continue
        cpus, gpus, desired = key
        shape = JobShape(cpus, memory[key], gpus=gpus, desired_sites=desired)
        item = item_of(shape)
        fits = [s.name for s in sites if not site_rejects(shape, s, item)]
        if fits:  # the largest memory of a group may fit fewer sites than its jobs do
            rows.append((item, shape, quota[key], fits))
    rows.sort(key=lambda r: (r[0].cpus, r[0].memory_mb, r[0].gpus), reverse=True)
    return rows


def plan(snapshot: Snapshot, config: Config, now: float) -> Plan:
    """Decide this cycle's actions. Pure; `now` is the cycle's time (epoch seconds)."""
    if not snapshot.pool_known:
        return Plan(actions=())

    sites = sorted(config.sites, key=lambda s: (-s.weight, s.name))
    known = {v.name: v.known for v in snapshot.sites}
    site_ok = {s.name: known.get(s.name, False) for s in sites}
    breaker = {v.name: v.max_new for v in snapshot.sites if v.max_new is not None}

    # 1. match demand to sites
    unmatchable: list[Unmatchable] = []
    rows: list[Row] = []
    merged: Counter[JobShape] = Counter()
    for d in snapshot.demand:
        if d.idle > 0:
            merged[d.shape] += d.idle
    for shape, idle in merged.items():
        item = item_of(shape)
        fits = [s.name for s in sites if not site_rejects(shape, s, item)]
        if not fits:
            unmatchable.append(Unmatchable(shape, idle, unmatchable_reason(shape, sites)))
            continue
        rows.append((item, shape, idle, fits))
    rows.sort(key=lambda r: (r[0].cpus, r[0].memory_mb, r[0].gpus), reverse=True)
    n_real = len(rows)
    ghosts = _reserve_rows(snapshot, config, sites)
    rows.extend(ghosts)  # the reserve: after all real demand
    reserve = sum(r[2] for r in ghosts)
    floor = Item(
        cpus=min((r[0].cpus for r in rows), default=1),
        memory_mb=min((r[0].memory_mb for r in rows), default=0),
        gpus=0,
    )

    # 2. existing capacity
    registry: list[BinGroup] = []
    existing = _existing_bins(snapshot.pilots, config, now, registry)
    left = [r[2] for r in rows]
    absorbed: Counter[str] = Counter()
    absorbed_reserve: Counter[str] = Counter()
    for i, (item, _shape, _idle, fits) in enumerate(rows):
        deadline = now + (item.runtime_s or 0)
        for site_name in fits:
            site_bins = existing.get(site_name)
            if not site_bins:
                continue
            for bins in site_bins:
                if not bins.may_fit(item):
                    continue  # nothing there can hold this job (cheap pre-check)
                got = bins.fill(item, left[i], deadline, floor)
                if got:
                    left[i] -= got
                    (absorbed if i < n_real else absorbed_reserve)[site_name] += got
                    if left[i] == 0:
                        break
            if left[i] == 0:
                break

    # 3. new pilots, by site weight, within caps: real demand at every site, then reserve
    counts = _site_counts(snapshot.pilots)
    global_left = config.policy.max_submit_per_cycle
    actions: list[Action] = []
    summaries: list[SiteSummary] = []
    rooms: dict[str, dict[str, int]] = {}
    news: dict[str, NewPilots] = {}
    placed: dict[str, list[int]] = {}  # site -> [real jobs, reserve slots] on new pilots
    site_demand: dict[str, tuple[int, int]] = {}
    for site in sites:
        c = counts[site.name]
        room = {
            "max_pilots": site.caps.max_pilots - c.alive,
            "max_pending": site.caps.max_pending - c.pending,
            "site max_submit_per_cycle": site.caps.max_submit_per_cycle,
            "policy max_submit_per_cycle": global_left,
        }
        if site.name in breaker:
            room["circuit breaker"] = breaker[site.name]
        rooms[site.name] = room
        allowed = max(0, min(room.values())) if site_ok[site.name] else 0
        new = NewPilots(
            site.pilot.cpus, site.pilot.memory_mb, site.pilot.gpus,
            site.pilot.usable_s, allowed, site.pilot.pack_cpus,
        )
        news[site.name] = new
        site_jobs = site_cpus = jobs_new = 0
        for i in range(n_real):
            item, _shape, _idle, fits = rows[i]
            if left[i] and site.name in fits:
                site_jobs += left[i]
                site_cpus += left[i] * item.cpus
                got = new.fill(item, left[i], True)
                left[i] -= got
                jobs_new += got
        placed[site.name] = [jobs_new, 0]
        site_demand[site.name] = (site_jobs, site_cpus)
        global_left -= new.opened
    for site in sites:
        if not ghosts:
            break
        new = news[site.name]
        before = new.opened
        new.allowed = min(new.allowed, before + max(0, global_left))
        for i in range(n_real, len(rows)):
            item, _shape, _idle, fits = rows[i]
            if left[i] and site.name in fits:
                got = new.fill(item, left[i], True)
                left[i] -= got
                placed[site.name][1] += got
        global_left -= new.opened - before
    for site in sites:
        new = news[site.name]
        shapes: Counter[tuple[int, int]] = Counter()
        for g in new.registry:
            if g.count > 0 and g.jobs > 0:
                shapes[_size_new_pilot(site, g.used_cpus, g.used_mem)] += g.count
        n_new = sum(shapes.values())
        jobs_new, reserve_new = placed[site.name]
        why = f"{jobs_new} idle jobs"
        if reserve_new:
            why += f" and {reserve_new} reserve slots"
        for (cpus, mem), n in sorted(shapes.items(), reverse=True):
            actions.append(Submit(
                site=site.name, count=n, cpus=cpus, memory_mb=mem,
                walltime_s=site.pilot.walltime_s,
                reason=f"{why} need {n_new} new pilots at {site.name}",
            ))
        capped = ""
        room = rooms[site.name]
        if any(left[i] and site.name in rows[i][3] for i in range(n_real)):
            capped = min(room, key=lambda k: room[k]) if site_ok[site.name] else "site unknown"
        site_jobs, site_cpus = site_demand[site.name]
        summaries.append(SiteSummary(
            site=site.name, demand_jobs=site_jobs + absorbed[site.name],
            demand_cpus=site_cpus, existing_jobs=absorbed[site.name],
            new_pilot_jobs=jobs_new, new_pilots=n_new,
            new_cpus=sum(cp * n for (cp, _m), n in shapes.items()), capped=capped,
            reserve_jobs=absorbed_reserve[site.name] + reserve_new,
        ))

    # 4. existing pilots: flag / unflag / release / cancel
    used = {p.key for g in registry if g.jobs > 0 for p in g.members}
    actions.extend(_pilot_actions(snapshot, config, now, used, site_ok))
    return Plan(
        actions=tuple(actions),
        unmatchable=tuple(unmatchable),
        summary=tuple(summaries),
        unplaced_jobs=sum(left[:n_real]),
        reserve_jobs=reserve,
        reserve_held=reserve - sum(left[n_real:]),
    )


def _idle_observations(snapshot: Snapshot, p: Pilot, now: float) -> int:
    """How many consecutive cycles `p` has been seen idle, this one included. Earlier
    observations count only if the pilot was flagged in an earlier cycle (flagged_at < now);
    `snapshot.idle_cycles` (from `carry_over`) tells how many, else one."""
    flagged_at = snapshot.flagged.get(p.key)
    if flagged_at is None or flagged_at >= now:
        return 1
    return max(1, snapshot.idle_cycles.get(p.key, 1)) + 1


def _drained_empty(p: Pilot) -> bool:
    """A draining pilot with nothing claimed (the service reports a draining pilot on
    which the schedd runs a job with no free cpus)."""
    return p.state is PilotState.DRAINING and p.free_cpus >= p.cpus > 0


def _pilot_actions(
    snapshot: Snapshot, config: Config, now: float, used: set[str], site_ok: dict[str, bool]
) -> list[Action]:
    out: list[Action] = []
    by_site: dict[str, list[Pilot]] = defaultdict(list)
    for p in snapshot.pilots:
        if site_ok.get(p.site, False):
            by_site[p.site].append(p)
    n_release = config.policy.idle_release_cycles
    for site_name, pilots in sorted(by_site.items()):
        site = config.site(site_name)
        # warm = unclaimed pilots that are up or coming up; keep_warm of them are kept
        warm = sum(1 for p in pilots if p.state in _WARM and p.key not in used)
        cancels: list[Pilot] = []
        releases: list[Pilot] = []
        for p in pilots:
            flagged = p.key in snapshot.flagged
            if p.state is PilotState.BUSY:
                if flagged:
                    out.append(Unflag(p, "busy again"))
            elif p.state is PilotState.IDLE:
                if p.key in used:
                    if flagged:
                        out.append(Unflag(p, "idle demand will use it"))
                elif _idle_observations(snapshot, p, now) >= n_release:
                    releases.append(p)
                elif not flagged:
                    out.append(Flag(p, "idle, no demand for it"))
            elif p.state is PilotState.DRAINING:
                # Drained (an admin's condor_drain, or a release in progress): once it
                # runs nothing (free_cpus == cpus only if neither the collector nor the
                # schedd sees a job there) for n_release cycles, it only burns allocation.
                if not _drained_empty(p):
                    if flagged:
                        out.append(Unflag(p, "draining with jobs"))
                elif _idle_observations(snapshot, p, now) >= n_release:
                    out.append(Cancel(p, f"drained and running nothing for {n_release} cycles"))
                elif not flagged:
                    out.append(Flag(p, "drained, runs nothing"))
            elif p.state is PilotState.PENDING and p.key not in used:
                cancels.append(p)
            elif (p.state is PilotState.STARTING and p.started_at is not None
                  and now - p.started_at > config.policy.start_timeout_s):
                # Running at the site but its startd never registered (and the schedd
                # runs nothing there, or it would be BUSY): it only burns allocation.
                out.append(Cancel(p, f"started {now - p.started_at:.0f} s ago, never joined "
                                     "the pool"))
        # release the pilots that end soonest, cancel the ones submitted last; keep the rest
        releases.sort(key=lambda p: (p.walltime_end or math.inf, p.job_id))
        for p in releases:
            age = now - (p.started_at if p.started_at is not None else p.submitted_at)
            if age >= config.policy.min_pilot_lifetime_s and warm > site.keep_warm:
                out.append(Release(p, f"idle for {n_release} cycles, no demand for it"))
                warm -= 1
            elif p.key not in snapshot.flagged:
                out.append(Flag(p, "idle, no demand for it (kept: lifetime/keep_warm)"))
        for p in sorted(cancels, key=lambda p: (-p.submitted_at, p.job_id)):
            if warm > site.keep_warm:
                out.append(Cancel(p, "pending, no demand for it"))
                warm -= 1
    return out


def carry_over(
    snapshot: Snapshot, result: Plan, now: float
) -> tuple[dict[str, float], dict[str, int]]:
    """The `flagged` and `idle_cycles` maps for the next cycle's Snapshot.

    Flags set this cycle are stamped `now`; unflagged, released, cancelled and vanished
    pilots drop out; pilots at unknown sites keep what they had. Pure helper for the service
    (and the simulator), so hysteresis state lives in one place.
    """
    if not snapshot.pool_known:
        return dict(snapshot.flagged), dict(snapshot.idle_cycles)
    known = {v.name for v in snapshot.sites if v.known}
    flagged = dict(snapshot.flagged)
    idle_cycles: dict[str, int] = {}
    present = {p.key: p for p in snapshot.pilots}
    for key in list(flagged):
        if key not in present:
            del flagged[key]
    dropped: set[str] = set()
    for a in result.actions:
        if isinstance(a, Flag):
            flagged[a.pilot.key] = now
        elif isinstance(a, (Unflag, Release, Cancel)):
            flagged.pop(a.pilot.key, None)
            dropped.add(a.pilot.key)
    for key, p in present.items():
        if p.site not in known:
            if key in snapshot.idle_cycles:
                idle_cycles[key] = snapshot.idle_cycles[key]
        elif ((p.state is PilotState.IDLE or _drained_empty(p)) and key not in dropped
              and key in flagged):
            idle_cycles[key] = _idle_observations(snapshot, p, now)
    return flagged, idle_cycles


def demand_of(shapes: Iterable[tuple[JobShape, int]]) -> tuple[Demand, ...]:
    """Convenience: Demand rows from (shape, idle) pairs, merging equal shapes."""
    merged: Counter[JobShape] = Counter()
    for shape, n in shapes:
        merged[shape] += n
    return tuple(Demand(s, n) for s, n in merged.items() if n > 0)
