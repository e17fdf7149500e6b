"""Data through the site's cache without editing a job: the pilot puts the XRootD
client proxy plugin into every job's environment at a site with a cache, so a plain
`xrdcp root://origin//file`, the Python XRootD client and HTCondor's own transfer of
root:// input files all read through the cache; a job can opt out. Checked against
the cache's and the origin's own records. Other URLs go through HTCondor's curl
plugin, the one the pilot keeps beside its own root:// plugin."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run, service_config
from test_loop import ALICE, clean_pool, jobs_left, submit_script, wait_for
from test_testbed import _origin_opens, _sha256

from provisioner.service.loop import Provisioner

ORIGIN = "root://gsi-storage:1094"
DATA = Path("/srv/origin/data")
CACHED = Path("/srv/xcache/data")
AT_FRANKFURT = 'requirements = PilotSite == "frankfurt"\n+DesiredSites = "frankfurt"\n'
AT_GSI = 'requirements = PilotSite == "gsi"\n+DesiredSites = "gsi"\n'
READ_XRDCP = (
    'xrdcp -f -s "$1" "$_CONDOR_SCRATCH_DIR/copy"\n'
    'echo "sha256=$(sha256sum "$_CONDOR_SCRATCH_DIR/copy" | cut -d" " -f1)"\n'
    'echo "proxy=${XROOT_PROXY:-none}"\n')
READ_PYTHON = (
    "python3 -c '\n"
    "import hashlib, sys\n"
    "from XRootD import client\n"
    "f = client.File(); st, _ = f.open(sys.argv[1]); assert st.ok, st.message\n"
    "st, data = f.read(0, 1 << 30); assert st.ok, st.message\n"
    "print(\"sha256=\" + hashlib.sha256(data).hexdigest())\n"
    "' \"$1\"\n")


@pytest.fixture
def fresh_file() -> Iterator[tuple[str, str]]:
    """A file new to the origin and the cache: (name, sha256)."""
    name = f"xc-{uuid.uuid4().hex}.dat"
    path = DATA / name
    path.write_bytes(os.urandom(4 << 20))
    yield name, _sha256(path)
    path.unlink(missing_ok=True)


@pytest.fixture
def prov() -> Iterator[Provisioner]:
    clean_pool()
    yield Provisioner(service_config())
    clean_pool()


def run_jobs(prov: Provisioner, cluster: str, timeout: float = 180) -> None:
    """Cycles every few seconds until the cluster's jobs are done."""
    def done() -> bool:
        prov.run_cycle("test")
        return jobs_left(cluster) == 0
    wait_for(f"cluster {cluster} done", done, timeout, step=4)


def submit_reader(name: str, script: str, url: str, extra: str) -> str:
    return submit_script(name, script.replace('"$1"', f'"{url}"'), 1, extra)


def output(name: str) -> dict[str, str]:
    text = (ALICE / "out" / name / "0.out").read_text()
    err = (ALICE / "out" / name / "0.err").read_text()
    pairs = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    assert "sha256" in pairs, f"no checksum in the output of {name}: {text!r} {err!r}"
    return pairs


def wait_cached(name: str, digest: str) -> None:
    wait_for(f"{name} in the cache", lambda: (CACHED / name).exists()
             and _sha256(CACHED / name) == digest, 30, step=0.5)


def test_plain_root_urls_at_a_cache_site_go_through_the_cache(
        prov: Provisioner, fresh_file: tuple[str, str]) -> None:
    name, digest = fresh_file
    url = f"{ORIGIN}//data/{name}"  # no cache prefix: the job is not edited
    cluster = submit_reader("xc-first", READ_XRDCP, url, AT_FRANKFURT)
    run_jobs(prov, cluster)
    first = output("xc-first")
    assert first["sha256"] == digest
    assert first["proxy"] == "root://fra-cache:1094//"
    # A miss: the cache fetched the file from the origin once and keeps a copy.
    assert _origin_opens(name) == 1
    wait_cached(name, digest)
    # A second job, with the Python client: a hit, the origin is not asked again.
    cluster = submit_reader("xc-second", READ_PYTHON, url, AT_FRANKFURT)
    run_jobs(prov, cluster)
    assert output("xc-second")["sha256"] == digest
    assert _origin_opens(name) == 1
    stats = ""
    deadline = time.time() + 20
    while "N_acc_total=2" not in stats and time.time() < deadline:
        stats = run(["xrdpfc_print", f"{CACHED / name}.cinfo"]).stdout
        time.sleep(0.5)
    assert "N_acc_total=2" in stats, stats


def test_a_site_without_cache_reads_from_the_origin(
        prov: Provisioner, fresh_file: tuple[str, str]) -> None:
    name, digest = fresh_file
    cluster = submit_reader("xc-gsi", READ_XRDCP, f"{ORIGIN}//data/{name}", AT_GSI)
    run_jobs(prov, cluster)
    out = output("xc-gsi")
    assert (out["sha256"], out["proxy"]) == (digest, "none")
    assert _origin_opens(name) == 1
    assert not (CACHED / name).exists()


