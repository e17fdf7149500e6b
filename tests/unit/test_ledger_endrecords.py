"""The service's accounting takes a pilot's end from its own end record, read in the
cycle that saw the pilot leave `squeue`; without one, or when the site's records cannot
be read, the end stays that cycle's time and provisioning goes on."""

from __future__ import annotations

import logging

import pytest

from provisioner.errors import Unreachable
from provisioner.model import Demand, JobShape
from provisioner.pilot.endrecord import EndRecord
from provisioner.service.accounting import site_days
from provisioner.service.journal import Journal
from provisioner.service.ledger import RECORD_TRIES, RECORD_WAIT_S, Ledger
from provisioner.service.metrics import Metrics
from provisioner.sites.base import MAX_END_RECORDS, SiteJob, SiteJobState
from tests.unit.fakes import FakeBackend, FakePool
from tests.unit.test_service_act import make_world

T = 1_000_000.0


def running(job_id: str, cores: int = 4, start: float = T) -> SiteJob:
    return SiteJob(job_id, SiteJobState.RUNNING, cores, 8000, start - 60, start,
                   start + 3600)


def allocated_core_s(journal: Journal, now: float) -> float:
    return sum(r.allocated for r in site_days(journal.pilots(), [], now)) * 3600


@pytest.mark.parametrize(("records", "core_s", "source"), [
    ({"7": EndRecord("7", "gsi", "t", T + 2, T + 100, 4, "released")}, 400.0, "record"),
    ({}, 1000.0, "squeue"),  # no record: the cycle that saw it gone, 250 s after start
])
def test_known_answer_4_cores_100_s_by_record_seen_gone_after_250_s(
        records: dict[str, EndRecord], core_s: float, source: str) -> None:
    journal = Journal("")
    site = FakeBackend("gsi", records=records)
    ledger = Ledger(journal, Metrics(), FakePool(), {"gsi": site})
    ledger.account({"gsi": [running("7")]}, frozenset({"gsi/7"}), False, T + 10)
    assert site.record_reads == []  # nothing left squeue: nothing to read
    ledger.account({"gsi": []}, frozenset(), False, T + 250)
    assert site.record_reads == [["7"]]  # read in the cycle that saw it gone
    [p] = journal.pilots()
    assert p.end_source == source
    assert allocated_core_s(journal, now=T + 10_000) == pytest.approx(core_s)


def test_a_pilot_that_ended_while_the_service_was_stopped() -> None:
    journal = Journal("")
    Ledger(journal, Metrics(), FakePool()).account(
        {"gsi": [running("7")]}, frozenset({"gsi/7"}), False, T + 10)
    # the service is stopped; the pilot ends at T + 500; a new service starts at T + 9000
    site = FakeBackend("gsi", records={"7": EndRecord("7", "gsi", "t", T + 1, T + 500, 4,
                                                      "noclaim-shutdown")})
    Ledger(journal, Metrics(), FakePool(), {"gsi": site}).account(
        {"gsi": []}, frozenset(), False, T + 9000)
    [p] = journal.pilots()
    assert (p.start_at, p.end_at, p.end_reason) == (T, T + 500, "noclaim-shutdown")
    assert allocated_core_s(journal, now=T + 10_000) == pytest.approx(4 * 500)


def test_a_record_seen_late_is_taken_in_a_later_cycle_up_to_a_few_tries() -> None:
    journal = Journal("")
    site = FakeBackend("gsi")
    ledger = Ledger(journal, Metrics(), FakePool(), {"gsi": site})
    ledger.account({"gsi": [running("7"), running("8")]}, frozenset(), False, T + 10)
    ledger.account({"gsi": []}, frozenset(), False, T + 300)
    site.records["7"] = EndRecord("7", "gsi", "t", T + 1, T + 200, 4, "released")
    ledger.account({"gsi": []}, frozenset(), False, T + 600)  # the shared FS shows it now
    assert [p.end_at for p in journal.pilots()] == [T + 200, T + 300]
    for i in range(5):
        ledger.account({"gsi": []}, frozenset(), False, T + 900 + 300 * i)
    assert site.record_reads == [["7", "8"], ["7", "8"], *[["8"]] * (RECORD_TRIES - 2)]
    # a restart asks again, but only within the wait after the pilot left squeue
    again = Ledger(journal, Metrics(), FakePool(), {"gsi": site})
    again.account({"gsi": []}, frozenset(), False, T + 300 + RECORD_WAIT_S + 1)
    assert len(site.record_reads) == RECORD_TRIES


