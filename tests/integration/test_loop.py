"""The provisioning loop end to end, against the testbed's real daemons.

alice submits with plain condor_submit; the provisioner (as a service, or one
cycle at a time) submits pilots to both SLURM sites; each pilot's startd joins
through CCB from inside Apptainer; the jobs run; idle pilots are flagged, then
released, and nothing is left in squeue.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import htcondor2 as htcondor
import pytest
from conftest import (
    SITES,
    WORKERS,
    kill_pilot_processes,
    pilot_process_count,
    run,
    service_config,
    slurm,
)
from servicectl import Service, service_dir, write_config

from provisioner.config import Config
from provisioner.model import Flag, PilotState, Release, Retire, Submit, Unflag, Unretire
from provisioner.service.loop import CycleResult, Provisioner

ALICE = Path("/home/alice")


def wait_for(what: str, predicate: Callable[[], object], timeout: float, step: float = 1.0
             ) -> object:
    """Poll `predicate` until it returns something true. A poll that raises (a
    daemon restarting under a fault test) counts as not yet; the last error is
    reported if time runs out."""
    start = time.time()
    deadline = start + timeout
    last: Exception | None = None
    while time.time() < deadline:
        try:
            value = predicate()
        except Exception as exc:
            last, value = exc, None
        if value:
            print(f"[{time.strftime('%H:%M:%S')}] {time.time() - start:5.1f} s: {what}")
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}"
                         + (f" (last error: {last})" if last else ""))


def squeue_ids(site: str) -> list[str]:
    out = slurm(site, ["squeue", "-h", "-u", "pilot", "-o", "%i"]).stdout
    return out.split()


def all_pilot_jobs() -> dict[str, list[str]]:
    return {site: squeue_ids(site) for site in SITES}


def pilot_startds() -> list[object]:
    return htcondor.Collector().query(htcondor.AdType.Startd,
                                      constraint='PilotProvisionerId =?= "testbed"',
                                      projection=["Name"])


def clean_pool() -> None:
    """No jobs, no pilots, no pilot ads: pilots are stopped gracefully (TERM to
    the wrapper) so their startds withdraw their ads; a hard scancel is the fallback."""
    run(["condor_rm", "-all"], check=False)
    for site in SITES:
        # A signal reaches only a running job: one still pending is cancelled outright
        # (it has no process and no ad), first, so that none starts unsignalled.
        slurm(site, ["scancel", "-u", "pilot", "--state=PENDING"], check=False)
        slurm(site, ["scancel", "-u", "pilot", "--batch", "--signal=TERM"], check=False)
    try:
        wait_for("pilot jobs to stop", lambda: not any(all_pilot_jobs().values()), 60)
    except AssertionError:
        for site in SITES:
            slurm(site, ["scancel", "-u", "pilot"], check=False)
        wait_for("no pilot jobs left", lambda: not any(all_pilot_jobs().values()), 30)
    try:
        wait_for("no pilot startds left", lambda: not pilot_startds(), 30)
    except AssertionError:
        # No SLURM job is left, so what still advertises is an orphan (a node lost
        # and back, a test that failed midway) or a dead pilot's stale ad: end the
        # one, drop the other, so that a failed test does not fail the ones after it.
        print(f"clean_pool: pilot ads without SLURM jobs: {pilot_ad_ages()}; killed "
              f"{sum(kill_pilot_processes(h) for s in SITES for h in WORKERS[s])} "
              "orphaned pilot processes")
        wait_for("no pilot process on any worker", lambda: not pilot_process_counts(), 60)
        drop_dead_pilot_ads()
        wait_for("no pilot startds left", lambda: not pilot_startds(), 30)


def pilot_process_counts() -> dict[str, int]:
    """Workers where the pilot account still has processes: how many."""
    counts = {h: pilot_process_count(h) for s in SITES for h in WORKERS[s]}
    return {h: n for h, n in counts.items() if n}


def drop_dead_pilot_ads() -> list[str]:
    """Invalidate every pilot ad in the collector, as the pool's administrator would
    for pilots known dead (no SLURM job, no process on any worker: the caller checks):
    the collector would keep a dead startd's ads for its ad lifetime (120 s here) plus
    up to one sweep. The names dropped."""
    names = sorted(str(ad["Name"]) for ad in pilot_startds())
    if names:
        query = Path(tempfile.mkdtemp(prefix="invalidate.")) / "query.ad"
        query.write_text('MyType = "Query"\nTargetType = "Machine"\n'
                         'Requirements = PilotProvisionerId =?= "testbed"\n')
        run(["condor_advertise", "INVALIDATE_STARTD_ADS", str(query)], env=ADMIN)
        shutil.rmtree(query.parent)
    return names


def pilot_ad_ages() -> dict[str, int]:
    """Each pilot startd ad: seconds since the collector last heard from it."""
    ads = htcondor.Collector().query(htcondor.AdType.Startd,
                                     constraint='PilotProvisionerId =?= "testbed"',
                                     projection=["Name", "LastHeardFrom"])
    now = time.time()
    return {str(ad["Name"]): int(now - ad.get("LastHeardFrom", 0)) for ad in ads}


@pytest.fixture
def clean() -> Iterator[None]:
    clean_pool()
    yield
    clean_pool()


def submit(name: str, count: int, seconds: int, extra: str = "") -> str:
    """alice submits `count` jobs that sleep, then print job-<n>-ok; returns the cluster."""
    return submit_script(name, f"sleep {seconds}; echo job-$1-ok\n", count, extra)


#: A gated job sleeps this long (a day) unless the test opens its gate first: the
#: argument marks its `sleep` among the workers' processes.
GATE_SECONDS = 86399


def submit_gated(name: str, count: int, extra: str = "") -> str:
    """alice submits `count` jobs that run until the test opens their gate
    (`gated_jobs_left`), then print job-<n>-ok and exit 0; returns the cluster. A
    test that needs jobs running while it injects a fault waits on that event, not
    on a guessed job length."""
    return submit_script(name, f"sleep {GATE_SECONDS}; echo job-$1-ok\n", count, extra)


def open_gates() -> int:
    """End every gated job's sleep that runs now (the job goes on to print its line
    and exit 0); how many. Processes are found in /proc: every testbed host shares
    this PID namespace."""
    ended = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:2] == [b"sleep", str(GATE_SECONDS).encode()]:
            try:
                os.kill(int(entry.name), signal.SIGTERM)
                ended += 1
            except ProcessLookupError:
                pass
    return ended


def gated_jobs_left(cluster: str) -> int:
    """`jobs_left`, after opening the gate of every gated job running now (jobs that
    start later are opened at the next call: poll it)."""
    open_gates()
    return jobs_left(cluster)


def submit_script(name: str, script: str, count: int = 1, extra: str = "",
                  user: str = "alice", check: bool = True) -> str:
    """`user` submits `count` jobs running the shell `script` (argument: the process
    number); outputs in ~user/out/<name>/<n>.out, events in job.log. The cluster id;
    with check=False condor_submit's output, whether it succeeded or not."""
    home = Path(f"/home/{user}")
    out = home / "out" / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    executable = home / f"{name}.sh"
    executable.write_text("#!/bin/sh\n" + script)
    executable.chmod(0o755)
    sub = home / f"{name}.sub"
    sub.write_text(
        f"executable = {executable}\narguments = $(Process)\n"
        f"output = {out}/$(Process).out\nerror = {out}/$(Process).err\nlog = {out}/job.log\n"
        "request_cpus = 1\nrequest_memory = 500\n" + extra + f"queue {count}\n")
    run(["chown", "-R", f"{user}:{user}", str(home)])
    res = run(["condor_submit", "-terse", str(sub)], user=user, cwd=str(home), check=check)
    if not check:
        return res.stdout + res.stderr
    return res.stdout.split(".")[0].strip()


