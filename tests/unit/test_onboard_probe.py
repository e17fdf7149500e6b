"""The probe pilot on a virtual clock against a scripted SLURM and collector: each
outcome in its row, and the job cancelled whatever happens; the check table."""

from __future__ import annotations

import json
import socket
import struct
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from provisioner.config import parse_config
from provisioner.onboard import nodecheck
from provisioner.onboard.probe import (
    Limits,
    Probe,
    ProbeScriptError,
    parse_node_lines,
    probe_script,
)
from provisioner.onboard.probeio import parse_squeue_state
from provisioner.onboard.table import as_json, failed, passed, render, site_ok, skipped
from provisioner.pilot.endrecord import EndRecord
from provisioner.pilot.script import render_pilot_script
from provisioner.security.tokens import PilotToken, identity_of
from provisioner.service.pilot_tokens import PilotTokens
from provisioner.sites.executor import CommandResult
from provisioner.sites.slurm_cli import SlurmCliBackend

REPO = Path(__file__).resolve().parents[2]
LIVE = tempfile.mkdtemp(prefix="probe-tokens.")
CONFIG = parse_config(f"""
templates_dir: {REPO}/slurm_templates
pool: {{collector: "cm:9618", provisioner_id: testbed}}
pilot_tokens: {{live_list: {LIVE}/live}}
sites:
  - name: frankfurt
    partition: general1
    max_walltime_s: 172800
    template: frankfurt.sh.j2
    image: /opt/images/pilot.sif
    xcache: "root://fra-cache:1094"
    pilot: {{cpus: 4, min_cpus: 4, memory_mb: 7800, walltime_s: 7200, shutdown_margin_s: 300}}
    runtime: {{log_dir: /var/log/pilots}}
""")
SITE = CONFIG.sites[0]
NODE_OUTPUT = "".join(nodecheck.PREFIX + json.dumps(d) + "\n" for d in (
    {"step": "image", "ok": True, "seconds": 0.0, "detail": "/opt/images/pilot.sif (180 MiB)"},
    {"step": "apptainer", "ok": True, "seconds": 0.4, "detail": "apptainer exec"},
    {"step": "collector", "ok": False, "seconds": 10.0,
     "detail": "fra-n1 cannot connect to cm:9618: timed out"},
    {"step": "xcache", "ok": True, "seconds": 0.01, "detail": "XRootD at fra-cache:1094"},
)) + "INFO provisioner.pilot: starting\n"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


class FakeSlurm:
    """sbatch/squeue/scancel/head as a site answers them; `states` is what squeue
    says over (virtual) time; records every argv."""

    def __init__(self, clock: Clock, states: Callable[[float, bool], str]) -> None:
        self.clock, self.states, self.calls = clock, states, []
        self.cancelled = False
        self.stdin: str | None = None
        self.node_output = NODE_OUTPUT
        self.end_records: dict[str, str] = {}

    def run(self, argv: Sequence[str], env: Mapping[str, str], stdin: str | None = None
            ) -> CommandResult:
        self.calls.append(list(argv))
        if argv[0] == "sbatch":
            self.stdin = stdin
            return CommandResult(0, "42\n", "")
        if argv[0] == "squeue":
            state = self.states(self.clock(), self.cancelled)
            return CommandResult(0, state + ("\n" if state else ""), "")
        if argv[0] == "scancel":
            if "--batch" not in argv:
                self.cancelled = True
            return CommandResult(0, "", "")
        if argv[0] == "head" and "-v" in argv:  # the end records
            paths = argv[argv.index("--") + 1:]
            return CommandResult(0, "".join(f"==> {p} <==\n{self.end_records[p]}"
                                            for p in paths if p in self.end_records), "")
        if argv[0] == "head":
            return CommandResult(0, self.node_output, "")
        if argv[0] == "find":  # pruning the end records
            return CommandResult(0, "", "")
        raise AssertionError(argv)

    def close(self) -> None:
        pass


def probe(slurm: FakeSlurm, clock: Clock, ads: Callable[[str], Sequence[Mapping[str, Any]]]
          ) -> Probe:
    backend = SlurmCliBackend(name="frankfurt", provisioner_id="testbed-probe",
                              executor=slurm, partition="general1",
                              output_dir="/var/log/pilots", log_dir="/var/log/pilots")
    return Probe(0, SITE, CONFIG, backend, ads, Limits(pending_s=60, join_s=120, leave_s=30,
                                                       poll_s=5), clock, clock.sleep,
                 tokens=PilotTokens(CONFIG, reconfig=lambda: None, list_suffix=".probe",
                                    minter=fake_mint))


