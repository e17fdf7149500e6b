"""`provisioner why` as alice on the submit host, against the real service's status ad
(issue 39): a job no site can run names the largest offer, an ordinary job its pilot,
a job of a shape only a site at its submission limit can run the limit, and a stopped
service its silence (and a job submitted since, that it has not seen). With one more
service: a job whose container image cannot be used, failing to start and then held by
the pool's policy; a job only a site behind its open circuit breaker can run; a job
whose Requirements no site meets; a completed job kept in the queue; a job only a
site that cannot be read can run; a job waiting for a site's last allowed pilot. Bad input: a
malformed id, a job that does not exist, another user's job (no paths shown). Each
answer's text is printed (`pytest -s` shows them).

Not produced here (the unit tests answer them): a pilot in the pool with room (the
negotiator takes the job within seconds), the per-cycle budget and "no pilot on its way
yet" (a cycle long), a stuck shape (minutes beside an unmatched pilot), a pool the
service cannot read (the collector stopped under every other test's service) and a
pool no provisioner reports to (the status ad withdrawn as the provisioner)."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run
from pilottokens import clear_test_list, list_live, mint
from servicectl import Service, pilot_ids, service_dir, write_config
from test_limits import LIMIT_FILE, limited  # noqa: F401 (a fixture)
from test_loop import (
    ALICE,
    clean_pool,
    gated_jobs_left,
    submit_gated,
    submit_script,
    wait_for,
)

WHY = "/opt/venv/bin/provisioner"
#: A pilot's own identity, and the name its daemons advertise under.
PILOT_IDENTITY = "pilot-gsi-0123456789ab@testbed"
PILOT_NAME = "pilot-gsi-7@pilot-gsi-0123456789ab.forged"
TERA_MB = 1024 * 1024


def why(*args: str, user: str = "alice") -> subprocess.CompletedProcess[str]:
    """`provisioner why ARGS` as `user` (no configuration, no token: the pool's READ)."""
    return run([WHY, "why", *args], user=user, check=False, cwd=f"/home/{user}")


def answers(job: str, user: str = "alice") -> dict[str, dict]:  # type: ignore[type-arg]
    """job id -> its JSON answer."""
    res = why("--json", job, user=user)
    assert res.returncode == 0, res.stderr
    return {a["job"]: a for a in json.loads(res.stdout)["answers"]}


def until(job: str, pattern: str, timeout: float, user: str = "alice",
          step: float = 1.0) -> str:
    """`why JOB`'s output once its text matches `pattern`; on time-out, the last one."""
    last: list[str] = []

    def poll() -> str | None:
        res = why(job, user=user)
        last[:] = [f"exit {res.returncode}: {res.stdout}{res.stderr}"]
        return res.stdout if res.returncode == 0 and re.search(pattern, res.stdout, re.I) else None
    try:
        return str(wait_for(f"why {job}: {pattern}", poll, timeout, step=step))
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the last answer: {last}") from None


@pytest.fixture
def service() -> Iterator[Service]:
    clean_pool()
    directory = service_dir()
    svc = Service(write_config(directory), directory / "service.log")
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()
        clean_pool()


def test_why_tells_alice_what_the_provisioner_does(service: Service) -> None:
    big = submit_script("why-tera", "true\n", 1, extra=f"request_memory = {TERA_MB}\n")
    ordinary = submit_gated("why-ordinary", 1)
    # from this service's report (a stopped one's ad may still say the same, stale)
    text = until(big, "\n  No site offers", 60)
    print(f"--- why {big} (1 TB) ---\n{text}")
    assert f"{big}.0 (alice, idle): 1 core, 1 TB" in str(text)
    assert re.search(r"No site offers 1 TB per job; the largest is (gsi|frankfurt)'s 7.6 GB",
                     str(text)), text
    text = until(ordinary, r"pending at|starting at|Running on pilot", 90, step=0.5)
    print(f"--- why {ordinary} (while its pilot comes) ---\n{text}")
    text = until(ordinary, "Running on pilot", 180)
    print(f"--- why {ordinary} (running) ---\n{text}")
    site, job_id = re.search(r"Running on pilot (\w+)/(\d+) since \d\d:\d\d",
                             str(text)).groups()  # type: ignore[union-attr]
    assert job_id in pilot_ids(site), (site, job_id, text)
    a = answers(ordinary)[f"{ordinary}.0"]
    assert a["reason"] == "running" and a["params"]["site"] == site
    # bad input: one clear line, a status scripts can test
    res = why("12x")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "'12x'" in res.stderr
    res = why("999999")
    assert res.returncode == 3 and "no job 999999 in the queue" in res.stderr, res.stderr
    print(f"--- why 12x / why 999999 ---\n{why('12x').stderr}{res.stderr}")
    # another user's job: its reason, none of its paths
    res = why(big, user="bob")
    print(f"--- why {big} as bob ---\n{res.stdout}")
    assert res.returncode == 0 and "No site offers 1 TB" in res.stdout
    assert "/home/alice" not in why("--json", big, user="bob").stdout
    # the service stopped: its last word, and how old it is
    service.stop()
    text = until(big, "has not reported for", 60)
    print(f"--- why {big} (service stopped) ---\n{text}")
    assert "what it last said: no site offers 1 TB" in str(text)
    # a job of a shape of its own submitted since: not in the last report
    late = submit_script("why-late", "true\n", 1, extra="request_memory = 777\n")
    text = until(late, "has not reported for", 30)
    print(f"--- why {late} (submitted after the last report) ---\n{text}")
    assert "what it last said: submitted after the provisioner's last cycle (" in text, text
    assert answers(late)[f"{late}.0"]["reason"] == "not_seen"
    wait_for("the gated job done", lambda: gated_jobs_left(ordinary) == 0, 60, step=1)


def _limited_gsi(data: dict) -> None:  # type: ignore[type-arg]
    """gsi's own caps above the account's limit (SLURM's bites first), frankfurt out."""
    for s in data["sites"]:
        if s["name"] == "gsi":
            s["caps"] = {"max_pilots": 4, "max_pending": 4, "max_submit_per_cycle": 4}


def test_a_site_at_its_submission_limit(limited: None) -> None:  # noqa: F811
    LIMIT_FILE.write_text("1\n")
    clean_pool()
    directory = service_dir()
    svc = Service(write_config(directory, _limited_gsi), directory / "service.log")
    gsi_only = 'request_cpus = 4\n+DesiredSites = "gsi"\n'
    first = submit_gated("why-limit-1", 1, extra=gsi_only)
    svc.start()
    try:
        until(first, "Running on pilot gsi/", 180)
        second = submit_gated("why-limit-2", 1, extra=gsi_only)
        text = until(second, "\n  gsi is at its submission limit", 120)
        print(f"--- why {second} (gsi at its limit) ---\n{text}")
        assert re.search(r"gsi is at its submission limit \(1 jobs?, \w+\); waiting for a "
                         r"pilot there to end", str(text)), text
        a = answers(second)[f"{second}.0"]
        assert a["reason"] == "site_limit" and a["shape"]["cores"] == 4
    finally:
        svc.stop()
        print(f"--- service log ---\n{svc.text()}")
        clean_pool()


def test_another_users_hold_reason_without_its_paths() -> None:
    clean_pool()
    held = submit_script("why-held", "true\n", 1, extra="hold = true\n")
    run(["condor_hold", "-reason", "input /home/alice/secret/run7.root is missing", held],
        user="alice")
    try:
        mine = until(held, "Held: ", 30)
        print(f"--- why {held} (held, as alice) ---\n{mine}")
        assert "/home/alice/secret/run7.root" in mine
        other = until(held, "Held: ", 30, user="bob")
        print(f"--- why {held} (held, as bob) ---\n{other}")
        assert "/home/alice" not in other and "input <path> is missing" in other
        assert "/home/alice" not in why("--json", held, user="bob").stdout
    finally:
        clean_pool()


def test_a_status_ad_from_another_identity_is_not_believed() -> None:
    """Pilots hold DAEMON at the collector too, so a pilot's token could advertise a
    status ad of its own: `why` reads only the provisioner identity's."""
    clean_pool()
    big = submit_script("why-forged", "true\n", 1, extra=f"request_memory = {TERA_MB}\n")
    key = answers(big)[f"{big}.0"]["shape"]["key"]
    # a pilot's token advertises only under its own pilot's name (docs/security.md): an
    # ad that fits the collector's rule for pilots, and says it is a status ad
    minted = mint(PILOT_IDENTITY)
    list_live(minted)
    forged = (f'MyType = "ProvisionerStatus"\nName = "{PILOT_NAME}"\nSchema = 1\n'
              'PilotSite = "gsi"\nPilotSlurmJobId = "7"\n'
              f'ProvisionerId = "forged"\nWrittenAt = {int(time.time()) + 3600}\n'
              f'CycleSeconds = 3600.0\nPoolKnown = true\nClassAdLifetime = 300\n'
              f'Shapes = {{ [ Key = "{key}"; Idle = 1; Reason = "pilot_ready"; '
              f'site = "forged"; pilot = "666" ] }}\n')
    with tempfile.TemporaryDirectory(prefix="why-forged.", dir="/home/pilot") as tmp:
        token, ads = Path(tmp) / "pilot", Path(tmp) / "ad"
        token.write_text(minted.text + "\n")
        ads.write_text(forged)
        run(["chown", "-R", "pilot:", tmp])
        token.chmod(0o600)
        pilot_env = {"_CONDOR_SEC_TOKEN_DIRECTORY": tmp,
                     "_CONDOR_SEC_CLIENT_AUTHENTICATION_METHODS": "IDTOKENS"}
        run(["condor_advertise", "UPDATE_AD_GENERIC", str(ads)], user="pilot", env=pilot_env)
        try:
            seen = wait_for("the forged ad in the collector", lambda: run(
                ["condor_status", "-any", "-constraint", f'Name == "{PILOT_NAME}"', "-af",
                 "AuthenticatedIdentity"]).stdout.strip(), 30)
            assert seen == PILOT_IDENTITY, seen
            res = why(big)
            print(f"--- why {big} beside a forged status ad ---\n{res.stdout}")
            assert res.returncode == 0 and "forged" not in res.stdout, res.stdout
        finally:
            ads.write_text('MyType = "Query"\nTargetType = "ProvisionerStatus"\n'
                           f'Requirements = Name == "{PILOT_NAME}"\n')
            run(["condor_advertise", "INVALIDATE_ADS_GENERIC", str(ads)], user="pilot",
                env=pilot_env, check=False)
            clear_test_list()
            clean_pool()


PAYLOAD = "/opt/images/payload.sif"
GSI_ONLY = '+DesiredSites = "gsi"\nrequirements = PilotSite == "gsi"\n'
BROKEN = GSI_ONLY + "transfer_executable = true\ncontainer_image = broken.sif\n"


def _frankfurt_a_black_hole(data: dict) -> None:  # type: ignore[type-arg]
    """Frankfurt's pilots point at an image that does not exist: they start and die,
    and after two its breaker stays open for the rest of the test. A third site, kit,
    has a login node that refuses connections: it is never read."""
    data["policy"]["breaker"] = {"threshold": 2, "base_s": 900, "max_s": 900}
    for s in data["sites"]:
        if s["name"] == "frankfurt":
            s["image"] = "/opt/images/missing.sif"
        if s["name"] == "gsi":  # reached over SSH: kit's login is an SSH host
            kit = copy.deepcopy(s)
    kit["name"] = "kit"
    kit["executor"]["host"] = "127.0.0.9"  # nothing listens: refused at once
    data["sites"].append(kit)


def test_failed_starts_held_paused_unreadable_capped_unmatched_and_done() -> None:
    clean_pool()
    data = Path(PAYLOAD).read_bytes()
    broken = ALICE / "broken.sif"
    broken.write_bytes(data[: len(data) // 2])
    directory = service_dir()
    svc = Service(write_config(directory, _frankfurt_a_black_hole), directory / "service.log")
    failing = submit_script("why-failing", "echo never\n", 1, extra=BROKEN)
    # the schedd counts on from the job's own NumJobCoolDowns: its first failed start is
    # its third, and the pool's policy holds it (HTCondor 23.9's schedd, in a quiet
    # pool, may not retry a job for minutes after a failed start)
    last_try = submit_script("why-last-try", "echo never\n", 1,
                             extra=BROKEN + "+NumJobCoolDowns = 2\n")
    paused = submit_script("why-paused", "true\n", 1, extra=(
        '+DesiredSites = "frankfurt"\nrequirements = PilotSite == "frankfurt"\n'))
    nowhere = submit_script("why-nowhere", "true\n", 1,
                            extra='requirements = PilotSite == "nowhere"\n')
    done = submit_script("why-done", "true\n", 1,
                         extra=GSI_ONLY + "leave_in_queue = JobStatus == 4\n")
    unread = submit_script("why-unread", "true\n", 1, extra=(
        '+DesiredSites = "kit"\nrequirements = PilotSite == "kit"\n'))
    svc.start()
    try:
        # from this service's report (the last one's ad may still say the same, stale)
        text = until(nowhere, "\n  No site's pilot matches its Requirements", 60)
        print(f"--- why {nowhere} (Requirements no site meets) ---\n{text}")
        assert 'PilotSite == "nowhere"' in text and "no pilot is started for it" in text
        text = until(failing, "last start failed", 180)
        print(f"--- why {failing} (its start failed) ---\n{text}")
        # (retried 10 s later: under load the first answer may already count two)
        assert re.search(r"Its last start failed \([12] failed starts?\): container image could "
                         r"not be used: while extracting broken.sif: ", text), text
        assert "the pool holds it after the third" in text
        text = until(last_try, "Held after", 240, step=2)
        print(f"--- why {last_try} (held by the pool) ---\n{text}")
        assert re.search(rf"Held after 3 failed starts: container image {broken} could not "
                         r"be used: .*3 failed starts.*release the job once fixed", text), text
        assert answers(last_try)[f"{last_try}.0"]["reason"] == "held_failed_starts"
        text = until(paused, "\n  frankfurt is paused", 180, step=2)
        print(f"--- why {paused} (frankfurt behind its breaker) ---\n{text}")
        assert re.search(r"frankfurt is paused: its last [23] pilots ended without joining "
                         r"the pool; one pilot tests it again at \d\d:\d\d \(in about 1\d min\)",
                         text), text
        assert answers(paused)[f"{paused}.0"]["reason"] == "site_paused"
        text = until(done, r"\(alice, completed\)", 120, step=2)
        print(f"--- why {done} (completed, kept in the queue) ---\n{text}")
        assert "Completed; nothing more is provisioned for it" in text, text
        assert answers(done)[f"{done}.0"]["reason"] == "done"
        text = until(unread, "\n  kit could not be read", 60)
        print(f"--- why {unread} (kit unreadable) ---\n{text}")
        assert "no pilot is sent there until it can" in text, text
        # gsi has its one allowed pilot (its cap), busy with one of these or sized for
        # the failing job: a 4-core job waits for it to end
        capped = submit_gated("why-capped", 2, extra=GSI_ONLY + "request_cpus = 4\n")
        text = until(capped, "\n  gsi holds as many pilots as it may", 120, step=2)
        print(f"--- why {capped} (gsi at its cap) ---\n{text}")
        assert "(max_pilots); waiting for a pilot there to end" in text, text
        assert "site_cap" in {a["reason"] for a in answers(capped).values()}
    finally:
        svc.stop()
        print(f"--- service log ---\n{svc.text()}")
        clean_pool()
