"""The fast paths of plan() decide exactly as the straightforward code they replaced.

The references below are the stages as they were before they were made fast (issue 25: plan()
on the 100k-job snapshot): every row visits every tier and site, every pilot is grouped
through nested maps, every site is checked through `site_rejects`. plan() with the
references patched in must return the same Plan, on random snapshots and on small synthetic
ones of the benchmark's kind.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping
from contextlib import ExitStack
from itertools import product
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

import provisioner.decide.capacity as capacity_module
import provisioner.decide.matching as matching
import provisioner.decide.placement as placement
import provisioner.decide.plan as plan_module
import provisioner.decide.scaledown as scaledown
from bench.sim.synthetic import synthetic_snapshot
from provisioner.config import Config, SiteConfig
from provisioner.decide.matching import (
    Row,
    ShapeMatches,
    fitting_sites,
    item_of,
    matched_sites,
    site_rejects,
)
from provisioner.decide.packing import INF, BinGroup, CapacityIndex, GpuShare, Item, pilot_share
from provisioner.decide.placement import ranked, shares, whole_pilots
from provisioner.decide.plan import _TIERS, SiteRow, _per_pilot, _pilots_left, plan
from provisioner.model import (
    Action,
    CycleMemory,
    Demand,
    Pilot,
    PilotState,
    Plan,
    Snapshot,
    by_state,
)

from .test_plan_properties import SETTINGS, SITES, scenarios, shapes


def ref_deadline(p: Pilot, site: SiteConfig, now: float) -> float | None:
    if p.state is PilotState.PENDING:
        return INF
    end = p.walltime_end
    if end is None:
        start = p.started_at if p.started_at is not None else now
        end = start + site.pilot.walltime_s
    if end - site.pilot.shutdown_margin_s <= now:
        return None
    return end


def ref_add_capacity(sites: dict[str, SiteRow], snapshot: Snapshot, now: float,
                     registry: list[BinGroup], skip: Iterable[str] = (),
                     states: object = None) -> None:
    """`add_capacity` straight from the snapshot (`states`, the pilots by state, unread)."""
    skip = frozenset(skip)
    tier_of = {state: i for i, state in enumerate(_TIERS)}
    whole = (PilotState.PENDING, PilotState.STARTING)
    raw: dict[tuple[str, int], dict[tuple[int, int, int, GpuShare],
                                     list[tuple[float, Pilot]]]] = (
        defaultdict(lambda: defaultdict(list)))
    for p in snapshot.pilots:
        row = sites.get(p.site)
        tier = tier_of.get(p.state)
        if row is None or tier is None or p.key in skip or p.limit_reason:
            continue
        if p.state in whole:
            free = (p.cpus, p.memory_mb, p.gpus)
        elif p.free_cpus > 0:
            free = (p.free_cpus, p.free_memory_mb, p.free_gpus)
        else:
            continue
        end = ref_deadline(p, row.config, now)
        if end is None:
            continue
        raw[(p.site, tier)][(*free, pilot_share(p))].append((end, p))
    for (site_name, tier), by_free in sorted(raw.items()):
        groups = []
        for (c, m, g, share), members in by_free.items():
            members.sort(key=lambda member: -member[0])
            untils = [u for u, _p in members]
            groups.append(BinGroup(c, m, g, untils[0], len(members),
                                   [p for _u, p in members], untils=untils, share=share))
        sites[site_name].existing[tier] = CapacityIndex(groups, registry)


def ref_fill_existing(rows: Iterable[Row], sites: dict[str, SiteRow], now: float,
                      floor: Item) -> None:
    for row in rows:
        deadline = now + (row.item.runtime_s or 0)
        for tier, site_name in product(range(len(_TIERS)), row.sites):
            bins = sites[site_name].existing.get(tier)
            if bins is None or not bins.may_fit(row.item):
                continue
            got = bins.fill(row.item, row.left, deadline, floor)
            if row.reserve:
                sites[site_name].absorbed_reserve += got
            else:
                sites[site_name].absorbed += got
            row.left -= got
            if row.left == 0:
                break


def ref_place(s: SiteRow, row: Row, n: int, global_left: list[int]) -> None:
    new = s.new
    assert new is not None
    if n <= 0:
        return
    room = new.allowed
    new.allowed = min(room, new.opened + max(0, global_left[0]))
    before = new.opened
    got = new.fill(row.item, min(n, row.left))
    new.allowed = room
    global_left[0] -= new.opened - before
    row.left -= got
    if row.reserve:
        s.new_reserve += got
    else:
        s.new_jobs += got


def ref_fill_new(rows: Iterable[Row], sites: dict[str, SiteRow], global_left: int,
                 costs: Mapping[str, float], tie_share: float) -> int:
    left = [global_left]
    min_cpus = {name: s.config.pilot.min_cpus for name, s in sites.items()}
    for row in rows:
        if row.left == 0:
            continue
        if not row.reserve:
            for name in row.sites:
                sites[name].offered_jobs += row.left
                sites[name].offered_cpus += row.left * row.item.cpus
        for tier in ranked(row, costs, min_cpus, tie_share):
            if row.left == 0:
                break
            per = [_per_pilot(sites[name], row) for name in tier]
            capacity = [_pilots_left(sites[name], left[0]) * k
                        for name, k in zip(tier, per, strict=True)]
            load = [sites[name].load() for name in tier]
            split = shares(row.left, capacity, load)
            fill = [-(-min_cpus[name] // row.item.cpus) for name in tier]
            if len(tier) > 1 and max(fill) > 1:
                split = whole_pilots(split, capacity, per, fill,
                                     [(costs[name], load[k]) for k, name in enumerate(tier)])
            for name, n in zip(tier, split, strict=True):
                ref_place(sites[name], row, n, left)
            for name in tier:
                ref_place(sites[name], row, row.left, left)
    return left[0]


def ref_fitting_sites(shape, sites, item):  # type: ignore[no-untyped-def]
    return [s.name for s in sites if not site_rejects(shape, s, item)]


class RefMatches(ShapeMatches):
    """Every row matched on its own: no item or site list shared between shapes."""

    def of(self, d: Demand, key: object = None) -> tuple[matching.Item, list[str], str]:
        item = item_of(d.shape)
        fits, why = matched_sites(d, self.sites, item)
        return item, fits, why


def ref_site_leads(snapshot: Snapshot, memory: CycleMemory, config: Config, now: float,
                   pending: object = None) -> dict[str, float]:
    return placement.site_leads(snapshot, memory, config, now)


def ref_slow_pending(snapshot: Snapshot, memory: CycleMemory, config: Config, now: float,
                     leads: Mapping[str, float], open_sites: Iterable[str],
                     pending: object = None) -> dict[str, str]:
    return placement.slow_pending(snapshot, memory, config, now, leads, open_sites)


_site_rows = plan_module.site_rows


def ref_site_rows(snapshot: Snapshot, memory: CycleMemory, config: Config,
                  pending: object = None) -> dict[str, SiteRow]:
    return _site_rows(snapshot, memory, config)


def ref_pilot_actions(snapshot: Snapshot, memory: CycleMemory, config: Config, now: float,
                      used: set[str], site_ok: dict[str, bool], submitting: bool = False,
                      spare: bool = False) -> tuple[list[Action], list[str]]:
    """`pilot_actions` visiting every pilot of every site whose scale-down is safe."""
    c = scaledown._Cycle(snapshot, memory, config, now, used, submitting,
                         retire_ok=config.policy.retire_when_done and spare)
    by_site: dict[str, list[Pilot]] = defaultdict(list)
    for p in snapshot.pilots:
        if site_ok.get(p.site, False):
            by_site[p.site].append(p)
    for name, pilots in sorted(by_site.items()):
        s = scaledown._Site(name, config.site(name))
        for p in pilots:
            if p.state in scaledown._WARM and p.key not in used:
                s.warm += 1
            for rule in scaledown._PILOT_RULES[p.state]:
                rule(c, s, p)
        for site_rule in scaledown._SITE_RULES:
            site_rule(c, s)
    return c.out, c.unneeded


def reference_plan(snapshot: Snapshot, memory: CycleMemory, config: Config, now: float
                   ) -> Plan:
    with ExitStack() as stack:
        for module, name, ref in (
            (plan_module, "add_capacity", ref_add_capacity),
            (plan_module, "fill_existing", ref_fill_existing),
            (plan_module, "fill_new", ref_fill_new),
            (matching, "fitting_sites", ref_fitting_sites),
            (plan_module, "ShapeMatches", RefMatches),
            (capacity_module, "site_leads", ref_site_leads),
            (plan_module, "slow_pending", ref_slow_pending),
            (capacity_module, "site_rows", ref_site_rows),
            (plan_module, "pilot_actions", ref_pilot_actions),
        ):
            stack.enter_context(mock.patch.object(module, name, ref))
        return plan(snapshot, memory, config, now)


@st.composite
def with_gpu_pilots(draw: st.DrawFn) -> tuple[Snapshot, CycleMemory, Config]:
    """`scenarios()` with some pilots holding GPUs (a GPU share in their groups)."""
    snap, mem, cfg = draw(scenarios())
    pilots = []
    for p in snap.pilots:
        gpus = draw(st.sampled_from((0, 0, 1, 2)))
        if gpus:
            p = dataclasses.replace(p, gpus=gpus, free_gpus=draw(st.integers(0, gpus)))
        pilots.append(p)
    return dataclasses.replace(snap, pilots=tuple(pilots)), mem, cfg


@SETTINGS
@given(with_gpu_pilots(), st.sampled_from((0.0, 300.0, 90000.0)))
def test_plan_decides_as_the_reference(sc: tuple[Snapshot, CycleMemory, Config],
                                       later: float) -> None:
    snap, mem, cfg = sc
    now = 100_000.0 + later
    assert plan(snap, mem, cfg, now) == reference_plan(snap, mem, cfg, now)


@pytest.mark.parametrize("seed", range(6))
def test_synthetic_snapshots_decide_as_the_reference(seed: int) -> None:
    """Many shapes, pilots in every state, an unknown site, the per-cycle caps reached:
    the benchmark's snapshot, smaller."""
    snap, mem, cfg = synthetic_snapshot(seed=seed, n_jobs=3000, n_shapes=60, n_pilots=400,
                                        n_sites=(1, 3, 10)[seed % 3])
    assert plan(snap, mem, cfg, 1_000_000.0) == reference_plan(snap, mem, cfg, 1_000_000.0)