def fake_mint(site: str, uid_domain: str, key: str, lifetime: int) -> PilotToken:
    """A token as condor_token_create would return it, for the fake SLURM."""
    identity = identity_of(site, uid_domain)
    return PilotToken(site, identity, "ab" * 16, 0, lifetime, "aGVhZA.cGF5bG9hZA.c2ln")


def test_a_probe_slurm_keeps_pending_is_given_up_and_cancelled() -> None:
    clock = Clock()
    slurm = FakeSlurm(clock, lambda t, cancelled: "" if cancelled else "PENDING|Resources")
    rows = {r.name: r for r in probe(slurm, clock, lambda c: []).run()}
    assert rows["probe starts"].ok is False
    assert rows["probe starts"].found == "pending for 60 s: Resources"
    assert ["scancel", "42"] in slurm.calls
    assert rows["cleaned up"].ok is True
    assert rows["reaches the collector"].ok is None
    assert "image readable on the worker" not in rows  # never ran: no node rows


def test_a_probe_whose_startd_never_joins_fails_at_reaches_the_collector() -> None:
    clock = Clock()
    slurm = FakeSlurm(clock, lambda t, cancelled: "" if cancelled else
                      ("PENDING|Priority" if t < 10 else "RUNNING|None"))
    rows = {r.name: r for r in probe(slurm, clock, lambda c: []).run()}
    assert rows["probe starts"].ok and rows["probe starts"].seconds == 10
    assert rows["reaches the collector"].ok is False
    # the worker's own check already says it cannot connect: no waiting out join_s
    assert rows["reaches the collector"].found == (
        "no startd ad of job 42: the node checks failed (worker connects to the "
        "collector), after 0 s")
    worker = rows["worker connects to the collector"]
    assert worker.ok is False and "cannot connect to cm:9618" in worker.found
    assert "pool.collector cm:9618" in worker.fix
    assert rows["XRootD cache answers"].ok is True
    assert ["scancel", "42"] in slurm.calls and rows["cleaned up"].ok
    assert not site_ok(rows.values())


def test_a_probe_that_fails_before_joining_shows_the_pilots_own_reason() -> None:
    """The pilot's work directory could not be prepared (a full scratch): the failing
    row carries its end record and the line of its output that says why."""
    clock = Clock()
    slurm = FakeSlurm(clock, lambda t, cancelled: "" if cancelled or t >= 20 else
                      "RUNNING|None")
    slurm.node_output = NODE_OUTPUT.replace('"ok": false', '"ok": true') + (
        "ERROR provisioner.pilot: prepare failed: [Errno 28] No space left on device: "
        "'/scratch/pilot-42'\nINFO provisioner.pilot: end record written\n")
    record = EndRecord("42", "frankfurt", "testbed-probe", 1000.0, 1010.0, 1,
                       "prepare-failed")
    slurm.end_records["/var/log/pilots/end/frankfurt-42.json"] = record.to_json()
    rows = {r.name: r for r in probe(slurm, clock, lambda c: []).run()}
    found = rows["reaches the collector"].found
    assert rows["reaches the collector"].ok is False
    assert "its end record: prepare-failed (its work directory or configuration could " \
           "not be prepared)" in found, found
    assert "its output: ERROR provisioner.pilot: prepare failed: [Errno 28] No space left " \
           "on device" in found, found


def test_a_probe_whose_node_checks_pass_but_never_joins_waits_out_the_join_limit() -> None:
    clock = Clock()
    slurm = FakeSlurm(clock, lambda t, cancelled: "" if cancelled else "RUNNING|None")
    slurm.node_output = NODE_OUTPUT.replace('"ok": false', '"ok": true')
    rows = {r.name: r for r in probe(slurm, clock, lambda c: []).run()}
    assert rows["reaches the collector"].found == (
        "no startd ad of job 42: within 120 s of its start")
    assert rows["worker connects to the collector"].ok is True
    assert ["scancel", "42"] in slurm.calls and rows["cleaned up"].ok


def test_a_probe_that_joins_is_released_then_cancelled_and_its_ad_gone() -> None:
    clock = Clock()
    slurm = FakeSlurm(clock, lambda t, cancelled: "" if cancelled else "RUNNING|None")
    slurm.node_output = NODE_OUTPUT.replace('"ok": false', '"ok": true')
    ad = {"Name": "pilot-frankfurt-42@fra-n1", "PilotContainerTest": "ok: apptainer 3.1 s"}
    released: list[float] = []

    def ads(constraint: str) -> list[dict[str, str]]:
        assert 'PilotSlurmJobId == "42"' in constraint
        assert 'PilotProvisionerId == "testbed-probe"' in constraint
        if any("--signal=USR1" in a for a in slurm.calls[-1:]) and not released:
            released.append(clock())
        return [] if released or clock() < 15 else [ad]

    rows = {r.name: r for r in probe(slurm, clock, ads).run()}
    assert rows["reaches the collector"].ok and rows["reaches the collector"].seconds == 15
    assert rows["nested-container self-test"].found == "ok: apptainer 3.1 s"
    assert rows["ad leaves the collector"].ok
    release = ["scancel", "--batch", "--signal=USR1", "42"]
    assert slurm.calls.index(release) < slurm.calls.index(["scancel", "42"])
    assert rows["cleaned up"].ok


