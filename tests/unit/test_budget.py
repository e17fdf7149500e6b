"""The budget arithmetic (provisioner.decide.budget) and the allocations' configuration."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provisioner.config import AllocationConfig, ConfigError, parse_config
from provisioner.decide.budget import BudgetStatus, budget_of, pilot_commitment
from provisioner.model import Pilot, PilotState


def utc(*args: int) -> float:
    return dt.datetime(*args, tzinfo=dt.UTC).timestamp()


def alloc(**kw: object) -> AllocationConfig:
    base: dict[str, object] = {"name": "alloc-a", "account": "alloc-a", "amount": 1000,
                               "period": "monthly", "groups": ["group_a"]}
    base.update(kw)
    return AllocationConfig.model_validate(base)


def pilot(state: PilotState, cpus: int = 4, end: float | None = None) -> Pilot:
    return Pilot(site="gsi", job_id="1", state=state, cpus=cpus, memory_mb=8000,
                 submitted_at=0.0, walltime_end=end)


@pytest.mark.parametrize(("period", "now", "bounds"), [
    ("monthly", utc(2026, 12, 1, 21), (utc(2026, 12, 1), utc(2027, 1, 1))),
    ("monthly", utc(2026, 2, 28, 23), (utc(2026, 2, 1), utc(2026, 3, 1))),
    ("quarterly", utc(2026, 12, 31, 23), (utc(2026, 10, 1), utc(2027, 1, 1))),
    ("quarterly", utc(2026, 4, 1), (utc(2026, 4, 1), utc(2026, 7, 1))),
    ({"start": "2026-11-15", "end": "2027-02-01"}, utc(2026, 1, 1),
     (utc(2026, 11, 15), utc(2027, 2, 1))),
])
def test_period_bounds(period: object, now: float, bounds: tuple[float, float]) -> None:
    assert alloc(period=period).period_bounds(now) == bounds


def test_rates_and_commitments() -> None:
    now = utc(2026, 12, 10)
    assert pilot_commitment("core-hours", pilot(PilotState.PENDING), 7200, now) == 8.0
    assert pilot_commitment("node-hours", pilot(PilotState.PENDING), 7200, now) == 2.0
    running = pilot(PilotState.BUSY, end=now + 1800)
    assert pilot_commitment("core-hours", running, 7200, now) == 2.0
    assert pilot_commitment("core-hours", pilot(PilotState.BUSY, end=now - 5), 7200, now) == 0


def test_a_pilot_that_would_cross_the_line_does_not_fit() -> None:
    now = utc(2026, 12, 10)
    # 1000 - 990 spent - one pending 4-core 1 h pilot (4) = 6 core-h left.
    b = budget_of("gsi", alloc(), 990.0, [pilot(PilotState.PENDING)], 3600, now)
    assert b.left == pytest.approx(6.0)
    assert b.fits(4, 0)
    assert not b.fits(8, 0)
    assert not b.fits(4, 0, already=4.0)
    spent = budget_of("gsi", alloc(), 1000.0, [], 3600, now)
    assert spent.status is BudgetStatus.SPENT and not spent.fits(1, 0)


def test_even_pace_carries_unspent_hours_forward() -> None:
    a = alloc(pace="even", amount=31 * 24)  # 24 core-h per day in December
    day10 = utc(2026, 12, 10)
    # ideal at day 10 + 1 h: 9 days and 1 h of 24/day = 217; nothing spent yet
    fresh = budget_of("gsi", a, 0.0, [], 3600, day10)
    assert fresh.allowance == pytest.approx(217.0)
    assert fresh.status is BudgetStatus.PACED
    behind = budget_of("gsi", a, 216.0, [], 3600, day10)
    assert behind.allowance == pytest.approx(1.0)
    assert behind.fits(1, 0) and not behind.fits(2, 0)
    ahead = budget_of("gsi", a, 300.0, [], 3600, day10)
    assert ahead.allowance == 0.0
    assert "paced, 444 of 744 core-h left for 22 days" in ahead.line()


def test_dated_grant_outside_its_period_takes_nothing() -> None:
    a = alloc(period={"start": "2026-11-01", "end": "2026-12-01"})
    after = budget_of("gsi", a, 100.0, [], 3600, utc(2026, 12, 1, 12))
    assert after.status is BudgetStatus.ENDED and after.allowance == 0
    assert after.line() == ("gsi/alloc-a: ended (2026-12-01), no new pilot; "
                            "900 of 1000 core-h were left")
    before = budget_of("gsi", a, 0.0, [], 3600, utc(2026, 10, 30))
    assert before.status is BudgetStatus.NOT_STARTED and before.allowance == 0


def test_unknown_books_allow_nothing() -> None:
    b = budget_of("gsi", alloc(), None, [], 3600, utc(2026, 12, 10))
    assert b.status is BudgetStatus.UNKNOWN and b.allowance == 0 and not b.fits(1, 0)


@given(amount=st.floats(1, 1e5), spent=st.floats(0, 1e5), pace=st.sampled_from(["asap", "even"]),
       pending=st.integers(0, 5), cpus=st.integers(1, 64), day=st.integers(1, 30))
def test_allowance_never_exceeds_what_is_left(amount: float, spent: float, pace: str,
                                              pending: int, cpus: int, day: int) -> None:
    now = utc(2026, 12, day, 6)
    b = budget_of("gsi", alloc(amount=amount, pace=pace), spent,
                  [pilot(PilotState.PENDING, cpus)] * pending, 7200, now)
    assert 0 <= b.allowance <= max(0.0, b.left) + 1e-9
    if b.fits(cpus, 0):
        assert b.spent + b.committed + b.cost(cpus, 0) <= amount + 1e-6


SITE = """
sites:
  - name: gsi
    max_walltime_s: 7200
    template: gsi.j2
    image: /x.sif
    pilot: {cpus: 4, memory_mb: 8000, walltime_s: 3600}
    allocations:
