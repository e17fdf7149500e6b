"""A site at its account's submit limit, enforced by SLURM itself (issue 23, item 1), on
both backends: gsi through sbatch over SSH, frankfurt through slurmrestd.

Each cluster's job_submit.lua (deploy/testbed/etc/job_submit.lua) refuses, in SLURM's
words (QOSMaxSubmitJobPerUserLimit, "Job violates accounting/QOS policy"), a job whose
user already holds as many jobs as /etc/slurm-SITE/job-limit says; the test writes that
file and removes it (without it the plugin changes nothing). A burst of 4-core jobs,
more than the limit lets the site take: at most one refused submission per cycle
there, the overflow runs at the other site, every job completes, and the log and
`provisioner status` say "SITE: at its submission limit (2 jobs)". Then gsi's admin
removes the limit while work still waits: one sbatch past the learnt limit is accepted,
the service says the limit was raised or removed, and gsi takes more pilots than the
old limit.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import run, slurm
from faults import assert_completed
from servicectl import Service, SiteWatch, pilot_ads, pilot_ids, service_dir, write_config
from test_loop import clean_pool, gated_jobs_left, submit_gated, wait_for

LIMIT = 2
REFUSED = "job_submit.lua: refused a job"
#: The limited site (its backend) -> the site the overflow goes to.
OTHER = {"gsi": "frankfurt", "frankfurt": "gsi"}


def _roomy(limited: str, probe_s: float = 3600) -> Callable[[dict], None]:  # type: ignore[type-arg]
    """The limited site's own caps above the account's limit, so that SLURM's limit is
    the one that bites, and that site tried first; the other takes two pilots. A learnt
    limit is tested again after `probe_s` (an hour: not within the first test)."""
    def edit(data: dict) -> None:  # type: ignore[type-arg]
        data["policy"]["limit_probe_s"] = probe_s
        for s in data["sites"]:
            if s["name"] == limited:
                s["caps"] = {"max_pilots": 4, "max_pending": 4, "max_submit_per_cycle": 4}
                s["weight"] = 2.0  # the cheaper site: it is tried first
            else:
                s["caps"] = {"max_pilots": 2, "max_pending": 2, "max_submit_per_cycle": 2}
    return edit


@contextlib.contextmanager
def _limit(site: str) -> Iterator[Path]:
    """The site's job_submit.lua switched on (LIMIT jobs); yields its limit file."""
    conf = slurm(site, ["scontrol", "show", "config"]).stdout
    if not re.search(r"^JobSubmitPlugins\s*=\s*lua", conf, re.MULTILINE):
        pytest.fail(f"the {site} slurmctld runs without JobSubmitPlugins=lua: rebuild the "
                    f"testbed (deploy/testbed/etc/slurm-{site}.conf, job_submit.lua)")
    limit_file = Path(f"/etc/slurm-{site}/job-limit")
    limit_file.write_text(f"{LIMIT}\n")
    try:
        yield limit_file
    finally:
        limit_file.unlink(missing_ok=True)


#: gsi's limit file, for tests that hold gsi alone to a limit (with `limited`).
LIMIT_FILE = Path("/etc/slurm-gsi/job-limit")


@pytest.fixture
def limited() -> Iterator[None]:
    """gsi's account held to LIMIT jobs (LIMIT_FILE may set another number)."""
    with _limit("gsi"):
        yield


@pytest.fixture(params=["gsi", "frankfurt"], ids=["ssh-gsi", "rest-frankfurt"])
def limited_site(request: pytest.FixtureRequest) -> Iterator[str]:
    """The site (by its backend) whose account is held to LIMIT jobs."""
    with _limit(request.param):
        yield request.param


def _refusals(site: str) -> int:
    log = Path(f"/var/log/slurm/slurmctld-{site}.log")
    return log.read_text(errors="replace").count(REFUSED) if log.exists() else 0


def _cycle_of_refusal(svc: Service, site: str) -> Callable[[], list[str] | None]:
    """The service's lines from the site's refusal to the end of that cycle (its
    summary line, logged once it has acted); None until that line is there."""
    def lines() -> list[str] | None:
        text = svc.text().splitlines()
        refused = [i for i, x in enumerate(text) if f"{site}: at its submission limit" in x]
        if not refused:
            return None
        rest = text[refused[0]:]
        end = next((i for i, x in enumerate(rest) if " cycle " in x), None)
        return None if end is None else rest[:end + 1]
    return lines


