"""The pool's policy for jobs that fail at start (condor_config/central-manager.conf and
submit.conf), read by HTCondor's own configuration parser and evaluated with the ClassAd
bindings against job ads that go through what HTCondor 23.9's shadow and schedd do with
them (src/condor_schedd.V6/schedd.cpp add_shadow_birthdate and Scheduler::jobExitCode,
src/condor_shadow.V6.1/remoteresource.cpp beginExecution, pseudo_ops.cpp pseudo_ulog,
baseshadow.cpp evictJob, src/condor_starter.V6.1/os_proc.cpp StartJob):

- a shadow starts: NumShadowStarts + 1, JobCurrentStartDate = now, VacateReason* deleted;
- the starter is about to spawn the job (or the job wrapper): NumJobStarts + 1,
  JobCurrentStartExecutingDate = now (the execute event). This comes before the
  container test and before the wrapper runs: a start that fails there has begun to
  execute a second before it fails (a real 23.9 history ad: executing at t, vacated at
  t + 1);
- the starter fails (critical error): VacateReason "Error from <slot>: <error>",
  VacateReasonCode = the starter's hold code, or 1007 (StarterError) if it gave none
  (the container test, the job wrapper's error file), LastVacateTime = now; the schedd
  evaluates SYSTEM_ON_VACATE_COOL_DOWN (a positive value: NumJobCoolDowns + 1,
  JobCoolDownExpiration = now + value, the job idles); otherwise a code below 1000 holds
  the job with VacateReason as HoldReason;
- SYSTEM_PERIODIC_HOLD_<Name> is evaluated on idle jobs every PERIODIC_EXPR_INTERVAL.

The service reads the same ads (`provisioner.pool.classads.failure_of`): it must call a try a
failed start exactly when the pool does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.decide.failed_starts import FAILED_START_WITHIN_S, PILOT_LOST
from provisioner.pool.classads import failure_of

classad = pytest.importorskip("classad2")

CONF_DIR = Path(__file__).resolve().parents[2] / "condor_config"
NAME = "SYSTEM_PERIODIC_HOLD_ProvisionerFailedStarts"
START_FAILED = "PROVISIONER_START_FAILED"
KNOBS = ["SYSTEM_PERIODIC_HOLD_NAMES", NAME, f"{NAME}_REASON", f"{NAME}_SUBCODE",
         "SYSTEM_ON_VACATE_COOL_DOWN", "SYSTEM_PERIODIC_HOLD", "SYSTEM_PERIODIC_HOLD_REASON",
         START_FAILED, "PROVISIONER_FAILED_START_WITHIN_S"]
#: The two ways a try fails at start, as PROVISIONER_START_FAILED reads once expanded.
NEVER_EXECUTED = "(JobCurrentStartExecutingDate ?: 0) < (JobCurrentStartDate ?: 0)"
EXECUTED_BRIEFLY = ("((JobCurrentStartExecutingDate ?: 0) > 0 && (LastVacateTime ?: 0) >= "
                    "JobCurrentStartExecutingDate && LastVacateTime - "
                    f"JobCurrentStartExecutingDate <= {FAILED_START_WITHIN_S})")
NOT_PILOT_LOST = f'!regexp("{PILOT_LOST}", VacateReason ?: "")'
#: From the execute event to the failure of a start that fails in the starter's container
#: test or the job wrapper (the real history ad: 1 s).
FAILS_AFTER_S = 1
READ_KNOBS = ("import htcondor2, json, sys\n"
              "print(json.dumps({k: htcondor2.param.get(k) for k in sys.argv[1:]}))\n")

BROKEN = "/home/alice/broken.sif"
APPTAINER = ("FATAL:   while extracting /home/alice/broken.sif: root filesystem extraction "
             "failed: extract command failed: exit status 1")
TEST_FAILED = f"Error from slot1_1@pilot-gsi-8@node1: Singularity test failed:{APPTAINER}"
NO_INPUT = ("Transfer input files failure at access point cm while sending files to "
            "execution point slot1_1@pilot-gsi-8@node1. Details: reading from file "
            "/home/alice/in.dat: (errno 2) No such file or directory")
NO_EXE = ("Error from slot1_1@pilot-gsi-8@node1: Failed to execute '/home/alice/gone.sh': "
          "(errno=2: 'No such file or directory')")
#: The pilots' job wrapper found no executable (its error file, provisioner/pilot/files/
#: job_wrapper.sh); the starter reports it as its own error.
WRAPPER_NO_EXE = ("Error from slot1_1@pilot-gsi-8@node1: The job wrapper failed to execute "
                  "the job: executable /home/alice/gone.sh does not exist on this worker node")
OOM = "Error from slot1_1@pilot-gsi-8@node1: Worker node is out of memory"
#: The starter's own error when SLURM kills the pilot under a running job (HTCondor 23.9,
#: seen in the testbed: the node set down 10 s after the job began to execute).
PROCD_LOST = ("Error from slot1_1@pilot-gsi-5@gsi-n1: unable to restart the ProcD after "
              "several tries")
#: The same when the starter finds its startd gone (a real 23.9 ad, the node set down
#: right after the jobs began to execute).
STARTD_LOST = ("Error from slot1_1@pilot-gsi-1@gsi-n1: FAILED TO SEND INITIAL KEEP ALIVE TO "
               "OUR PARENT <10.10.1.11:39143?CCBID=10.10.0.10:9618%3faddrs%3d10.10.0.10-9618"
               "%26alias%3dcm%26noUDP%26sock%3dcollector#1&PrivNet=gsi-n1&addrs=10.10.1.11-"
               "39143&alias=gsi-n1&noUDP&sock=startd_1675_7d39>")
#: What the shadow sets when a pilot ends, is released or is lost (never a failed start).
NORMAL_EVICTIONS = {1000: "PERIODIC_VACATE", 1001: "system policy vacate",
                    1002: "shadow exception", 1003: "Problem preparing job to run",
                    1004: "condor_vacate_job", 1005: "Unspecified job interruption",
                    1006: "failed to activate claim", 1008: "reconnect failed"}


def read_knobs(conf: Path, tmp: Path, extra: str = "") -> dict[str, str]:
    """The knobs as HTCondor's parser expands them from `conf` (a site's own earlier
    settings in `extra`)."""
    top = tmp / "condor_config"
    top.write_text(f"CONDOR_HOST = cm\nUID_DOMAIN = t\nLOCAL_DIR = {tmp}\n{extra}\n"
                   f"include : {conf}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("_CONDOR_")}
    env["CONDOR_CONFIG"] = str(top)
    out = subprocess.run([sys.executable, "-c", READ_KNOBS, *KNOBS], env=env, check=True,
                         capture_output=True, text=True).stdout
    return {k: v for k, v in json.loads(out).items() if v is not None}


@pytest.fixture(scope="module", params=["central-manager.conf", "submit.conf"])
def knobs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> dict[str, str]:
    return read_knobs(CONF_DIR / request.param, tmp_path_factory.mktemp("cfg"))


def value(ad: Any, text: str) -> Any:
    ad["_Probe"] = classad.ExprTree(text)
    try:
        return ad.eval("_Probe")
    finally:
        del ad["_Probe"]


@dataclass
class Job:
    """One job ad driven through start attempts as the shadow and the schedd do it."""

    knobs: dict[str, str]
    image: str | None = BROKEN
    ad: Any = field(init=False)
    now: int = 1_700_000_000
    starts: int = 0

    def __post_init__(self) -> None:
        self.ad = classad.ClassAd({"JobStatus": 1, "Iwd": "/home/alice/job", "QDate": self.now})
        if self.image is not None:
            self.ad["ContainerImage"] = self.image

    @property
    def status(self) -> int:
        return int(self.ad["JobStatus"])

    def runnable(self) -> bool:
        return self.status == 1 and self.ad.get("JobCoolDownExpiration", 0) < self.now

    def attempt(self, code: int, reason: str, executed_for: int | None = FAILS_AFTER_S
                ) -> None:
        """One start: the shadow is born, the input is sent, the starter reports the job
        executing and the try ends with `code` `executed_for` seconds later (None: it
        ends before the job began to execute)."""
        assert self.runnable(), "the schedd would not start this job now"
        self.now += 10
        self.starts += 1
        self.ad["JobStatus"] = 2
        self.ad["NumShadowStarts"] = self.ad.get("NumShadowStarts", 0) + 1
        self.ad["JobCurrentStartDate"] = self.now
        for attr in ("VacateReason", "VacateReasonCode", "VacateReasonSubCode"):
            if attr in self.ad:
                del self.ad[attr]
        self.now += 5  # input transfer
        if executed_for is None:
            self.now += 2
        else:
            self.ad["NumJobStarts"] = self.ad.get("NumJobStarts", 0) + 1
            self.ad["JobCurrentStartExecutingDate"] = self.now
            self.now += executed_for
        self.ad.update({"VacateReason": reason, "VacateReasonCode": code,
                        "VacateReasonSubCode": 0, "LastVacateTime": self.now})
        cool = value(self.ad, self.knobs["SYSTEM_ON_VACATE_COOL_DOWN"])
        if isinstance(cool, int) and not isinstance(cool, bool) and cool > 0:
            self.ad["NumJobCoolDowns"] = self.ad.get("NumJobCoolDowns", 0) + 1
            self.ad["JobCoolDownExpiration"] = self.now + cool
            self.ad["JobStatus"] = 1
        elif 0 < code < 1000:
            self.ad.update({"JobStatus": 5, "HoldReason": reason, "HoldReasonCode": code})
        else:
            self.ad["JobStatus"] = 1

    def failed_at_start(self) -> bool:
        """The pool's discriminator on the ad as it is now; the service's reading of the
        same ad agrees with it (and counts the pool's failed starts)."""
        pool = value(self.ad, self.knobs[START_FAILED]) is True
        service = failure_of(self.ad)
        assert (service is not None) == pool, (dict(self.ad), pool, service)
        if service is not None and "NumJobCoolDowns" in self.ad:
            assert service.failed_starts == self.ad["NumJobCoolDowns"]
        return pool

    def periodic(self) -> bool:
        """The schedd's periodic policy walk (after PERIODIC_EXPR_INTERVAL); True if it
        held the job."""
        self.now += 60
        if self.status != 1 or value(self.ad, self.knobs[NAME]) is not True:
            return False
        by = self.ad.get("NumHoldsByReason") or classad.ClassAd()
        by["SystemPolicy"] = by.get("SystemPolicy", 0) + 1
        self.ad.update({"JobStatus": 5, "HoldReasonCode": 26, "NumHoldsByReason": by,
                        "HoldReason": value(self.ad, self.knobs[f"{NAME}_REASON"]),
                        "HoldReasonSubCode": value(self.ad, self.knobs[f"{NAME}_SUBCODE"])})
        return True

    def release(self) -> None:
        assert self.status == 5
        self.ad["JobStatus"] = 1
        self.now += 30

    def fail_container_test(self, reason: str = TEST_FAILED,
                            executed_for: int | None = FAILS_AFTER_S) -> bool:
        """A start whose container test fails; then the periodic walk (True: held)."""
        self.attempt(1007, reason, executed_for)
        return self.periodic()

    def fail_times(self, n: int, reason: str = TEST_FAILED,
                   executed_for: int | None = FAILS_AFTER_S) -> list[bool]:
        """`n` failed container tests, each once the short cool-down is over: held?"""
        held = []
        for _ in range(n):
            held.append(self.fail_container_test(reason, executed_for))
            self.now += 11
        return held


def test_the_policy_is_named_and_composes_with_the_registry_hold(knobs: dict[str, str]
                                                                 ) -> None:
    assert knobs["SYSTEM_PERIODIC_HOLD_NAMES"].split() == ["ProvisionerFailedStarts"]
    assert "regexp" in knobs["SYSTEM_PERIODIC_HOLD"]  # the registry hold is still there
    assert "container registry" in knobs["SYSTEM_PERIODIC_HOLD_REASON"]


def test_the_pool_and_the_service_use_one_rule_and_one_window(knobs: dict[str, str]) -> None:
    assert int(knobs["PROVISIONER_FAILED_START_WITHIN_S"]) == FAILED_START_WITHIN_S
    rule = knobs[START_FAILED]
    assert rule == (f"(VacateReasonCode =?= 1007 && {NOT_PILOT_LOST} && ({NEVER_EXECUTED} || "
                    f"{EXECUTED_BRIEFLY}))")
    assert rule in knobs[NAME] and rule in knobs["SYSTEM_ON_VACATE_COOL_DOWN"]


def test_a_container_test_failure_is_held_at_the_third_start_naming_image_and_error(
        knobs: dict[str, str]) -> None:
    job = Job(knobs)
    job.attempt(1007, TEST_FAILED)
    # as HTCondor 23.9 leaves it: the try began to execute, a second before it failed
    assert job.ad["NumJobStarts"] == job.ad["NumShadowStarts"] == 1
    assert job.ad["JobCurrentStartExecutingDate"] > job.ad["JobCurrentStartDate"]
    assert job.failed_at_start()
    assert not job.runnable() and job.ad["JobCoolDownExpiration"] == job.now + 10
    assert not job.periodic() and job.runnable() and job.ad["NumJobCoolDowns"] == 1
    assert not job.fail_container_test()
    assert job.fail_container_test(), "held at the third failed start"
    assert job.starts == 3 and job.status == 5
    reason = job.ad["HoldReason"]
    assert reason.startswith(f"container image {BROKEN} could not be used: while extracting "
                             f"{BROKEN}: root filesystem extraction failed"), reason
    assert "3 failed starts, the last on slot1_1@pilot-gsi-8@node1" in reason, reason
    assert job.ad["HoldReasonCode"] == 26 and job.ad["HoldReasonSubCode"] == 1007


def without(knobs: dict[str, str], clause: str, instead: str) -> dict[str, str]:
    """The knobs with one clause of the rule replaced (to see that it matters)."""
    assert clause in knobs[START_FAILED]
    return {**knobs, **{k: knobs[k].replace(clause, instead) for k in
                        (NAME, "SYSTEM_ON_VACATE_COOL_DOWN", START_FAILED)}}


def test_without_the_execute_window_htcondor_23_9_retries_the_job_for_ever(
        knobs: dict[str, str]) -> None:
    """The rule before: only a try that never began to execute failed at start. 23.9
    reports the execute before the container test: never held, never cooled down."""
    old = Job(without(knobs, EXECUTED_BRIEFLY, "false"))
    assert old.fail_times(8) == [False] * 8
    assert "NumJobCoolDowns" not in old.ad and old.runnable()


@pytest.mark.parametrize("executed_for", [None, 0, FAILED_START_WITHIN_S],
                         ids=["never-executed", "at-once", "window-edge"])
def test_a_start_that_fails_before_or_soon_after_it_executes_is_held_at_the_third(
        knobs: dict[str, str], executed_for: int | None) -> None:
    """The starter may fail before it reports the job executing (the executing date
    stays an earlier try's, or none): that try never ran either."""
    job = Job(knobs)
    if executed_for is None:
        job.attempt(1005, "Unspecified job interruption", executed_for=3600)  # an earlier run
        job.now += 30
    assert job.fail_times(3, executed_for=executed_for) == [False, False, True]
    assert "3 failed starts" in job.ad["HoldReason"]


def test_after_the_last_allowed_failure_the_job_is_not_started_before_the_hold(
        knobs: dict[str, str]) -> None:
    """The periodic walk comes up to PERIODIC_EXPR_INTERVAL (60 s) after the third
    failure; the negotiator matches every 10-20 s: the cool-down keeps it idle."""
    job = Job(knobs)
    for _ in range(2):
        job.attempt(1007, TEST_FAILED)
        job.now += 11
    job.attempt(1007, TEST_FAILED)
    assert job.ad["JobCoolDownExpiration"] - job.now >= 2 * 60
    job.now += 60
    assert not job.runnable()


def test_a_relative_image_is_named_with_the_submit_directory_and_the_legacy_attribute(
        knobs: dict[str, str]) -> None:
    job = Job(knobs, image="broken.sif")
    assert job.fail_times(3) == [False, False, True]
    assert job.ad["HoldReason"].startswith("container image /home/alice/job/broken.sif ")
    legacy = Job(knobs, image=None)
    legacy.ad["SingularityImage"] = BROKEN
    assert legacy.fail_times(3) == [False, False, True]
    assert legacy.ad["HoldReason"].startswith(f"container image {BROKEN} could not be used")


@pytest.mark.parametrize("code,reason,executed_for", [(13, NO_INPUT, None), (6, NO_EXE, 0)])
def test_a_missing_input_file_or_executable_stays_htcondors_own_hold_at_the_first_start(
        knobs: dict[str, str], code: int, reason: str, executed_for: int | None) -> None:
    """HTCondor holds these itself (a hold code below 1000 from the shadow or the
    starter; the executable's only without a job wrapper). A cool-down would stop that
    hold (the schedd holds only when none is set): none is set."""
    job = Job(knobs, image=None)
    job.attempt(code, reason, executed_for)
    assert job.status == 5 and job.ad["HoldReason"] == reason
    assert job.ad["HoldReasonCode"] == code and "NumJobCoolDowns" not in job.ad
    assert not job.periodic()  # held jobs are not evaluated; nothing rewrites the reason


def test_an_executable_the_job_wrapper_cannot_find_is_held_at_the_third_start_naming_it(
        knobs: dict[str, str]) -> None:
    """With the pilots' job wrapper the starter executes the wrapper, which finds no
    executable and says so in its error file: a starter error (1007) a second after the
    execute event, not HTCondor's own hold."""
    job = Job(knobs, image=None)
    assert job.fail_times(3, WRAPPER_NO_EXE) == [False, False, True]
    assert job.ad["HoldReason"] == (
        "the job could not be started: executable /home/alice/gone.sh does not exist on "
        "this worker node (3 failed starts, the last on slot1_1@pilot-gsi-8@node1; release "
        "the job once fixed)")
    assert job.ad["HoldReasonCode"] == 26 and job.ad["HoldReasonSubCode"] == 1007


@pytest.mark.parametrize("executed_for", [None, FAILS_AFTER_S, 3600],
                         ids=["never-executed", "at-once", "ran"])
def test_normal_evictions_are_never_counted(knobs: dict[str, str],
                                            executed_for: int | None) -> None:
    """Pilot walltime, release, lost node, claim activation failed: before, soon after
    or long after the job began to execute, as often as it happens; then a container
    failure still gets three tries."""
    job = Job(knobs)
    for _ in range(3):
        for code, reason in NORMAL_EVICTIONS.items():
            job.attempt(code, reason, executed_for)
            assert not job.failed_at_start()
            assert not job.periodic() and job.runnable(), (code, executed_for)
    assert "NumJobCoolDowns" not in job.ad
    assert job.fail_times(3) == [False, False, True]


@pytest.mark.parametrize("executed_for", [FAILED_START_WITHIN_S + 1, 3600])
def test_a_starter_error_after_the_job_ran_is_not_a_failed_start(
        knobs: dict[str, str], executed_for: int) -> None:
    """1007 also ends a job that ran (the node out of memory): longer than the window,
    it is not counted, however often; the times, not the code, tell the two apart."""
    job = Job(knobs, image=None)
    for _ in range(5):
        job.attempt(1007, OOM, executed_for)
        assert not job.failed_at_start()
        assert not job.periodic() and job.runnable()
    assert "NumJobCoolDowns" not in job.ad
    # the safeguard matters: without the window's bound, the job would be held
    bound = f"LastVacateTime - JobCurrentStartExecutingDate <= {FAILED_START_WITHIN_S}"
    careless = Job(without(knobs, bound, "true"), image=None)
    held = []
    for _ in range(3):
        careless.attempt(1007, OOM, executed_for)
        careless.now += 10
        held.append(careless.periodic())
    assert held == [False, False, True]


@pytest.mark.parametrize("reason", [PROCD_LOST, "Error from slot1_1@pilot-gsi-5@gsi-n1: "
                                    "ProcD has failed", STARTD_LOST],
                         ids=["procd-restart", "procd-failed", "startd"])
@pytest.mark.parametrize("executed_for", [None, 0, 10, FAILED_START_WITHIN_S])
def test_a_pilot_killed_under_its_jobs_is_never_a_failed_start(
        knobs: dict[str, str], reason: str, executed_for: int | None) -> None:
    """SLURM kills the pilot (a node declared down, a cancel) soon after its jobs began
    to execute: the starter loses its ProcD or its startd and ends with a 1007 of its
    own. No cool-down
    (HTCondor 23.9's schedd would not offer the job again before its runnable list is
    rebuilt: up to 20 minutes beside an idle pilot), never held, however often."""
    job = Job(knobs, image=None)
    for _ in range(4):
        job.attempt(1007, reason, executed_for)
        assert not job.failed_at_start()
        assert not job.periodic() and job.runnable()
    assert "NumJobCoolDowns" not in job.ad and "JobCoolDownExpiration" not in job.ad
    # the clause matters: without it, each kill is a cool-down and the third a hold
    careless = Job(without(knobs, NOT_PILOT_LOST, "true"), image=None)
    assert careless.fail_times(3, reason, executed_for) == [False, False, True]
    # a real failed start still counts after such kills
    assert job.fail_times(3, executed_for=executed_for) == [False, False, True]


def test_a_released_job_gets_three_tries_again_and_runs_once_fixed(knobs: dict[str, str]
                                                                   ) -> None:
    job = Job(knobs)
    assert job.fail_times(3) == [False, False, True]
    job.release()
    job.now += 300  # the last cool-down has passed
    assert not job.periodic(), "not held again at once"
    assert job.fail_times(3) == [False, False, True]
    assert "6 failed starts" in job.ad["HoldReason"]
    job.release()
    job.now += 300
    job.attempt(1005, "Unspecified job interruption", executed_for=3600)  # fixed: it runs
    assert not job.periodic()


def test_a_sites_own_cool_down_is_kept_for_other_evictions(tmp_path: Path) -> None:
    knobs = read_knobs(CONF_DIR / "central-manager.conf", tmp_path,
                       "SYSTEM_ON_VACATE_COOL_DOWN = 42")
    job = Job(knobs)
    job.attempt(1008, "reconnect failed", executed_for=3600)
    assert job.ad["JobCoolDownExpiration"] - job.now == 42
    job.now += 60
    job.attempt(1007, TEST_FAILED)
    assert job.ad["JobCoolDownExpiration"] - job.now == 10


#: One try: what ends it, and how long after the execute event (None: before it).
TRIES = st.one_of(
    st.tuples(st.just("fail"), st.none() | st.integers(0, FAILED_START_WITHIN_S)),
    st.tuples(st.just("oom"), st.integers(FAILED_START_WITHIN_S + 1, 4 * 3600)),
    st.tuples(st.sampled_from(sorted(NORMAL_EVICTIONS)),
              st.none() | st.integers(0, 4 * 3600)))


@settings(max_examples=80, deadline=None)
@given(st.lists(TRIES, min_size=1, max_size=14))
def test_held_exactly_when_the_third_start_failed_since_the_last_release(
        tries: list[tuple[str | int, int | None]]) -> None:
    """Whatever comes between: a starter error within the window of the execute event
    (or before it) counts, one after a longer run never does, nor any other eviction;
    held at the third failed start since the last release, and the service agrees on
    every try."""
    knobs = _cached_knobs()
    job = Job(knobs)
    failed = 0
    for kind, executed_for in tries:
        if job.status == 5:
            assert failed == 3
            job.release()
            failed = 0
        job.now += 400  # any cool-down is over
        if kind == "fail":
            job.attempt(1007, TEST_FAILED, executed_for)
            failed += 1
        elif kind == "oom":
            job.attempt(1007, OOM, executed_for)
        else:
            assert isinstance(kind, int)
            job.attempt(kind, NORMAL_EVICTIONS[kind], executed_for)
        assert job.failed_at_start() == (kind == "fail"), (tries, kind)
        held = job.periodic()
        assert held == (failed == 3 and kind == "fail"), (tries, failed)


_KNOBS: dict[str, str] = {}


def _cached_knobs() -> dict[str, str]:
    if not _KNOBS:
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            _KNOBS.update(read_knobs(CONF_DIR / "central-manager.conf", Path(tmp)))
    return _KNOBS
