"""Reading job ads fast without changing what is read: a literal attribute is taken as
stored, an expression is evaluated in the ad (as before), and a job whose last try did
not end with a starter error is not read further for a failed start. Real ClassAds
(the bindings' classad2), not the dict stand-in."""

from __future__ import annotations

import classad2
import pytest

from provisioner.pool.condor import _float, _int, _str, failure_of, queue_view, shape_of


def ad(**attrs: object) -> classad2.ClassAd:
    out = classad2.ClassAd()
    for key, value in attrs.items():
        out[key] = value
    return out


def test_literals_and_expressions_read_alike() -> None:
    job = ad(RequestCpus=3, RequestMemory=classad2.ExprTree("2 * 1024"),
             RequestDisk=classad2.ExprTree("DiskUsage"), MaxRuntime=classad2.ExprTree("60 + 60"),
             DesiredSites="gsi, frankfurt", Owner=classad2.ExprTree('strcat("al", "ice")'),
             Weight=2.5, Flag=True, Name="x")
    assert _int(job, "RequestCpus") == 3 and _int(job, "RequestMemory") == 2048
    assert _int(job, "RequestDisk", 7) == 7  # undefined here: the default
    assert _int(job, "Missing", 5) == 5 and _int(job, "Flag") == 0 and _int(job, "Name") == 0
    assert _float(job, "Weight") == 2.5 and _float(job, "MaxRuntime") == 120.0
    assert _str(job, "Owner") == "alice" and _str(job, "RequestCpus") == ""
    shape = shape_of(job)
    assert (shape.cpus, shape.memory_mb, shape.disk_kb, shape.runtime_s) == (3, 2048, 0, 120)
    assert shape.desired_sites == ("frankfurt", "gsi")


@pytest.mark.parametrize("code", [None, 0, 1006])
def test_no_starter_error_no_failed_start(code: int | None) -> None:
    job = ad(JobStatus=1) if code is None else ad(JobStatus=1, VacateReasonCode=code,
                                                   JobCurrentStartDate=100, LastVacateTime=101)
    assert failure_of(job) is None


def test_a_starter_error_at_start_is_a_failed_start() -> None:
    job = ad(JobStatus=1, VacateReasonCode=1007, VacateReason="Singularity test failed",
             JobCurrentStartDate=100, JobCurrentStartExecutingDate=100, LastVacateTime=101,
             NumJobCoolDowns=2, JobCoolDownExpiration=500)
    failure = failure_of(job)
    assert failure is not None and failure.failed_starts == 2
    assert failure.reason == "Singularity test failed" and failure.cooling_until == 500.0


def test_queue_view_of_real_ads_counts_shapes_and_running_startds() -> None:
    ads = [ad(JobStatus=1, QDate=10, RequestCpus=1, RequestMemory=500) for _ in range(3)]
    ads.append(ad(JobStatus=1, QDate=20, RequestCpus=classad2.ExprTree("1 + 1"),
                  RequestMemory=500))
    ads.append(ad(JobStatus=2, QDate=5, RemoteHost="slot1_1@pilot-gsi-7@gsi-n1"))
    view = queue_view(ads, since=15.0, now=30.0)
    assert sorted((d.shape.cpus, d.idle) for d in view.demand) == [(1, 3), (2, 1)]
    assert view.running_on == frozenset({"pilot-gsi-7@gsi-n1"})
    assert [(d.shape.cpus, d.idle) for d in view.recent_arrivals] == [(2, 1)]
    assert (view.total, view.older, view.newest) == (5, 4, 20.0)  # the running one too


def test_undefined_or_error_is_no_number() -> None:
    """classad2 gives UNDEFINED and ERROR as members of an IntEnum (2 and 1): read as
    numbers they made a job whose request_memory names an attribute the query does not
    project ask for 2 MB."""
    job = ad(RequestMemory=classad2.ExprTree("MemoryUsage"),
             RequestCpus=classad2.ExprTree('1 / "x"'), MaxRuntime=classad2.ExprTree("undefined"))
    assert _int(job, "RequestMemory", 9) == 9 and _int(job, "RequestCpus", 9) == 9
    assert _float(job, "MaxRuntime") == 0.0
    shape = shape_of(job)
    assert (shape.cpus, shape.memory_mb, shape.runtime_s) == (1, 0, None)
