"""The allocations' books: what each allocation has spent this period, as the service
knows it, reconciled with SLURM's own charge.

The ledger: every pilot charged to an allocation's SLURM account costs its rate for the
time SLURM holds it (`provisioner.service.spend`), from the journal's pilot records and
this cycle's `squeue` (a start or a pilot the journal has not recorded yet).

SLURM's charge: every cycle, at most once every SLURM_READ_EVERY_S per site, the site's
backend reads SLURM's accounting of all the site's allocation accounts in one call
(`account_charges`, in a reader thread beside `squeue`): each account's used TRES-minutes
and its GrpTRESMins grant, of the TRES the allocation's unit counts (`UNIT_TRES`).

SLURM wins: spent = SLURM's last reading of the period plus what the ledger charged since
that reading. SLURM counts a running job's use at each of its usage passes, so a
reading trails the truth by up to SLURM_LAG_S of the pilots' time: where SLURM's figure
is below the ledger's by no more than the tolerance, the ledger's counts. The difference
is SLURM's reading minus the ledger's charge up to the reading; beyond the tolerance
(AGREE_SHARE of the amount plus what the ledger charged in the SLURM_LAG_S before the
reading) it is logged once per change, shown by `status` and exported.

When SLURM's charge cannot be read (no slurmdbd, a failed read, an account or a TRES
SLURM does not know), the last reading of the period plus the ledger since counts, or
the ledger alone; `status` names the error and the reading's age. Only a journal that
cannot be read (or is not open: the one in memory meanwhile holds no pilot) makes the
books unknown: `AllocationBooks.known` False, no new pilot is charged to the allocation.

Readings go into the journal (`slurm_readings`) at most every READING_KEEP_S per
allocation; after a restart the last one kept counts until SLURM is read again.
"""

from __future__ import annotations

import logging
import math
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, replace
from typing import Any

from provisioner.config import UNIT_TRES, AllocationConfig, Config, SiteBase
from provisioner.decide.budget import Budget, Stopped, budgets
from provisioner.errors import Unreachable
from provisioner.model import AllocationBooks, Snapshot
from provisioner.service.accounting import HOUR_S, PilotRecord
from provisioner.service.journal import Journal, Reading
from provisioner.service.spend import (
    BURN_WINDOW_S,
    NO_GROUP,
    GroupSpend,
    charged,
    of_allocation,
    runout,
)
from provisioner.sites.base import AccountCharge, SiteJob

log = logging.getLogger(__name__)

#: SLURM's charge of a site's accounts is read at most this often.
SLURM_READ_EVERY_S = 60.0
#: How far SLURM's count of a running job's use may trail (its usage passes,
#: PriorityCalcPeriod, 5 minutes by default).
SLURM_LAG_S = 300.0
#: SLURM and the ledger agree within this share of the amount (plus the lag).
AGREE_SHARE = 0.01
#: A reading goes into the journal at most this often per allocation.
READING_KEEP_S = 600.0
#: The groups' spend is read from the journal's job runs at most this often.
GROUPS_EVERY_S = 300.0

Key = tuple[str, str]  # (site, allocation name)


@dataclass(frozen=True)
class BookEntry:
    """One allocation's books this cycle (unit-hours of `unit`)."""

    site: str
    allocation: str
    account: str
    unit: str
    amount: float
    start: float  # the period, [start, end)
    end: float
    spent: float = 0.0  # what counts: SLURM's reading + the ledger since, or the ledger
    ledger_spent: float = 0.0  # the ledger alone, this period
    known: bool = True
    error: str = ""  # why the books are unknown
    slurm_spent: float | None = None  # SLURM's last reading of the period
    slurm_grant: float | None = None  # SLURM's GrpTRESMins grant (None: none, or unread)
    reading_at: float | None = None
    read_error: str = ""  # why SLURM's charge could not be read at the last try
    difference: float | None = None  # SLURM's reading - the ledger's charge up to it
    tolerance: float = 0.0
    burn_rate: float = 0.0  # unit-hours per hour over the last day (the ledger's)

    @property
    def key(self) -> Key:
        return self.site, self.allocation

    @property
    def differs(self) -> bool:
        """SLURM's charge and the ledger disagree beyond the tolerance."""
        return self.difference is not None and abs(self.difference) > self.tolerance

    def books(self) -> AllocationBooks:
        return AllocationBooks(self.site, self.allocation, self.spent, self.known,
                               self.error)