def jobs_left(cluster: str) -> int:
    return len(htcondor.Schedd().query(constraint=f"ClusterId == {cluster}",
                                       projection=["JobStatus"]))


def assert_clean_completion(name: str, count: int, outputs: bool = True) -> None:
    out = ALICE / "out" / name
    for i in range(count if outputs else 0):
        assert (out / f"{i}.out").read_text().strip() == f"job-{i}-ok"
    events = (out / "job.log").read_text()
    # Event codes: 005 terminated; 004 evicted, 009 aborted (removed), 012 held,
    # 022 disconnected.
    codes = [line[:3] for line in events.splitlines() if re.match(r"^\d{3} \(", line)]
    assert codes.count("005") == count, events
    for bad in ("004", "009", "012", "022"):
        assert bad not in codes, f"event {bad} in the job log of {name}:\n{events}"
    for bad in ("Job was evicted", "Job was aborted", "Job was held"):
        assert bad not in events, f"{bad!r} in the job log of {name}"


@pytest.fixture
def service(clean: None, tmp_path: Path) -> Iterator[Path]:
    """`provisioner run` as a real background service, as its own unprivileged
    account (as the systemd unit runs it), with a journal of its own; yields its
    log file."""
    svc = Service(write_config(service_dir()), tmp_path / "service.log")
    svc.start()
    try:
        yield svc.log
    finally:
        svc.stop()
        print(f"--- service log ---\n{svc.text()}")


