"""The site interface on both backends against the real sites: gsi through sbatch,
squeue and scancel over SSH, frankfurt through slurmrestd. One real pilot each:
submitted, listed running, a cancel of pending pilots only that leaves it running
(SLURM checks the state itself), released, gone from the list, and its end record
read back (over SSH from its file; over REST from its job's comment)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import htcondor2 as htcondor
import pytest
from conftest import SITES, service_config
from pilottokens import list_live, mint
from test_loop import clean_pool, wait_for

from provisioner.pilot.script import render_pilot_script
from provisioner.sites import make_backend
from provisioner.sites.base import PilotRequest, SiteBackend, SiteJobState


@pytest.fixture
def clean() -> Iterator[None]:
    clean_pool()
    yield
    clean_pool()


def _state(backend: SiteBackend, job_id: str) -> SiteJobState | None:
    return next((p.state for p in backend.list_pilots() if p.job_id == job_id), None)


def _ads(job_id: str, site: str) -> list[object]:
    return list(htcondor.Collector().query(
        htcondor.AdType.Startd, constraint=f'PilotSite == "{site}" && '
        f'PilotSlurmJobId == "{job_id}"', projection=["Name"]))


@pytest.mark.parametrize("site", SITES, ids=["ssh-gsi", "rest-frankfurt"])
def test_a_pilot_through_the_site_interface(clean: None, site: str) -> None:
    config = service_config()
    cfg = config.site(site)
    backend = make_backend(cfg, config.pool)
    cpus = cfg.pilot.min_cpus
    # its own token, as the service mints one, listed live in the tests' list
    token = mint(f"pilot-{site}-{uuid.uuid4().hex[:12]}@testbed", lifetime_s=1800)
    list_live(token)
    request = PilotRequest(cpus=cpus, memory_mb=cfg.pilot.memory_per_cpu_mb * cpus,
                           walltime_s=900, shutdown_margin_s=cfg.pilot.shutdown_margin_s,
                           script=render_pilot_script(config, cfg, 900, 0, token=token.text))
    job_id = backend.submit(request)
    try:
        wait_for("the pilot listed running",
                 lambda: _state(backend, job_id) is SiteJobState.RUNNING, 60)
        (pilot,) = [p for p in backend.list_pilots() if p.job_id == job_id]
        assert (pilot.cpus, pilot.memory_mb) == (cpus, request.memory_mb), pilot
        backend.cancel(job_id, only_pending=True)  # it runs: SLURM leaves it be
        wait_for("its startd in the pool", lambda: _ads(job_id, site), 120)
        assert _state(backend, job_id) is SiteJobState.RUNNING
        backend.release(job_id)
        wait_for("the released pilot gone", lambda: _state(backend, job_id) is None, 120)
        record = wait_for("its end record", lambda: backend.end_records([job_id]).get(job_id),
                          60)
        assert (record.site, record.job_id, record.cores) == (  # type: ignore[attr-defined]
            site, job_id, cpus), record
        assert record.reason == "released", record  # type: ignore[attr-defined]
        backend.cancel(job_id)  # gone already: no error
    finally:
        backend.cancel(job_id)
        list_live()