#: The ledger's charge of one allocation: unit-hours its pilots held within [t0, t1).
Charge = Callable[[float, float], float]


def pilots_charge(pilots: Sequence[PilotRecord], site: str, alloc: AllocationConfig,
                  now: float) -> Charge:
    """The ledger's charge of `alloc` from pilot records (those of the site's other
    allocations and sites left out)."""
    mine = of_allocation(pilots, site, alloc)
    return lambda t0, t1: charged(mine, alloc.unit, t0, t1, now)


def reconcile(site: str, alloc: AllocationConfig, charge: Charge, reading: Reading | None,
              now: float, read_error: str = "") -> BookEntry:
    """The allocation's books at `now` from the ledger's `charge` and SLURM's last
    reading (None: never read)."""
    start, end = alloc.period_bounds(now)
    upto = min(now, end)
    ledger = charge(start, upto)
    entry = BookEntry(site=site, allocation=alloc.name, account=alloc.account,
                      unit=alloc.unit, amount=alloc.amount, start=start, end=end,
                      spent=ledger, ledger_spent=ledger, read_error=read_error,
                      burn_rate=charge(now - BURN_WINDOW_S, now) / (BURN_WINDOW_S / HOUR_S),
                      slurm_grant=None if reading is None else reading.grant)
    if reading is None or not start <= reading.at < end:
        return entry
    at_reading = charge(start, reading.at)
    since = charge(reading.at, upto)
    lag = charge(reading.at - SLURM_LAG_S, reading.at)
    tolerance = AGREE_SHARE * alloc.amount + lag
    difference = reading.used - at_reading
    slurm_now = reading.used + since
    # SLURM below the ledger within the tolerance: SLURM has not counted the last minutes
    spent = max(slurm_now, ledger) if difference >= -tolerance else slurm_now
    return replace(entry, spent=spent, slurm_spent=reading.used, reading_at=reading.at,
                   difference=difference, tolerance=tolerance)


def unknown_entry(site: str, alloc: AllocationConfig, now: float, error: str) -> BookEntry:
    start, end = alloc.period_bounds(now)
    return BookEntry(site=site, allocation=alloc.name, account=alloc.account,
                     unit=alloc.unit, amount=alloc.amount, start=start, end=end,
                     known=False, error=error)


def reading_of(site: str, alloc: AllocationConfig, charges: Mapping[str, AccountCharge],
               now: float) -> Reading | str:
    """SLURM's charge of the allocation's account as a reading, or why there is none."""
    tres = UNIT_TRES[alloc.unit]
    charge = charges.get(alloc.account)
    if charge is None:
        return f"SLURM's accounting does not know account {alloc.account}"
    if tres not in charge.used_minutes:
        return (f"SLURM's accounting of account {alloc.account} does not count TRES {tres} "
                f"(the unit {alloc.unit})")
    grant = charge.grant_minutes.get(tres)
    return Reading(site, alloc.name, alloc.account, now, charge.used_minutes[tres] / 60.0,
                   None if grant is None else grant / 60.0)


def unrecorded(open_records: Iterable[PilotRecord], site: str,
               jobs: Iterable[SiteJob] | None) -> list[PilotRecord]:
    """What this cycle's `squeue` knows of the site's pilots and the journal's open
    records (`open_records`) do not charge yet: a pilot not recorded (new, or a job id
    reused), a start not recorded."""
    by_id = {r.job_id: r for r in open_records}
    out = []
    for j in jobs or ():
        r = by_id.get(j.job_id)
        if r is None:
            out.append(PilotRecord(site, j.job_id, j.cpus, j.submitted_at, j.started_at,
                                   None, j.memory_mb, gpus=j.gpus, account=j.account))
        elif r.start_at is None and j.started_at is not None:
            out.append(replace(r, start_at=j.started_at, account=r.account or j.account))
    return out


