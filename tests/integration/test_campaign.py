"""Benchmark campaigns end to end: alice runs `provisioner campaign run` on cm while
the provisioner service (as its own account) starts pilots at Frankfurt; every
client is an HTCondor job running benchread.py on a pilot; the per-client CSVs come
back and become results.csv, summary.csv, report.md and plots. A cache that serves
wrong bytes and an origin nobody answers for fail the campaign, naming the scenario,
the client count and the client, and leave none of its jobs in the queue.

No cache-mode switching here (the testbed's cache host stays in its default xcache
mode): the xcache scenario reads the explicit cache URL, the no-cache scenario the
origin URL (campaign jobs opt out of the site's transparent proxy).
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import htcondor2 as htcondor
import pytest
from conftest import run
from servicectl import Service, service_dir, write_config
from test_loop import ALICE, clean_pool, wait_for

DATA = Path("/srv/origin/data")
CACHED = Path("/srv/xcache/data")
CACHE_URL = "root://fra-cache:1094//root://gsi-storage:1094//data/{file}"
ORIGIN_URL = "root://gsi-storage:1094//data/{file}"
#: Nothing listens there: the origin serves on 1094.
DEAD_URL = "root://gsi-storage:1095//data/{file}"
FILE_SIZE = 8 << 20
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    """The provisioner as a real service (testbed configuration) while the test runs."""
    clean_pool()
    svc = Service(write_config(service_dir()), tmp_path / "service.log")
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()
        print(f"--- service log ---\n{svc.text()}")
        clean_pool()


@pytest.fixture
def prefix() -> Iterator[str]:
    """Two files of 8 MiB, same content, new to the origin and the cache."""
    name = f"camp-{uuid.uuid4().hex[:10]}-"
    data = bytes(range(256)) * (FILE_SIZE // 256)
    data = hashlib.sha256(name.encode()).digest() + data[32:]  # distinct per test run
    for i in range(2):
        (DATA / f"{name}{i}").write_bytes(data)
    yield name
    for i in range(2):
        (DATA / f"{name}{i}").unlink(missing_ok=True)


@pytest.fixture
def work() -> Iterator[Path]:
    directory = ALICE / "campaign-tests" / uuid.uuid4().hex[:10]
    directory.mkdir(parents=True)
    run(["chown", "-R", "alice:alice", str(ALICE / "campaign-tests")])
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def scenario(name: str, url: str) -> str:
    return f"  - name: {name}\n    site: frankfurt\n    url: \"{url}\"\n"


def campaign_file(work: Path, name: str, prefix: str, clients: list[int], scenarios: str
                  ) -> tuple[Path, Path]:
    """The campaign file alice runs, and its result directory."""
    spec = work / f"{name}.yaml"
    spec.write_text(
        f"name: {name}\nfiles: {{prefix: {prefix}, count: 2, size: 8M}}\n"
        f"clients: {clients}\nreader: {{block_size: 1M}}\nstep_timeout_s: 600\n"
        f"scenarios:\n{scenarios}")
    run(["chown", "alice:alice", str(spec)])
    return spec, work / f"{name}-out"


def campaign(work: Path, name: str, prefix: str, clients: list[int], scenarios: str
             ) -> tuple[int, str, Path]:
    """alice runs the campaign; returns (exit code, output, result directory)."""
    spec, out = campaign_file(work, name, prefix, clients, scenarios)
    proc = run(["provisioner", "campaign", "run", str(spec), "--out", str(out)], user="alice",
               cwd=str(work), check=False, timeout=1500)
    text = proc.stdout + proc.stderr
    print(text)
    if "timed out after" in text:  # where a client stalled: what the servers last did
        for log in ("/var/log/xrootd/cache/xrootd.log", "/var/log/xrootd/origin/origin.log"):
            lines = Path(log).read_text(errors="replace").splitlines() if Path(
                log).exists() else ["(none)"]
            print(f"--- {log} (last 40 lines) ---", *lines[-40:], sep="\n")
    return proc.returncode, text, out


def campaign_jobs(name: str) -> list[object]:
    """The campaign's jobs still in the queue, other than ones being removed."""
    return htcondor.Schedd().query(constraint=f'CampaignName == "{name}" && JobStatus != 3',
                                   projection=["ClusterId", "ProcId", "JobStatus"])


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_two_scenarios_two_clients_end_to_end(service: Service, prefix: str,
                                              work: Path) -> None:
    code, text, out = campaign(work, "e2e", prefix, [1, 2], scenario("xcache", CACHE_URL)
                               + scenario("no-cache", ORIGIN_URL))
    assert code == 0, text
    assert "scenario xcache, 2 clients: " in text and " running, " in text, text
    # Every client's CSV came back and holds the whole file, second by second.
    spans = {}
    for name in ("xcache", "no-cache"):
        for n in (1, 2):
            seconds: list[int] = []
            for i in range(n):
                rows = list(csv.DictReader((out / name / str(n) / f"client-{i}.csv").open()))
                assert sum(int(r["bytes"]) for r in rows) == FILE_SIZE, (name, n, i)
                assert rows[0]["url"] == (CACHE_URL if name == "xcache" else ORIGIN_URL
                                          ).replace("{file}", f"{prefix}{i}")
                seconds += [int(r["second"]) for r in rows]
            spans[name, str(n)] = max(seconds) - min(seconds) + 1
            step = json.loads((out / name / str(n) / "step.json").read_text())
            assert step["status"] == "ok", step
    # results.csv: one row per second of each step's span; the bytes add up.
    results = list(csv.DictReader((out / "results.csv").open()))
    for key, span in spans.items():
        rows = [r for r in results if (r["scenario"], r["clients"]) == key]
        assert len(rows) == span, (key, rows)
        assert sum(int(r["bytes"]) for r in rows) == int(key[1]) * FILE_SIZE, key
    summary = {(r["scenario"], r["clients"]): r
               for r in csv.DictReader((out / "summary.csv").open())}
    assert set(summary) == set(spans)
    for key, row in summary.items():
        assert float(row["mean_gbit_s"]) > 0 and float(row["max_gbit_s"]) > 0, (key, row)
        assert (row["clients_ok"], row["clients_failed"]) == (key[1], "0"), row
    report = (out / "report.md").read_text()
    for key in spans:
        assert f"| {key[0]} | {key[1]} |" in report, report
    assert "## Failures\n\nnone" in report, report
    for png in ("throughput-xcache.png", "throughput-no-cache.png", "scaling.png"):
        path = out / png
        assert path.exists(), (f"{png} missing: is matplotlib installed in the testbed's "
                               f"venv? report.md says: {report}")
        data = path.read_bytes()
        assert data[:8] == PNG and len(data) > 1024, png
    # The xcache scenario read through the cache: it keeps a copy.
    wait_for("the cache's copy", lambda: (CACHED / f"{prefix}0").exists(), 30, step=0.5)
    # `campaign report` renders the same tables again from the client files alone.
    before = (out / "results.csv").read_text()
    (out / "results.csv").unlink()
    run(["provisioner", "campaign", "report", str(out)], user="alice")
    assert (out / "results.csv").read_text() == before
    assert not campaign_jobs("e2e")