"""


@pytest.mark.parametrize(("block", "field"), [
    ("      - {name: a, account: a, amount: 10, groups: [g]}", "period"),
    ("      - {name: a, account: a, amount: -1, period: monthly, groups: [g]}", "amount"),
    ("      - {name: a, account: a, amount: 1, period: {start: 2026-12-02, end: 2026-12-01},"
     " groups: [g]}", "period.end"),
    ("      - {name: a, account: a, amount: 1, period: monthly, groups: []}", "groups"),
    ("      - {name: a, account: a, amount: 1, period: monthly, groups: ['a\"||true']}",
     "groups"),
    ("      - {name: a, account: a, amount: 1, period: monthly, pace: fast, groups: [g]}",
     "pace"),
    ("      - {name: a, account: a, amount: 1, period: monthly, groups: [g]}\n"
     "      - {name: a, account: b, amount: 1, period: monthly, groups: [g]}", "name"),
    ("      - {name: a, account: a, amount: 1, period: monthly, groups: [g]}\n"
     "      - {name: b, account: a, amount: 1, period: monthly, groups: [g]}", "account"),
    ("      - {name: a, account: a, unit: gpu-hours, amount: 1, period: monthly, groups: [g]}",
     "unit"),
])
def test_bad_allocations_name_their_field(block: str, field: str) -> None:
    text = "journal: /var/lib/p/journal.db\n" + SITE + block + "\n"
    with pytest.raises(ConfigError, match=rf"allocations\[\d\]\.{field}"):
        parse_config(text, "provisioner.yaml")


def test_account_beside_allocations_and_a_missing_journal_are_refused() -> None:
    block = "      - {name: a, account: a, amount: 1, period: monthly, groups: [g]}\n"
    with pytest.raises(ConfigError, match=r"journal.*gsi have allocations"):
        parse_config(SITE + block, "provisioner.yaml")
    with pytest.raises(ConfigError, match=r"sites\[0\]\.account"):
        parse_config("journal: /j.db\n" + SITE.replace("    allocations:", "    account: x\n"
                     "    allocations:") + block, "provisioner.yaml")
    cfg = parse_config("journal: /j.db\n" + SITE + block, "provisioner.yaml")
    assert cfg.groups_in_use and cfg.sites[0].allocation("a").groups == ("g",)


def test_budgets_read_the_books_and_the_allocations_pilots() -> None:
    from provisioner.decide.budget import budgets
    from provisioner.model import AllocationBooks, SiteView, Snapshot

    block = ("      - {name: a, account: acct-a, amount: 100, period: monthly, groups: [g]}\n"
             "      - {name: b, account: acct-b, amount: 100, period: monthly, groups: [h]}\n")
    cfg = parse_config("journal: /j.db\n" + SITE + block, "provisioner.yaml")
    mine = Pilot(site="gsi", job_id="7", state=PilotState.PENDING, cpus=4, memory_mb=8000,
                 submitted_at=0.0, account="acct-a")
    other = Pilot(site="gsi", job_id="8", state=PilotState.PENDING, cpus=4, memory_mb=8000,
                  submitted_at=0.0, account="acct-b")
    snap = Snapshot(demand=(), pilots=(mine, other), sites=(SiteView("gsi", True),),
                    books=(AllocationBooks("gsi", "a", 10.0),))
    out = budgets(cfg, snap, utc(2026, 12, 5), {("gsi", "b"): "SLURM refused its account"})
    assert out["gsi", "a"].spent == 10.0 and out["gsi", "a"].committed == 4.0
    assert out["gsi", "b"].status is BudgetStatus.STOPPED
    assert out["gsi", "b"].allowance == 0.0


def test_a_refused_site_is_one_error_not_two() -> None:
    text = "journal: /j.db\n" + SITE + ("      - {name: a, account: a, amount: 1, "
                                        "period: {start: 2026-12-02, end: 2026-12-01}, "
                                        "groups: [g]}\n")
    with pytest.raises(ConfigError) as err:
        parse_config(text, "provisioner.yaml")
    assert str(err.value).count("\n") == 0, err.value
    assert "allocations[0].period.end: period end 2026-12-01" in str(err.value)
