"""A site at its account's submit limit, enforced by SLURM itself (issue 23, item 1).

The GSI cluster's job_submit.lua (deploy/testbed/etc/job_submit-gsi.lua) refuses, in
SLURM's words (QOSMaxSubmitJobPerUserLimit, "Job violates accounting/QOS policy"), a
job whose user already holds as many jobs as /etc/slurm-gsi/job-limit says; the test
writes that file and removes it (without it the plugin changes nothing). A burst of
4-core jobs, more than the limit lets gsi take: at most one refused sbatch per cycle at
gsi, the overflow runs at Frankfurt, every job completes, and the log and `provisioner
status` say "gsi: at its submission limit (2 jobs)".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import run, slurm
from faults import assert_completed
from servicectl import Service, SiteWatch, pilot_ads, pilot_ids, service_dir, write_config
from test_loop import clean_pool, gated_jobs_left, submit_gated, wait_for

LIMIT_FILE = Path("/etc/slurm-gsi/job-limit")
CTLD_LOG = Path("/var/log/slurm/slurmctld-gsi.log")
LIMIT = 2
REFUSED = "job_submit.lua: refused a job"


def _roomy_gsi(data: dict) -> None:  # type: ignore[type-arg]
    """gsi's own caps above the account's limit, so that SLURM's limit is the one that
    bites (Frankfurt keeps its cap of 2)."""
    for s in data["sites"]:
        if s["name"] == "gsi":
            s["caps"] = {"max_pilots": 4, "max_pending": 4, "max_submit_per_cycle": 4}
            s["weight"] = 2.0  # the cheaper site: it is tried first


@pytest.fixture
def limited() -> Iterator[None]:
    conf = slurm("gsi", ["scontrol", "show", "config"]).stdout
    if not re.search(r"^JobSubmitPlugins\s*=\s*lua", conf, re.MULTILINE):
        pytest.fail("the gsi slurmctld runs without JobSubmitPlugins=lua: rebuild the "
                    "testbed (deploy/testbed/etc/slurm-gsi.conf, job_submit-gsi.lua)")
    LIMIT_FILE.write_text(f"{LIMIT}\n")
    try:
        yield
    finally:
        LIMIT_FILE.unlink(missing_ok=True)


def _refusals() -> int:
    return CTLD_LOG.read_text(errors="replace").count(REFUSED) if CTLD_LOG.exists() else 0


def _cycle_of_refusal(svc: Service) -> Callable[[], list[str] | None]:
    """The service's lines from gsi's refusal to the end of that cycle (its summary
    line, logged once it has acted); None until that line is there."""
    def lines() -> list[str] | None:
        text = svc.text().splitlines()
        refused = [i for i, x in enumerate(text) if "gsi: at its submission limit" in x]
        if not refused:
            return None
        rest = text[refused[0]:]
        end = next((i for i, x in enumerate(rest) if " cycle " in x), None)
        return None if end is None else rest[:end + 1]
    return lines


def test_a_burst_beyond_the_submit_limit_overflows_to_the_other_site(limited: None) -> None:
    clean_pool()
    directory = service_dir()
    config = write_config(directory, _roomy_gsi)
    svc = Service(config, directory / "service.log")
    before = _refusals()
    cluster = submit_gated("limit", 4, extra="request_cpus = 4\n")
    try:
        with SiteWatch() as watch:
            svc.start()
            wait_for("the limit learnt",
                     lambda: f"gsi: at its submission limit ({LIMIT} jobs)" in svc.text(), 120)
            # the overflow went to Frankfurt in the cycle of the refusal: that cycle's
            # line comes once it has acted, after the refusal's own
            lines = wait_for("the cycle of the refusal logged", _cycle_of_refusal(svc), 60,
                             step=0.2)
            placed = [x for x in lines if "placed anew" in x]  # type: ignore[attr-defined]
            assert any("at frankfurt" in x for x in placed), svc.text()
            status = run(["/opt/venv/bin/provisioner", "-c", str(config), "status"],
                         user="provisioner").stdout
            assert f"gsi: at its submission limit ({LIMIT} jobs" in status, status
            wait_for("all jobs done", lambda: gated_jobs_left(cluster) == 0, 300, step=2)
            cycles = len(svc.cycles())
            wait_for("no pilot left in SLURM",
                     lambda: not pilot_ids("gsi") and not pilot_ids("frankfurt"), 240, step=2)
            wait_for("no pilot left in the collector", lambda: not pilot_ads(), 300, step=2)
        refused = _refusals() - before
        # SLURM itself counted the refusals: at least one, never more than one a cycle,
        # and none once the limit was learnt (it is kept for an hour)
        assert refused == 1, (refused, cycles, svc.text())
        assert watch.most["gsi"] <= LIMIT, (watch.most, watch.story())
        assert len(watch.seen["frankfurt"]) >= 2, watch.story()
    finally:
        svc.stop()
        print(f"--- service log ({svc.log}) ---\n{svc.text()}")
        clean_pool()
    assert_completed("limit", 4)
