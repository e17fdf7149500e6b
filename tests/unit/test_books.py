"""The allocations' books (provisioner.service.books, spend): the ledger's sums across
month, quarter and dated boundaries, the reconciliation with SLURM's charge (SLURM
wins, a difference logged once), SLURM unreadable (its last reading and the ledger
since), unknown books when the journal cannot be read, and the groups' spend."""

from __future__ import annotations

import datetime as dt
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.config import AllocationConfig, Config, parse_config
from provisioner.decide.budget import BudgetStatus, budgets
from provisioner.errors import Unreachable
from provisioner.model import Snapshot
from provisioner.service.accounting import JobRun, PilotRecord
from provisioner.service.books import (
    AGREE_SHARE,
    READING_KEEP_S,
    SLURM_READ_EVERY_S,
    BookEntry,
    Books,
    allocation_rows,
    pilots_charge,
    reconcile,
)
from provisioner.service.journal import Journal, Reading, SeenPilot
from provisioner.service.spend import (
    NO_GROUP,
    charged,
    group_spend,
    group_totals,
    runout,
    spent_series,
)
from provisioner.sites.base import AccountCharge, SiteJob, SiteJobState
from tests.unit.fakes import FakeBackend

HOUR = 3600.0


def utc(*args: int) -> float:
    return dt.datetime(*args, tzinfo=dt.UTC).timestamp()


def alloc(**kw: object) -> AllocationConfig:
    base: dict[str, object] = {"name": "a", "account": "acct-a", "amount": 1000,
                               "period": "monthly", "groups": ["group_a"]}
    base.update(kw)
    return AllocationConfig.model_validate(base)


def rec(job_id: str, start: float | None, end: float | None, cores: int = 4,
        gpus: int = 0, account: str = "acct-a", site: str = "gsi") -> PilotRecord:
    return PilotRecord(site, job_id, cores, (start or 0.0) - 60, start, end, 8000,
                       gpus=gpus, account=account)


def books_at(a: AllocationConfig, pilots: list[PilotRecord], reading: Reading | None,
             now: float) -> BookEntry:
    return reconcile("gsi", a, pilots_charge(pilots, "gsi", a, now), reading, now)


def test_a_pilot_costs_its_rate_for_the_time_slurm_holds_it() -> None:
    t = utc(2026, 12, 10)
    pilots = [rec("1", t, t + 2 * HOUR, cores=8, gpus=2), rec("2", None, None),
              rec("3", t + HOUR, None, cores=4)]  # pending: nothing; running: to now
    now = t + 3 * HOUR
    assert charged(pilots, "core-hours", t, now, now) == pytest.approx(16 + 8)
    assert charged(pilots, "node-hours", t, now, now) == pytest.approx(2 + 2)
    assert charged(pilots, "gpu-hours", t, now, now) == pytest.approx(4)
    assert runout(100.0, 40.0, 6.0, now) == now + 10 * HOUR
    assert runout(100.0, 40.0, 0.0, now) is None and runout(10.0, 12.0, 1.0, now) == now


@pytest.mark.parametrize(("period", "boundary"), [
    ("monthly", utc(2026, 12, 1)),
    ("quarterly", utc(2026, 10, 1)),
    ({"start": "2026-11-15", "end": "2026-12-01"}, utc(2026, 12, 1)),
    ({"start": "2026-11-15", "end": "2026-12-01"}, utc(2026, 11, 15)),
])
def test_a_pilot_crossing_a_period_boundary_is_split_between_the_periods(
        period: object, boundary: float) -> None:
    a = alloc(period=period)
    crossing = rec("1", boundary - 2 * HOUR, boundary + 3 * HOUR)  # 4 cores: 8 + 12
    inside_before = rec("2", boundary - 5 * HOUR, boundary - 4 * HOUR)  # 4 core-h
    pilots = [crossing, inside_before]
    before = books_at(a, pilots, None, boundary - 1)
    after = books_at(a, pilots, None, boundary + 10 * HOUR)
    if isinstance(period, str) or boundary == utc(2026, 12, 1):
        assert before.ledger_spent == pytest.approx(8 + 4, abs=0.01)
    if isinstance(period, str):
        assert after.ledger_spent == pytest.approx(12)
        assert after.start == boundary
    elif boundary == utc(2026, 12, 1):  # the dated grant's end: nothing after it
        assert after.ledger_spent == pytest.approx(8 + 4)
    else:  # the dated grant's start: nothing before it
        assert after.ledger_spent == pytest.approx(12)


