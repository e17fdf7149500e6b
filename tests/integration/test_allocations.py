"""Allocations end to end: the service with both sites budgeted, alloc-a for group_a and
alloc-b for group_b (the testbed's SLURM accounts of those names, deploy/testbed/etc/
accounts.cfg), against SLURM's own accounting (slurmdbd).

- gsi's alloc-a nearly spent: group_a's burst runs at frankfurt, on pilots charged to
  frankfurt's alloc-a; group_b's jobs run only on alloc-b pilots; no alloc-a pilot is
  ever sent to gsi, where SLURM's own grant (GrpTRESMins, lowered to what is left)
  would have held it pending; frankfurt's books end reconciled with SLURM's charge.
- alloc-a spent at both sites by jobs outside the provisioner: status shows SLURM's
  charge against an empty ledger as a difference and both allocations spent, `why` tells
  alice her group_a job waits for spent allocations, group_b's jobs run, and no pilot of
  alloc-a is submitted.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import htcondor2 as htcondor
import pytest
from conftest import SITES, run, service_config, slurm
from servicectl import Service, service_dir, write_config
from test_loop import clean_pool, submit_script, wait_for
from test_why import until

from provisioner.sites import make_backend

ACCOUNTS = ("alloc-a", "alloc-b")
#: SLURM's grants of the testbed (accounts.cfg), restored after each test.
GRANTS = {"alloc-a": "cpu=6000", "alloc-b": "cpu=3000"}
#: What a job records of the pilot it ran on (job_machine_attrs -> MachineAttr<X>0).
MACHINE_ATTRS = ("PilotAllocation", "PilotSite", "PilotSlurmJobId")


def sacctmgr(site: str, *args: str) -> None:
    slurm(site, ["sacctmgr", "-i", *args])


def reset_use(site: str) -> None:
    """SLURM forgets what the allocations' accounts used (RawUsage=0)."""
    for account in ACCOUNTS:
        sacctmgr(site, "modify", "account", f"name={account}", "set", "RawUsage=0")


def charges(site: str) -> dict[str, Any]:
    """SLURM's use and grant of each allocation account, as the service's backend reads it."""
    backend = make_backend(service_config().site(site), service_config().pool)
    return dict(backend.account_charges(list(ACCOUNTS)))


@pytest.fixture
def accounting() -> Iterator[None]:
    """Both sites' allocation accounts with no use; the grants restored afterwards."""
    clean_pool()
    for site in SITES:
        reset_use(site)
        wait_for(f"{site}: use reset", lambda s=site: all(  # type: ignore[misc]
            c.used_minutes.get("cpu", 0) == 0 for c in charges(s).values()), 120, step=5)
    try:
        yield
    finally:
        for site in SITES:
            for account, grant in GRANTS.items():
                sacctmgr(site, "modify", "account", f"name={account}", "set",
                         f"GrpTRESMins={grant}")
        clean_pool()


def budgets(gsi_a: float, fra_a: float, b: float) -> Callable[[dict[str, Any]], None]:
    """A configuration edit: alloc-a (group_a) and alloc-b (group_b) at both sites."""
    def edit(data: dict[str, Any]) -> None:
        for s in data["sites"]:
            s.pop("account", None)
            s["caps"] = {"max_pilots": 3, "max_pending": 2, "max_submit_per_cycle": 2}
            s["allocations"] = [
                {"name": "alloc-a", "account": "alloc-a", "period": "monthly",
                 "amount": gsi_a if s["name"] == "gsi" else fra_a, "groups": ["group_a"]},
                {"name": "alloc-b", "account": "alloc-b", "period": "monthly",
                 "amount": b, "groups": ["group_b"]}]
    return edit


def submit_group(name: str, group: str, count: int, seconds: int = 20) -> str:
    return submit_script(name, f"sleep {seconds}; echo job-$1-ok\n", count,
                         extra=f"accounting_group = {group}\naccounting_group_user = alice\n"
                               f"job_machine_attrs = {','.join(MACHINE_ATTRS)}\n")


def ran_on(cluster: str) -> list[tuple[str, str, str]]:
    """(allocation, site, SLURM job id) of the pilot each finished job ran on."""
    ads = htcondor.Schedd().history(f"ClusterId == {cluster}",
                                    [f"MachineAttr{a}0" for a in MACHINE_ATTRS])
    return sorted(tuple(str(ad.get(f"MachineAttr{a}0")) for a in MACHINE_ATTRS)  # type: ignore[misc]
                  for ad in ads)