def test_a_corrupted_cached_file_fails_naming_scenario_and_client(
        service: Service, prefix: str, work: Path) -> None:
    # Warm the cache with both files, then corrupt the cache's copy of file 1.
    code, text, _ = campaign(work, "warm", prefix, [2], scenario("xcache", CACHE_URL))
    assert code == 0, text
    digest = sha256(DATA / f"{prefix}1")
    copy = CACHED / f"{prefix}1"
    wait_for("file 1 in the cache", lambda: copy.exists() and sha256(copy) == digest, 30,
             step=0.5)
    with copy.open("r+b") as f:
        f.seek(FILE_SIZE - 1)
        last = f.read(1)
        f.seek(FILE_SIZE - 1)
        f.write(bytes([last[0] ^ 0xFF]))
    code, text, out = campaign(work, "corrupt", prefix, [2], scenario("xcache", CACHE_URL))
    assert code == 1, text
    assert "FAILED: scenario xcache, 2 clients, client 1: bench read: " in text, text
    assert "wrong bytes" in text, text
    step = json.loads((out / "xcache" / "2" / "step.json").read_text())
    assert step["status"] == "failed" and step["failed_clients"] == [1], step
    assert "scenario xcache, 2 clients, client 1: bench read: " in (out / "report.md").read_text()
    wait_for("no job of the campaign left", lambda: not campaign_jobs("corrupt"), 60)


def test_an_unreachable_origin_fails_naming_scenario_and_client(
        service: Service, prefix: str, work: Path) -> None:
    code, text, out = campaign(work, "dead", prefix, [1, 2], scenario("unreachable", DEAD_URL))
    assert code == 1, text
    dead = DEAD_URL.replace("{file}", f"{prefix}0")
    assert f"FAILED: scenario unreachable, 1 client, client 0: bench read: {dead}: " \
           "cannot open" in text, text
    assert not (out / "unreachable" / "2").exists(), "the campaign went on after a failure"
    summary = list(csv.DictReader((out / "summary.csv").open()))
    assert [(r["scenario"], r["clients"], r["clients_failed"]) for r in summary] == [
        ("unreachable", "1", "1")], summary
    wait_for("no job of the campaign left", lambda: not campaign_jobs("dead"), 60)