def test_a_burst_beyond_the_submit_limit_overflows_to_the_other_site(
        limited_site: str) -> None:
    site, other = limited_site, OTHER[limited_site]
    clean_pool()
    directory = service_dir()
    config = write_config(directory, _roomy(site))
    svc = Service(config, directory / "service.log")
    before = _refusals(site)
    cluster = submit_gated("limit", 4, extra="request_cpus = 4\n")
    try:
        with SiteWatch() as watch:
            svc.start()
            wait_for("the limit learnt",
                     lambda: f"{site}: at its submission limit ({LIMIT} jobs)" in svc.text(),
                     120)
            # the overflow went to the other site in the cycle of the refusal: that cycle's
            # line comes once it has acted, after the refusal's own
            lines = wait_for("the cycle of the refusal logged", _cycle_of_refusal(svc, site), 60,
                             step=0.2)
            placed = [x for x in lines if "placed anew" in x]  # type: ignore[attr-defined]
            assert any(f"at {other}" in x for x in placed), svc.text()
            status = run(["/opt/venv/bin/provisioner", "-c", str(config), "status"],
                         user="provisioner").stdout
            assert f"{site}: at its submission limit ({LIMIT} jobs" in status, status
            wait_for("all jobs done", lambda: gated_jobs_left(cluster) == 0, 300, step=2)
            cycles = len(svc.cycles())
            wait_for("no pilot left in SLURM",
                     lambda: not pilot_ids("gsi") and not pilot_ids("frankfurt"), 240, step=2)
            wait_for("no pilot left in the collector", lambda: not pilot_ads(), 300, step=2)
        refused = _refusals(site) - before
        # SLURM itself counted the refusals: at least one, never more than one a cycle,
        # and none once the limit was learnt (it is tested again only after an hour)
        assert refused == 1, (refused, cycles, svc.text())
        assert watch.most[site] <= LIMIT, (watch.most, watch.story())
        assert len(watch.seen[other]) >= 2, watch.story()
    finally:
        svc.stop()
        print(f"--- service log ({svc.log}) ---\n{svc.text()}")
        clean_pool()
    assert_completed("limit", 4)


PROBE_S = 15


def test_a_submit_limit_the_admin_removed_is_noticed(limited: None) -> None:
    """Six 4-core jobs that run until their gate opens: gsi takes 2 (its limit),
    Frankfurt 2, two wait. The admin removes the limit; within a test of the limit
    (PROBE_S after the refusal, doubling while refused) gsi's next sbatch is accepted
    and the service takes the waiting jobs there."""
    clean_pool()
    directory = service_dir()
    svc = Service(write_config(directory, _roomy("gsi", PROBE_S)), directory / "service.log")
    before = _refusals("gsi")
    cluster = submit_gated("unlimit", 6, extra="request_cpus = 4\n")
    try:
        with SiteWatch() as watch:
            svc.start()
            wait_for("the limit learnt",
                     lambda: f"gsi: at its submission limit ({LIMIT} jobs)" in svc.text(), 120)
            LIMIT_FILE.unlink()  # the admin removed the account's limit
            wait_for("the removed limit noticed",
                     lambda: "the limit was raised or removed" in svc.text(), 6 * PROBE_S + 60)
            wait_for("gsi past its old limit", lambda: watch.most["gsi"] > LIMIT, 90)
            wait_for("all jobs done", lambda: gated_jobs_left(cluster) == 0, 300, step=2)
            wait_for("no pilot left in SLURM",
                     lambda: not pilot_ids("gsi") and not pilot_ids("frankfurt"), 240, step=2)
            wait_for("no pilot left in the collector", lambda: not pilot_ads(), 300, step=2)
        refused = _refusals("gsi") - before
        assert 1 <= refused <= 3, (refused, svc.text())  # the first, and refused tests
        line = next(x for x in svc.text().splitlines() if "raised or removed" in x)
        assert "gsi" in line and f"({LIMIT} jobs" in line, line
    finally:
        svc.stop()
        print(f"--- service log ({svc.log}) ---\n{svc.text()}")
        clean_pool()
    assert_completed("unlimit", 6)