def test_spent_series_rises_with_the_pilots_held() -> None:
    start = utc(2026, 12, 1)
    series = spent_series([rec("1", start, start + 10 * HOUR)], "core-hours", start,
                          utc(2027, 1, 1), start + 20 * HOUR, points=20)
    assert series[0] == (start, 0.0) and series[-1][1] == pytest.approx(40)
    assert series[5][1] == pytest.approx(20)
    values = [v for _t, v in series]
    assert values == sorted(values)


def reading(at: float, used: float, grant: float | None = 1000.0) -> Reading:
    return Reading("gsi", "a", "acct-a", at, used, grant)


def test_slurm_wins_and_the_ledger_counts_since_its_reading() -> None:
    a = alloc()
    t = utc(2026, 12, 10)
    pilots = [rec("1", t, None, cores=10)]  # 10 core-h per hour, still running
    now = t + 5 * HOUR
    # SLURM charged 100 more than the ledger by its reading at t + 2 h (outside jobs)
    e = books_at(a, pilots, reading(t + 2 * HOUR, 120.0), now)
    assert e.ledger_spent == pytest.approx(50)
    assert e.difference == pytest.approx(100)
    assert e.spent == pytest.approx(120 + 30)  # the reading + the ledger since
    assert e.differs and e.slurm_spent == 120 and e.slurm_grant == 1000
    # SLURM below the ledger by what its usage passes may trail: the ledger counts
    lag = books_at(a, pilots, reading(t + 2 * HOUR, 19.0), now)
    assert not lag.differs and lag.spent == pytest.approx(50)
    # far below the ledger (the journal charged a pilot SLURM never ran): SLURM wins
    low = books_at(a, [*pilots, rec("2", t - HOUR, t + HOUR, cores=20)],
                    reading(t + 2 * HOUR, 20.0), now)
    assert low.differs and low.spent == pytest.approx(20 + 30)
    # a reading of an earlier period does not count in this one
    old = books_at(a, pilots, reading(utc(2026, 11, 30), 900.0), now)
    assert old.spent == pytest.approx(50) and old.slurm_spent is None


def test_the_tolerance_is_a_share_of_the_amount_plus_slurms_lag() -> None:
    a = alloc(amount=500)
    t = utc(2026, 12, 10)
    idle = books_at(a, [], reading(t, 4.0), t + 60)
    assert idle.tolerance == pytest.approx(AGREE_SHARE * 500)
    assert not idle.differs
    assert books_at(a, [], reading(t, 6.0), t + 60).differs


CONFIG = """
journal: /j.db
pool: {collector: "cm:9618", provisioner_id: t, uid_domain: example}
sites:
  - name: gsi
    max_walltime_s: 7200
    template: gsi.sh.j2
    image: /images/pilot.sif
    pilot: {cpus: 4, memory_mb: 8000, walltime_s: 3600}
    allocations:
      - {name: a, account: acct-a, amount: 1000, period: monthly, groups: [group_a]}
      - {name: b, account: acct-b, unit: node-hours, amount: 50, period: quarterly,
         pace: even, groups: [group_b]}
  - name: fra
    max_walltime_s: 7200
    template: frankfurt.sh.j2
    image: /images/pilot.sif
    pilot: {cpus: 4, memory_mb: 8000, walltime_s: 3600}
"""
T0 = utc(2026, 12, 10)


def charge(account: str, cpu_h: float, node_h: float = 0.0) -> AccountCharge:
    return AccountCharge(account, {"cpu": cpu_h * 60, "node": node_h * 60},
                         {"cpu": 1000 * 60})


def setup() -> tuple[Config, Journal, FakeBackend, Books]:
    config = parse_config(CONFIG, "t.yaml")
    journal = Journal("")
    backend = FakeBackend("gsi")
    journal.record_pilots("gsi", [SeenPilot("7", 4, 8000, T0 - 60, T0, True,
                                            account="acct-a", allocation="a")], now=T0)
    return config, journal, backend, Books(config, {"gsi": backend})


def observe(books: Books, journal: Journal, now: float,
            jobs: dict[str, list[SiteJob]] | None = None) -> dict[str, float]:
    books.start(now)
    got = books.observe(now, journal, jobs or {})
    return {b.allocation: b.spent for b in got if b.known}


