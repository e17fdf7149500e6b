"""The container start-up test beside the master: where no pass is cached and the site
sets no payload image, the startd starts with containers off and says the test runs;
the test's outcome is added to the configuration and the startd reconfigured once it
ended. With a payload image (every job in a container) or a cached pass, the order is
the one before: test (or record), then the master."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import pytest

from provisioner.pilot import testcache, workfiles
from provisioner.pilot.containers import (
    RUNNING,
    ContainerSupport,
    container_config,
    defer_test,
    pending_config,
)
from provisioner.pilot.nested import STARTD_ADDRESS_FILE
from provisioner.pilot.params import params_from_env
from provisioner.pilot.wrapper import PilotRun
from tests.unit.test_container_cache import NOW, TTL, images
from tests.unit.test_starter_answer import ANSWER
from tests.unit.test_wrapper import ENV

PAYLOAD = "/images/payload.sif"


@pytest.mark.parametrize(("payload", "cached", "beside"), [
    ("", False, True), ("", True, False), (PAYLOAD, False, False), (PAYLOAD, True, False)])
def test_only_a_node_without_a_pass_and_a_site_without_payload_image_tests_beside(
        payload: str, cached: bool, beside: bool) -> None:
    assert defer_test(payload, cached) is beside


def test_while_the_test_runs_the_startd_offers_no_containers_and_says_why() -> None:
    settings = pending_config("/p.sif")
    assert settings["SINGULARITY"] == ""
    assert settings["PilotContainerTest"].startswith(f'"{RUNNING}apptainer exec of /p.sif')
    assert "STARTER" not in settings and "SINGULARITY_JOB" not in settings


class Node:
    """A worker node, one pilot on it, and what that pilot ran in its container."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                 payload_image: str = "") -> None:
        test_image, pilot_image = images(tmp_path)
        site_config = tmp_path / "pilot.conf"
        site_config.write_text("UPDATE_INTERVAL = 30\n")
        self.params = dataclasses.replace(
            params_from_env(ENV, 0.0), scratch=tmp_path / "scratch", containers=True,
            image=pilot_image, container_test_image=test_image, container_test_cache_s=TTL,
            condor_config=site_config, payload_image=payload_image)
        self.params.scratch.mkdir()
        monkeypatch.setattr(testcache.socket, "gethostname", lambda: "wn001")
        self.monkeypatch = monkeypatch
        self.cache = testcache.cache_file(self.params.scratch)
        self.calls: list[str] = []
        self.test_rc = 0
        self.n = 0

    def pilot(self, now: float = NOW) -> PilotRun:
        self.n += 1
        workdir = self.params.scratch / f"pilot-{self.n}"
        (workdir / "local" / "log").mkdir(parents=True)
        workfiles.install(workdir, self.params.scratch)
        config = workdir / "condor_config"
        config.write_text("# pilot.conf\n")
        pilot = PilotRun(self.params, workdir, config)

        def execute(argv: list[str]) -> tuple[int, str]:
            name = argv[0].rsplit("/", 1)[-1]
            self.calls.append(name)
            if name == "condor_who":  # the startd is up: its address file is there
                (workdir / "local" / "log" / STARTD_ADDRESS_FILE).write_text("<addr>\n")
            rc = self.test_rc if name == "apptainer" else 0
            return rc, "" if rc == 0 else "FATAL: no user namespaces"

        self.monkeypatch.setattr(pilot, "_in_container", execute)
        pilot.clock = lambda: now
        return pilot


