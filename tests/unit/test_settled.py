"""The queue read that keeps the settled idle jobs between cycles
(`provisioner.pool.settled`) says what a full read says, after any sequence of what
happens to jobs, and asks the schedd to group only what moved. The schedd here tests
constraints and groups with real ClassAds (`GroupingSchedd`)."""

from __future__ import annotations

import classad2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.pool.classads import queue_view
from provisioner.pool.condor import GROUP_ATTRS, QUEUE_CONSTRAINT, read_queue
from provisioner.pool.settled import SettledReads

from .test_queue_read import GroupingSchedd, ad, summary

T0 = 1_000_000


class Queue:
    """A schedd's queue whose changes stamp EnteredCurrentStatus as the schedd does."""

    def __init__(self) -> None:
        self.jobs: dict[tuple[int, int], classad2.ClassAd] = {}
        self.schedd = GroupingSchedd([])
        self.now = float(T0)
        self.next_cluster = 1

    def sync(self) -> GroupingSchedd:
        self.schedd.jobs = list(self.jobs.values())
        if self.schedd.clock:  # a schedd that tells its time
            self.schedd.clock = int(self.now)
        return self.schedd

    def submit(self, count: int, cpus: int, memory: int = 500) -> int:
        c = self.next_cluster
        self.next_cluster += 1
        for p in range(count):
            self.jobs[c, p] = ad(ClusterId=c, ProcId=p, JobStatus=1, QDate=int(self.now),
                                 EnteredCurrentStatus=int(self.now), RequestCpus=cpus,
                                 RequestMemory=memory + p % 2)
        return c

    def status(self, key: tuple[int, int], status: int, **attrs: object) -> None:
        job = self.jobs[key]
        job["JobStatus"] = status
        job["EnteredCurrentStatus"] = int(self.now)
        for name, value in attrs.items():
            job[name] = value

    def of(self, status: int) -> list[tuple[int, int]]:
        return sorted(k for k, j in self.jobs.items() if j["JobStatus"] == status)

    def truth(self, since: float | None) -> tuple[object, ...]:
        test = classad2.ExprTree(QUEUE_CONSTRAINT)
        return summary(queue_view([j for j in self.jobs.values() if test.eval(j) is True],
                                  since, self.now))


def reads() -> SettledReads:
    return SettledReads(GROUP_ATTRS, QUEUE_CONSTRAINT, resync_s=300.0, lag_s=60)


def read(q: Queue, memory: SettledReads, since: float | None = None) -> tuple[object, ...]:
    return summary(read_queue(q.sync(), "groupby", since, q.now, memory, "schedd",
                              "summary"))


EVENTS = st.sampled_from(["submit", "start", "finish", "remove", "hold", "release",
                          "evict", "fail", "wait", "wait", "read"])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(EVENTS, st.integers(0, 10_000)), max_size=60), st.booleans())
def test_what_is_kept_and_read_again_is_what_a_full_read_says(
        steps: list[tuple[str, int]], tells_time: bool) -> None:
    q = Queue()
    q.schedd.clock = T0 if tells_time else 0
    memory = reads()
    q.submit(30, 1)
    q.submit(12, 2)
    assert read(q, memory) == q.truth(None)
    for step, n in steps:
        idle, running, held = q.of(1), q.of(2), q.of(5)
        if step == "submit":
            q.submit(1 + n % 40, 1 + n % 3)
        elif step == "start" and idle:
            q.status(idle[n % len(idle)], 2, RemoteHost=f"slot1_{n % 4}@pilot-{n % 3}@n")
        elif step == "finish" and running:
            del q.jobs[running[n % len(running)]]
        elif step == "remove" and q.jobs:
            del q.jobs[sorted(q.jobs)[n % len(q.jobs)]]
        elif step == "hold" and idle:
            q.status(idle[n % len(idle)], 5)
        elif step == "release" and held:
            q.status(held[n % len(held)], 1)
        elif step in ("evict", "fail") and running:
            t = int(q.now)
            q.status(running[n % len(running)], 1, RemoteHost=classad2.ExprTree("undefined"),
                     VacateReasonCode=1006 if step == "evict" else 1007,
                     VacateReason="x", JobCurrentStartDate=t - 5,
                     JobCurrentStartExecutingDate=t - 5, LastVacateTime=t,
                     NumJobCoolDowns=1, JobCoolDownExpiration=t + 100 + n % 200)
        elif step == "wait":
            q.now += n % 200
        since = q.now - 30
        assert read(q, memory, since) == q.truth(since), memory.last


