"""Demand is what a pilot could actually run: a job whose Requirements no site's pilot
meets is unmatchable with the failing clause, in `once --dry-run` and `status`, and no
pilot is planned for it. With `policy.match_requirements: false` (the safeguard off) the
same queue plans a pilot for it: the test would fail without the prototype matching.

A job whose Requirements fail only on what a real node knows (its Machine) passes the
prototype, gets a pilot, and stays idle beside it: after `policy.stuck_after_s` the
service reports it stuck and neither keeps that pilot nor starts another for it. (With
`stuck_after_s: 0`, the safeguard off, the pilot is kept for it until its startd's
no-claim shutdown ends it, 600 s in the testbed, and then a new one is started: checked
by hand when the rule was written, not a test, for its length.)"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import htcondor2 as htcondor
import pytest
from conftest import run
from servicectl import SERVICE_USER, Service, SiteWatch, service_dir, write_config
from test_loop import all_pilot_jobs, clean_pool, pilot_startds, submit, wait_for

from provisioner.pool.classads import JOB_ATTRS, queue_view
from provisioner.pool.condor import GROUP_ATTRS, QUEUE_CONSTRAINT, read_queue
from provisioner.pool.schedds import QueueView
from provisioner.pool.settled import SettledReads

#: Short for a test; the testbed's pilots end themselves unclaimed after 600 s.
STUCK_AFTER_S = 40


@pytest.fixture
def queue() -> Iterator[None]:
    """alice's queue: 2 jobs only a Windows pilot could run, 1 ordinary job."""
    clean_pool()
    submit("windows-only", 2, 5, extra='requirements = (OpSys == "WINDOWS")\n')
    submit("ordinary", 1, 5, extra="+DesiredSites = \"frankfurt\"\n")
    yield
    clean_pool()


def log_time(line: str) -> float:
    """When the service logged `line` (logging's asctime: "2026-01-02 03:04:05,678")."""
    stamp, millis = line[:23].split(",")
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000


def provisioner(config: Path, *args: str) -> str:
    return run(["runuser", "-u", SERVICE_USER, "--", "/opt/venv/bin/provisioner", "-c",
                str(config), *args]).stdout


def config(match: bool) -> Path:
    def edit(data: dict) -> None:
        data.setdefault("policy", {})["match_requirements"] = match
    return write_config(service_dir(), edit)


def test_job_no_pilot_can_run_is_unmatchable_with_its_clause(queue: None) -> None:
    plan = provisioner(config(True), "once", "--dry-run")
    unmatchable = [line for line in plan.splitlines() if "unmatchable:" in line]
    assert len(unmatchable) == 1, plan
    assert "2 job(s)" in unmatchable[0] and "OpSys" in unmatchable[0], plan
    submits = [line for line in plan.splitlines() if "submit" in line.lower()]
    # The ordinary job still gets its pilot, and only it: one pilot of 1 job's worth.
    assert submits and all("frankfurt" in line for line in submits), plan

    status = json.loads(provisioner(config(True), "status", "--json"))
    [entry] = status["unmatchable"]
    assert entry["idle"] == 2 and "OpSys" in entry["reason"], status
    assert sum(d["idle"] for d in status["demand"]) == 1, status


def test_without_matching_the_same_job_counts_as_demand(queue: None) -> None:
    plan = provisioner(config(False), "once", "--dry-run")
    assert "unmatchable:" not in plan, plan
    status = json.loads(provisioner(config(False), "status", "--json"))
    assert status["unmatchable"] == [] and sum(d["idle"] for d in status["demand"]) == 3, status


