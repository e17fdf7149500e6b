"""Each testbed component, proven against the real daemon."""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
import uuid
from pathlib import Path

import htcondor2 as htcondor
import pytest
from conftest import SITES, WORKERS, run, slurm
from pilottokens import clear_test_list, list_live, mint

#: A pilot's identity (provisioner.security.tokens): pilot-<site>-<serial>@<uid_domain>.
PILOT_IDENTITY = "pilot-gsi-0123456789ab@testbed"


def test_pool_daemons_answer() -> None:
    collector = htcondor.Collector()
    for daemon in (htcondor.DaemonType.Collector, htcondor.DaemonType.Negotiator,
                   htcondor.DaemonType.Schedd):
        ads = collector.locateAll(daemon)
        assert ads, f"no {daemon} ad in the collector"


def test_alice_submits_and_job_is_queued(tmp_path: Path) -> None:
    sub = Path("/home/alice/queued.sub")
    sub.write_text("executable = /bin/true\nrequest_cpus = 1\nrequest_memory = 100\n"
                   "+TestbedProbe = True\nqueue\n")
    os.chown(sub, 2001, 2001)
    out = run(["condor_submit", "-terse", str(sub)], user="alice", cwd="/home/alice").stdout
    cluster = out.split(".")[0].strip()
    try:
        ads = htcondor.Schedd().query(constraint=f"ClusterId == {cluster}",
                                      projection=["Owner", "JobStatus"])
        assert [(ad["Owner"], ad["JobStatus"]) for ad in ads] == [("alice", 1)]
    finally:
        run(["condor_rm", cluster], user="alice")


def _as_pilot_identity(user: str) -> dict[str, str]:
    """Environment that makes HTCondor tools authenticate with a pilot's token only (one
    minted as the service mints them, and listed live)."""
    minted = mint(PILOT_IDENTITY)
    list_live(minted)
    token_dir = tempfile.mkdtemp(prefix="pilot-token.", dir=f"/home/{user}")
    token = Path(token_dir) / "pilot"
    token.write_text(minted.text + "\n")
    uid = 2001 if user == "alice" else 2002
    os.chown(token_dir, uid, uid)
    os.chown(token, uid, uid)
    token.chmod(0o600)
    return {"_CONDOR_SEC_TOKEN_DIRECTORY": token_dir,
            "_CONDOR_SEC_CLIENT_AUTHENTICATION_METHODS": "IDTOKENS"}


def test_pilot_token_cannot_submit() -> None:
    sub = Path("/home/pilot/forbidden.sub")
    sub.write_text("executable = /bin/true\nqueue\n")
    os.chown(sub, 2002, 2002)
    proc = run(["condor_submit", str(sub)], user="pilot", env=_as_pilot_identity("pilot"),
               check=False, cwd="/home/pilot")
    assert proc.returncode != 0, proc.stdout
    # the schedd does not even know the pilots' signing key: the token is nobody there
    assert "failed to authenticate using idtokens" in (proc.stdout + proc.stderr).lower(), \
        proc.stderr
    clear_test_list()


def _startd_ad(name: str) -> str:
    """A pilot's startd ad under `name` (the pilot with PILOT_IDENTITY, SLURM job 7)."""
    return (f'MyType = "Machine"\nName = "{name}"\nMachine = "fake.testbed"\n'
            'MyAddress = "<127.0.0.1:1>"\nStartdIpAddr = "<127.0.0.1:1>"\n'
            'PilotSite = "gsi"\nPilotSlurmJobId = "7"\nTestbedProbe = True\n')


#: The name the pilot with PILOT_IDENTITY gives its startd (provisioner.pilot.params).
PILOT_STARTD = "pilot-gsi-7@pilot-gsi-0123456789ab.fake"


def _advertise(user: str, env: dict[str, str], name: str) -> tuple[int, str]:
    ad = Path(f"/home/{user}/{name}.ad")
    ad.write_text(_startd_ad(name))
    os.chown(ad, 2001 if user == "alice" else 2002, 2001 if user == "alice" else 2002)
    proc = run(["condor_advertise", "UPDATE_STARTD_AD", str(ad)], user=user, env=env,
               check=False)
    return proc.returncode, proc.stdout + proc.stderr


def _startd_names() -> set[str]:
    ads = htcondor.Collector().query(
        htcondor.AdType.Startd, constraint="TestbedProbe =?= True", projection=["Name"])
    return {ad["Name"] for ad in ads}