def done(cluster: str) -> bool:
    return not htcondor.Schedd().query(f"ClusterId == {cluster}", ["JobStatus"])


def status(service: Service) -> dict[str, Any]:
    res = run(["/opt/venv/bin/provisioner", "-c", str(service.config), "status", "--json"],
              user="provisioner")
    return json.loads(res.stdout)  # type: ignore[no-any-return]


def allocation(service: Service, site: str, name: str) -> dict[str, Any]:
    (row,) = [a for a in status(service)["allocations"]
              if a["site"] == site and a["allocation"] == name]
    return row


def pilots_charged(site: str, account: str, since: float, besides: tuple[str, ...] = ()
                   ) -> list[str]:
    """The jobs of the pilot account at `site` charged to `account` submitted since
    `since` (sacct: every state, finished ones too), but the jobs `besides`."""
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since - 1))
    out = slurm(site, ["sacct", "-n", "-X", "-P", "-a", "-u", "pilot", f"--accounts={account}",
                       f"--starttime={start}", "-o", "JobID,JobName"]).stdout
    return [line for line in out.splitlines()
            if line.strip() and line.split("|")[0] not in besides]


@pytest.fixture
def started() -> Iterator[Callable[[Callable[[dict[str, Any]], None]], Service]]:
    services: list[Service] = []

    def start(edit: Callable[[dict[str, Any]], None]) -> Service:
        directory = service_dir()
        svc = Service(write_config(directory, edit), directory / "service.log")
        svc.start()
        services.append(svc)
        return svc
    yield start
    for svc in services:
        svc.stop()
        print(f"--- service log ---\n{svc.text()[-6000:]}")


def test_a_nearly_spent_allocation_sends_its_group_elsewhere(
        accounting: None, started: Callable[..., Service]) -> None:
    # gsi's alloc-a: 0.5 core-h left, less than its smallest pilot's worst case (1 core
    # for its 1 h walltime); SLURM's own grant says the same.
    sacctmgr("gsi", "modify", "account", "name=alloc-a", "set", "GrpTRESMins=cpu=30")
    t0 = time.time()
    service = started(budgets(gsi_a=0.5, fra_a=12.0, b=50.0))
    a_jobs = submit_group("alloc-burst-a", "group_a", 3)
    b_jobs = submit_group("alloc-burst-b", "group_b", 2)
    wait_for("both groups' jobs done", lambda: done(a_jobs) and done(b_jobs), 420, step=3)
    on_a, on_b = ran_on(a_jobs), ran_on(b_jobs)
    print(f"group_a ran on {on_a}\ngroup_b ran on {on_b}")
    assert len(on_a) == 3 and all(a == "alloc-a" and s == "frankfurt" for a, s, _ in on_a)
    assert len(on_b) == 2 and all(a == "alloc-b" for a, _, _ in on_b)
    for _, site, job_id in on_a + on_b:  # SLURM charged the account the pilot advertised
        account = slurm(site, ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "Account"])
        assert account.stdout.split()[0] in ACCOUNTS
    assert pilots_charged("gsi", "alloc-a", t0) == []
    assert pilots_charged("frankfurt", "alloc-a", t0)
    gsi_a = allocation(service, "gsi", "alloc-a")
    print(f"gsi/alloc-a: {gsi_a['line']}")
    assert gsi_a["left"] < 1.0 and gsi_a["slurm_grant"] == pytest.approx(0.5)
    # frankfurt's alloc-a pilots gone: SLURM's charge, read since, matches the ledger
    wait_for("frankfurt's alloc-a pilots gone", lambda: not [
        j for j in slurm("frankfurt", ["squeue", "-h", "-A", "alloc-a", "-o", "%i"])
        .stdout.split()], 300, step=3)
    gone = time.time()

    def reconciled() -> dict[str, Any] | None:
        row = allocation(service, "frankfurt", "alloc-a")
        fresh = row["reading_age_s"] is not None and row["reading_age_s"] < time.time() - gone
        return row if fresh and row["slurm_spent"] else None
    row = wait_for("a SLURM reading after the pilots ended", reconciled, 240, step=5)
    print(f"frankfurt/alloc-a: {row}")
    assert isinstance(row, dict) and not row["differs"], row
    assert row["ledger_spent"] == pytest.approx(row["slurm_spent"], abs=row["tolerance"])


