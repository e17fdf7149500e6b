"""The testbed's network is the real one's: separate hosts, a shaped WAN between
the sites, and worker nodes that accept no connection from outside their site,
so the pool works only because pilots reach the central manager through CCB."""

from __future__ import annotations

import os
import re
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import htcondor2 as htcondor
import pytest
from conftest import HOSTS, LOGIN, SITES, WORKERS, run, service_config, slurm
from pilottokens import list_live, mint

from provisioner.pilot.script import render_pilot_script

ALICE = Path("/home/alice")


def test_every_host_has_its_own_name_and_address() -> None:
    assert socket.gethostname() == "cm"  # the tests run on the submit host
    for host, (addr, _, _) in HOSTS.items():
        out = run(["sh", "-c", "hostname; ip -o -4 addr show dev eth0"], host=host).stdout
        name, line = out.splitlines()[0], out.splitlines()[1]
        assert name == host
        assert f" {addr}/" in line, line


def _connects(host: str, addr: str, port: int) -> bool:
    """A TCP connection from `host` to addr:port succeeds within 3 s."""
    probe = ("import socket,sys\n"
             "try:\n socket.create_connection((sys.argv[1], int(sys.argv[2])), 3).close()\n"
             "except OSError: sys.exit(1)\n")
    return run(["python3", "-c", probe, addr, str(port)], host=host, check=False,
               timeout=20).returncode == 0


@pytest.fixture
def gsi_pilot() -> Iterator[htcondor.classad.ClassAd]:
    """One pilot at gsi, submitted by hand on the login node as the pilot account;
    yields its startd ad once it joined the pool."""
    config = service_config()
    site = config.site("gsi")
    script = Path("/home/pilot") / f"topology-{uuid.uuid4().hex}.sh"
    # its own token, as the service mints one, listed live in the tests' list
    token = mint(f"pilot-gsi-{uuid.uuid4().hex[:12]}@testbed", lifetime_s=1800)
    list_live(token)
    script.touch(mode=0o600)
    os.chown(script, 2002, 2002)
    script.write_text(render_pilot_script(config, site, 900, token=token.text))
    job_id = slurm("gsi", ["sbatch", "--parsable", "--job-name=htcpilot-topology",
                           "--cpus-per-task=1", "--mem=1000M", "--time=15",
                           "--output=/var/log/pilots/topology-%j.out", str(script)],
                   user="pilot").stdout.strip()
    try:
        ad = None
        deadline = time.time() + 120
        while ad is None and time.time() < deadline:
            ads = htcondor.Collector().query(
                htcondor.AdType.Startd, constraint=f'PilotSlurmJobId =?= "{job_id}"',
                projection=["Name", "MyAddress", "Machine"])
            ad = ads[0] if ads else None
            time.sleep(1)
        assert ad is not None, f"pilot gsi/{job_id} did not join the pool"
        yield ad
    finally:
        slurm("gsi", ["scancel", "--batch", "--signal=TERM", job_id], check=False)
        script.unlink(missing_ok=True)
        list_live()


def test_workers_refuse_outside_connections_yet_jobs_run_through_ccb(
        gsi_pilot: htcondor.classad.ClassAd) -> None:
    address = gsi_pilot["MyAddress"]
    m = re.search(r"addrs=([0-9.]+)-(\d+)", address)
    assert m, address
    addr, port = m.group(1), int(m.group(2))
    worker = gsi_pilot["Machine"].split(".")[0]
    assert worker in WORKERS["gsi"]
    assert "CCBID=" in address, f"the pilot did not register with CCB: {address}"
    # From the central manager and from the other site: refused (dropped).
    assert not _connects("cm", addr, port)
    assert not _connects(WORKERS["frankfurt"][0], addr, port)
    # From inside the site: the same port answers, so the port is really open.
    other = next(w for w in WORKERS["gsi"] if w != worker)
    assert _connects(other, addr, port)
    # A job still runs there: the startd connects out to the schedd (CCB).
    sub = ALICE / "ccb.sub"
    out = ALICE / "ccb.out"
    out.unlink(missing_ok=True)
    sub.write_text(f"executable = /bin/hostname\noutput = {out}\nlog = {ALICE}/ccb.log\n"
                   "request_cpus = 1\nrequest_memory = 100\nshould_transfer_files = YES\n"
                   f'requirements = Machine == "{gsi_pilot["Machine"]}"\nqueue\n')
    run(["chown", "alice:", str(sub)])
    cluster = run(["condor_submit", "-terse", str(sub)], user="alice",
                  cwd=str(ALICE)).stdout.split(".")[0]
    deadline = time.time() + 120
    while not (out.exists() and out.read_text().strip()) and time.time() < deadline:
        time.sleep(1)
    run(["condor_rm", cluster], check=False)
    assert out.read_text().strip() == worker
    # The check can fail: with the worker's firewall off, cm connects directly.
    run(["nft", "delete", "table", "inet", "testbed"], host=worker)
    try:
        assert _connects("cm", addr, port)
    finally:
        run(["/src/deploy/testbed/inside/firewall.sh", worker])
    assert not _connects("cm", addr, port)


#: What of a login node the service's host reaches: gsi's SSH, frankfurt's slurmrestd
#: (no SSH route there); never a controller.
LOGIN_OPEN = {"gsi": 22, "frankfurt": 6820}
LOGIN_CLOSED = {"gsi": (6817,), "frankfurt": (22, 6917)}


def test_only_the_way_in_reaches_a_login_node_from_outside() -> None:
    for site in SITES:
        login_addr = HOSTS[LOGIN[site]][0]
        assert _connects("cm", login_addr, LOGIN_OPEN[site]), site
        for port in LOGIN_CLOSED[site]:
            assert not _connects("cm", login_addr, port), (site, port)


def _wan_bytes(site_bridge: str) -> int:
    """Bytes the WAN shaper on a site's bridge has sent (routed into the site)."""
    out = _router(["tc", "-s", "qdisc", "show", "dev", site_bridge])
    m = re.search(r"qdisc tbf .*?Sent (\d+) bytes", out, re.S)
    assert m, f"no WAN shaper on {site_bridge} (was `testbed wan off` left behind?):\n{out}"
    return int(m.group(1))


def _router(argv: list[str]) -> str:
    """A command in the router's namespace (PID 1's), where the WAN is shaped."""
    return run(["nsenter", "--net=/proc/1/ns/net", "--", *argv]).stdout


def test_wan_is_shaped_and_site_local_reads_do_not_cross_it() -> None:
    name = f"wan-{uuid.uuid4().hex}.dat"
    origin = Path("/srv/origin/data") / name
    origin.write_bytes(os.urandom(8 << 20))
    url = f"root://gsi-storage:1094//data/{name}"
    try:
        # Frankfurt reads from GSI's storage: 8 MB cross the shaped WAN link.
        before = _wan_bytes("br-fra")
        run(["xrdcp", "-f", "-s", url, "/dev/null"], host=WORKERS["frankfurt"][0])
        assert _wan_bytes("br-fra") - before >= 8 << 20
        # GSI reads its own storage inside the site: the WAN shapers see nothing of it.
        before_gsi, before_fra = _wan_bytes("br-gsi"), _wan_bytes("br-fra")
        run(["xrdcp", "-f", "-s", url, "/dev/null"], host=WORKERS["gsi"][0])
        assert _wan_bytes("br-gsi") - before_gsi < 1 << 20
        assert _wan_bytes("br-fra") - before_fra < 1 << 20
    finally:
        origin.unlink(missing_ok=True)