def submits_in(line: str) -> bool:
    """Whether a cycle's summary line has a submission among its actions."""
    return "actions:" in line and re.search(r"\bsubmit \d+ at ", line.split(
        "actions:", 1)[1]) is not None


def cycle_lines(logfile: Path) -> list[str]:
    return [line for line in logfile.read_text().splitlines() if " cycle " in line]


def no_retirement(data: dict) -> None:  # type: ignore[type-arg]
    """Busy pilots are not told to leave when done: idle ones are flagged and released."""
    data["policy"]["retire_when_done"] = False


@pytest.fixture
def releasing_service(clean: None, tmp_path: Path) -> Iterator[Path]:
    """As `service`, without retirement: idle pilots are flagged, then released."""
    svc = Service(write_config(service_dir(), no_retirement), tmp_path / "service.log")
    svc.start()
    try:
        yield svc.log
    finally:
        svc.stop()
        print(f"--- service log ---\n{svc.text()}")


def test_jobs_run_on_pilots_at_both_sites_then_pilots_are_released(
        releasing_service: Path) -> None:
    service = releasing_service
    cluster = submit("eight", 8, 20)
    # Pilots at both sites within two cycles of the first submission (gsi is capped
    # at one 4-core pilot): the demand is placed across sites, not one site per cycle.
    wait_for("pilots at both sites", lambda: all(all_pilot_jobs().values()), 120)

    def across_sites() -> bool:
        """Whether the first two cycles from the first that submitted, once logged (a
        cycle's line comes after its sbatch and journal commit), submitted at both."""
        lines = cycle_lines(service)
        first = next((i for i, line in enumerate(lines) if submits_in(line)), len(lines))
        both = " ".join(line.split("actions:")[1] for line in lines[first:first + 2])
        return "at gsi" in both and "at frankfurt" in both

    wait_for("the cycles that submitted at both sites logged", across_sites, 30, step=0.5)
    wait_for("all 8 jobs done", lambda: jobs_left(cluster) == 0, 240, step=2)
    assert_clean_completion("eight", 8)
    # Queue empty: each pilot is flagged in one cycle, released in a later one.
    wait_for("all pilots gone from squeue", lambda: not any(all_pilot_jobs().values()), 120)

    def releases_logged() -> str:
        """The cycle lines once they show a release at each site, of every pilot
        flagged (a pilot leaves squeue before its cycle's line is written)."""
        log = "\n".join(cycle_lines(service))
        released = set(re.findall(r"release (\w+/\d+)", log))
        done = ({k.split("/")[0] for k in released} == set(SITES)
                and released >= set(re.findall(r"flag (\w+/\d+)", log)))
        return log if done else ""

    log = wait_for("the releases logged", releases_logged, 30, step=0.5)
    assert isinstance(log, str)
    flagged = re.findall(r"flag (\w+/\d+)", log)
    released = re.findall(r"release (\w+/\d+)", log)
    assert set(released) >= {k for k in flagged}, log
    for key in released:
        assert log.index(f"flag {key}") < log.index(f"release {key}"), log
    assert {k.split("/")[0] for k in released} == set(SITES), log
    assert " ERROR " not in service.read_text(), service.read_text()


