"""Unreachable pool or site: a logged, skipped cycle, never a crash and never a
scale-down or submission based on missing data (real daemons, real failures)."""

from __future__ import annotations

import configparser
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import CONFIG, ROOT_TOKEN_DIR, run, service_config
from servicectl import workers_drained
from test_loop import clean_pool, jobs_left, submit, wait_for

from provisioner.config import Config, parse_config
from provisioner.model import Cancel, PilotState
from provisioner.service.loop import Provisioner


def config_with(tmp_path: Path, edit: dict[str, object] | None = None,
                site_edit: dict[str, dict[str, object]] | None = None) -> Path:
    data = yaml.safe_load(Path(CONFIG).read_text())
    data["journal"] = ""
    # These tests run the provisioner in-process as root: root's copy of its token.
    data["pool"]["token_file"] = f"{ROOT_TOKEN_DIR}/provisioner"
    for key, value in (edit or {}).items():
        section, field = key.split(".")
        data[section][field] = value
    for site in data["sites"]:
        site.update((site_edit or {}).get(site["name"], {}))
    path = tmp_path / "provisioner.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def one_idle_job() -> object:
    clean_pool()
    cluster = submit("waiting", 1, 1)
    yield cluster
    clean_pool()


def cancel_unneeded_pending_at_once(config: Config) -> Config:
    """`config` where a pending pilot no demand needs is cancelled in the first such
    cycle (policy.placement.pending_cancel_cycles 1; the default waits 3 cycles)."""
    placement = config.policy.placement.model_copy(update={"pending_cancel_cycles": 1})
    policy = config.policy.model_copy(update={"placement": placement})
    return config.model_copy(update={"policy": policy})