def test_ctrl_c_removes_the_jobs_and_leaves_a_report_that_says_it_is_partial(
        service: Service, prefix: str, work: Path) -> None:
    # The second scenario's client waits for a site no pilot is at: Ctrl-C finds it idle.
    spec, out = campaign_file(work, "ctrlc", prefix, [1], scenario("xcache", CACHE_URL)
                              + scenario("stuck", CACHE_URL).replace("frankfurt", "nowhere"))
    env = {"PATH": "/opt/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
           "HOME": "/home/alice", "USER": "alice"}  # alice's own, not the tests' (root's)
    argv = ["runuser", "-u", "alice", "--", "env", *(f"{k}={v}" for k, v in env.items()),
            "provisioner", "campaign", "run", str(spec), "--out", str(out)]
    # A terminal's Ctrl-C: SIGINT to the foreground process group.
    proc = subprocess.Popen(argv, cwd=str(work), env=env, start_new_session=True, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def stuck_step_queued() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the campaign ended early:\n{proc.communicate()[0]}")
        return (out / "stuck" / "1").is_dir() and bool(campaign_jobs("ctrlc"))

    try:
        deadline = time.time() + 600
        while not stuck_step_queued():
            assert time.time() < deadline, "timed out waiting for the stuck step's job"
            time.sleep(1)
        os.killpg(proc.pid, signal.SIGINT)
        text = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    print(text)
    assert proc.returncode != 0, text
    assert "campaign ctrlc: interrupted (Ctrl-C); partial report" in text, text
    wait_for("no job of the campaign left", lambda: not campaign_jobs("ctrlc"), 60)
    md = (out / "report.md").read_text()
    assert md.startswith("# Campaign ctrlc\n\n**Partial report"), md
    assert "- scenario stuck, 1 client: interrupted" in md, md
    assert "| xcache | 1 |" in md, md  # the finished step is reported
    step = json.loads((out / "stuck" / "1" / "step.json").read_text())
    assert step["status"] == "interrupted", step


def test_a_fio_campaign_returns_fio_s_seconds_and_the_node_s_network(
        service: Service, work: Path) -> None:
    jobfile = work / "short.fio"
    jobfile.write_text("[global]\nioengine=psync\nbs=1M\nsize=16M\nruntime=4\ntime_based=1\n"
                       "\n[short-read]\nrw=read\nnumjobs=2\n")
    spec = work / "fio.yaml"
    spec.write_text("name: fio-it\nkind: fio\nfio: {jobfile: short.fio, nodes: [1], "
                    "site: frankfurt, request_cpus: 4}\nstep_timeout_s: 600\n")
    run(["chown", "alice:alice", str(jobfile), str(spec)])
    out = work / "fio-out"
    proc = run(["provisioner", "campaign", "run", str(spec), "--out", str(out)], user="alice",
               cwd=str(work), check=False, timeout=900)
    text = proc.stdout + proc.stderr
    print(text)
    assert proc.returncode == 0, text
    step = out / "short" / "1"  # the scenario is named after the job file
    assert json.loads((step / "step.json").read_text())["status"] == "ok"
    report = json.loads((step / "client-0.json").read_text())
    assert sum(j["read"]["io_bytes"] for j in report["jobs"]) > 0, report
    # fio's own log, one row per second of its 4 s, bytes in each.
    bw = list(csv.DictReader((step / "client-0.bw.csv").open()))
    assert len(bw) >= 3 and all(int(r["bytes"]) > 0 for r in bw[:-1]), bw
    # The node's interfaces, sampled every second while fio ran.
    net = list(csv.DictReader((step / "client-0.netdev.csv").open()))
    assert len({r["second"] for r in net}) >= 4, net
    assert {r["interface"] for r in net} - {"lo"}, net
    # Only what the job names came back: fio's 16 MiB data files stayed on the node.
    assert not [p.name for p in step.iterdir() if p.stat().st_size > 8 << 20]
    summary = next(csv.DictReader((out / "summary.csv").open()))
    assert float(summary["fio_gbit_s"]) > 0 and float(summary["mean_gbit_s"]) > 0, summary
    assert summary["nic_rx_gbit_s"] not in ("", "-"), summary
    md = (out / "report.md").read_text()
    assert "| short | 1 |" in md and "NIC rx Gbit/s" in md, md
    for png in ("throughput-short.png", "scaling.png"):
        assert (out / png).read_bytes()[:8] == PNG, png
    assert not campaign_jobs("fio-it")