def account_names(config: Config) -> dict[tuple[str, str], str]:
    """(site, SLURM account) -> the name of the site's allocation charged to it."""
    return {(s.name, a.account): a.name for s in config.sites for a in s.allocations}


def _charges(backend: object, accounts: Sequence[str],
             after: Future[Any] | None = None) -> Mapping[str, AccountCharge]:
    """The backend's read of SLURM's charge of `accounts`, once `after` (the site's
    `squeue` read of the same cycle: a backend takes one call at a time) is done."""
    if after is not None:
        after.exception()  # waits; its outcome is the loop's
    read = getattr(backend, "account_charges", None)
    if read is None:
        raise Unreachable("this site's backend cannot read SLURM's accounting")
    return dict(read(accounts))


class Books:
    """The books of every configured allocation, kept between cycles: SLURM's readings,
    what was logged, the entries of the last cycle."""

    def __init__(self, config: Config, backends: Mapping[str, object]) -> None:
        self.sites: list[SiteBase] = [s for s in config.sites if s.allocations]
        self.backends = backends
        self.asked: dict[str, float] = {}  # site -> when its charge was last asked
        self.pending: dict[str, Future[Mapping[str, AccountCharge]]] = {}
        self.readings: dict[Key, Reading] = {}  # the last of each allocation
        self.read_errors: dict[Key, str] = {}
        self.kept: dict[Key, float] = {}  # the time of the last reading in the journal
        self.unrecorded: list[Reading] = []
        self.said: dict[str, str] = {}  # what was logged of a read or the journal
        self.logged: dict[Key, float] = {}  # the difference last logged
        self.loaded = False  # the journal's last readings taken
        self.entries: dict[Key, BookEntry] = {}
        self.groups: list[GroupSpend] = []
        self.groups_at = -math.inf

    # --- SLURM's charge --------------------------------------------------
    def start(self, now: float, executor: Executor | None = None,
              after: Mapping[str, Future[Any]] | None = None) -> list[str]:
        """Ask SLURM's charge at every site with allocations not asked within
        SLURM_READ_EVERY_S (in `executor`'s threads, each after the site's call in
        `after`; or here); returns those sites."""
        due = [s for s in self.sites
               if now - self.asked.get(s.name, -math.inf) >= SLURM_READ_EVERY_S]
        for site in due:
            self.asked[site.name] = now
            backend = self.backends.get(site.name)
            accounts = [a.account for a in site.allocations]
            if executor is not None:
                self.pending[site.name] = executor.submit(
                    _charges, backend, accounts, (after or {}).get(site.name))
                continue
            fut: Future[Mapping[str, AccountCharge]] = Future()
            try:
                fut.set_result(_charges(backend, accounts))
            except Exception as exc:
                fut.set_exception(exc)
            self.pending[site.name] = fut
        return [s.name for s in due]

    def _collect(self, now: float) -> None:
        """The readings of the reads started this cycle."""
        for site in self.sites:
            fut = self.pending.pop(site.name, None)
            if fut is None:
                continue
            try:
                charges = fut.result()
            except Exception as exc:  # BackendError or worse: the last reading counts
                why = f"SLURM's charge at {site.name} unreadable: {exc}"
                self._say(site.name, why, "%s (the last reading and the ledger since "
                          "count; logged once until it changes)")
                for alloc in site.allocations:
                    self.read_errors[(site.name, alloc.name)] = why
                continue
            self._said_ok(site.name, f"SLURM's charge at {site.name} readable again")
            for alloc in site.allocations:
                self._took(site.name, alloc, reading_of(site.name, alloc, charges, now))

    def _took(self, site: str, alloc: AllocationConfig, got: Reading | str) -> None:
        key = (site, alloc.name)
        name = f"{site}/{alloc.name}"
        if isinstance(got, str):
            self.read_errors[key] = got
            self._say(name, f"{name}: {got}", "%s (the last reading and the ledger since "
                      "count; logged once until it changes)")
            return
        self.read_errors.pop(key, None)
        self._said_ok(name, f"{name}: SLURM's charge readable again")
        self.readings[key] = got
        kept = self.kept.get(key)
        if kept is None or got.at - kept >= READING_KEEP_S \
                or alloc.period_bounds(kept) != alloc.period_bounds(got.at):
            self.unrecorded.append(got)
            self.kept[key] = got.at

    def _say(self, key: str, text: str, fmt: str = "%s") -> None:
        if self.said.get(key) != text:
            log.error(fmt, text)
            self.said[key] = text

    def _said_ok(self, key: str, text: str) -> None:
        if self.said.pop(key, None) is not None:
            log.warning("%s", text)

    # --- the books -------------------------------------------------------
    def observe(self, now: float, journal: Journal, jobs: Mapping[str, Iterable[SiteJob]],
                usable: bool = True) -> tuple[AllocationBooks, ...]:
        """Every allocation's books at `now` (one per configured allocation): the reads
        started this cycle collected, the journal's pilots merged with this cycle's
        `jobs`. `usable` False: the journal is not the configured one (it could not be
        opened): the books are unknown."""
        self._collect(now)
        if not self.sites:
            return ()
        if not usable:
            return self._unknown(now, "the journal could not be opened")
        try:
            if not self.loaded:
                for key, r in journal.last_readings().items():
                    self.readings.setdefault(key, r)
                    self.kept.setdefault(key, r.at)
                self.loaded = True
            entries = {}
            for site in self.sites:
                extra = unrecorded(journal.pilots(since=now, site=site.name), site.name,
                                   jobs.get(site.name))
                for alloc in site.allocations:
                    key = (site.name, alloc.name)
                    entries[key] = reconcile(
                        site.name, alloc, self._charge(journal, site.name, alloc, extra, now),
                        self.readings.get(key), now, self.read_errors.get(key, ""))
            self._group_spend(journal, now)
        except (sqlite3.Error, OSError) as exc:
            return self._unknown(now, f"the journal cannot be read ({exc})")
        self._said_ok("journal", "the journal is readable again: the allocations' books "
                      "are known")
        for entry in entries.values():
            self._log_difference(entry)
        self.entries = entries
        return tuple(e.books() for e in entries.values())

    def _unknown(self, now: float, cause: str) -> tuple[AllocationBooks, ...]:
        why = f"{cause}: what the allocations spent is unknown, no new pilot is charged to them"
        self._say("journal", why)
        self.entries = {(s.name, a.name): unknown_entry(s.name, a, now, why)
                        for s in self.sites for a in s.allocations}
        return tuple(e.books() for e in self.entries.values())

    @staticmethod
    def _charge(journal: Journal, site: str, alloc: AllocationConfig,
                extra: Sequence[PilotRecord], now: float) -> Charge:
        """The ledger's charge of `alloc`: the journal's records (summed by SQLite) and
        what this cycle's `squeue` adds to them (`extra`)."""
        mine = of_allocation(extra, site, alloc)
        return lambda t0, t1: (
            journal.charged(site, alloc.account, alloc.name, alloc.unit, t0, t1, now)
            + charged(mine, alloc.unit, t0, t1, now))

    def _group_spend(self, journal: Journal, now: float) -> None:
        """The groups' spend this period, from the journal's job runs (at most every
        GROUPS_EVERY_S)."""
        if now - self.groups_at < GROUPS_EVERY_S:
            return
        out = []
        for site in self.sites:
            for alloc in site.allocations:
                start, end = alloc.period_bounds(now)
                claims = journal.group_claims(site.name, alloc.account, alloc.name,
                                              alloc.unit, start, min(end, now))
                out += [GroupSpend(group or NO_GROUP, site.name, alloc.name, alloc.unit, v)
                        for group, v in sorted(claims.items())]
        self.groups = out
        self.groups_at = now

    def _log_difference(self, entry: BookEntry) -> None:
        """A difference between SLURM and the ledger, logged when it shows, when it
        changes by more than the tolerance and when it is gone."""
        if entry.difference is None:
            return
        name = f"{entry.site}/{entry.allocation}"
        last = self.logged.get(entry.key)
        unit = entry.unit
        if entry.differs:
            if last is None or abs(entry.difference - last) > entry.tolerance:
                log.warning("%s: DIFFERENCE: SLURM has charged account %s %.4g %s this "
                            "period, the ledger %.4g %s by the same time (%+.4g); SLURM's "
                            "figure counts", name, entry.account, entry.slurm_spent, unit,
                            (entry.slurm_spent or 0.0) - entry.difference, unit,
                            entry.difference)
                self.logged[entry.key] = entry.difference
        elif last is not None:
            log.warning("%s: SLURM's charge and the ledger agree again (within %.4g %s)",
                        name, entry.tolerance, unit)
            del self.logged[entry.key]

    def record(self, journal: Journal) -> None:
        """The readings not yet kept into the journal (inside the cycle's batch)."""
        readings, self.unrecorded = self.unrecorded, []
        for r in readings:
            journal.add_reading(r)