def test_books_read_slurm_at_most_once_a_minute_and_reconcile(
        caplog: pytest.LogCaptureFixture) -> None:
    _config, journal, backend, books = setup()
    backend.charges = {"acct-a": charge("acct-a", 0.0), "acct-b": charge("acct-b", 0, 0)}
    assert observe(books, journal, T0 + HOUR) == {"a": pytest.approx(4), "b": 0.0}
    assert backend.charge_reads == [["acct-a", "acct-b"]]
    observe(books, journal, T0 + HOUR + SLURM_READ_EVERY_S - 1)
    assert len(backend.charge_reads) == 1  # not again within the minute
    # SLURM has charged acct-a 104 core-h (100 by jobs outside the provisioner)
    backend.charges["acct-a"] = charge("acct-a", 104.0)
    caplog.set_level(logging.WARNING, "provisioner.service.books")
    spent = observe(books, journal, T0 + HOUR + SLURM_READ_EVERY_S)
    assert spent["a"] == pytest.approx(104)
    entry = books.entries[("gsi", "a")]
    assert entry.differs and entry.difference == pytest.approx(100, abs=0.1)
    for i in range(2, 5):  # the same difference: logged once
        observe(books, journal, T0 + HOUR + i * SLURM_READ_EVERY_S)
    assert caplog.text.count("DIFFERENCE") == 1
    assert "SLURM has charged account acct-a 104" in caplog.text
    backend.charges["acct-a"] = charge("acct-a", 4.0 + 5 * SLURM_READ_EVERY_S / HOUR * 4)
    observe(books, journal, T0 + HOUR + 5 * SLURM_READ_EVERY_S)
    assert "agree again" in caplog.text and not books.entries[("gsi", "a")].differs


def test_unreadable_slurm_counts_the_last_reading_and_the_ledger_since(
        caplog: pytest.LogCaptureFixture) -> None:
    _config, journal, backend, books = setup()
    backend.charges = {"acct-a": charge("acct-a", 54.0)}  # 50 more than the ledger
    assert observe(books, journal, T0 + HOUR)["a"] == pytest.approx(54)
    entry = books.entries[("gsi", "b")]
    assert "does not know account acct-b" in entry.read_error and entry.spent == 0
    backend.charges_error = Unreachable("sshare: slurmdbd not responding")
    spent = observe(books, journal, T0 + 3 * HOUR)
    assert spent["a"] == pytest.approx(54 + 8)  # the reading + 2 h of 4 cores since
    entry = books.entries[("gsi", "a")]
    assert "slurmdbd not responding" in entry.read_error
    assert entry.reading_at == T0 + HOUR and entry.known
    for i in range(3):
        observe(books, journal, T0 + 4 * HOUR + i * SLURM_READ_EVERY_S)
    assert caplog.text.count("slurmdbd not responding") == 1
    # never read: the ledger alone
    fresh = Books(parse_config(CONFIG, "t.yaml"), {"gsi": backend})
    assert observe(fresh, journal, T0 + 3 * HOUR)["a"] == pytest.approx(12)
    backend.charges_error = None
    observe(books, journal, T0 + 5 * HOUR)
    assert books.entries[("gsi", "a")].read_error == ""
    assert "readable again" in caplog.text


def test_a_tres_slurm_does_not_count_is_named() -> None:
    _config, journal, backend, books = setup()
    backend.charges = {"acct-a": charge("acct-a", 4.0),
                       "acct-b": AccountCharge("acct-b", {"cpu": 60.0}, {})}
    observe(books, journal, T0 + HOUR)
    assert "does not count TRES node" in books.entries[("gsi", "b")].read_error


def test_a_backend_without_accounting_reads_leaves_the_ledger() -> None:
    config, journal, _backend, _books = setup()
    books = Books(config, {"gsi": object()})
    assert observe(books, journal, T0 + HOUR)["a"] == pytest.approx(4)
    assert "cannot read SLURM's accounting" in books.entries[("gsi", "a")].read_error