def test_alice_cannot_advertise_but_pilot_token_can() -> None:
    _, alice_out = _advertise("alice", {}, "alice-fake-startd")
    # The pilot's ad, sent after alice's, shows the collector has processed both.
    rc, out = _advertise("pilot", _as_pilot_identity("pilot"), PILOT_STARTD)
    assert rc == 0, out
    deadline = time.time() + 10
    while PILOT_STARTD not in _startd_names() and time.time() < deadline:
        time.sleep(0.5)
    assert PILOT_STARTD in _startd_names()
    assert "alice-fake-startd" not in _startd_names(), alice_out
    denials = Path("/var/log/condor/CollectorLog").read_text(errors="replace")
    assert "alice@testbed" in denials and "PERMISSION DENIED" in denials
    inv = Path("/home/pilot/invalidate.ad")
    inv.write_text('MyType = "Query"\nTargetType = "Machine"\n'
                   f'Requirements = Name == "{PILOT_STARTD}"\n')
    os.chown(inv, 2002, 2002)
    run(["condor_advertise", "INVALIDATE_STARTD_ADS", str(inv)], user="pilot",
        env=_as_pilot_identity("pilot"))
    clear_test_list()


@pytest.mark.parametrize("site", SITES)
def test_sbatch_as_pilot_runs_on_every_node(site: str) -> None:
    nodes = slurm(site, ["sinfo", "-h", "-N", "-o", "%N"]).stdout.split()
    assert len(nodes) >= 2
    outdir = Path(tempfile.mkdtemp(prefix=f"sbatch-{site}.", dir="/home/pilot"))
    os.chown(outdir, 2002, 2002)
    for node in nodes:
        slurm(site, ["sbatch", "--wait", "--parsable", f"--nodelist={node}", "--time=2",
                     f"--output={outdir}/{node}.out", "--wrap",
                     "echo $SLURMD_NODENAME $(hostname) $(id -un)"], user="pilot")
    for node in nodes:
        # Each node is a host of its own: its SLURM name is its host name.
        assert (outdir / f"{node}.out").read_text().split() == [node, node, "pilot"]


def test_apptainer_runs_as_pilot() -> None:
    out = run(["apptainer", "-s", "exec", "/opt/images/pilot.sif", "sh", "-c",
               "id -un; condor_version"], user="pilot", host=WORKERS["gsi"][0]).stdout
    assert out.splitlines()[0] == "pilot"
    assert "$CondorVersion:" in out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _origin_opens(name: str) -> int:
    """How often the origin opened /data/<name> (the origin traces opens)."""
    log = Path("/var/log/xrootd/origin/origin.log").read_text(errors="replace")
    return sum(1 for line in log.splitlines() if "ofs_open" in line and f"/data/{name}" in line)


def test_xcache_read_returns_right_bytes_and_caches(tmp_path: Path) -> None:
    # The origin's files and their checksums.
    sums = dict(reversed(line.split()) for line in
                Path("/srv/origin/data/SHA256SUMS").read_text().splitlines())
    assert sums, "the origin has no test files"
    # A file new to the cache, so the first read is a miss whatever ran before.
    name = f"probe-{uuid.uuid4().hex}.dat"
    origin_file = Path("/srv/origin/data") / name
    origin_file.write_bytes(os.urandom(8 << 20))
    expected = _sha256(origin_file)
    url = f"root://fra-cache:1094//root://gsi-storage:1094//data/{name}"
    worker = WORKERS["frankfurt"][0]
    cached = Path("/srv/xcache/data") / name
    try:
        run(["xrdcp", "-f", "-s", url, str(tmp_path / "first")], host=worker)
        assert _sha256(tmp_path / "first") == expected
        assert _origin_opens(name) == 1
        # The cache writes its copy asynchronously.
        deadline = time.time() + 20
        while not (cached.exists() and _sha256(cached) == expected) and time.time() < deadline:
            time.sleep(0.5)
        assert cached.exists() and _sha256(cached) == expected
        # Second read: served from the cache, the origin does not open the file again.
        run(["xrdcp", "-f", "-s", url, str(tmp_path / "second")], host=worker)
        assert _sha256(tmp_path / "second") == expected
        assert _origin_opens(name) == 1
        deadline = time.time() + 20
        stats = ""
        while "N_acc_total=2" not in stats and time.time() < deadline:
            stats = run(["xrdpfc_print", f"{cached}.cinfo"]).stdout
            time.sleep(0.5)
        assert "N_acc_total=2" in stats, stats
        # And a file of the published set reads back with its published checksum.
        published = sorted(sums)[0]
        run(["xrdcp", "-f", "-s", f"root://fra-cache:1094//root://gsi-storage:1094//data/{published}",
             str(tmp_path / "published")], host=worker)
        assert _sha256(tmp_path / "published") == sums[published]
    finally:
        origin_file.unlink(missing_ok=True)
