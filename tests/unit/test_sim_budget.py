"""The allocations bench: the simulator's charges and never-past checks, groups on
pilots, faults, and the pacing measures."""

from __future__ import annotations

import datetime as dt
import itertools
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from bench.sim.accounts import Accounts, Point, period_charge
from bench.sim.budget_world import EPOCH, JOURNAL, allocation, grants, workload
from bench.sim.entities import SimJob, SimPilot
from bench.sim.pacing import hourly, pace, used, waited_throughout
from bench.sim.scenarios import default_config, default_sites
from bench.sim.traces import DAY, HOUR, JobSpec
from bench.sim.world import World
from provisioner.model import JobShape, Submit


def budgeted(amount: float = 1000.0, pace_: str = "asap", days: int = 10):
    """The default sites, gsi with one allocation for group a (account acct-a)."""
    gsi, frankfurt = default_sites()
    alloc = allocation("gsi", "a", amount, pace_, days)
    gsi = replace(gsi, config=gsi.config.model_copy(update={"allocations": (alloc,)}))
    return [gsi, frankfurt]


def world_of(sites, **kwargs) -> World:
    return World(sites, default_config(sites, journal=JOURNAL), seed=1, **kwargs)


def test_period_charge_clips_to_the_period() -> None:
    assert period_charge(4, 0, 2 * HOUR, 0, DAY) == 8
    assert period_charge(4, -HOUR, HOUR, 0, DAY) == 4
    assert period_charge(4, DAY - HOUR, DAY + HOUR, 0, DAY) == 4
    assert period_charge(4, DAY + 1, DAY + HOUR, 0, DAY) == 0


def test_a_pilot_is_charged_its_held_time_once_past_the_grants_end() -> None:
    sites = budgeted(days=1)
    world = world_of(sites)
    p = world.submit("gsi", 4, 8000, 86400, allocation="a-gsi")
    assert (p.account, p.groups) == ("acct-a", frozenset({"a"}))
    p.started_at = DAY - 2 * HOUR
    accounts = world.accounts
    assert accounts is not None
    grant = accounts.grant_of("gsi", "a-gsi")
    assert grant is not None
    accounts.ended(p, DAY + 5 * HOUR)
    assert accounts.spent(grant, DAY + 6 * HOUR) == 8  # 2 h x 4 cores, within the day


def test_running_pilots_count_as_spent_and_their_rest_as_committed() -> None:
    world = world_of(budgeted())
    accounts = world.accounts
    assert accounts is not None
    grant = accounts.grant_of("gsi", "a-gsi")
    assert grant is not None
    p = world.submit("gsi", 4, 8000, 10 * HOUR, allocation="a-gsi")
    assert accounts.committed(grant, 0) == 40  # pending: its whole walltime
    p.started_at = HOUR
    assert accounts.spent(grant, 3 * HOUR) == 8
    assert accounts.committed(grant, 3 * HOUR) == 32  # the 8 hours left of its walltime
    assert accounts.books(3 * HOUR)[0].spent == 8


def test_a_submission_past_the_line_is_counted() -> None:
    world = world_of(budgeted(amount=100.0))
    for _ in range(2):
        world.submit("gsi", 4, 8000, 10 * HOUR, allocation="a-gsi")  # 40 each: fits
    assert world.accounts is not None
    assert world.accounts.checks.past_at_submit == 0
    world.submit("gsi", 4, 8000, 10 * HOUR, allocation="a-gsi")  # 120 > 100
    assert world.accounts.checks.past_at_submit == 1
    world.submit("gsi", 4, 8000, 10 * HOUR)  # no allocation at a budgeted site
    world.submit("frankfurt", 4, 8000, 10 * HOUR)  # frankfurt has no allocations
    assert world.accounts.checks.unallocated == 1
    assert world.accounts.checks.headroom[("gsi", "a-gsi")] < 0


def test_spent_past_the_amount_is_counted_at_a_sample() -> None:
    world = world_of(budgeted(amount=10.0))
    p = world.submit("gsi", 4, 8000, 10 * HOUR, allocation="a-gsi")
    p.started_at = 0.0
    assert world.accounts is not None
    world.accounts.sample(2 * HOUR)  # 8 of 10
    world.accounts.sample(3 * HOUR)  # 12 of 10
    assert (world.accounts.checks.samples, world.accounts.checks.past_at_sample) == (2, 1)


def test_precharged_units_are_spent_in_the_first_period() -> None:
    sites = budgeted(amount=50.0)
    accounts = Accounts((s.config for s in sites), {("gsi", "a-gsi"): 50.0})
    grant = accounts.grant_of("gsi", "a-gsi")
    assert grant is not None
    assert accounts.spent(grant, HOUR) == 50.0


def test_a_pilot_starts_only_its_groups_jobs() -> None:
    world = world_of(budgeted())
    p = world.submit("gsi", 8, 32000, 10 * HOUR, allocation="a-gsi")
    p.started_at, p.booted = 0.0, True
    mine = SimJob(JobSpec(1, 0.0, JobShape(1, 1000, group="a"), HOUR))
    other = SimJob(JobSpec(2, 0.0, JobShape(1, 1000, group="b"), HOUR))
    none = SimJob(JobSpec(3, 0.0, JobShape(1, 1000), HOUR))
    assert p.can_start(mine, 0.0)
    assert not p.can_start(other, 0.0) and not p.can_start(none, 0.0)
    free = SimPilot(99, world.sites["frankfurt"], 8, 32000, 10 * HOUR, 0.0, started_at=0.0,
                    booted=True)
    assert free.can_start(other, 0.0) and free.can_start(none, 0.0)