def _settings(text: str) -> dict[str, str]:
    """The configuration's values as HTCondor reads them: the last definition wins."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if " = " in line and not line.startswith("#"):
            k, v = line.split(" = ", 1)
            out[k] = v
    return out


def test_a_cold_node_starts_the_master_with_containers_off_and_tests_beside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, monkeypatch)
    pilot = node.pilot()
    assert pilot.test_later()
    assert node.calls == []  # nothing ran before the master
    before = _settings(pilot.config.read_text())
    assert before["SINGULARITY"] == "" and before["PilotContainerTest"].startswith(
        f'"{RUNNING}') and "STARTER" not in before
    (pilot.workdir / workfiles.STARTER_CLASSAD_NEW).write_text(ANSWER)  # at the reconfig
    support = pilot.enable_containers_later()
    assert support is not None and support.ok
    assert node.calls == ["condor_who", "apptainer", "condor_reconfig"]
    text = pilot.config.read_text()
    after = _settings(text)
    assert after["SINGULARITY"] == "/usr/bin/apptainer"
    assert after["STARTER"] == str(pilot.workdir / workfiles.STARTER)
    assert after["PilotContainerTest"].startswith('"ok: apptainer exec of')
    assert after["PilotBootTested"] == f"{NOW:.3f}"
    assert text.count("PilotContainerTest\n") == 1  # named in STARTD_ATTRS once
    assert not list(pilot.workdir.glob(".*.new"))  # replaced whole, nothing left over
    record = json.loads(node.cache.read_text())
    assert record["passed_at"] == NOW and record["starter"]["classad"] == ANSWER


def test_the_next_pilot_reads_the_pass_and_the_answer_and_starts_with_containers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass and the starter's answer kept by a pilot that tested beside its master
    serve the next pilot on the node (the same configuration digest as a test before
    the master gives)."""
    node = Node(tmp_path, monkeypatch)
    first = node.pilot()
    assert first.test_later()
    (first.workdir / workfiles.STARTER_CLASSAD_NEW).write_text(ANSWER)
    first.enable_containers_later()
    node.calls.clear()
    second = node.pilot(NOW + 60)
    assert not second.test_later()
    support = second.enable_containers()
    assert support is not None and support.ok and "cached" in support.detail
    assert node.calls == []
    assert (second.workdir / workfiles.STARTER_CLASSAD).read_text() == ANSWER
    assert _settings(second.config.read_text())["SINGULARITY"] == "/usr/bin/apptainer"


def test_a_failed_test_beside_the_master_keeps_containers_off_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, monkeypatch)
    node.test_rc = 255
    pilot = node.pilot()
    assert pilot.test_later()
    support = pilot.enable_containers_later()
    assert support is not None and not support.ok
    after = _settings(pilot.config.read_text())
    assert after["SINGULARITY"] == "" and "STARTER" not in after
    assert after["PilotContainerTest"].startswith('"failed: apptainer exec of')
    assert node.calls[-1] == "condor_reconfig"  # the ad says so
    assert not node.cache.exists()


def test_a_site_with_a_payload_image_tests_before_the_master(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, monkeypatch, payload_image=PAYLOAD)
    pilot = node.pilot()
    assert not pilot.test_later()
    assert "PilotContainerTest" not in pilot.config.read_text()
    support = pilot.enable_containers()
    assert support is not None and support.ok and node.calls == ["apptainer"]
    settings = _settings(pilot.config.read_text())
    assert settings["SINGULARITY"] == "/usr/bin/apptainer"
    assert settings["SINGULARITY_JOB"] == "true"


def test_a_pilot_that_ends_first_does_not_reconfigure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, monkeypatch)
    pilot = node.pilot()
    pilot.test_later()
    pilot.ended = threading.Event()
    pilot.ended.set()
    monkeypatch.setattr(pilot, "_wait_for_startd", lambda: None)  # no address file then
    support = pilot.enable_containers_later()
    assert support is not None and support.ok
    assert "condor_reconfig" not in node.calls


def test_a_pilot_that_began_to_stop_does_not_reconfigure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, monkeypatch)
    pilot = node.pilot()
    pilot.test_later()
    pilot.stopping = True
    assert pilot.enable_containers_later() is not None
    assert "condor_reconfig" not in node.calls


def test_a_test_beside_that_breaks_off_says_so_and_leaves_containers_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
        ) -> None:
    node = Node(tmp_path, monkeypatch)
    pilot = node.pilot()
    pilot.test_later()

    def broken(argv: list[str]) -> tuple[int, str]:
        raise OSError("apptainer: no such file")

    monkeypatch.setattr(pilot, "_in_container", broken)
    assert pilot.enable_containers_later() is None
    assert "broke off" in caplog.text
    assert _settings(pilot.config.read_text())["SINGULARITY"] == ""


def test_the_settings_of_a_pass_are_those_of_a_pass_before_the_master() -> None:
    ok = ContainerSupport(True, "apptainer exec of /p.sif: 1.0 s")
    assert set(container_config(ok)) - set(pending_config("/p.sif")) == set()
