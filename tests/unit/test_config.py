"""Config loading: valid sample loads; every bad input names file, field and value."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.config import ConfigError, load_config

SAMPLE = Path(__file__).parent / "data" / "provisioner.yaml"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "prov.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def rejected(tmp_path: Path, old: str, new: str) -> tuple[Path, str]:
    """Load the sample with `old` replaced by `new` (once); return the file and the error."""
    p = write(tmp_path, SAMPLE.read_text().replace(old, new, 1))
    with pytest.raises(ConfigError) as err:
        load_config(p)
    return p, str(err.value)


def test_sample_loads_with_all_fields() -> None:
    c = load_config(SAMPLE)
    assert c.site_names == ("gsi", "frankfurt")
    gsi = c.site("gsi")
    assert gsi.pilot.cpus == 4 and gsi.pilot.walltime_s == 3600
    assert gsi.caps.max_pending == 4 and gsi.weight == 2.0
    assert c.site("frankfurt").keep_warm == 1
    assert c.policy.idle_release_cycles == 2
    assert c.pool.provisioner_id == "prov-1"
    with pytest.raises(KeyError):
        c.site("nowhere")


def test_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    text = SAMPLE.read_text().replace("cpus: 16", "cpus: [16")
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(p)
    msg = str(err.value)
    assert str(p) in msg and "malformed YAML" in msg
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "[16" in t)
    assert f":{line}" in msg or f":{line + 1}" in msg


def test_unknown_backend_lists_known(tmp_path: Path) -> None:
    p, msg = rejected(tmp_path, "backend: slurm-cli\n    slurm_conf: /etc/slurm-frankfurt",
                      "backend: pyslurm\n    slurm_conf: /etc/slurm-frankfurt")
    assert str(p) in msg and "sites[1].backend" in msg
    assert "pyslurm" in msg and "slurm-cli" in msg


def test_walltime_over_partition_limit_names_both(tmp_path: Path) -> None:
    p, msg = rejected(tmp_path, "max_walltime_s: 86400", "max_walltime_s: 1800")
    assert str(p) in msg and "sites[0].pilot.walltime_s" in msg
    assert "3600" in msg and "1800" in msg


def test_duplicate_site_names(tmp_path: Path) -> None:
    p, msg = rejected(tmp_path, "name: frankfurt", "name: gsi")
    assert str(p) in msg and "sites[1].name" in msg and "'gsi'" in msg


@pytest.mark.parametrize(
    ("old", "new", "field", "value"),
    [
        ("weight: 1.0", "weight: 1.0\n    bogus: 3", "sites[1].bogus", "3"),
        ("name: gsi", "name: GSI!", "sites[0].name", "GSI!"),
        ("min_cpus: 4", "min_cpus: 40", "sites[1].pilot.min_cpus", "40"),
        ("max_pending: 4", "max_pending: -1", "sites[0].caps.max_pending", "-1"),
        ("idle_release_cycles: 2", "idle_release_cycles: 0", "policy.idle_release_cycles", "0"),
    ],
)
def test_bad_field_named_with_value(tmp_path: Path, old: str, new: str, field: str,
                                    value: str) -> None:
    p, msg = rejected(tmp_path, old, new)
    assert str(p) in msg and field in msg and value in msg


def test_missing_file_and_empty_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError, match="empty"):
        load_config(write(tmp_path, "# nothing\n"))


def test_missing_required_field(tmp_path: Path) -> None:
    _p, msg = rejected(tmp_path, "    template: gsi.sh.j2\n", "")
    assert "sites[0].template" in msg and "required" in msg


def test_quick_check_longer_than_interval_is_refused(tmp_path: Path) -> None:
    _p, msg = rejected(tmp_path, "idle_release_cycles: 2",
                      "idle_release_cycles: 2\n  interval_s: 10\n  quick_check_s: 30")
    assert "policy.quick_check_s" in msg and "30" in msg and "interval_s 10" in msg


def test_stuck_after_that_outlasts_an_unclaimed_pilot_is_refused(tmp_path: Path) -> None:
    # default noclaim_shutdown_s 1200: a pilot ends before 1000 s + a 300 s interval
    p, msg = rejected(tmp_path, "interval_s: 300", "interval_s: 300\n  stuck_after_s: 1000")
    assert str(p) in msg and "sites[0].runtime.noclaim_shutdown_s" in msg
    assert "1200" in msg and "stuck_after_s 1000" in msg and "interval_s 300" in msg
    text = SAMPLE.read_text().replace("interval_s: 300", "interval_s: 300\n  stuck_after_s: 0")
    assert load_config(write(tmp_path, text)).policy.stuck_after_s == 0  # 0: never stuck


def test_ssh_executor_fields_are_checked_by_the_executor_model(tmp_path: Path) -> None:
    conf = "    slurm_conf: /etc/slurm-frankfurt/slurm.conf\n"

    def with_executor(executor: str) -> str:
        return rejected(tmp_path, conf, f"{conf}    executor: {executor}\n")[1]

    msg = with_executor("{type: ssh, host: fra-login, user: pilot, key_file: /k, "
                        "known_hosts: /kh, port: 70000}")
    assert "sites[1].executor.port" in msg and "70000" in msg
    assert "sites[1].executor.host: field required" in with_executor("{type: ssh, user: p}")
    msg = with_executor("{type: telnet}")
    assert "sites[1].executor.type" in msg and "'telnet'" in msg and "ssh" in msg


def test_every_problem_is_one_line(tmp_path: Path) -> None:
    _p, msg = rejected(tmp_path, "max_pending: 4", "max_pending: -1\n      bogus: 1")
    lines = msg.splitlines()
    assert len(lines) == 2 and all(line.startswith(str(_p) + ":") for line in lines)