def test_this_cycles_squeue_fills_in_what_the_journal_has_not_recorded() -> None:
    _config, journal, _backend, books = setup()
    jobs = {"gsi": [SiteJob("7", SiteJobState.RUNNING, 4, 8000, T0 - 60, T0, None,
                            account="acct-a"),
                    SiteJob("8", SiteJobState.RUNNING, 8, 8000, T0, T0 + HOUR, None,
                            account="acct-a"),
                    SiteJob("9", SiteJobState.RUNNING, 1, 8000, T0, T0, None,
                            account="acct-b")]}
    spent = observe(books, journal, T0 + 2 * HOUR, jobs)
    assert spent == {"a": pytest.approx(8 + 8), "b": pytest.approx(2)}


def test_unknown_books_when_the_journal_cannot_be_read(
        caplog: pytest.LogCaptureFixture) -> None:
    config, journal, _backend, books = setup()
    journal.db.close()
    got = books.observe(T0 + HOUR, journal, {})
    assert [b.known for b in got] == [False, False]
    assert "journal cannot be read" in got[0].error
    snapshot = Snapshot(demand=(), pilots=(), sites=(), pool_known=True, books=got)
    budget = budgets(config, snapshot, T0 + HOUR)[("gsi", "a")]
    assert budget.status is BudgetStatus.UNKNOWN and budget.allowance == 0
    books.observe(T0 + 2 * HOUR, journal, {})
    assert caplog.text.count("journal cannot be read") == 1
    # the journal not opened (one in memory meanwhile): unknown too
    assert not any(b.known for b in books.observe(T0, Journal(""), {}, usable=False))


def test_readings_are_kept_in_the_journal_and_count_after_a_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = parse_config(CONFIG, "t.yaml")
    journal = Journal(str(tmp_path / "j.db"))
    journal.record_pilots("gsi", [SeenPilot("7", 4, 8000, T0 - 60, T0, True,
                                            account="acct-a", allocation="a")], now=T0)
    backend = FakeBackend("gsi", charges={"acct-a": charge("acct-a", 44.0)})
    books = Books(config, {"gsi": backend})
    for i in range(12):  # a reading a minute for 12 minutes
        observe(books, journal, T0 + HOUR + i * SLURM_READ_EVERY_S)
        books.record(journal)
    kept = journal.readings(allocation="a")
    assert [r.at for r in kept] == [T0 + HOUR, T0 + HOUR + READING_KEEP_S]
    restarted = Books(config, {"gsi": FakeBackend("gsi", charges_error=Unreachable("x"))})
    spent = observe(restarted, Journal(str(tmp_path / "j.db")), T0 + 2 * HOUR)
    # the reading kept at T0 + 1 h 10 min (44) and the ledger's 50 minutes since
    assert spent["a"] == pytest.approx(44 + 4 * 50 / 60)


def test_rows_give_status_and_metrics_one_set_of_numbers() -> None:
    config, journal, backend, books = setup()
    backend.charges = {"acct-a": charge("acct-a", 4.0), "acct-b": charge("acct-b", 0, 0)}
    now = T0 + HOUR
    books.start(now)
    snapshot = Snapshot(demand=(), pilots=(), sites=(), pool_known=True,
                        books=books.observe(now, journal, {}))
    rows = {(r.budget.site, r.budget.name): r for r in allocation_rows(
        config, snapshot, books.entries, now, {("gsi", "b"): "stopped: SLURM refused"})}
    a = rows[("gsi", "a")].as_dict()
    assert a["spent"] == pytest.approx(4) and a["slurm_spent"] == pytest.approx(4)
    assert a["line"].startswith("gsi/a: open, 996 of 1000 core-h left")
    assert a["runout_at"] == pytest.approx(now + 996 / (4 / 24) * HOUR)
    assert rows[("gsi", "b")].budget.status is BudgetStatus.STOPPED


def test_groups_spend_what_their_jobs_claimed_of_the_allocations_pilots() -> None:
    config = parse_config(CONFIG, "t.yaml")
    start = utc(2026, 12, 1)
    pilots = [rec("7", start - HOUR, start + 4 * HOUR, cores=4),
              rec("8", start, start + 4 * HOUR, cores=4, account="acct-b"),
              rec("9", start, start + 4 * HOUR, cores=4, site="fra", account="")]
    runs = [JobRun("1.0", "u", "gsi", "7", 2, start - HOUR, start + HOUR, group="group_a"),
            JobRun("2.0", "u", "gsi", "8", 2, start, start + 2 * HOUR, group="group_b"),
            JobRun("3.0", "u", "gsi", "7", 1, start, start + 3 * HOUR),
            JobRun("4.0", "u", "fra", "9", 4, start, start + HOUR, group="group_a")]
    spends = group_spend(config.sites, pilots, runs, start + 5 * HOUR)
    assert group_totals(spends) == {("group_a", "core-hours"): pytest.approx(2),
                                    ("group_b", "node-hours"): pytest.approx(1),
                                    (NO_GROUP, "core-hours"): pytest.approx(3)}