@SETTINGS
@given(scenarios(), shapes)
def test_fitting_sites_is_site_rejects(sc: tuple[Snapshot, CycleMemory, Config],
                                       shape: matching.JobShape) -> None:
    _snap, _mem, cfg = sc
    item = item_of(shape)
    assert fitting_sites(shape, cfg.sites, item) == ref_fitting_sites(shape, cfg.sites, item)


def test_site_limits_follow_the_sites_asked_about() -> None:
    """`fitting_sites` reads the sites' limits once per tuple of sites: another tuple, the
    same sites in another order or a list are read anew."""
    snap, _mem, small = synthetic_snapshot(seed=1, n_jobs=300, n_shapes=30, n_pilots=10,
                                           n_sites=3)
    _snap, _mem, large = synthetic_snapshot(seed=2, n_jobs=300, n_shapes=30, n_pilots=10,
                                            n_sites=7)
    for sites in (small.sites, large.sites, list(small.sites), small.sites[::-1], large.sites):
        for d in snap.demand:
            item = item_of(d.shape)
            assert fitting_sites(d.shape, sites, item) == ref_fitting_sites(d.shape, sites, item)


demand_rows = st.builds(
    Demand, shape=shapes, idle=st.integers(1, 5),
    sites=st.one_of(st.none(), st.frozensets(st.sampled_from(SITES))),
    mismatch=st.sampled_from(("", "no GPU")))


