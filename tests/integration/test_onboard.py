"""A new site from nothing (issue 24): from an empty configuration directory and the
built wheel, `init`, `site discover` for both sites, `site check` (every row ✔, the
probe pilots reach the pool and leave), then a job runs; and the checker's faults,
each named in its output. The checks run as the service's account, as an admin would."""

from __future__ import annotations

import math
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import htcondor2 as htcondor
import pytest
import unitsandbox
import yaml
from conftest import LOGIN, SITES, WORKERS, drop_output, run, slurm
from servicectl import SERVICE_USER
from test_loop import clean_pool, jobs_left, submit, wait_for

PYTHON = "/opt/venv/bin/python"
SSH = "/etc/provisioner/ssh"
TOKEN = "/etc/provisioner/tokens.d/provisioner"
JWT = "/etc/provisioner/tokens.d/frankfurt.jwt"
#: How each site is reached: gsi over SSH, frankfurt only through its slurmrestd.
DISCOVER = {"gsi": ["--host", LOGIN["gsi"], "--key-file", f"{SSH}/id_ed25519",
                    "--known-hosts", f"{SSH}/known_hosts",
                    "--slurm-conf", "/etc/slurm-gsi/slurm.conf"],
            "frankfurt": ["--rest-url", "http://fra-login:6820", "--token-file", JWT,
                          "--account", "hpc-physics"]}
CM = "10.10.0.10"


@pytest.fixture(scope="module")
def wheel() -> Iterator[Path]:
    """The wheel built from this tree, unpacked under /opt as the systemd unit has it
    (read-only to the service, outside its private /tmp): the provisioner the tests
    run is the wheel's, not /src."""
    top = Path(tempfile.mkdtemp(prefix="provisioner-onboard.", dir="/opt"))
    subprocess.run([PYTHON, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(top / "dist"), "/src"], check=True, capture_output=True)
    (whl,) = (top / "dist").glob("provisioner-*.whl")
    subprocess.run([PYTHON, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(top / "lib"), str(whl)], check=True, capture_output=True)
    run(["chown", "-R", f"{SERVICE_USER}:", str(top)])
    top.chmod(0o755)
    yield top
    shutil.rmtree(top, ignore_errors=True)
    for left in Path("/var/lib/provisioner").glob(f"{top.name}*"):  # journal and lock
        left.unlink()


def provisioner(wheel: Path, *argv: str, check: bool = False, timeout: float = 900
                ) -> subprocess.CompletedProcess[str]:
    """`provisioner ARGV` from the wheel, as the service's account."""
    return run([PYTHON, "-m", "provisioner.cli", *argv], user=SERVICE_USER,
               env={"PYTHONPATH": str(wheel / "lib")}, check=check, timeout=timeout)


def discover(wheel: Path, site: str) -> dict:
    out = provisioner(wheel, "site", "discover", "--user", "pilot",
                      "--image", "/opt/images/pilot.sif", "--name", site, *DISCOVER[site],
                      check=True, timeout=120).stdout
    (block,) = yaml.safe_load(out)["sites"]
    return block


def journal_of(wheel: Path) -> str:
    return f"/var/lib/provisioner/{wheel.name}.sqlite"