def test_unreachable_collector_is_unknown_not_empty(tmp_path: Path, one_idle_job: str,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    """With a pilot pending for the one idle job, a cycle that cannot read the pool
    decides nothing; read as an empty queue, the same pilot would be cancelled in that
    one cycle (the control at the end shows that)."""
    with workers_drained():
        real = Provisioner(cancel_unneeded_pending_at_once(service_config()))
        real.run_cycle("test")
        pending = wait_for("a pending pilot", lambda: [
            p for p in real.observe().snapshot.pilots if p.state is PilotState.PENDING], 60)
        path = config_with(tmp_path, {"pool.collector": "127.0.0.1:9"})
        prov = Provisioner(cancel_unneeded_pending_at_once(
            parse_config(path.read_text(), str(path))))
        cycle = prov.run_cycle("test", dry_run=True)
        assert not cycle.observation.snapshot.pool_known
        seen = {p.key for p in cycle.observation.snapshot.pilots}
        assert {p.key for p in pending} <= seen, seen  # type: ignore[attr-defined]
        assert cycle.plan.actions == ()
        assert "pool unknown this cycle" in caplog.text
        # The control: the queue read and empty, the pending pilot is cancelled.
        run(["condor_rm", one_idle_job])
        wait_for("the job gone", lambda: jobs_left(one_idle_job) == 0, 60)
        empty = real.run_cycle("test", dry_run=True)
        cancelled = {a.pilot.key for a in empty.plan.actions if isinstance(a, Cancel)}
        assert {p.key for p in pending} <= cancelled, empty.plan.actions  # type: ignore[attr-defined]


#: The login nodes' SSH gate's settings: the SLURM configurations it lets commands name.
GATE_INI = Path("/etc/provisioner-gate.ini")


@pytest.fixture
def gate_ini() -> Iterator[None]:
    """The gate's settings as they were, after a test that allowed more."""
    saved = GATE_INI.read_text()
    yield
    GATE_INI.write_text(saved)


def _dead_slurmctld() -> dict[str, object]:
    """gsi (SSH) with a SLURM configuration whose controller port nobody listens on,
    allowed by the site's gate as an admin would allow a new configuration (else the
    gate refuses it before squeue runs, which test_site_gate.py covers)."""
    conf = Path("/etc/slurm-gsi/slurm.conf").read_text()
    # squeue runs as the pilot account: the configuration must be readable by it.
    dead = Path(tempfile.mkdtemp(prefix="slurm-dead.", dir="/home/pilot"))
    dead.chmod(0o755)
    (dead / "slurm.conf").write_text(conf.replace("SlurmctldPort=6817", "SlurmctldPort=6999"))
    (dead / "cgroup.conf").write_text("CgroupPlugin=disabled\n")
    ini = configparser.ConfigParser()
    ini.read_string(GATE_INI.read_text())
    ini["gate"]["slurm_confs"] = f"{ini['gate'].get('slurm_confs', '')} {dead / 'slurm.conf'}"
    with GATE_INI.open("w") as out:
        ini.write(out)
    return {"slurm_conf": str(dead / "slurm.conf")}


def _readable_token(tmp_path: Path) -> dict[str, object]:
    """frankfurt's JWT in a file others may read."""
    token = tmp_path / "frankfurt.jwt"
    token.write_text(Path("/etc/provisioner/tokens.d/frankfurt.jwt").read_text())
    token.chmod(0o644)
    rest = service_config().site("frankfurt").rest.model_dump()  # type: ignore[union-attr]
    return {"rest": {**rest, "token_file": str(token)}}


def _not_slurmrestd(tmp_path: Path) -> dict[str, object]:
    """frankfurt's URL pointing at another HTTP server (Prometheus on cm)."""
    rest = service_config().site("frankfurt").rest.model_dump()  # type: ignore[union-attr]
    return {"rest": {**rest, "url": "http://127.0.0.1:9090"}}


#: A site that cannot be read, per backend: (site, its edit, the words its error has).
UNREADABLE = {
    "ssh: slurmctld unreachable": ("gsi", lambda tmp: _dead_slurmctld(),
                                   "Unable to contact slurm controller"),
    "rest: token readable by others": ("frankfurt", _readable_token,
                                       "sites[frankfurt].rest.token_file"),
    "rest: URL not slurmrestd": ("frankfurt", _not_slurmrestd,
                                 "sites[frankfurt].rest.url http://127.0.0.1:9090: GET "
                                 "/openapi/v3 answered HTTP 404: is this slurmrestd?"),
}


@pytest.mark.parametrize("case", list(UNREADABLE))
def test_a_site_that_cannot_be_read_is_skipped_alone(
        tmp_path: Path, one_idle_job: str, caplog: pytest.LogCaptureFixture,
        case: str, gate_ini: None) -> None:
    """The site is unknown that cycle, its error names what is wrong (no traceback),
    and the demand goes to the other site."""
    site, edit, words = UNREADABLE[case]
    other = next(s for s in ("gsi", "frankfurt") if s != site)
    # Both sites could take the job; the unreadable one is preferred.
    path = config_with(tmp_path, site_edit={site: {**edit(tmp_path), "weight": 5.0}})
    prov = Provisioner(parse_config(path.read_text(), str(path)))
    cycle = prov.run_cycle("test", dry_run=True)
    views = {v.name: v for v in cycle.observation.snapshot.sites}
    assert views[other].known and not views[site].known
    assert words in views[site].error, views[site].error
    assert f"site {site} unknown this cycle" in caplog.text
    assert "Traceback" not in caplog.text
    sites_acted = {getattr(a, "site", None) or a.pilot.site for a in cycle.plan.actions}
    assert sites_acted == {other}  # the demand moves to the readable site


def test_check_config_names_file_field_and_value(tmp_path: Path) -> None:
    path = config_with(tmp_path, site_edit={"gsi": {"pilot": {
        "cpus": 4, "memory_mb": 7800, "walltime_s": 90000}}})
    proc = subprocess.run(["provisioner", "-c", str(path), "check-config"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert str(path) in proc.stderr and "sites[0].pilot.walltime_s" in proc.stderr
    assert "90000" in proc.stderr and "28800" in proc.stderr
    bad = tmp_path / "broken.yaml"
    bad.write_text("pool:\n  collector: [unclosed\n")
    proc = subprocess.run(["provisioner", "-c", str(bad), "run"], capture_output=True, text=True)
    assert proc.returncode == 2 and f"{bad}:" in proc.stderr and "malformed YAML" in proc.stderr


def test_pilot_states_are_read_from_real_daemons(one_idle_job: str) -> None:
    """A submitted pilot is seen PENDING, then IDLE or BUSY: never lost. Every worker
    node is drained while it is submitted, so it waits in SLURM's queue until the test
    has seen it there (a pilot on a node that ran one before is in the pool 2-4 s after
    its sbatch: between two reads it could pass unseen)."""
    prov = Provisioner(service_config())

    def states() -> set[PilotState]:
        return {p.state for p in prov.observe().snapshot.pilots}

    with workers_drained():
        prov.run_cycle("test")
        wait_for("the pilot pending", lambda: PilotState.PENDING in states(), 60, step=0.5)
    wait_for("a pilot up", lambda: bool(states() & {PilotState.IDLE, PilotState.BUSY}), 90,
             step=0.5)
    wait_for("the job done", lambda: jobs_left(one_idle_job) == 0, 90)


@pytest.mark.parametrize(("line", "field"), [("request_cpus = 0", "request_cpus"),
                                             ("request_memory = -1", "request_memory")])
def test_jobs_asking_for_nothing_are_refused_at_submit(line: str, field: str) -> None:
    """The central manager refuses them with a message naming the field; nothing queued."""
    sub = Path("/home/alice/nothing.sub")
    sub.write_text(f"executable = /bin/true\n{line}\nqueue\n")
    subprocess.run(["chown", "alice:", str(sub)], check=True)
    proc = run(["condor_submit", str(sub)], user="alice", cwd="/home/alice", check=False)
    assert proc.returncode != 0, proc.stdout
    assert f"{field} must be" in proc.stderr, proc.stderr
    ok = Path("/home/alice/one.sub")
    ok.write_text("executable = /bin/true\nrequest_cpus = 1\nrequest_memory = 100\nhold = true\n"
                  "queue\n")
    subprocess.run(["chown", "alice:", str(ok)], check=True)
    # The rule refuses only what is wrong.
    accepted = run(["condor_submit", "-terse", str(ok)], user="alice", cwd="/home/alice")
    run(["condor_rm", accepted.stdout.split(".")[0]], check=False)