def test_the_charge_is_read_after_the_sites_squeue_never_beside_it() -> None:
    """A backend takes one call at a time: the charge read waits for the same site's
    `squeue` read of the cycle, in another thread."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    _config, journal, backend, books = setup()
    backend.charges = {"acct-a": charge("acct-a", 4.0)}
    listing = threading.Event()
    order: list[str] = []

    def list_pilots() -> list[SiteJob]:
        listing.wait(5)
        order.append("squeue")
        return []

    real = backend.account_charges

    def account_charges(accounts: list[str]) -> dict[str, AccountCharge]:
        order.append("charges")
        return real(accounts)

    backend.account_charges = account_charges  # type: ignore[method-assign]
    with ThreadPoolExecutor(max_workers=2) as pool:
        squeue = pool.submit(list_pilots)
        books.start(T0 + HOUR, pool, {"gsi": squeue})
        listing.set()
        got = books.observe(T0 + HOUR, journal, {})
    assert order == ["squeue", "charges"] and got[0].spent == pytest.approx(4)


pilot_records = st.lists(st.tuples(
    st.integers(0, 40), st.one_of(st.none(), st.integers(-30, 30)), st.integers(0, 30),
    st.booleans(), st.integers(1, 16), st.integers(0, 4),
    st.sampled_from(["acct-a", "acct-b", ""])), max_size=8)


@settings(max_examples=150, deadline=None)
@given(rows=pilot_records, unit=st.sampled_from(["core-hours", "node-hours", "gpu-hours"]),
       window=st.tuples(st.integers(-40, 40), st.integers(0, 40)),
       runs=st.lists(st.tuples(st.integers(0, 40), st.integers(-30, 30), st.integers(1, 20),
                               st.integers(1, 16), st.integers(0, 4),
                               st.sampled_from(["group_a", "group_b", ""])), max_size=6))
def test_the_journals_sums_are_the_ledgers(rows: list[tuple[int, int | None, int, bool, int,
                                                             int, str]],
                                           unit: str, window: tuple[int, int],
                                           runs: list[tuple[int, int, int, int, int, str]]
                                           ) -> None:
    """SQLite's sums over the journal (what the service reads every cycle) equal the
    pure ledger's over the same records (what the report and the tests use)."""
    now = T0
    journal = Journal("")
    records = []
    for i, (_k, start, length, ended, cores, gpus, account) in enumerate(rows):
        begin = None if start is None else T0 + start * HOUR
        end = None if begin is None or not ended else min(begin + length * HOUR, now)
        records.append(PilotRecord("gsi", str(i), cores, T0 - 40 * HOUR, begin, end, 8000,
                                   gpus=gpus, account=account,
                                   allocation="a" if account == "" and i % 2 else ""))
    journal.add_pilot_records(records, "test")
    t0 = T0 + window[0] * HOUR
    t1 = t0 + window[1] * HOUR
    want = charged([p for p in records if p.account == "acct-a"
                    or (not p.account and p.allocation == "a")], unit, t0, t1, now)
    got = journal.charged("gsi", "acct-a", "a", unit, t0, t1, now)
    assert got == pytest.approx(want, abs=1e-6)
    job_runs = [JobRun(f"{j}.0", "u", "gsi", str(p % max(1, len(records))), cores,
                       T0 + s * HOUR, T0 + (s + d) * HOUR, gpus=g, group=group)
                for j, (p, s, d, cores, g, group) in enumerate(runs)]
    journal.add_job_runs(job_runs)
    sites = parse_config(CONFIG, "t.yaml").sites
    config_alloc = sites[0].allocation("a").model_copy(update={"unit": unit})
    site = sites[0].model_copy(update={"allocations": (config_alloc,)})
    spends = group_spend([site], records, job_runs, now, window=(t0, t1))
    claims = journal.group_claims("gsi", "acct-a", "a", unit, t0, min(t1, now))
    assert {g or NO_GROUP: v for g, v in claims.items()} == pytest.approx(
        {(s.group): s.spent for s in spends if s.spent > 1e-12})
