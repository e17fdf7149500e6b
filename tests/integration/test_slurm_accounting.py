"""SLURM's own accounting read through both backends (`account_charges`): gsi with
`sshare --json` over SSH through the login node's gate, frankfurt with slurmrestd's
/shares. Each test module run makes its own account at each site (sacctmgr, the pilot
account associated with it), so that no other job charges it:

- the grant set with sacctmgr is what the backend reads, also once it changes, and an
  account SLURM does not know is absent;
- after a job charged to it ends, its use is the earlier reading plus sacct's
  ElapsedRaw x AllocCPUS / 60 CPU-minutes (and the same of its node and GPU);
- a running job's use shows at the controller's next usage pass (PriorityCalcPeriod:
  a minute in the testbed), no more than the job has run;
- frankfurt's slurmdbd accepts the JWTs slurmrestd passes on, and refuses a forged one.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from conftest import LOGIN, SITES, run, service_config, slurm, slurm_env
from test_loop import wait_for

from provisioner.sites import make_backend
from provisioner.sites.base import AccountCharge, SiteBackend

#: What the test account may use (GrpTRESMins); gsi charges GPUs too (slurm-gsi.conf
#: AccountingStorageTRES), frankfurt has none.
GRANT = {"gsi": {"cpu": 1234.0, "node": 56.0, "gres/gpu": 78.0},
         "frankfurt": {"cpu": 1234.0, "node": 56.0}}
#: A test job's shape: gsi's nodes are shared (2 CPUs, 1 GPU), frankfurt's whole.
SHAPE = {"gsi": ["--cpus-per-task=2", "--gres=gpu:1"], "frankfurt": []}
#: The controller's usage pass runs every PriorityCalcPeriod (1 min): two passes and
#: the time SLURM takes to start or end a job.
PASS_S = 150


def _grant(grant: dict[str, float]) -> str:
    return ",".join(f"{tres}={minutes:g}" for tres, minutes in grant.items())


@pytest.fixture(scope="module", params=SITES, ids=["ssh-gsi", "rest-frankfurt"])
def site(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, SiteBackend]]:
    """(site, a fresh account of the site's pilot account, the site's backend)."""
    name = request.param
    account = f"acct-test-{uuid.uuid4().hex[:8]}"
    slurm(name, ["sacctmgr", "-i", "add", "account", account, f"cluster={name}",
                 "description=test_slurm_accounting", f"GrpTRESMins={_grant(GRANT[name])}"])
    slurm(name, ["sacctmgr", "-i", "add", "user", "pilot", f"account={account}",
                 f"cluster={name}"])
    config = service_config()
    backend = make_backend(config.site(name), config.pool)
    try:
        yield name, account, backend
    finally:
        slurm(name, ["scancel", f"--account={account}"], check=False)
        slurm(name, ["sacctmgr", "-i", "delete", "account", account], check=False)
        close = getattr(backend, "close", None)
        if close:
            close()


def _read(backend: SiteBackend, account: str) -> AccountCharge | None:
    return backend.account_charges([account, "no-such-account"]).get(account)


def _job(site: str, account: str, seconds: int, wait: bool) -> str:
    out = slurm(site, ["sbatch", "--parsable", *(["--wait"] if wait else []),
                       f"--account={account}", "--time=10", "--output=/dev/null",
                       "--chdir=/tmp", *SHAPE[site], "--wrap", f"sleep {seconds}"],
                user="pilot", timeout=seconds + 120).stdout
    return out.strip().split(";")[0]


def _sacct(site: str, job_id: str) -> dict[str, str]:
    fields = ("State", "ElapsedRaw", "AllocCPUS", "AllocTRES")
    out = slurm(site, ["sacct", "-X", "-n", "-P", "-j", job_id,
                       f"--format={','.join(fields)}"]).stdout.strip()
    return dict(zip(fields, out.split("|"), strict=True)) if out else {}


def test_the_grant_set_with_sacctmgr_is_what_the_backend_reads(
        site: tuple[str, str, SiteBackend]) -> None:
    name, account, backend = site
    charges = wait_for("the new account in the backend's reading",
                       lambda: backend.account_charges([account, "no-such-account"]), 60)
    assert set(charges) == {account}  # the unknown one is absent  # type: ignore[arg-type]
    charge = charges[account]  # type: ignore[index]
    assert charge.grant_minutes == GRANT[name]
    assert all(used == 0 for used in charge.used_minutes.values()), charge
    assert set(charge.used_minutes) == set(GRANT[name])
    # the admin changes the grant: the next read says so; a limit removed is no grant
    slurm(name, ["sacctmgr", "-i", "modify", "account", account, "set",
                 "GrpTRESMins=cpu=4321,node=-1"])
    changed = {**GRANT[name], "cpu": 4321.0}
    del changed["node"]
    wait_for("the changed grant read", lambda: (c := _read(backend, account)) is not None
             and c.grant_minutes == changed, 30, step=0.5)
    slurm(name, ["sacctmgr", "-i", "modify", "account", account, "set",
                 f"GrpTRESMins={_grant(GRANT[name])}"])
    assert backend.account_charges([]) == {}
    assert backend.account_charges(["no-such-account"]) == {}


def test_the_use_of_an_ended_job_is_its_elapsed_time_times_its_cpus(
        site: tuple[str, str, SiteBackend]) -> None:
    name, account, backend = site
    before = wait_for("a first reading", lambda: _read(backend, account), 60)
    job_id = _job(name, account, 5, wait=True)
    rec = wait_for("the ended job in sacct",
                   lambda: (r := _sacct(name, job_id)).get("State") == "COMPLETED" and r, 60)
    elapsed, cpus = int(rec["ElapsedRaw"]), int(rec["AllocCPUS"])  # type: ignore[index]
    gpus = 1 if "gres/gpu=1" in rec["AllocTRES"] else 0  # type: ignore[index]
    assert elapsed >= 5 and cpus == (2 if name == "gsi" else 4), rec
    want = {"cpu": elapsed * cpus / 60, "node": elapsed / 60}
    if name == "gsi":
        assert gpus == 1, rec
        want["gres/gpu"] = elapsed * gpus / 60
    used0 = before.used_minutes  # type: ignore[attr-defined]
    after = wait_for("the job's use at the controller's next usage pass",
                     lambda: (c := _read(backend, account)) is not None
                     and c.used_minutes["cpu"] > used0["cpu"] and c, PASS_S)
    # Both are whole seconds of the same start and end (sacct's ElapsedRaw, the
    # controller's usage passes): equal within a second of the job's CPUs, node, GPUs.
    for tres, minutes in want.items():
        got = after.used_minutes[tres] - used0[tres]  # type: ignore[attr-defined]
        assert got == pytest.approx(minutes, abs=1 / 60 * (cpus if tres == "cpu" else 1)), (
            tres, got, minutes, rec)


def test_a_running_jobs_use_shows_at_the_next_usage_pass(
        site: tuple[str, str, SiteBackend]) -> None:
    name, account, backend = site
    before = wait_for("a first reading", lambda: _read(backend, account), 60)
    used0 = before.used_minutes["cpu"]  # type: ignore[attr-defined]
    t0 = time.time()
    job_id = _job(name, account, 600, wait=False)
    try:
        after = wait_for("its use while it runs", lambda: (c := _read(backend, account))
                         is not None and c.used_minutes["cpu"] > used0 and c, PASS_S)
        state = slurm(name, ["squeue", "-h", "-j", job_id, "-o", "%T"]).stdout.strip()
        assert state == "RUNNING", state
        cpus = 2 if name == "gsi" else 4
        grown = after.used_minutes["cpu"] - used0  # type: ignore[attr-defined]
        # at most what it can have run since it was submitted (whole seconds)
        assert 0 < grown <= cpus * (time.time() - t0 + 1) / 60, (grown, time.time() - t0)
    finally:
        slurm(name, ["scancel", job_id], check=False)


def test_frankfurts_slurmdbd_accepts_the_pilots_jwt_and_refuses_a_forged_one() -> None:
    """A client with SLURM_JWT speaks auth/jwt to slurmdbd too (sacct), as slurmrestd
    does with each client's token."""
    token = slurm("frankfurt", ["scontrol", "token", "username=pilot", "lifespan=300"]
                  ).stdout.strip().removeprefix("SLURM_JWT=")

    def sacct(jwt: str) -> tuple[int, str]:
        proc = run(["sacct", "-X", "-n", "-P", "-S", "now-1day", "-o", "JobID,Account"],
                   user="pilot", env={**slurm_env("frankfurt"), "SLURM_JWT": jwt},
                   host=LOGIN["frankfurt"], check=False)
        return proc.returncode, proc.stderr

    rc, err = sacct(token)
    assert rc == 0 and "error" not in err, err
    head, _, sig = token.rpartition(".")
    rc, err = sacct(f"{head}.{sig[::-1]}")
    assert "Protocol authentication error" in err, (rc, err)