def cycle(prov: Provisioner) -> CycleResult:
    return prov.run_cycle("test")


def releasing_config() -> Config:
    config = service_config()
    policy = config.policy.model_copy(update={"retire_when_done": False})
    return config.model_copy(update={"policy": policy})


def test_flagged_pilot_is_unflagged_by_new_work_and_runs_it(clean: None) -> None:
    prov = Provisioner(releasing_config())
    cluster = submit("first", 1, 1)
    first = cycle(prov)
    submits = [a for a in first.plan.actions if isinstance(a, Submit)]
    assert submits and submits[0].count == 1
    wait_for("the job done", lambda: jobs_left(cluster) == 0, 120)

    def flagged_pilot() -> str | None:
        result = cycle(prov)
        flags = [a.pilot.key for a in result.plan.actions if isinstance(a, Flag)]
        return flags[0] if flags else None

    key = wait_for("the idle pilot flagged", flagged_pilot, 60, step=2)
    assert key in prov.flagged
    # New work while flagged: the negotiator gives it to the flagged pilot.
    cluster = submit("second", 1, 15)
    wait_for("the job running", lambda: htcondor.Schedd().query(
        constraint=f"ClusterId == {cluster} && JobStatus == 2", projection=["ClusterId"]), 60)
    result = cycle(prov)
    unflags = [a.pilot.key for a in result.plan.actions if isinstance(a, Unflag)]
    assert unflags == [key], result.plan.actions
    assert not [a for a in result.plan.actions if isinstance(a, Release | Submit)]
    assert key not in prov.flagged
    ad = htcondor.Schedd().query(constraint=f"ClusterId == {cluster}",
                                 projection=["RemoteHost"])[0]
    site, job_id = key.split("/")
    assert f"pilot-{site}-{job_id}@" in ad["RemoteHost"]
    wait_for("the second job done", lambda: jobs_left(cluster) == 0, 60)
    assert_clean_completion("second", 1)


def test_release_of_a_busy_pilot_is_refused_by_the_pilot(clean: None) -> None:
    """Even a wrong release (pilot busy) never kills the job: the startd refuses."""
    prov = Provisioner(service_config())
    cluster = submit("busy", 1, 25)
    cycle(prov)
    wait_for("the job running", lambda: htcondor.Schedd().query(
        constraint=f"ClusterId == {cluster} && JobStatus == 2", projection=["ClusterId"]), 90)
    obs = prov.observe()
    busy = [p for p in obs.snapshot.pilots if p.state is PilotState.BUSY]
    assert len(busy) == 1
    prov.backends[busy[0].site].release(busy[0].job_id)
    # The release reached the pilot, which refused it: its startd never drained.
    pilot_log = Path(f"/var/log/pilots/htcpilot-testbed-{busy[0].site}-{busy[0].job_id}.out")
    wait_for("the pilot refusing the release", lambda: pilot_log.exists() and
             "released refused (not idle)" in pilot_log.read_text(), 60, step=0.5)
    ads = prov.pool.pilot_ads()
    assert busy[0].key in ads and not ads[busy[0].key].draining
    wait_for("the job done", lambda: jobs_left(cluster) == 0, 90)
    assert_clean_completion("busy", 1)
    # Still a pilot, and it takes new work.
    assert busy[0].job_id in squeue_ids(busy[0].site)
    cluster = submit("after", 1, 1)
    wait_for("the new job done on the same pilot", lambda: jobs_left(cluster) == 0, 90)
    assert_clean_completion("after", 1)


END_RECORDS = Path("/var/log/pilots/end")  # the sites' runtime.log_dir + /end


def end_record(key: str) -> dict[str, object]:
    site, job_id = key.split("/")
    return json.loads((END_RECORDS / f"{site}-{job_id}.json").read_text())


def completions(cluster: str) -> dict[str, float]:
    """Pilot key -> when the last of the cluster's jobs on it completed (history)."""
    out: dict[str, float] = {}
    for ad in htcondor.Schedd().history(constraint=f"ClusterId == {cluster}",
                                        projection=["PilotSite", "PilotSlurmJobId",
                                                    "MachineAttrPilotSite0",
                                                    "MachineAttrPilotSlurmJobId0",
                                                    "CompletionDate"]):
        key = f"{ad['MachineAttrPilotSite0']}/{ad['MachineAttrPilotSlurmJobId0']}"
        out[key] = max(out.get(key, 0.0), float(ad["CompletionDate"]))
    return out