def test_root_input_files_are_transferred_through_the_cache(
        prov: Provisioner, fresh_file: tuple[str, str]) -> None:
    name, digest = fresh_file
    script = ('echo "sha256=$(sha256sum "$_CONDOR_SCRATCH_DIR/' + name + '" | cut -d" " -f1)"\n')
    cluster = submit_script("xc-transfer", script, 1, AT_FRANKFURT + (
        f"should_transfer_files = YES\ntransfer_input_files = {ORIGIN}//data/{name}\n"))
    run_jobs(prov, cluster)
    assert output("xc-transfer")["sha256"] == digest
    assert _origin_opens(name) == 1
    wait_cached(name, digest)


def test_a_job_can_opt_out_of_the_cache(
        prov: Provisioner, fresh_file: tuple[str, str]) -> None:
    name, digest = fresh_file
    url = f"{ORIGIN}//data/{name}"
    cluster = submit_reader("xc-optout", READ_XRDCP, url, AT_FRANKFURT + "+WantXCache = false\n")
    run_jobs(prov, cluster)
    out = output("xc-optout")
    assert (out["sha256"], out["proxy"]) == (digest, "none")
    assert _origin_opens(name) == 1
    assert not (CACHED / name).exists()
    # $XCACHE stays for explicit use, and is not prefixed a second time.
    script = READ_XRDCP.replace('"$1"', f'"$XCACHE//{url}"')
    cluster = submit_script("xc-explicit", script, 1, AT_FRANKFURT)
    run_jobs(prov, cluster)
    assert output("xc-explicit")["sha256"] == digest
    wait_cached(name, digest)
    assert _origin_opens(name) == 2  # the opt-out's direct read, then the cache's one


def test_xcache_url_and_bench_read_through_the_cache(
        fresh_file: tuple[str, str], tmp_path: Path) -> None:
    name, digest = fresh_file
    url = f"{ORIGIN}//data/{name}"
    cfg = "/src/deploy/testbed/provisioner.yaml"
    cached = run(["provisioner", "-c", cfg, "xcache-url", "--site", "frankfurt", url]).stdout
    assert cached.strip() == f"root://fra-cache:1094//{url}"
    again = run(["provisioner", "-c", cfg, "xcache-url", "--site", "frankfurt", cached.strip()])
    assert again.stdout == cached
    assert run(["provisioner", "-c", cfg, "xcache-url", "--site", "gsi", url]).stdout.strip() \
        == url
    csv_file = tmp_path / "read.csv"
    out = run(["provisioner", "bench", "read", "--block-size", "1M", "--sha256", digest,
               "--csv", str(csv_file), cached.strip()], host="fra-n1").stdout
    assert "checked: sha256, 4 blocks vs root://gsi-storage:1094//data/" in out, out
    rows = csv_file.read_text().splitlines()
    assert rows[0] == "url,second,blocks,bytes,start,end"
    records = [r.split(",") for r in rows[1:]]
    assert sum(int(r[3]) for r in records) == 4 << 20
    # Each read's start and end (epoch seconds, ms) lie within the run.
    assert all(float(r[4]) <= float(r[5]) for r in records), rows
    assert max(float(r[5]) for r in records) - min(float(r[4]) for r in records) < 60, rows
    # A cache that serves wrong bytes fails the run loudly.
    wait_cached(name, digest)
    cache_copy = CACHED / name
    with cache_copy.open("r+b") as f:
        f.seek((4 << 20) - 1)
        last = f.read(1)
        f.seek((4 << 20) - 1)
        f.write(bytes([last[0] ^ 0xFF]))
    bad = run(["provisioner", "bench", "read", "--block-size", "1M", cached.strip()],
              host="fra-n1", check=False)
    assert bad.returncode == 1, bad
    assert "wrong bytes in the block at offset 3145728" in bad.stderr, bad.stderr


def test_other_url_input_files_go_through_the_curl_plugin(prov: Provisioner) -> None:
    """The pilot lists only the curl and data transfer plugins (condor_config/pilot.conf;
    the others cost every pilot's start and need a credd): a file:// input is fetched
    by curl on the worker. A plugin missing from the list would leave the job idle (its
    Requirements ask the slot for the method): the run times out."""
    script = 'grep "^ID=" "$_CONDOR_SCRATCH_DIR/os-release"\n'
    cluster = submit_script("url-file", script, 1, AT_GSI + (
        "should_transfer_files = YES\ntransfer_input_files = file:///etc/os-release\n"))
    run_jobs(prov, cluster)
    out = (ALICE / "out" / "url-file" / "0.out").read_text()
    assert out.startswith("ID="), out