def test_a_quiet_queue_is_counted_not_grouped_again() -> None:
    q = Queue()
    q.schedd.clock = T0
    for cpus in (1, 2, 4):
        q.submit(100, cpus)
    q.now += 120  # submitted a while before the service's first read
    memory = reads()
    read(q, memory)
    assert memory.last["schedd"].how == "full"
    q.now += 120
    q.schedd.queries.clear()
    assert read(q, memory) == q.truth(None)
    assert memory.last["schedd"].how == "kept" and memory.last["schedd"].reread == 0
    (count, _), (fresh, _) = q.schedd.queries  # the schedd's clock only at a full read
    assert "ClusterId ==" not in count and "!(JobStatus == 1" in fresh


def test_only_a_cluster_that_lost_a_job_is_grouped_again() -> None:
    q = Queue()
    a, b, c = (q.submit(50, cpus) for cpus in (1, 2, 4))
    q.now += 120
    memory = reads()
    read(q, memory)
    q.now += 120
    q.status((b, 7), 2, RemoteHost="slot1_1@pilot-1@n")  # starts
    del q.jobs[b, 8]  # removed while idle
    q.schedd.queries.clear()
    assert read(q, memory) == q.truth(None)
    assert memory.last["schedd"].reread == 1
    reread = q.schedd.queries[1][0]
    assert f"ClusterId == {b}" in reread and f"ClusterId == {a}" not in reread \
        and f"ClusterId == {c}" not in reread


def test_a_job_that_joins_the_settled_set_is_seen() -> None:
    """A schedd whose clock runs behind ours: a job released after the cut stamped with
    a time before it joins the settled set. Its cluster's count grows: read again."""
    q = Queue()
    c = q.submit(20, 1)
    q.submit(30, 2)
    q.status((c, 3), 5)
    q.now += 120
    memory = reads()
    read(q, memory)
    q.now += 120
    q.status((c, 3), 1)
    q.jobs[c, 3]["EnteredCurrentStatus"] = T0 - 600
    assert read(q, memory) == q.truth(None)
    assert memory.last["schedd"].reread == 1


def test_an_edit_in_place_is_seen_at_the_next_resync() -> None:
    """condor_qedit of a settled job's request changes no status: the counts cannot see
    it. The whole queue is read again after resync_s."""
    q = Queue()
    q.submit(10, 1)
    q.submit(10, 2)
    q.now += 120
    memory = reads()
    read(q, memory)
    q.now += 100
    q.jobs[1, 0]["RequestCpus"] = 8
    assert read(q, memory) != q.truth(None)  # stale, as documented
    q.now += 300
    assert read(q, memory) == q.truth(None)
    assert memory.last["schedd"].why == "resync"


def test_a_big_submission_moves_the_cut_and_a_failed_query_forgets() -> None:
    q = Queue()
    q.submit(100, 1)
    q.now += 120
    memory = reads()
    read(q, memory)
    q.now += 120
    q.submit(500, 2)
    q.now += 30  # within lag_s: a schedd that does not tell its time
    assert read(q, memory) == q.truth(None)  # the 500 read as fresh ones this time
    assert memory.last["schedd"].how == "kept"
    q.now += 10
    assert read(q, memory) == q.truth(None)
    assert memory.last["schedd"].how == "full"  # and settled from now on

    class Failing(GroupingSchedd):
        def query(self, constraint: str, projection: list[str], opts: object = None
                  ) -> list[classad2.ClassAd]:
            if "!(JobStatus == 1" in constraint:
                raise RuntimeError("schedd restarting")
            return super().query(constraint, projection, opts)

    q.now += 120
    failing = Failing(list(q.jobs.values()))
    with pytest.raises(RuntimeError):
        read_queue(failing, "groupby", None, q.now, memory, "schedd")
    assert "schedd" not in memory.memory
    assert read(q, memory) == q.truth(None) and memory.last["schedd"].why == "first read"


def test_a_schedd_that_ignores_the_grouping_is_read_alike() -> None:
    q = Queue()
    q.submit(10, 1)
    memory = reads()
    plain = GroupingSchedd(list(q.jobs.values()), group=False)
    assert summary(read_queue(plain, "groupby", None, q.now, memory, "old")) == \
        q.truth(None)
    q.now += 120
    q.status((1, 2), 2, RemoteHost="slot1_1@pilot-1@n")
    plain.jobs = list(q.jobs.values())
    assert summary(read_queue(plain, "groupby", None, q.now, memory, "old")) == \
        q.truth(None)