def test_busy_pilots_retire_and_leave_as_their_jobs_end(service: Path) -> None:
    """The product default: once the queue is empty, each busy pilot is told to leave
    when its jobs end, and leaves by itself then (not a quick check and a release
    later); no job is evicted."""
    cluster = submit_gated("retire", 6)
    # The jobs run until the service has told a busy pilot to leave (then their gates
    # open): a pilot is retired only while its jobs run with the queue empty.
    wait_for("a busy pilot retired", lambda: re.search(
        r"retire \w+/\d+", "\n".join(cycle_lines(service))), 240, step=1)
    wait_for("all 6 jobs done", lambda: gated_jobs_left(cluster) == 0, 240, step=2)
    assert_clean_completion("retire", 6)
    wait_for("all pilots gone from squeue", lambda: not any(all_pilot_jobs().values()), 120)
    log = "\n".join(cycle_lines(service))
    retired = set(re.findall(r"retire (\w+/\d+)", log))
    ran = completions(cluster)
    assert retired and retired <= set(ran), (retired, ran, log)
    for key in retired:
        record = end_record(key)
        assert record["reason"] == "retired", (key, record)
        # it left by itself right after its last job: no release was needed
        assert f"release {key}" not in log, log
        print(f"{key}: left {float(record['end']) - ran[key]:.1f} s after its last job "
              f"({record['cores']} cores)")
    assert " ERROR " not in service.read_text(), service.read_text()


SCHEDD_LOG = Path("/var/log/condor/SchedLog")
#: The pool's administrator: root on cm authenticates with FS.
ADMIN = {"_CONDOR_SEC_CLIENT_AUTHENTICATION_METHODS": "FS"}


#: Each host's daemon logs (cm's own LOG; submit2's, etc/condor-host-submit2.conf).
LOGS = {"cm": Path("/var/log/condor"), "submit2": Path("/var/log/condor-submit2")}


def log_since(path: Path, mark: int) -> str:
    """What `path` gained after byte `mark` (all of it if it was rotated since)."""
    with path.open(errors="replace") as f:
        f.seek(mark if path.stat().st_size >= mark else 0)
        return f.read()


def restarted(daemon: str, log: str, host: str = "cm") -> None:
    """Restart `daemon` on `host` and wait until the new process has written
    `log`'s first line of a new start and, for a negotiator, its first cycle (a
    restarted negotiator negotiates at once, then every NEGOTIATOR_INTERVAL)."""
    path = LOGS[host] / log
    mark = path.stat().st_size if path.exists() else 0
    run(["condor_restart", "-daemon", daemon], env=ADMIN, host=None if host == "cm" else host)

    def up() -> bool:
        text = log_since(path, mark)
        banner = text.rfind("STARTING UP")
        if banner < 0:
            return False
        if daemon == "negotiator":
            return "Started Negotiation Cycle" in text[banner:]
        return run(["condor_q", "-totals"], env=ADMIN, check=False,
                   host=None if host == "cm" else host).returncode == 0
    wait_for(f"the {daemon} on {host} restarted", up, 120, step=0.2)


@contextmanager
def negotiator_interval(seconds: int) -> Iterator[None]:
    """The negotiator's own cycles `seconds` apart while the block runs (a file in the
    central manager's config directory; undone after), so that a job runs only if
    someone asks for a negotiation. In force from the block's first line:
    - the negotiator is restarted, not reconfigured: a reconfig keeps the wait it set
      at its last cycle, which can still match jobs early in the block;
    - both schedds are restarted first: a schedd asked for a negotiation while it had no
      idle job (condor_reschedule on an empty queue, or a request for jobs matched
      meanwhile) keeps asking the negotiator every SCHEDD_INTERVAL (5 s here) until it
      next has idle jobs, so any earlier test could have left one asking.
    At the end the negotiator is restarted again: from then on the usual interval."""
    path = Path("/etc/condor/config.d/99-test-negotiator-interval.conf")
    path.write_text(f"NEGOTIATOR_INTERVAL = {seconds}\n")
    try:
        for host in LOGS:
            restarted("schedd", "SchedLog", host)
        restarted("negotiator", "NegotiatorLog")
        yield
    finally:
        path.unlink(missing_ok=True)
        restarted("negotiator", "NegotiatorLog")