def test_jobs_no_real_pilot_matches_are_found_stuck_and_get_no_pilot() -> None:
    clean_pool()
    directory = service_dir()

    def edit(data: dict) -> None:
        data.setdefault("policy", {})["stuck_after_s"] = STUCK_AFTER_S
    svc = Service(write_config(directory, edit), directory / "service.log")
    cluster = submit("nowhere", 2, 5, extra='requirements = (TARGET.Machine == "no-such-node")'
                     '\n+DesiredSites = "frankfurt"\n')
    try:
        with SiteWatch() as watch:
            svc.start()
            # the prototype cannot tell a node's name: a pilot is started for them
            wait_for("a pilot in the pool", pilot_startds, 180)
            wait_for("the jobs reported stuck", lambda: "stuck: matches no pilot" in svc.text(),
                     STUCK_AFTER_S + 120)
            # not before they had waited stuck_after_s beside the idle pilot (the
            # service's own clock: its log's times; a cycle's line is written after it
            # acted, up to a second or two after the time it judged by)
            lines = svc.text().splitlines()
            idle = next(ln for ln in lines if " cycle " in ln
                        and re.search(r"frankfurt: [^;]*\b\d+ idle\b", ln))
            stuck = next(ln for ln in lines if "stuck: matches no pilot" in ln)
            assert log_time(stuck) - log_time(idle) >= STUCK_AFTER_S - 2, (idle, stuck)
            # `provisioner status` shows them as the service treats them (journal)
            status = json.loads(provisioner(svc.config, "status", "--json"))
            assert [u["idle"] for u in status["unmatchable"]
                    if u["reason"].startswith("stuck")] == [2], status
            wait_for("the pilot released", lambda: not any(all_pilot_jobs().values()), 90)
            seen = {site: set(ids) for site, ids in watch.seen.items()}
            cycles = len([ln for ln in svc.text().splitlines() if " cycle " in ln])
            # 3 full cycles more: no pilot is started for them again
            wait_for("3 more cycles", lambda: len([
                ln for ln in svc.text().splitlines() if " cycle " in ln]) >= cycles + 3, 90)
            assert watch.checked().seen == seen, (seen, watch.seen)
        assert sum(len(ids) for ids in seen.values()) == 1, seen
        log = svc.text()
        [line] = [ln for ln in log.splitlines() if "idle jobs stuck" in ln]
        assert "2 idle jobs" in line and "no-such-node" in line, line
        # the jobs themselves are untouched: still idle in the queue
        left = run(["condor_q", "-all", str(cluster), "-af", "JobStatus"]).stdout.split()
        assert left == ["1", "1"], left
        assert "Traceback" not in log
    finally:
        svc.stop()
        print(f"--- service log ({svc.log}) ---\n{svc.text()}")
        clean_pool()


def _summary(view: QueueView) -> tuple[object, ...]:
    return (sorted((repr(d.shape), d.idle) for d in view.demand), view.running_on,
            sorted((repr(d.shape), d.idle) for d in view.recent_arrivals), view.total,
            view.older, view.newest)