def test_the_snapshot_carries_groups_and_accounts_only_where_in_use() -> None:
    shape = JobShape(4, 8000, group="a")
    for sites, group in ((budgeted(), "a"), (default_sites(), "")):
        world = World(sites, default_config(sites, journal=JOURNAL), seed=1)
        world.queue.append(SimJob(JobSpec(1, 0.0, shape, HOUR)))
        world.submit("gsi", 4, 8000, HOUR, allocation="a-gsi")
        snap = world.snapshot()
        assert [d.shape.group for d in snap.demand] == [group]
        assert [p.account for p in snap.pilots] == (["acct-a"] if group else [""])
        assert [b.allocation for b in snap.books] == (["a-gsi"] if group else [])


def test_faults_kill_pilots_and_refuse_sbatch() -> None:
    sites = [replace(s, kill_per_h=2.0, refuse_share=0.5) for s in default_sites()]
    world = World(sites, default_config(sites), seed=1)
    refused = 0
    for _ in range(20):
        _ids, error = world.sbatch(Submit("gsi", 1, 1, 4000, 3600))
        refused += error is not None
    assert 0 < refused < 20 and world.sbatch_refused == refused
    world.run(_Idle(), [], duration=2 * HOUR, drain_s=0)
    assert world.pilots_killed > 0


class _Idle:
    name = "idle"
    tick_s = 60.0

    def tick(self, world: World, now: float) -> list:
        return []


def test_grants_of_the_variants() -> None:
    assert grants("none", 30) == {}
    loose, tight = grants("loose", 30), grants("tight", 30)
    assert set(loose) == set(tight) and all(a > 100 * tight[k][0] for k, (a, _p) in
                                            loose.items())
    paces = {pace_ for _a, pace_ in tight.values()}
    assert paces == {"even", "asap"}
    spent = grants("spent", 30)
    assert spent[("gsi", "campaign")] == tight[("gsi", "campaign")]
    assert spent[("gsi", "analysis")] == loose[("gsi", "analysis")]
    assert grants("tight", 15)[("gsi", "analysis")][0] == tight[("gsi", "analysis")][0] / 2


def test_workload_has_both_groups_in_order() -> None:
    jobs = workload(1, 4)
    assert {j.shape.group for j in jobs} == {"analysis", "campaign"}
    assert [j.id for j in jobs] == list(range(len(jobs)))
    assert all(a.submit <= b.submit for a, b in itertools.pairwise(jobs))
    assert {j.shape.cpus for j in jobs if j.shape.group == "campaign"} == {8}
    assert {j.shape.group for j in workload(1, 4, ("analysis",))} == {"analysis"}
    assert allocation("gsi", "x", 1, "even", 30).period_bounds(0) == (
        0.0, (dt.date(1970, 1, 31) - EPOCH).days * DAY)


def line(amount: float, hours: int, off: dict[int, float] | None = None) -> list[Point]:
    """Burn-down points every 5 minutes over `hours`, on the even line but for `off`
    (hour -> spent minus the line)."""
    end = hours * HOUR
    out = []
    for i in range(hours * 12 + 1):
        t = i * 300.0
        spent = amount * t / end + (off or {}).get(int(t // HOUR), 0.0)
        out.append(Point(t, spent, 0.0, 0.0, end))
    return out


def test_hourly_points_are_the_whole_hours_of_the_period() -> None:
    points = [*line(100, 3), Point(4 * HOUR, 100, 0, 0, 3 * HOUR)]
    assert [p.t for p in hourly(points)] == [HOUR, 2 * HOUR, 3 * HOUR]


def test_on_the_line_nothing_deviates() -> None:
    p = pace(line(100, 10), 100, [(i * 300.0, 5) for i in range(121)])
    assert (p.hours, p.demand_hours) == (10, 10)
    assert p.run_ahead == p.lag == p.error == 0


def test_run_ahead_and_lag_are_apart_and_lag_without_demand_is_not_an_error() -> None:
    points = line(100, 10, {3: 4.0, 7: -9.0})
    idle = [(t, 0 if 6 * HOUR < t <= 8 * HOUR else 3) for t in (i * 300.0 for i in range(121))]
    p = pace(points, 100, idle)
    assert round(p.run_ahead, 6) == 4 and round(p.lag, 6) == 9
    assert p.demand_hours == 8 and round(p.error, 6) == 4 and p.demand_lag == 0
    assert p.worst_hour == 3


def test_waited_throughout() -> None:
    idle = [(0.0, 1), (300.0, 2), (600.0, 0), (900.0, 1)]
    assert waited_throughout(idle, 0, 300)
    assert not waited_throughout(idle, 0, 600)
    assert not waited_throughout(idle, 1000, 2000)  # no sample: not known to wait


def test_used_is_the_spend_at_the_period_end() -> None:
    points = [*line(100, 4)[:-1], Point(4 * HOUR, 97, 0, 0, 4 * HOUR),
              Point(5 * HOUR, 97, 0, 0, 4 * HOUR)]
    assert used(points, 100) == 97
    assert used(line(100, 4)[:13], 100) == 25  # the run ended early: its last point
    assert used([], 100) == 0


@given(st.lists(st.floats(-0.2, 0.2), min_size=24, max_size=24))
def test_errors_are_bounded_by_the_deviations(offs: list[float]) -> None:
    amount = 1000.0
    points = line(amount, 24, {h: o * amount for h, o in enumerate(offs)})
    p = pace(points, amount, [(pt.t, 1) for pt in points])
    devs = [100 * offs[h] for h in range(1, 24)] + [0.0]  # hours 1-24 (24: the end)
    assert abs(p.run_ahead - max(0.0, *devs)) < 1e-6
    assert abs(p.lag - max(0.0, *(-d for d in devs))) < 1e-6
    assert p.error == max(p.run_ahead, p.demand_lag) and p.demand_lag == p.lag