def test_a_probe_whose_container_test_runs_beside_its_master_waits_for_the_outcome(
        ) -> None:
    clock = Clock()
    slurm = FakeSlurm(clock, lambda t, cancelled: "" if cancelled else "RUNNING|None")
    slurm.node_output = NODE_OUTPUT.replace('"ok": false', '"ok": true')
    running = {"Name": "pilot-frankfurt-42@fra-n1",
               "PilotContainerTest": "running: apptainer exec of /p.sif, beside the master"}
    tested = {**running, "PilotContainerTest": "ok: apptainer exec of /p.sif: 4.0 s"}

    def ads(constraint: str) -> list[dict[str, str]]:
        if any("--signal=USR1" in a for a in slurm.calls):
            return []
        return [] if clock() < 15 else [running] if clock() < 30 else [tested]

    rows = {r.name: r for r in probe(slurm, clock, ads).run()}
    assert rows["reaches the collector"].seconds == 15
    assert rows["nested-container self-test"].ok
    assert rows["nested-container self-test"].found == "ok: apptainer exec of /p.sif: 4.0 s"


def test_the_probe_script_is_the_real_one_plus_node_checks_and_no_jobs() -> None:
    slurm = FakeSlurm(Clock(), lambda t, c: "")
    script = probe(slurm, Clock(), lambda c: []).request().script
    real = render_pilot_script(CONFIG, SITE, 600, 0)
    lines = script.splitlines()
    assert lines[-1] == real.splitlines()[-1] == \
        "exec /opt/venv/bin/python -m provisioner.pilot.wrapper"
    assert lines[-3:-1] == ["/opt/venv/bin/python -m provisioner.onboard.nodecheck",
                            "export APPTAINERENV__CONDOR_START=False"]
    assert "export PILOT_PROVISIONER_ID=testbed-probe" in lines
    with pytest.raises(ProbeScriptError, match="no line `exec"):
        probe_script("#!/bin/bash\necho hi\n")


def test_parsers_of_what_the_probe_reads_back() -> None:
    steps = parse_node_lines(NODE_OUTPUT + "onboard-probe {broken\n")
    assert set(steps) == {"image", "apptainer", "collector", "xcache"}
    assert steps["collector"][0] is False
    assert parse_squeue_state("PENDING|QOSMaxJobsPerUserLimit\n") == \
        ("PENDING", "QOSMaxJobsPerUserLimit")
    assert parse_squeue_state("") is None


def test_xcache_step_speaks_the_xrootd_handshake_and_names_a_silent_cache() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    got: list[bytes] = []

    def answer() -> None:
        conn, _ = server.accept()
        got.append(conn.recv(20))
        conn.sendall(struct.pack("!HHi", 0, 0, 8) + struct.pack("!ii", 0x520, 1))
        conn.close()

    thread = threading.Thread(target=answer)
    thread.start()
    port = server.getsockname()[1]
    ok, detail = nodecheck.check_xcache({"PILOT_XCACHE": f"root://127.0.0.1:{port}"})
    thread.join()
    server.close()
    assert got == [struct.pack("!iiiii", 0, 0, 0, 4, 2012)]
    assert ok and detail == f"XRootD at 127.0.0.1:{port} (protocol 0x520)"
    ok, detail = nodecheck.check_xcache({"PILOT_XCACHE": f"root://127.0.0.1:{port}"})
    assert not ok and "does not answer" in detail


def test_the_table_marks_rows_and_shows_fixes_only_for_failures() -> None:
    rows = [passed("host reachable", "yes", "ssh", 0.21),
            failed("image on the login node", "no /opt/images/x.sif",
                   "publish the pilot image at sites[1].image", "image"),
            skipped("probe pilot", "--no-probe", "probe")]
    text = render("frankfurt", rows, 1.5)
    assert text.splitlines() == [
        "Site frankfurt: 1 check(s) failed in 1.5 s",
        "  ✔ host reachable           yes (0.2 s)",
        "  ✗ image on the login node  no /opt/images/x.sif",
        "                             fix: publish the pilot image at sites[1].image",
        "  - probe pilot              --no-probe"]
    doc = json.loads(as_json({"frankfurt": (rows, 1.5)}))
    assert doc["frankfurt"]["ok"] is False
    assert [c["ok"] for c in doc["frankfurt"]["checks"]] == [True, False, None]
    assert site_ok(rows[:1] + rows[2:])
