"""Hand-written fakes of the pool and a site backend: they record calls and inject the
next error. Fine for unit tests of the service's act phase, never proof that the real
daemons behave so (that is the testbed's job)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import classad2

from provisioner.model import Demand
from provisioner.pilot.endrecord import EndRecord
from provisioner.pool.classads import PilotAd
from provisioner.pool.condor import PoolUnreachable, QueueView
from provisioner.service.accounting import JobRun
from provisioner.sites.base import AccountCharge, SiteJob


def matches(constraint: str, attrs: Mapping[str, object]) -> bool:
    """`constraint` as the schedd tests it, on an ad of literal attribute values."""
    if not constraint:
        return True
    ad = classad2.ClassAd()
    for key, value in attrs.items():
        ad[key] = value
    return classad2.ExprTree(constraint).eval(ad) is True


@dataclass
class FakePool:
    ads: dict[str, PilotAd] = field(default_factory=dict)
    running_on: frozenset[str] = frozenset()
    demand: tuple[Demand, ...] = ()
    fail: bool = False
    arrivals: tuple[Demand, ...] = ()  # returned when asked for arrivals
    total: int = 0
    older: int = 0
    newest: float | None = None
    runs: list[JobRun] = field(default_factory=list)  # the schedd's history
    history_fail: bool = False
    history_calls: list[float] = field(default_factory=list)
    reschedules: int = 0  # negotiations asked for
    #: schedds not read, (name, why): the queue is read in part
    unknown: tuple[tuple[str, str], ...] = ()

    def queue(self, arrivals_since: float | None = None) -> QueueView:
        if self.fail:
            raise PoolUnreachable("schedd down")
        arrivals = self.arrivals if arrivals_since is not None else ()
        return QueueView(self.demand, self.running_on, arrivals, self.total, self.older,
                         self.newest, unknown=self.unknown)

    def pilot_ads(self) -> dict[str, PilotAd]:
        if self.fail:
            raise PoolUnreachable("collector down")
        return dict(self.ads)

    def history(self, after: float, match: int = 5000) -> list[JobRun]:
        self.history_calls.append(after)
        if self.history_fail:
            raise PoolUnreachable("history unreadable")
        return [r for r in self.runs if r.end_at > after][:match]

    def idle_count(self) -> int:
        return sum(d.idle for d in self.demand)

    def reschedule(self) -> None:
        self.reschedules += 1

    def offer_cooled(self, now: float) -> list[str]:
        return []


@dataclass
class FakeBackend:
    name: str
    jobs: list[SiteJob] = field(default_factory=list)
    calls: list[tuple[str, str]] = field(default_factory=list)
    next_error: Exception | None = None
    list_error: Exception | None = None
    #: job ids the next submissions get (shared between backends: one sequence); when
    #: empty, ids from the number of calls
    next_ids: list[str] = field(default_factory=list)
    #: the end records the site holds, by job id; and the ids each read asked for
    records: dict[str, EndRecord] = field(default_factory=dict)
    records_error: Exception | None = None
    record_reads: list[list[str]] = field(default_factory=list)
    #: SLURM's accounting of the accounts, by account; the next read's error; the
    #: accounts each read asked for
    charges: dict[str, AccountCharge] = field(default_factory=dict)
    charges_error: Exception | None = None
    charge_reads: list[list[str]] = field(default_factory=list)

    def _maybe_fail(self) -> None:
        if self.next_error is not None:
            err, self.next_error = self.next_error, None
            raise err

    def submit(self, request: object) -> str:
        self._maybe_fail()
        self.calls.append(("submit", ""))
        return self.next_ids.pop(0) if self.next_ids else str(100 + len(self.calls))

    def list_pilots(self) -> list[SiteJob]:
        if self.list_error is not None:
            raise self.list_error
        return list(self.jobs)

    def release(self, job_id: str) -> None:
        self._maybe_fail()
        self.calls.append(("release", job_id))

    def retire(self, job_id: str, retire: bool = True) -> None:
        self._maybe_fail()
        self.calls.append(("retire" if retire else "unretire", job_id))

    def cancel(self, job_id: str, only_pending: bool = False) -> None:
        self._maybe_fail()
        self.calls.append(("cancel-pending" if only_pending else "cancel", job_id))

    def end_records(self, job_ids: list[str]) -> dict[str, EndRecord]:
        self.record_reads.append(list(job_ids))
        if self.records_error is not None:
            raise self.records_error
        return {j: self.records[j] for j in job_ids if j in self.records}

    def account_charges(self, accounts: list[str]) -> dict[str, AccountCharge]:
        self.charge_reads.append(list(accounts))
        if self.charges_error is not None:
            raise self.charges_error
        return {a: self.charges[a] for a in accounts if a in self.charges}


class Clock:
    def __init__(self) -> None:
        self.t = 10_000.0

    def __call__(self) -> float:
        return self.t


