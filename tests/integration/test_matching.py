"""Demand is what a pilot could actually run: a job whose Requirements no site's pilot
meets is unmatchable with the failing clause, in `once --dry-run` and `status`, and no
pilot is planned for it. With `policy.match_requirements: false` (the safeguard off) the
same queue plans a pilot for it: the test would fail without the prototype matching."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run
from servicectl import SERVICE_USER, service_dir, write_config
from test_loop import clean_pool, submit


@pytest.fixture
def queue() -> Iterator[None]:
    """alice's queue: 2 jobs only a Windows pilot could run, 1 ordinary job."""
    clean_pool()
    submit("windows-only", 2, 5, extra='requirements = (OpSys == "WINDOWS")\n')
    submit("ordinary", 1, 5, extra="+DesiredSites = \"frankfurt\"\n")
    yield
    clean_pool()


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