# --- what status and the metrics show ---------------------------------------------

@dataclass(frozen=True)
class AllocationRow:
    """An allocation's budget (what plan() sees) beside its books."""

    budget: Budget
    entry: BookEntry

    @property
    def runout(self) -> float | None:
        """When the grant runs out at the last day's rate (None: nothing spent lately)."""
        b = self.budget
        return runout(b.amount, b.spent, self.entry.burn_rate, b.now) if b.known else None

    def as_dict(self) -> dict[str, Any]:
        b, e = self.budget, self.entry
        return {
            "site": b.site, "allocation": b.name, "account": e.account, "unit": b.unit,
            "line": b.line(), "status": b.status.value, "pace": b.pace,
            "amount": b.amount, "spent": round(b.spent, 6),
            "committed": round(b.committed, 6), "left": round(b.left, 6),
            "allowance": round(b.allowance, 6), "period_start": b.start,
            "period_end": b.end, "known": e.known, "error": e.error,
            "ledger_spent": round(e.ledger_spent, 6),
            "slurm_spent": None if e.slurm_spent is None else round(e.slurm_spent, 6),
            "slurm_grant": e.slurm_grant,
            "reading_age_s": None if e.reading_at is None else round(b.now - e.reading_at),
            "read_error": e.read_error,
            "difference": None if e.difference is None else round(e.difference, 6),
            "tolerance": round(e.tolerance, 6), "differs": e.differs,
            "burn_rate_per_h": round(e.burn_rate, 6), "runout_at": self.runout}