def _negotiation_since(mark: int) -> bool:
    """Whether the negotiator has started and finished a cycle since its log was `mark`
    bytes long."""
    text = log_since(LOGS["cm"] / "NegotiatorLog", mark)
    started = text.find("Started Negotiation Cycle")
    return started >= 0 and "Finished Negotiation Cycle" in text[started:]


def test_a_pilot_that_joins_while_jobs_wait_asks_for_a_negotiation(
        clean: None, tmp_path: Path) -> None:
    """The service reads the pilots' ads every join_check_s while they join; when one
    is in the pool, idle, while jobs wait, it asks the schedd for a negotiation (which
    the schedd accepts from the provisioner's identity) instead of leaving the jobs to
    the negotiator's next cycle. That cycle is an hour away here, so the jobs run only
    if the service asks. The submission asks for a negotiation of its own (the schedd
    passes it on at its next queue scan, up to SCHEDD_INTERVAL later): the service
    starts once that negotiation is over, so a pilot that boots in seconds cannot join
    in time for it (it did, and the jobs ran without the service's request)."""
    before = SCHEDD_LOG.stat().st_size
    svc = Service(write_config(service_dir()), tmp_path / "service.log")
    with negotiator_interval(3600):
        mark = (LOGS["cm"] / "NegotiatorLog").stat().st_size
        cluster = submit("joined", 2, 5)
        wait_for("the negotiation the submission asked for", lambda: _negotiation_since(mark),
                 60, step=0.2)
        svc.start()
        try:
            wait_for("both jobs done", lambda: jobs_left(cluster) == 0, 180, step=2)
        finally:
            svc.stop()
            print(f"--- service log ---\n{svc.text()}")
    assert_clean_completion("joined", 2)
    assert "negotiation asked for" in svc.text(), svc.text()
    with SCHEDD_LOG.open() as f:
        f.seek(before)
        log = f.read()
    asked = [line for line in log.splitlines()
             if "command 421 (RESCHEDULE) from provisioner@testbed" in line]
    assert asked, log[-3000:]


def test_a_withdrawn_retirement_keeps_the_pilot(clean: None) -> None:
    """Retire, then demand that needs new capacity: the order is withdrawn and the
    pilot is still there after its job ended (a retiring one leaves within a second)."""
    prov = Provisioner(service_config())
    cluster = submit_gated("long", 1)
    cycle(prov)
    wait_for("the job running", lambda: htcondor.Schedd().query(
        constraint=f"ClusterId == {cluster} && JobStatus == 2", projection=["ClusterId"]), 90)
    result = cycle(prov)
    retires = [a.pilot.key for a in result.plan.actions if isinstance(a, Retire)]
    assert len(retires) == 1, result.plan.actions
    key = retires[0]
    site, job_id = key.split("/")
    assert key in prov.controller.memory.retiring
    # A job as wide as the whole pilot, so not for its free room (the negotiator cannot
    # take it there before the cycle looks): the cycle wants new capacity, so the order
    # is withdrawn; once the long job ends the pilot, still there, runs it.
    cores = next(p.cpus for p in prov.observe().snapshot.pilots if p.key == key)
    wide = submit("wide", 1, 5,
                  extra=f'request_cpus = {cores}\nrequirements = PilotSite == "{site}"\n')
    result = cycle(prov)
    assert [a.pilot.key for a in result.plan.actions if isinstance(a, Unretire)] == [key], \
        result.plan.actions
    assert key not in prov.controller.memory.retiring
    wait_for("the long job done", lambda: gated_jobs_left(cluster) == 0, 90)
    time.sleep(5)  # a retiring pilot would have left by now
    assert job_id in squeue_ids(site)
    wait_for("the wide job done", lambda: jobs_left(wide) == 0, 90, step=2)
    assert completions(wide) == {key: completions(wide)[key]}  # on that pilot
    assert_clean_completion("long", 1)
    assert_clean_completion("wide", 1)
    slurm(site, ["scancel", "--batch", "--signal=TERM", job_id])
    wait_for("the pilot gone", lambda: job_id not in squeue_ids(site), 60)
    text = Path(f"/var/log/pilots/htcpilot-testbed-{site}-{job_id}.out").read_text()
    assert "retire: leaving as soon as the running jobs end" in text, text
    assert "retire withdrawn" in text, text


