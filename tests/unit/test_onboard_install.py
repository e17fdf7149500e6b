"""`provisioner init` in a temporary directory; the wheel's package data; the site
check's login rows and its bad input (unknown site names) without a site."""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from provisioner.cli import main
from provisioner.config import parse_config
from provisioner.errors import Unreachable
from provisioner.onboard import check
from provisioner.onboard.data import DATA_DIRS, data_dir
from provisioner.onboard.init import init
from provisioner.sites.executor import CommandResult

REPO = Path(__file__).resolve().parents[2]


def test_init_writes_layout_and_skeleton_and_prints_what_is_left(tmp_path: Path) -> None:
    target = tmp_path / "etc-provisioner"
    report = init(target, owner="provisioner")
    mode = {p: stat.S_IMODE((target / p).stat().st_mode) for p in ("", "tokens.d", "ssh")}
    assert mode == {"": 0o755, "tokens.d": 0o700, "ssh": 0o700}
    config = target / "provisioner.yaml"
    assert stat.S_IMODE(config.stat().st_mode) == 0o644
    text = config.read_text()
    assert f"token_file: {target}/tokens.d/provisioner" in text
    assert "provisioner site discover --host LOGIN --user ACCOUNT" in text
    assert "condor_token_create -identity provisioner@DOMAIN -authz READ -authz WRITE" in report
    assert f"ssh-keygen -t ed25519 -N \"\" -f {target}/ssh/id_ed25519" in report
    assert report.index("site discover") < report.index("site check") < \
        report.index("systemctl enable")
    assert not list((target / "tokens.d").iterdir())  # init makes no secret
    config.write_text("# mine\n")
    assert "exists: left unchanged" in init(target)
    assert config.read_text() == "# mine\n"


def test_the_skeleton_only_lacks_its_sites(tmp_path: Path) -> None:
    init(tmp_path / "c")
    text = (tmp_path / "c" / "provisioner.yaml").read_text()
    with pytest.raises(Exception, match="sites: Tuple should have at least 1 item"):
        parse_config(text)


def test_data_dirs_come_from_the_checkout_without_a_wheel() -> None:
    assert data_dir("slurm_templates") == REPO / "slurm_templates"
    with pytest.raises(ValueError, match="not a data directory"):
        data_dir("tests")


def test_the_wheel_carries_templates_config_snippets_and_images(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "*.egg-info", "__pycache__", "bench", "tests"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
                   check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("provisioner-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for directory in DATA_DIRS:
        for f in (REPO / directory).iterdir():
            assert f"provisioner/_data/{directory}/{f.name}" in names, (directory, f.name)
    assert "provisioner/onboard/nodecheck.py" in names
    assert not any(n.startswith(("slurm_templates/", "tests/", "deploy/")) for n in names)
    # installed, the package finds its own copies (not a checkout's)
    site = tmp_path / "site-packages"
    zipfile.ZipFile(wheel).extractall(site)
    found = subprocess.run(
        [sys.executable, "-c", "from provisioner.onboard.data import data_dir; "
         "from provisioner.pilot.script import DEFAULT_TEMPLATE_DIRS as d; "
         "print(data_dir('images')); print(d[0].is_dir())"],
        env={"PYTHONPATH": str(site)}, cwd=tmp_path, capture_output=True, text=True,
        check=True).stdout.split()
    assert found == [str(site / "provisioner" / "_data" / "images"), "True"]


class Refusing:
    def __init__(self, message: str) -> None:
        self.message = message

    def run(self, argv: Sequence[str], env: Mapping[str, str], stdin: str | None = None
            ) -> CommandResult:
        raise Unreachable(self.message)

    def close(self) -> None:
        pass


SSH_SITE = parse_config("""
sites:
  - name: gsi
    max_walltime_s: 28800
    template: gsi.sh.j2
    image: /opt/images/pilot.sif
    executor: {type: ssh, host: gsi-login, user: pilot, key_file: /k, known_hosts: /kh}
    pilot: {cpus: 4, memory_mb: 7800, walltime_s: 3600}
""").sites[0]


@pytest.mark.parametrize(("message", "failing", "field"), [
    ("site gsi: wrong or unknown host key of gsi-login (check known_hosts /kh): Host key "
     "verification failed.", "host key matches", "sites[0].executor.known_hosts"),
    ("site gsi: login as pilot@gsi-login refused for key /k: Permission denied (publickey).",
     "key accepted", "sites[0].executor.key_file"),
    ("site gsi: cannot connect to gsi-login:22: Connection timed out", "host reachable",
     "sites[0].executor.host"),
])
def test_each_ssh_failure_fails_its_own_row(message: str, failing: str, field: str) -> None:
    rows = check.login_checks(0, SSH_SITE, Refusing(message))
    (bad,) = [r for r in rows if r.ok is False]
    assert bad.name == failing and field in bad.fix and bad.found == message
    after = rows[rows.index(bad) + 1:]
    assert all(r.ok is None for r in after)


def test_site_check_of_an_unknown_site_names_it_and_fails(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    config = tmp_path / "p.yaml"
    config.write_text(f"templates_dir: {REPO}/slurm_templates\npool: {{token_file: ''}}\n"
                      "sites:\n  - name: gsi\n    max_walltime_s: 28800\n"
                      "    template: gsi.sh.j2\n    image: /i.sif\n"
                      "    pilot: {cpus: 4, memory_mb: 7800, walltime_s: 3600}\n")
    assert main(["-c", str(config), "site", "check", "gsi", "fra"]) == 2
    assert "no site 'fra' in the configuration (sites: gsi)" in capsys.readouterr().err


def test_discover_refuses_a_bad_host_name_before_connecting(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["site", "discover", "--host", "gsi login;rm", "--user", "pilot"])
    assert "--host 'gsi login;rm'" in capsys.readouterr().err
