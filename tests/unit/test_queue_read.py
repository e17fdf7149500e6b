"""Reading job ads fast without changing what is read: a literal attribute is taken as
stored, an expression is evaluated in the ad (as before), and a job whose last try did
not end with a starter error is not read further for a failed start. Real ClassAds
(the bindings' classad2), not the dict stand-in."""

from __future__ import annotations

import classad2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from provisioner.pool.classads import (
    MATCH_JOB_ATTRS,
    _float,
    _int,
    _str,
    failure_of,
    queue_view,
    shape_of,
)
from provisioner.pool.condor import FAILED_IDLE, GROUP_ATTRS, QUEUE_CONSTRAINT, read_queue
from provisioner.pool.schedds import QueueView


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


# -- the queue read in groups (the schedd's GroupBy query) ----------------------------
def grouped(jobs: list[classad2.ClassAd], attrs: list[str] = GROUP_ATTRS,
            constraint: str = "") -> list[classad2.ClassAd]:
    """What the schedd's GroupBy query returns for `jobs`: one ad per distinct text of
    `attrs` and of the job attributes their expressions name (here MemoryUsage, read by
    a RequestMemory, and those of MATCH_JOB_ATTRS a Requirements reads), with its
    JobCount; like the schedd, it returns only the group ads `constraint` accepts."""
    keyed: dict[tuple[str, ...], list[classad2.ClassAd]] = {}

    def names(job: classad2.ClassAd) -> list[str]:
        text = str(job.lookup("Requirements")) if "Requirements" in job and \
            "Requirements" in attrs else ""
        memory = ["MemoryUsage"] if "RequestMemory" in attrs else []
        return [*attrs, *memory, *(a for a in MATCH_JOB_ATTRS if a in text)]

    for job in jobs:
        key = tuple(f"{a}={job.lookup(a)}" if a in job else a for a in names(job))
        keyed.setdefault(key, []).append(job)
    out = []
    for members in keyed.values():
        group = classad2.ClassAd()
        for name in names(members[0]):
            if name in members[0]:
                group[name] = members[0].lookup(name)
        group["JobCount"] = len(members)
        ids = sorted((m["ClusterId"], m["ProcId"]) for m in members
                     if "ClusterId" in m and "ProcId" in m)
        if ids:  # the schedd names the first and the last (MaxReturnedJobIds 2)
            names_ = [f"{c}.{p}" for c, p in (ids[0], ids[-1])]
            group["JobIds"] = names_[0] if len(ids) == 1 else \
                (" ".join(names_) if len(ids) == 2 else " ... ".join(names_))
        out.append(group)
    return [g for g in out if not constraint or classad2.ExprTree(constraint).eval(g) is True]


REQUEST_MEMORY = "ifThenElse(MemoryUsage =!= undefined, MemoryUsage * 2, 500)"


@st.composite
def job_ads(draw: st.DrawFn) -> classad2.ClassAd:
    status = draw(st.sampled_from([1, 1, 1, 2, 6, 7]))
    job = ad(JobStatus=status, QDate=draw(st.sampled_from([100, 200, 300])),
             RequestCpus=draw(st.sampled_from([1, 2, 8])),
             RequestMemory=classad2.ExprTree(REQUEST_MEMORY),
             DesiredSites=draw(st.sampled_from(["", "gsi", "gsi, frankfurt"])))
    if draw(st.booleans()):
        job["MemoryUsage"] = draw(st.sampled_from([100, 700]))
    if draw(st.booleans()):
        job["MaxRuntime"] = draw(st.sampled_from([600, 3600]))
    if draw(st.booleans()):  # a Requirements that reads a job attribute of its own
        job["Requirements"] = classad2.ExprTree("SingularityImage =!= undefined")
        job["SingularityImage"] = draw(st.sampled_from(["a.sif", "b.sif"]))
    if status != 1:
        job["RemoteHost"] = f"slot1_{draw(st.integers(1, 3))}@pilot-gsi-{draw(st.integers(1, 4))}@n"
    elif draw(st.booleans()):
        job["VacateReasonCode"] = 1006  # an eviction: no failed start
    return job


def summary(view: QueueView) -> tuple[object, ...]:
    return (sorted((repr(d.shape), d.idle) for d in view.demand), view.running_on,
            sorted((repr(d.shape), d.idle) for d in view.recent_arrivals), view.total,
            view.older, view.newest)


@given(st.lists(job_ads(), max_size=40), st.sampled_from([None, 150.0, 250.0]))
def test_groups_fold_as_the_jobs_they_stand_for(jobs: list[classad2.ClassAd],
                                                 since: float | None) -> None:
    assert summary(queue_view(grouped(jobs), since, 1000.0)) == \
        summary(queue_view(jobs, since, 1000.0))


class GroupingSchedd:
    """A schedd that tests its constraints and groups as the real one does."""

    def __init__(self, jobs: list[classad2.ClassAd], group: bool = True) -> None:
        self.jobs, self.group = jobs, group
        self.queries: list[tuple[str, bool]] = []
        self.clock = 0  # its summary ad's ServerTime (0: it tells none)

    def query(self, constraint: str = "", projection: list[str] | None = None,
              opts: object = None) -> list[classad2.ClassAd]:
        if opts == "summary":
            return [ad(MyType="Summary", ServerTime=self.clock)] if self.clock else []
        self.queries.append((constraint, opts == "groupby"))
        test = classad2.ExprTree(constraint)
        jobs = [j for j in self.jobs if test.eval(j) is True]
        return grouped(jobs, projection or [], constraint) if opts == "groupby" and self.group \
            else jobs


def failed_job(start: int) -> classad2.ClassAd:
    return ad(JobStatus=1, QDate=100, RequestCpus=4, VacateReasonCode=1007,
              VacateReason="Singularity test failed", JobCurrentStartDate=start,
              JobCurrentStartExecutingDate=start, LastVacateTime=start + 1,
              NumJobCoolDowns=1, JobCoolDownExpiration=start + 600)


def test_failed_starts_are_read_job_by_job_and_the_rest_in_groups() -> None:
    jobs = [ad(JobStatus=1, QDate=100, RequestCpus=1) for _ in range(50)]
    jobs += [failed_job(900), failed_job(100)]  # cooling at 1000, and not any more
    schedd = GroupingSchedd(jobs)
    view = read_queue(schedd, "groupby", None, 1000.0)
    assert schedd.queries == [(QUEUE_CONSTRAINT, True), (FAILED_IDLE, False)]
    assert sorted((d.shape.cpus, d.idle) for d in view.demand) == [(1, 50), (4, 1)]
    [failing] = view.failing
    assert failing.jobs == 2 and view.total == 52
    assert summary(view) == summary(queue_view(jobs, None, 1000.0))


def test_without_failed_starts_one_query_and_an_old_schedd_counts_alike() -> None:
    jobs = [ad(JobStatus=1, QDate=100, RequestCpus=c) for c in (1, 1, 2)]
    jobs.append(ad(JobStatus=2, QDate=50, RemoteHost="slot1_1@pilot-gsi-1@n"))
    grouping, plain = GroupingSchedd(jobs), GroupingSchedd(jobs, group=False)
    assert summary(read_queue(grouping, "groupby", 80.0, 1000.0)) == \
        summary(read_queue(plain, "groupby", 80.0, 1000.0))
    assert len(grouping.queries) == 1