def test_reads_are_bounded_per_cycle() -> None:
    journal = Journal("")
    site = FakeBackend("gsi")
    ledger = Ledger(journal, Metrics(), FakePool(), {"gsi": site})
    many = [running(str(i)) for i in range(MAX_END_RECORDS + 5)]
    ledger.account({"gsi": many}, frozenset(), False, T + 10)
    ledger.account({"gsi": []}, frozenset(), False, T + 300)
    ledger.account({"gsi": []}, frozenset(), False, T + 600)
    assert [len(r) for r in site.record_reads] == [MAX_END_RECORDS, MAX_END_RECORDS]
    # the second read asks first for those the first one left out
    assert set(site.record_reads[0]) | set(site.record_reads[1]) == {j.job_id for j in many}


def test_unreadable_records_logged_once_ends_stay_and_come_later(
        caplog: pytest.LogCaptureFixture) -> None:
    journal = Journal("")
    metrics = Metrics()
    site = FakeBackend("gsi", records_error=Unreachable("ssh: cannot connect"))
    ledger = Ledger(journal, metrics, FakePool(), {"gsi": site})
    ledger.account({"gsi": [running("7")]}, frozenset(), False, T + 10)
    caplog.set_level(logging.WARNING)
    for now in (T + 300, T + 600):
        ledger.account({"gsi": []}, frozenset(), False, now)
    assert journal.pilots()[0].end_at == T + 300  # as squeue saw it
    errors = [r for r in caplog.records if "end records at gsi unreadable" in r.getMessage()]
    assert len(errors) == 1 and "ssh: cannot connect" in errors[0].getMessage()
    site.records_error = None
    site.records["7"] = EndRecord("7", "gsi", "t", T + 1, T + 150, 4, "released")
    ledger.account({"gsi": []}, frozenset(), False, T + 900)
    assert journal.pilots()[0].end_at == T + 150
    assert "end records at gsi readable again" in caplog.text
    sample = metrics.registry.get_sample_value
    assert sample("provisioner_end_record_read_errors_total", {"site": "gsi"}) == 2
    assert sample("provisioner_pilot_end_records_total", {"site": "gsi"}) == 1


@pytest.mark.parametrize(("records", "failed"), [
    ({"7": EndRecord("7", "gsi", "t", T + 30, T + 40, 4, "master-failed")}, 1),
    ({}, None),  # squeue never saw it running: no start, nothing to say
])
def test_a_start_only_the_record_knows_counts_a_pilot_that_never_joined(
        records: dict[str, EndRecord], failed: int | None) -> None:
    journal = Journal("")
    metrics = Metrics()
    ledger = Ledger(journal, metrics, FakePool(), {"gsi": FakeBackend("gsi", records=records)})
    pending = SiteJob("7", SiteJobState.PENDING, 4, 8000, T, None, None)
    ledger.account({"gsi": [pending]}, frozenset(), False, T + 10)
    ledger.account({"gsi": []}, frozenset(), False, T + 300)
    assert metrics.registry.get_sample_value(
        "provisioner_pilots_failed_to_join_total", {"site": "gsi"}) == failed
    if failed:
        [p] = journal.pilots()
        assert (p.start_at, p.end_at, p.join_at) == (T + 30, T + 40, None)
        assert metrics.registry.get_sample_value(
            "provisioner_pilot_queue_wait_seconds_sum", {"site": "gsi"}) == 30.0


def test_the_service_reads_records_of_pilots_that_left_squeue_in_the_same_cycle() -> None:
    prov, pool, backends, clock = make_world()
    gsi = backends["gsi"]
    gsi.jobs = [SiteJob("7", SiteJobState.RUNNING, 4, 8000, clock.t - 60, clock.t,
                        clock.t + 3600)]
    prov.run_cycle()
    gsi.jobs = []
    gsi.records["7"] = EndRecord("7", "gsi", "t", clock.t + 1, clock.t + 100, 4, "released")
    gsi.records_error = None
    backends["fra"].records_error = Unreachable("fra down")  # never asked: nothing ended
    start = clock.t
    clock.t += 300
    pool.demand = (Demand(JobShape(1, 1000), 1),)
    prov.run_cycle()
    assert gsi.record_reads == [["7"]] and backends["fra"].record_reads == []
    [p] = prov.journal.pilots()
    assert (p.end_at, p.end_source) == (start + 100, "record")
    assert ("submit", "") in gsi.calls + backends["fra"].calls  # provisioning went on


def test_a_failing_record_read_does_not_stop_the_cycle() -> None:
    prov, pool, backends, clock = make_world()
    gsi = backends["gsi"]
    gsi.jobs = [SiteJob("7", SiteJobState.RUNNING, 4, 8000, clock.t - 60, clock.t,
                        clock.t + 3600)]
    prov.run_cycle()
    gsi.jobs = []
    gsi.records_error = RuntimeError("a bug in a backend")
    clock.t += 300
    pool.demand = (Demand(JobShape(1, 1000), 1),)
    result = prov.run_cycle()
    assert any(text.startswith("submit") for text, _outcome in result.outcomes)
    [p] = prov.journal.pilots()
    assert (p.end_at, p.end_source) == (clock.t, "squeue")