def stopped_of(controller: object) -> Stopped:
    """The allocations the controller stopped (SLURM refused their account), by
    (site, allocation)."""
    return dict(getattr(controller, "stopped_allocations", None) or {})


def stopped_record(stopped: Stopped) -> dict[str, str]:
    """The stopped allocations as the journal keeps them ("site/allocation": why)."""
    return {f"{site}/{name}": why for (site, name), why in sorted(stopped.items())}


def stopped_read(value: object) -> Stopped:
    """The journal's record of the stopped allocations (anything else: none)."""
    if not isinstance(value, dict):
        return {}
    return {tuple(str(k).split("/", 1)): str(v) for k, v in value.items()  # type: ignore[misc]
            if "/" in str(k)}


def allocation_rows(config: Config, snapshot: Snapshot, entries: Mapping[Key, BookEntry],
                    now: float, stopped: Stopped | None = None) -> list[AllocationRow]:
    """Every configured allocation's budget (`provisioner.decide.budget.budgets`, the
    numbers plan() takes) beside its books (unknown where the books have no entry)."""
    out = []
    for key, budget in budgets(config, snapshot, now, stopped).items():
        entry = entries.get(key)
        if entry is None:
            alloc = config.site(key[0]).allocation(key[1])
            entry = unknown_entry(key[0], alloc, now, "not read yet")
        out.append(AllocationRow(budget, entry))
    return out