def outside_job(site: str, seconds: int) -> str:
    """A job of alloc-a that the provisioner did not send (the account's other users)."""
    out = slurm(site, ["sbatch", "--parsable", "--account=alloc-a", "-n1", "-t", "5",
                       "-o", "/dev/null", f"--wrap=sleep {seconds}"], user="pilot")
    return out.stdout.strip().split(";")[0]


def test_a_spent_allocation_waits_and_says_why(
        accounting: None, started: Callable[..., Service]) -> None:
    jobs = {site: outside_job(site, 30) for site in SITES}
    for site, job in jobs.items():
        wait_for(f"{site}'s outside job ended", lambda s=site, j=job: not slurm(  # type: ignore[misc]
            s, ["squeue", "-h", "-j", j, "-o", "%i"], check=False).stdout.strip(), 120, step=2)
        wait_for(f"{site}: its use in SLURM's books", lambda s=site: charges(s)[  # type: ignore[misc]
            "alloc-a"].used_minutes.get("cpu", 0) >= 0.4, 180, step=5)
    t0 = time.time()
    service = started(budgets(gsi_a=0.005, fra_a=0.005, b=50.0))
    a_job = submit_group("alloc-spent-a", "group_a", 1)
    b_jobs = submit_group("alloc-spent-b", "group_b", 2)
    text = until(a_job, r"allocations of group group_a are spent", 120)
    print(f"--- why {a_job} ---\n{text}")
    assert "gsi/alloc-a: spent" in text or "frankfurt/alloc-a: spent" in text
    wait_for("group_b's jobs done", lambda: done(b_jobs), 300, step=3)
    assert all(a == "alloc-b" for a, _, _ in ran_on(b_jobs))
    for site in SITES:
        row = allocation(service, site, "alloc-a")
        print(f"{site}/alloc-a: {row['line']} (SLURM {row['slurm_spent']}, "
              f"ledger {row['ledger_spent']})")
        assert row["status"] == "spent" and row["differs"], row
        assert row["slurm_spent"] > row["amount"] and row["ledger_spent"] == 0
        assert pilots_charged(site, "alloc-a", t0, besides=(jobs[site],)) == []
    text = run(["/opt/venv/bin/provisioner", "-c", str(service.config), "status"],
               user="provisioner").stdout
    assert "Allocations (this period)" in text and "DIFFERENCE" in text, text
    assert htcondor.Schedd().query(f"ClusterId == {a_job}", ["JobStatus"])[0]["JobStatus"] == 1


def test_a_pilot_that_would_cross_the_line_is_not_submitted(
        accounting: None, started: Callable[..., Service]) -> None:
    """gsi's alloc-a is group_a's only grant, with 0.5 core-h left: less than the worst
    case of its smallest pilot (1 core for its 1 h walltime), though not nothing. No
    pilot is sent; a rule that only asked whether anything is left would send one (and
    SLURM, whose grant says the same, would hold it pending)."""
    sacctmgr("gsi", "modify", "account", "name=alloc-a", "set", "GrpTRESMins=cpu=30")

    def only_gsi_serves_a(data: dict[str, Any]) -> None:
        budgets(gsi_a=0.5, fra_a=1.0, b=50.0)(data)
        for s in data["sites"]:
            if s["name"] == "frankfurt":
                s["allocations"] = [a for a in s["allocations"] if a["name"] != "alloc-a"]
    t0 = time.time()
    service = started(only_gsi_serves_a)
    job = submit_group("alloc-line-a", "group_a", 1)
    text = until(job, r"allocations of group group_a", 120)
    print(f"--- why {job} ---\n{text}")
    # several cycles with the job idle and the grant open, not a single one
    wait_for("5 cycles", lambda: len(service.cycles()) >= 5, 120, step=2)
    assert pilots_charged("gsi", "alloc-a", t0) == []
    assert htcondor.Schedd().query(f"ClusterId == {job}", ["JobStatus"])[0]["JobStatus"] == 1