def test_the_queue_read_in_groups_says_what_each_job_says() -> None:
    """The schedd's GroupBy query (the service's queue read) gives the demand, arrivals
    and counts that reading every job gives, on the real schedd: jobs alike in one ad
    with their JobCount, and a request whose expression reads another job attribute
    (MemoryUsage) grouped by that attribute too, though the query does not name it."""
    clean_pool()
    try:
        memory = "request_memory = ifThenElse(MemoryUsage =!= undefined, MemoryUsage * 2, 700)\n"
        submit("groups-a", 5, 5, extra="request_cpus = 2\n")
        submit("groups-b", 3, 5, extra=memory + "+MaxRuntime = 600\n")
        submit("groups-c", 2, 5, extra=memory + "+MaxRuntime = 600\n+MemoryUsage = 900\n")
        submit("groups-d", 2, 5, extra='+DesiredSites = "gsi"\n'
               'requirements = (OpSys == "LINUX") && (TARGET.Arch == "X86_64")\n')
        # a Requirements that reads a job attribute the query does not name
        image = 'requirements = (SingularityImage =!= undefined)\n+SingularityImage = '
        submit("groups-e", 1, 5, extra=image + '"/opt/images/a.sif"\n')
        submit("groups-f", 1, 5, extra=image + '"/opt/images/b.sif"\n')
        schedd = htcondor.Schedd()
        now = time.time()
        since = now - 3600
        groups = schedd.query(constraint=QUEUE_CONSTRAINT, projection=GROUP_ATTRS,
                              opts=htcondor.QueryOpt.GroupBy)
        assert sorted(int(g["JobCount"]) for g in groups) == [1, 1, 2, 2, 3, 5], groups
        grouped = read_queue(schedd, htcondor.QueryOpt.GroupBy, since, now)
        one_by_one = queue_view(schedd.query(constraint=QUEUE_CONSTRAINT,
                                             projection=JOB_ATTRS), since, now)
        assert _summary(grouped) == _summary(one_by_one)
        memories = sorted((d.shape.memory_mb, d.idle) for d in grouped.demand)
        assert memories == [(500, 1), (500, 1), (500, 2), (500, 5), (700, 3), (1800, 2)]
        images = sorted(dict(d.shape.match_attrs).get("SingularityImage", "")
                        for d in grouped.demand)
        assert images[-2:] == ['"/opt/images/a.sif"', '"/opt/images/b.sif"'], images
        assert grouped.total == 14 and grouped.older == 0
    finally:
        clean_pool()


def test_settled_jobs_kept_between_reads_say_what_a_full_read_says() -> None:
    """The idle jobs that have not changed status since a cut are grouped once and then
    only counted (`provisioner.pool.settled`), on the real schedd: its clock stamps
    EnteredCurrentStatus, it tests its group ads against the constraints. After a hold,
    a release, a removal and a new submission, the kept read equals a full read, and
    only the cluster that lost a job is grouped again."""
    clean_pool()
    try:
        a = submit("settled-a", 4, 5, extra="request_cpus = 2\n")
        b = submit("settled-b", 3, 5)
        z = submit("settled-z", 10, 5, extra="request_cpus = 4\n")
        schedd, opts = htcondor.Schedd(), htcondor.QueryOpt
        group_by = opts.GroupBy
        memory = SettledReads(GROUP_ATTRS, QUEUE_CONSTRAINT)

        def both() -> tuple[object, object]:
            now = time.time()
            kept = read_queue(schedd, group_by, now - 3600, now, memory, "cm",
                              opts.SummaryOnly)
            full = read_queue(schedd, group_by, now - 3600, now)
            return _summary(kept), _summary(full)

        # the cut is a second before the schedd's clock at the first read (1 s steps)
        submitted = max(int(j["QDate"]) for j in schedd.query(
            constraint=QUEUE_CONSTRAINT, projection=["QDate"]))
        wait_for("a second after the submissions", lambda: int(time.time()) > submitted + 1,
                 5, step=0.1)
        first, full = both()
        assert first == full and memory.last["cm"].how == "full"
        settled = memory.memory["cm"].counts  # jobs, first and last id: the schedd names them
        assert settled == {int(c): (n, (int(c), 0), (int(c), n - 1))
                           for c, n in ((a, 4), (b, 3), (z, 10))}, settled
        kept, full = both()
        assert kept == full and memory.last["cm"].how == "kept"
        assert memory.last["cm"].reread == 0
        run(["condor_hold", f"{b}.1"], user="alice")
        run(["condor_rm", f"{a}.0"], user="alice")
        c = submit("settled-c", 2, 5, extra="request_cpus = 3\n")
        kept, full = both()
        assert kept == full and memory.last["cm"].reread == 2, memory.last
        run(["condor_release", f"{b}.1"], user="alice")
        kept, full = both()
        assert kept == full and memory.last["cm"].reread == 0
        view = read_queue(schedd, group_by, None, time.time(), memory, "cm")
        demand = sorted((d.shape.cpus, d.idle) for d in view.demand)
        assert demand == [(1, 3), (2, 3), (3, 2), (4, 10)], (demand, c)
    finally:
        clean_pool()
