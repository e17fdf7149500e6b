"""Metrics: the service's series after cycles with hand-written fakes, the endpoint and
its failure, the config field, and the Grafana dashboard against the series defined."""

from __future__ import annotations

import json
import logging
import re
import socket
import urllib.request
from pathlib import Path

import pytest

from provisioner.config import ConfigError, MetricsConfig, parse_config
from provisioner.errors import Unreachable
from provisioner.model import Demand, JobShape
from provisioner.service.accounting import JobRun
from provisioner.service.journal import Journal
from provisioner.service.loop import Provisioner
from provisioner.service.metrics import SERIES, Metrics, MetricsError, exposed_names
from provisioner.sites.base import SiteJob, SiteJobState
from tests.unit.fakes import Clock, FakeBackend, FakePool
from tests.unit.test_service_act import CONFIG, idle_ad, make_world

ROOT = Path(__file__).resolve().parents[2]


def make() -> tuple[Provisioner, FakePool, dict[str, FakeBackend], Clock]:
    return make_world()


def value(prov: Provisioner, name: str, **labels: str) -> float | None:
    return prov.metrics.registry.get_sample_value(name, labels or None)


def test_series_after_cycles() -> None:
    prov, pool, backends, clock = make()
    pool.demand = (Demand(JobShape(1, 1000), 3), Demand(JobShape(64, 1000), 2))
    prov.run_cycle()
    assert value(prov, "provisioner_idle_jobs", site="gsi") == 3
    assert value(prov, "provisioner_idle_jobs", site="none") == 2
    assert value(prov, "provisioner_unmatchable_jobs") == 2
    submitted = value(prov, "provisioner_pilots_submitted_total", site="gsi") or 0
    submitted += value(prov, "provisioner_pilots_submitted_total", site="fra") or 0
    assert submitted >= 1
    assert value(prov, "provisioner_cycle_phase_seconds_count", phase="plan") == 1
    # the pilot starts, joins, runs a job, ends; the site then fails to be read
    job = SiteJob("7", SiteJobState.RUNNING, 4, 8000, 9_000.0, 9_600.0, 20_000.0)
    backends["gsi"].jobs = [job]
    clock.t += 60
    prov.run_cycle()
    assert value(prov, "provisioner_pilot_queue_wait_seconds_sum", site="gsi") == 600
    assert value(prov, "provisioner_allocated_cores", site="gsi") == 4
    pool.ads = {"gsi/7": idle_ad("7")}
    clock.t += 60
    prov.run_cycle()
    assert value(prov, "provisioner_pilot_boot_seconds_count", site="gsi") == 1
    assert value(prov, "provisioner_pilots", site="gsi", state="idle") == 1
    backends["gsi"].list_error = Unreachable("ssh down")
    clock.t += 60
    prov.run_cycle()
    assert value(prov, "provisioner_site_read_errors_total", site="gsi") == 1
    assert value(prov, "provisioner_cycles_total") == 4


def test_pilot_that_never_joined_counts_as_failed() -> None:
    prov, _pool, backends, clock = make()
    backends["gsi"].jobs = [SiteJob("8", SiteJobState.RUNNING, 4, 8000, 9_000.0, 9_100.0,
                                    20_000.0)]
    prov.run_cycle()
    backends["gsi"].jobs = []
    clock.t += 60
    prov.run_cycle()
    assert value(prov, "provisioner_pilots_failed_to_join_total", site="gsi") == 1


def test_unmatchable_logged_once_and_again_when_it_returns(
        caplog: pytest.LogCaptureFixture) -> None:
    prov, pool, _b, clock = make()
    caplog.set_level(logging.WARNING, "provisioner.service.ledger")
    pool.demand = (Demand(JobShape(64, 1000), 2),)
    for _ in range(3):
        clock.t += 60
        prov.run_cycle()
    pool.demand = ()
    prov.run_cycle()
    pool.demand = (Demand(JobShape(64, 1000), 2),)
    prov.run_cycle()
    lines = [r.message for r in caplog.records if "unmatchable" in r.message]
    assert len(lines) == 2 and "RequestCpus 64" in lines[0]


def test_history_read_failure_logged_once_and_never_stops_cycles(
        caplog: pytest.LogCaptureFixture) -> None:
    prov, pool, _b, clock = make()
    pool.history_fail = True
    for _ in range(3):
        clock.t += 60
        prov.run_cycle()
    errors = [r for r in caplog.records if "history unreadable" in r.message]
    assert len(errors) == 1 and prov.cycles == 3
    pool.history_fail = False
    pool.runs = [JobRun("1.0", "alice", "gsi", "7", 1, clock.t - 100, clock.t - 10, 80.0)]
    prov.run_cycle()
    assert prov.journal.job_runs() == pool.runs
    assert pool.history_calls[-1] == clock.t - 86400.0  # a fresh journal: the last day
    prov.run_cycle()
    assert pool.history_calls[-1] == clock.t - 10  # then from the newest end seen


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_endpoint_serves_and_busy_port_is_a_clear_error() -> None:
    port = free_port()
    m = Metrics()
    m.serve(MetricsConfig(listen=f"127.0.0.1:{port}"))
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        assert b"provisioner_cycles_total" in body
        with pytest.raises(MetricsError, match=rf"metrics.listen '127.0.0.1:{port}'"):
            Metrics().serve(MetricsConfig(listen=f"127.0.0.1:{port}"))
    finally:
        m.stop()


def test_service_provisions_on_when_the_port_is_taken(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = parse_config(CONFIG + f"metrics: {{listen: '127.0.0.1:{port}'}}\n", "t.yaml")
        prov = Provisioner(cfg, pool=FakePool(), backends={  # type: ignore[arg-type]
            "gsi": FakeBackend("gsi"), "fra": FakeBackend("fra")}, journal=Journal(""))
        assert prov.start_metrics() is False
    assert "metrics.listen" in caplog.text and "without metrics" in caplog.text
    prov.run_cycle()  # still provisions


def test_metrics_config_validation_names_the_field() -> None:
    assert parse_config(CONFIG, "t.yaml").metrics.listen is None
    with pytest.raises(ConfigError, match=r"metrics\.listen"):
        parse_config(CONFIG + "metrics: {listen: 'no port'}\n", "t.yaml")
    with pytest.raises(ConfigError, match=r"metrics\.listen.*65535"):
        parse_config(CONFIG + "metrics: {listen: ':70000'}\n", "t.yaml")
    assert MetricsConfig(listen="[::1]:9100").address == ("::1", 9100)


def test_grafana_dashboard_names_only_defined_series() -> None:
    doc = json.loads((ROOT / "deploy" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    assert exprs
    known = exposed_names()
    used = set()
    for expr in exprs:
        names = set(re.findall(r"\bprovisioner_[a-z_]+", expr))
        assert names, expr
        assert names <= known, (expr, names - known)
        used |= names
    unused = [n for n in SERIES if not any(u == n or u.startswith(n + "_") for u in used)]
    assert unused == []  # every series has a panel