def test_the_cut_is_on_the_schedds_clock_when_it_tells_it() -> None:
    """Jobs submitted a few seconds before the first read are settled at once on the
    schedd's clock; without it, only those older than lag_s."""
    for clock, settled in ((T0, 40), (0, 0)):
        q = Queue()
        q.schedd.clock = clock
        q.submit(40, 1)
        q.now += 5
        memory = reads()
        assert read(q, memory) == q.truth(None)
        assert memory.memory["schedd"].jobs == settled
        assert memory.memory["schedd"].cut == (int(q.now) - 1 if clock else int(q.now) - 60)


def test_a_schedd_gone_from_the_roster_is_forgotten() -> None:
    q = Queue()
    q.submit(5, 1)
    memory = reads()
    read(q, memory)
    memory.keep_only({"other"})
    assert memory.memory == {}


def _two_clusters_read() -> tuple[Queue, SettledReads, int]:
    """Clusters of 10 and 30 jobs, read once (all settled), a minute before now; the
    first cluster's id."""
    q = Queue()
    c = q.submit(10, 1)
    q.submit(30, 2)
    q.now += 120
    memory = reads()
    read(q, memory)
    q.now += 60
    return q, memory, c


def _unstamped(cluster: int, proc: int, **attrs: object) -> classad2.ClassAd:
    """An idle job of `cluster` whose status is stamped with the cluster's submit time."""
    return ad(ClusterId=cluster, ProcId=proc, JobStatus=1, QDate=T0, EnteredCurrentStatus=T0,
              RequestCpus=1, RequestMemory=777, **attrs)


def test_a_job_materialized_late_is_not_settled() -> None:
    """A `max_idle` submission materializes jobs later, stamped with the cluster's
    QDate: their JobMaterializeDate keeps them out of the settled set."""
    q, memory, c = _two_clusters_read()
    q.jobs[c, 10] = _unstamped(c, 10, JobMaterializeDate=int(q.now))
    assert read(q, memory) == q.truth(None)  # read as a fresh one...
    assert memory.last["schedd"].how == "kept" and memory.last["schedd"].reread == 0
    assert memory.memory["schedd"].jobs == 40  # ...not as a settled one


def test_a_join_that_cancels_a_leave_is_seen_by_the_ids() -> None:
    """A job that joins a cluster's settled jobs without a stamp while another leaves:
    the count stays, the last id moves."""
    q, memory, c = _two_clusters_read()
    del q.jobs[c, 3]
    q.jobs[c, 10] = _unstamped(c, 10)
    assert read(q, memory) == q.truth(None)
    assert memory.last["schedd"].reread == 1


def test_many_small_clusters_and_a_busy_cluster_are_read_plainly() -> None:
    q = Queue()
    for _ in range(SettledReads.MAX_KEPT_CLUSTERS + 1):
        q.submit(1, 1)
    q.now += 120
    memory = reads()
    assert read(q, memory) == q.truth(None)
    assert memory.last["schedd"].how == "plain" and "schedd" not in memory.memory
    q.now += 100
    q.schedd.queries.clear()
    assert read(q, memory) == q.truth(None)
    assert q.schedd.queries == [(QUEUE_CONSTRAINT, True)]  # one query, as before
    q.now += 300  # the next resync: tried again
    assert read(q, memory) == q.truth(None) and memory.last["schedd"].how == "plain"

    busy = Queue()
    c = busy.submit(100, 1)
    busy.now += 120
    memory = reads()
    read(busy, memory)
    busy.now += 10
    busy.status((c, 5), 2, RemoteHost="slot1_1@pilot-1@n")
    assert read(busy, memory) == busy.truth(None)
    assert memory.last["schedd"].how == "plain"
    busy.now += 61  # a fifth of resync_s later: kept again after a full read
    assert read(busy, memory) == busy.truth(None) and memory.last["schedd"].how == "full"


def test_a_failing_summary_falls_back_to_our_clock() -> None:
    class NoSummary(GroupingSchedd):
        def query(self, constraint: str = "", projection: list[str] | None = None,
                  opts: object = None) -> list[classad2.ClassAd]:
            if opts == "summary":
                raise RuntimeError("summary refused")
            return super().query(constraint, projection, opts)

    q = Queue()
    q.submit(10, 1)
    q.now += 120
    memory = reads()
    schedd = NoSummary(list(q.jobs.values()))
    view = read_queue(schedd, "groupby", None, q.now, memory, "schedd", "summary")
    assert summary(view) == q.truth(None)
    assert memory.memory["schedd"].cut == int(q.now) - 60