def onboarded(wheel: Path) -> Path:
    """init, then discover both sites into the skeleton; the site-side settings SLURM
    cannot know (pilot runtime, cache) added as an admin would."""
    etc = wheel / "etc"
    report = provisioner(wheel, "init", "--dir", str(etc), check=True).stdout
    assert "condor_token_create -identity provisioner@DOMAIN" in report
    assert "pilot-keys/pilot-1" in report  # the pilots' signing key, for the admin to make
    for src, dest in ((TOKEN, "tokens.d/provisioner"), (f"{SSH}/id_ed25519", "ssh/id_ed25519"),
                      (f"{SSH}/known_hosts", "ssh/known_hosts"), (JWT, "tokens.d/frankfurt.jwt"),
                      ("/etc/provisioner/pilot-keys/pilot-1", "pilot-keys/pilot-1")):
        shutil.copy(src, etc / dest)  # stands in for the commands init printed
        run(["chown", f"{SERVICE_USER}:", str(etc / dest)])
        (etc / dest).chmod(0o600)
    data = yaml.safe_load((etc / "provisioner.yaml").read_text())
    data["pool"].update(collector="cm:9618", provisioner_id="testbed", uid_domain="testbed")
    data["journal"] = journal_of(wheel)  # in the unit's state directory
    data["policy"] = {"interval_s": 10, "quick_check_s": 3, "min_cycle_gap_s": 3,
                      "reserve": {"enabled": False}, "stuck_after_s": 120}
    blocks = {site: discover(wheel, site) for site in SITES}
    assert (blocks["gsi"]["max_walltime_s"], blocks["gsi"]["pilot"]["cpus"],
            blocks["gsi"]["pilot"]["gpus"]) == (28800, 4, 2)
    assert (blocks["frankfurt"]["max_walltime_s"], blocks["frankfurt"]["pilot"]["min_cpus"],
            blocks["frankfurt"]["template"]) == (172800, 4, "frankfurt.sh.j2")
    assert blocks["frankfurt"]["backend"] == "slurm-rest", blocks["frankfurt"]
    assert "executor" not in blocks["frankfurt"]
    allocations_wait_for_the_admin(wheel, data, blocks)
    blocks["gsi"]["executor"]["key_file"] = str(etc / "ssh/id_ed25519")
    blocks["gsi"]["executor"]["known_hosts"] = str(etc / "ssh/known_hosts")
    blocks["frankfurt"]["rest"]["token_file"] = str(etc / "tokens.d/frankfurt.jwt")
    for site, block in blocks.items():
        block["runtime"] = {"start_delay_max_s": 2, "noclaim_shutdown_s": 600,
                            "log_dir": "/var/log/pilots", "bind": ["/opt/images"]}
        block["caps"] = {"max_pilots": 1, "max_pending": 1, "max_submit_per_cycle": 1}
        if site == "gsi":
            block["runtime"]["gpu_discovery_extra"] = "-simulate:2,2"
        else:
            block["xcache"] = "root://fra-cache:1094"
    data["sites"] = [blocks[s] for s in SITES]
    (etc / "provisioner.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return etc / "provisioner.yaml"


def allocations_wait_for_the_admin(wheel: Path, data: dict, blocks: dict[str, dict]) -> None:
    """Each site's block has SLURM's grants on the accounts pilot may charge (the
    testbed's accounts.cfg: alloc-a, alloc-b), in core-hours, period and groups left
    empty; check-config refuses them until filled in. They are then removed: this
    onboarding runs without allocations."""
    for site, block in blocks.items():
        out = slurm(site, ["sacctmgr", "-n", "-P", "show", "assoc", "where",
                           "account=alloc-a,alloc-b", "user=", "format=account,grptresmins"])
        grants = dict(line.split("|") for line in out.stdout.split())
        want = [{"name": a, "account": a, "unit": "core-hours",
                 "amount": math.floor(int(grants[a].removeprefix("cpu=")) / 60 * 1000) / 1000,
                 "period": None,
                 "groups": []} for a in ("alloc-a", "alloc-b")]
        assert block["allocations"] == want, (site, block)
    unfinished = wheel / "unfinished.yaml"
    unfinished.write_text(yaml.safe_dump({**data, "sites": [blocks[s] for s in SITES]},
                                         sort_keys=False))
    run(["chown", f"{SERVICE_USER}:", str(unfinished)])
    refused = provisioner(wheel, "-c", str(unfinished), "check-config")
    assert refused.returncode != 0, refused.stdout
    for i in (0, 1):
        for field in (f"sites[{i}].allocations[0].period", f"sites[{i}].allocations[1].groups"):
            assert field in refused.stderr + refused.stdout, refused.stderr
    for block in blocks.values():
        del block["allocations"]


@pytest.fixture(scope="module")
def config(wheel: Path) -> Path:
    return onboarded(wheel)


def probes_left() -> tuple[list[str], list[object]]:
    jobs = [j for s in SITES for j in slurm(s, ["squeue", "-h", "-n", "htcpilot-testbed-probe",
                                                "-o", "%i"]).stdout.split()]
    ads = htcondor.Collector().query(htcondor.AdType.Startd,
                                     constraint='PilotProvisionerId == "testbed-probe"',
                                     projection=["Name"])
    return jobs, list(ads)


def test_from_nothing_to_a_job_with_init_discover_check_run(wheel: Path, config: Path) -> None:
    clean_pool()
    where = provisioner(wheel, "-c", str(config), "check-config", "--live")
    assert where.returncode == 0, where.stdout + where.stderr
    assert "sites[1] (frankfurt): matches the live site" in where.stdout
    assert "pilot_tokens.signing_key" in where.stdout and "usable" in where.stdout
    checked = provisioner(wheel, "-c", str(config), "site", "check")
    print(checked.stdout)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    for site in SITES:
        assert f"Site {site}: all checks passed" in checked.stdout
    assert checked.stdout.count("✔ reaches the collector") == 2
    # the gate at gsi, reached over SSH (frankfurt through slurmrestd: no SSH key)
    gsi, frankfurt = checked.stdout.split("Site gsi:", 1)[1].split("Site frankfurt:", 1)
    assert "✔ key restricted" in gsi and "key restricted" not in frankfurt
    assert "✔ XRootD cache answers" in checked.stdout
    assert "✗" not in checked.stdout
    assert probes_left() == ([], [])
    log = wheel / "service.log"
    with log.open("w") as out:
        # as systemd runs deploy/provisioner.service: its user, read-only system,
        # private /tmp, no new privileges; only its state, log and run directories
        # writable
        cli = ["env", f"PYTHONPATH={wheel / 'lib'}", PYTHON, "-m", "provisioner.cli",
               "-c", str(config)]
        pre = subprocess.run(unitsandbox.command([*cli, "check-config"]), text=True,
                             capture_output=True, timeout=120)
        assert pre.returncode == 0, pre.stdout + pre.stderr
        svc = subprocess.Popen(unitsandbox.command([*cli, "run"]), stdout=out,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        cluster = submit("onboard", 1, 5)
        wait_for("the job done", lambda: jobs_left(cluster) == 0, 300, step=2)
        assert Path(journal_of(wheel)).stat().st_size > 0  # its state directory: writable
    finally:
        svc.terminate()
        svc.wait(timeout=60)
        print(log.read_text())
        clean_pool()


def _other_key(wheel: Path) -> Callable[[dict], None]:
    key = wheel / "etc/ssh/other_ed25519"
    key.unlink(missing_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], user=SERVICE_USER)
    return lambda d: d["sites"][0]["executor"].update(key_file=str(key))


def _unknown_host_key(wheel: Path) -> Callable[[dict], None]:
    known = wheel / "etc/ssh/fra_only"
    lines = Path(f"{SSH}/known_hosts").read_text().splitlines()
    known.write_text("".join(f"{x}\n" for x in lines if x.startswith("fra-login ")))
    run(["chown", f"{SERVICE_USER}:", str(known)])
    return lambda d: d["sites"][0]["executor"].update(known_hosts=str(known))


def _token(wheel: Path, name: str, user: str, lifespan: int) -> Callable[[dict], None]:
    """A token of `user` for `lifespan` s (minted at the site) in the configuration."""
    path = wheel / "etc/tokens.d" / name
    minted = slurm("frankfurt", ["scontrol", "token", f"username={user}",
                                 f"lifespan={lifespan}"]).stdout.strip()
    path.write_text(minted.removeprefix("SLURM_JWT=") + "\n")
    run(["chown", f"{SERVICE_USER}:", str(path)])
    path.chmod(0o600)
    return lambda d: d["sites"][1]["rest"].update(token_file=str(path))


def _expired_token(wheel: Path) -> Callable[[dict], None]:
    edit = _token(wheel, "expired.jwt", "pilot", 1)
    time.sleep(1.5)
    return edit


def _foreign_token(wheel: Path) -> Callable[[dict], None]:
    """alice's token presented as the pilot account's: slurmrestd refuses it."""
    return _token(wheel, "alice.jwt", "alice", 600)


FAULTS: dict[str, tuple[Callable[[Path], Callable[[dict], None]], list[str], str, str]] = {
    # name: (config edit, site check argv, failing row, field or host named)
    "wrong key": (_other_key, ["gsi", "--no-probe"], "✗ key accepted",
                  "sites[0].executor.key_file"),
    "unknown host key": (_unknown_host_key, ["gsi", "--no-probe"], "✗ host key known",
                         "sites[0].executor.known_hosts"),
    "image missing": (lambda w: lambda d: d["sites"][0].update(image="/opt/images/none.sif"),
                      ["--no-probe"], "✗ image on the login node", "sites[0].image"),
    "not slurmrestd": (lambda w: lambda d: d["sites"][1]["rest"].update(
        url="http://cm:9618"), ["frankfurt", "--no-probe"], "✗ slurmrestd answers",
        "sites[1].rest.url"),
    "token expired": (_expired_token, ["frankfurt", "--no-probe"], "✗ JWT token file",
                      "sites[1].rest.token_file"),
    "token refused": (_foreign_token, ["frankfurt", "--no-probe"], "✗ token accepted",
                      "sites[1].rest.token_file"),
    "API version not spoken": (lambda w: lambda d: d["sites"][1]["rest"].update(
        api_version="v0.0.39"), ["frankfurt", "--no-probe"], "✗ slurmrestd answers",
        "api_version v0.0.39 is not spoken by both"),
    "time limit below walltime": (lambda w: lambda d: d["sites"][0].update(partition="debug"),
                                  ["gsi", "--no-probe"], "✗ MaxTime >= pilot walltime",
                                  "sites[0].pilot.walltime_s"),
    "account refused": (lambda w: lambda d: d["sites"][1].update(account="not-ours"),
                        ["frankfurt", "--no-probe"], "✗ account allowed", "sites[1].account"),
    "cache silent": (lambda w: lambda d: d["sites"][1].update(xcache="root://fra-cache:1095"),
                     ["frankfurt"], "✗ XRootD cache answers", "sites[1].xcache"),
    "workers cannot reach the collector": (lambda w: lambda d: None,
                                           ["frankfurt", "--pending-s", "120"],
                                           "✗ reaches the collector", "pool.collector"),
    "login host unknown": (lambda w: lambda d: d["sites"][0]["executor"].update(
        host="no-such-login"), ["gsi", "--no-probe"], "✗ login host resolves",
        "sites[0].executor.host"),
    "probe kept pending": (lambda w: lambda d: None, ["frankfurt", "--pending-s", "20"],
                           "✗ probe starts", "pending for"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_site_check_names_each_fault(wheel: Path, config: Path, fault: str) -> None:
    make_edit, argv, row, field = FAULTS[fault]
    data = yaml.safe_load(config.read_text())
    make_edit(wheel)(data)
    faulty = wheel / "faulty.yaml"
    faulty.write_text(yaml.safe_dump(data, sort_keys=False))
    run(["chown", f"{SERVICE_USER}:", str(faulty)])
    blocked = fault == "workers cannot reach the collector"
    if fault == "account refused":
        slurm("frankfurt", ["scontrol", "update", "PartitionName=general1",
                            "AllowAccounts=hpc-physics"])
    if blocked:
        for host in WORKERS["frankfurt"]:
            drop_output(host, f"ip daddr {CM} drop", "onboardtest")
    blockers = [slurm("frankfurt", ["sbatch", "--parsable", f"--nodelist={node}",
                                    "--exclusive", "--account=hpc-physics", "--time=10",
                                    "--output=/dev/null", "--wrap", "sleep 600"],
                      user="pilot").stdout.strip()
                for node in WORKERS["frankfurt"] if fault == "probe kept pending"]
    try:
        out = provisioner(wheel, "-c", str(faulty), "site", "check", *argv)
    finally:
        if fault == "account refused":
            slurm("frankfurt", ["scontrol", "update", "PartitionName=general1",
                                "AllowAccounts=ALL"])
        if blockers:  # every node busy with a job of the account: the probe pends
            slurm("frankfurt", ["scancel", *blockers])
        if blocked:
            for host in WORKERS["frankfurt"]:
                drop_output(host, None, "onboardtest")
    print(out.stdout, out.stderr)
    assert out.returncode == 1, out.stdout + out.stderr
    failing = [line for line in out.stdout.splitlines() if line.lstrip().startswith(row)]
    assert failing, out.stdout
    assert field in out.stdout
    if fault == "image missing":
        assert "Site frankfurt: all checks passed" in out.stdout
    if blocked:
        assert "✗ worker connects to the collector" in out.stdout
    assert probes_left() == ([], [])


def test_unknown_site_name_is_refused(wheel: Path, config: Path) -> None:
    out = provisioner(wheel, "-c", str(config), "site", "check", "nowhere")
    assert out.returncode == 2
    assert "no site 'nowhere' in the configuration (sites: gsi, frankfurt)" in out.stderr