def test_payload_does_not_see_the_pilot_accounts_home(clean: None) -> None:
    """Sites keep the pilot token in the pilot account's home: jobs must not see it."""
    Path("/home/pilot/secret-marker").write_text("x")
    prov = Provisioner(service_config())
    cluster = submit_script("peek", "ls /home/pilot/secret-marker 2>/dev/null || echo hidden\n")
    prov.run_cycle("test")
    wait_for("the job done", lambda: jobs_left(cluster) == 0, 120)
    assert (ALICE / "out" / "peek" / "0.out").read_text().strip() == "hidden"


def test_payload_cannot_read_the_pilot_token(clean: None) -> None:
    """Jobs run as the pilot account; the job wrapper hides the pilot's token,
    and the hiding cannot be undone from inside the job."""
    prov = Provisioner(service_config())
    cluster = submit_script("steal", (
        'pilot="$_CONDOR_SCRATCH_DIR/../../.."\n'
        'test -f "$pilot/condor_config" && echo LEAK-pilot-dir || echo hidden\n'
        'cat "$pilot/tokens.d/pilot" >/dev/null 2>&1 && echo LEAK || echo hidden\n'
        'unshare -rm sh -c "umount $pilot/tokens.d; cat $pilot/tokens.d/pilot" >/dev/null 2>&1 '
        "&& echo LEAK || echo hidden\n"))
    prov.run_cycle("test")
    wait_for("the job done", lambda: jobs_left(cluster) == 0, 120)
    out = (ALICE / "out" / "steal" / "0.out").read_text().split()
    assert out == ["hidden", "hidden", "hidden"]
    assert_clean_completion("steal", 1, outputs=False)


def test_payload_cannot_read_another_pilots_token_or_tmp(clean: None) -> None:
    """Pilots of one site account share a node's scratch directory and /tmp: a job
    must not reach another pilot's token there (it would let it advertise startds),
    nor what other jobs left in /tmp. The other pilot here is its work directory as
    a pilot of the same account leaves it on the node."""
    other = Path("/tmp/pilot-gsi-999999")
    shutil.rmtree(other, ignore_errors=True)
    (other / "tokens.d").mkdir(parents=True)
    (other / "tokens.d" / "pilot").write_text("SECRET")
    Path("/tmp/other-job-file").write_text("theirs")
    run(["chown", "-R", "pilot:", str(other), "/tmp/other-job-file"])
    other.chmod(0o700)
    try:
        prov = Provisioner(service_config())
        cluster = submit_script("neighbour", (
            f'cat {other}/tokens.d/pilot >/dev/null 2>&1 && echo LEAK-token || echo hidden\n'
            'cat /tmp/other-job-file >/dev/null 2>&1 && echo LEAK-tmp || echo hidden\n'
            'ls /tmp/pilot-*/tokens.d >/dev/null 2>&1 && echo LEAK-pilots || echo hidden\n'
            'echo mine >/tmp/own && cat /tmp/own\n'), extra='+DesiredSites = "gsi"\n'
            'requirements = PilotSite == "gsi"\n')
        prov.run_cycle("test")
        wait_for("the job done", lambda: jobs_left(cluster) == 0 or (prov.run_cycle("test")
                 and False), 120, step=3)
        out = (ALICE / "out" / "neighbour" / "0.out").read_text().split()
        assert out == ["hidden", "hidden", "hidden", "mine"]
        assert_clean_completion("neighbour", 1, outputs=False)
    finally:
        shutil.rmtree(other, ignore_errors=True)
        Path("/tmp/other-job-file").unlink(missing_ok=True)