@SETTINGS
@given(scenarios(), st.lists(demand_rows, max_size=12), st.data())
def test_shape_matches_are_each_rows_own(sc: tuple[Snapshot, CycleMemory, Config],
                                         rows: list[Demand], data: st.DataObject) -> None:
    """Rows that share an item or a site list through `ShapeMatches` get what matching
    each on its own gives, whatever the order they are asked in (memory a few MB apart:
    one rounding step, one item)."""
    _snap, _mem, cfg = sc
    near = [dataclasses.replace(d, shape=dataclasses.replace(d.shape,
                                                             memory_mb=d.shape.memory_mb + 1))
            for d in rows]
    asked = data.draw(st.permutations(rows + near + rows))
    matches = ShapeMatches(cfg.sites)
    for d in asked:
        item = item_of(d.shape)
        assert matches.of(d) == (item, *matched_sites(d, cfg.sites, item))


@SETTINGS
@given(scenarios())
def test_by_state_keeps_each_states_pilots_in_order(
        sc: tuple[Snapshot, CycleMemory, Config]) -> None:
    snap, _mem, _cfg = sc
    states = by_state(snap.pilots)
    assert set(states) == set(PilotState)
    for state, pilots in states.items():
        assert pilots == [p for p in snap.pilots if p.state is state]
