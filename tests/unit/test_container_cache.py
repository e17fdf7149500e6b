"""A passed container start-up test, cached per node: when a pilot may skip the nested
``apptainer exec``, where the record lives and whom it trusts, and how the setting
reaches the pilot."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from provisioner.config import ConfigError, PilotRuntimeConfig, parse_config
from provisioner.pilot import testcache
from provisioner.pilot.containers import self_test_argv
from provisioner.pilot.params import PilotError, params_from_env
from provisioner.pilot.script import render_pilot_script
from provisioner.pilot.wrapper import PilotRun
from tests.unit.test_gpus import SITE_YAML
from tests.unit.test_wrapper import ENV

NOW = 1_000_000.0
TTL = 3600


def images(tmp_path: Path) -> tuple[str, str]:
    """(test image, pilot image): files whose size and mtime the key holds."""
    test, pilot = tmp_path / "test.sif", tmp_path / "pilot.sif"
    test.write_bytes(b"test image")
    pilot.write_bytes(b"pilot image")
    return str(test), str(pilot)


def key(tmp_path: Path, hostname: str = "wn001") -> dict[str, Any]:
    """The key of the images in `tmp_path` (made on first use) on node `hostname`."""
    if not (tmp_path / "test.sif").exists():
        images(tmp_path)
    test, pilot = str(tmp_path / "test.sif"), str(tmp_path / "pilot.sif")
    return testcache.node_key(test, pilot, self_test_argv(test), hostname=hostname,
                              kernel="6.1.0-13-amd64")


def passed(k: dict[str, Any], at: float = NOW - 60, seconds: float = 5.5) -> dict[str, Any]:
    return testcache.new_record(k, at, seconds)


# --- the decision ---------------------------------------------------------------------


def test_a_fresh_record_with_the_same_key_stands_for_the_test(tmp_path: Path) -> None:
    k = key(tmp_path)
    support = testcache.lookup(passed(k), k, NOW, TTL, "/img/test.sif")
    assert support is not None and support.ok
    assert support.detail == ("apptainer exec of /img/test.sif: passed 60 s ago on this "
                              "node (cached; took 5.5 s)")
    assert testcache.valid(passed(k), k, NOW, TTL)


def test_an_expired_record_does_not(tmp_path: Path) -> None:
    k = key(tmp_path)
    assert testcache.valid(passed(k, at=NOW - TTL + 1), k, NOW, TTL)
    assert not testcache.valid(passed(k, at=NOW - TTL), k, NOW, TTL)
    assert testcache.lookup(passed(k, at=NOW - TTL - 1), k, NOW, TTL, "/i") is None
    # A record from the future (the clock went back): not trusted either.
    assert not testcache.valid(passed(k, at=NOW + 10), k, NOW, TTL)


def test_ttl_zero_disables_the_cache(tmp_path: Path) -> None:
    k = key(tmp_path)
    assert testcache.valid(passed(k), k, NOW, 61)  # control: the record itself is good
    assert not testcache.valid(passed(k), k, NOW, 0)
    assert testcache.lookup(passed(k), k, NOW, 0, "/i") is None


def test_a_changed_image_or_another_node_is_another_key(tmp_path: Path) -> None:
    k = key(tmp_path)
    record = passed(k)
    assert testcache.valid(record, key(tmp_path), NOW, TTL)  # control: same node, same files
    st = os.stat(tmp_path / "test.sif")
    os.utime(tmp_path / "test.sif", ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert not testcache.valid(record, key(tmp_path), NOW, TTL)
    record = passed(key(tmp_path))
    assert not testcache.valid(record, key(tmp_path, hostname="wn002"), NOW, TTL)
    (tmp_path / "pilot.sif").write_bytes(b"a new pilot image")
    assert not testcache.valid(record, key(tmp_path), NOW, TTL)


@pytest.mark.parametrize("damage", [
    {"key": "x"}, {"passed_at": "yesterday"}, {"passed_at": None}, {"seconds": "5.5"},
])
def test_a_malformed_record_is_no_record(tmp_path: Path, damage: dict[str, Any]) -> None:
    k = key(tmp_path)
    assert testcache.lookup(passed(k), k, NOW, TTL, "/i") is not None  # control
    assert testcache.lookup({**passed(k), **damage}, k, NOW, TTL, "/i") is None
    record = passed(k)
    del record["seconds"]
    assert testcache.lookup(record, k, NOW, TTL, "/i") is None
    assert testcache.lookup(None, k, NOW, TTL, "/i") is None
    assert not testcache.valid(None, k, NOW, TTL)


# --- the file -------------------------------------------------------------------------


def test_the_record_is_written_0600_in_a_0700_directory_and_read_back(
        tmp_path: Path) -> None:
    path = testcache.cache_file(tmp_path / "scratch")
    assert path == (tmp_path / "scratch" / ".pilot-cache" /
                    f"container-test-{socket.gethostname()}.json")
    # Nodes sharing a scratch directory keep a record each; a host name is made safe.
    assert testcache.cache_file(tmp_path, "n1") != testcache.cache_file(tmp_path, "n2")
    assert testcache.cache_file(tmp_path, "../x").name == "container-test-.._x.json"
    (tmp_path / "scratch" / ".pilot-cache").mkdir(parents=True, mode=0o755)
    os.chmod(tmp_path / "scratch" / ".pilot-cache", 0o755)
    record = passed(key(tmp_path))
    testcache.write_record(path, record)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert os.listdir(path.parent) == [path.name]  # no temporary file left
    assert testcache.read_record(path) == record


def test_a_new_directory_is_made_0700(tmp_path: Path) -> None:
    path = testcache.cache_file(tmp_path)
    old = os.umask(0)
    try:
        testcache.write_record(path, {"x": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_a_failed_write_leaves_the_old_record_and_no_temporary_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = testcache.cache_file(tmp_path)
    testcache.write_record(path, {"old": 1})

    def no_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(testcache.os, "replace", no_replace)
    with pytest.raises(OSError, match="disk full"):
        testcache.write_record(path, {"new": 2})
    assert json.loads(path.read_text()) == {"old": 1}
    assert os.listdir(path.parent) == [path.name]


def test_corrupt_or_foreign_files_are_not_read(tmp_path: Path) -> None:
    path = testcache.cache_file(tmp_path)
    testcache.write_record(path, {"x": 1})
    assert testcache.read_record(path) == {"x": 1}  # control
    assert testcache.read_record(path, uid=os.getuid() + 1) is None  # another owner
    path.write_text('{"x": 1')
    assert testcache.read_record(path) is None
    path.write_text("[1, 2]")
    assert testcache.read_record(path) is None
    path.write_bytes(b"\xff\xfe")
    assert testcache.read_record(path) is None
    assert testcache.read_record(tmp_path / "absent" / "container-test.json") is None


@pytest.mark.parametrize("mode", [0o620, 0o602])
def test_a_file_others_may_write_is_not_read(tmp_path: Path, mode: int) -> None:
    path = testcache.cache_file(tmp_path)
    testcache.write_record(path, {"x": 1})
    os.chmod(path, mode)
    assert testcache.read_record(path) is None
    os.chmod(path, 0o600)
    assert testcache.read_record(path) == {"x": 1}


def test_a_directory_others_may_write_or_a_link_is_not_read(tmp_path: Path) -> None:
    path = testcache.cache_file(tmp_path)
    testcache.write_record(path, {"x": 1})
    os.chmod(path.parent, 0o770)
    assert testcache.read_record(path) is None
    os.chmod(path.parent, 0o700)
    link = path.parent / "link.json"
    link.symlink_to(path)
    assert testcache.read_record(path) == {"x": 1}
    assert testcache.read_record(link) is None


# --- the pilot ------------------------------------------------------------------------


class Node:
    """A worker node: scratch, images, and a pilot whose nested test is counted."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                 ttl: int = TTL, containers: bool = True) -> None:
        self.tmp = tmp_path
        self.monkeypatch = monkeypatch
        self.test_image, self.pilot_image = images(tmp_path)
        self.params = dataclasses.replace(
            params_from_env(ENV, 0.0), scratch=tmp_path / "scratch", containers=containers,
            image=self.pilot_image, container_test_image=self.test_image,
            container_test_cache_s=ttl)
        self.params.scratch.mkdir(exist_ok=True)
        monkeypatch.setattr(testcache.socket, "gethostname", lambda: "wn001")
        self.cache = testcache.cache_file(self.params.scratch)
        self.calls: list[list[str]] = []
        self.rc = 0

    def start(self, now: float = NOW) -> tuple[Any, str]:
        """One pilot's enable_containers at `now`: (its outcome, its config file)."""
        config = self.tmp / "condor_config"
        config.write_text("")
        pilot = PilotRun(self.params, self.tmp / "work", config)

        def execute(argv: list[str]) -> tuple[int, str]:
            self.calls.append(argv)
            return self.rc, "" if self.rc == 0 else "FATAL: no user namespaces"

        self.monkeypatch.setattr(pilot, "_in_container", execute)
        pilot.clock = lambda: now
        return pilot.enable_containers(), config.read_text()


def test_a_pilot_after_a_pass_on_its_node_skips_the_test(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, monkeypatch)
    first, _ = node.start()
    assert first.ok and len(node.calls) == 1 and "cached" not in first.detail
    record = json.loads(node.cache.read_text())
    assert record["key"]["argv"] == node.calls[0] and record["passed_at"] == NOW
    assert record["key"]["hostname"] == "wn001"
    assert record["key"]["kernel"] == os.uname().release
    assert record["key"]["test_image"]["path"] == node.test_image
    assert record["key"]["pilot_image"]["mtime_ns"] == os.stat(node.pilot_image).st_mtime_ns
    second, config = node.start(NOW + 120)
    assert len(node.calls) == 1  # the nested test did not run again
    assert second.ok and second.detail.startswith(
        f"apptainer exec of {node.test_image}: passed 120 s ago on this node (cached; took ")
    assert "SINGULARITY = /usr/bin/apptainer\n" in config and "(cached; took" in config


def test_an_expired_pass_is_tested_again(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, monkeypatch)
    node.start()
    node.start(NOW + TTL)
    assert len(node.calls) == 2
    assert json.loads(node.cache.read_text())["passed_at"] == NOW + TTL


def test_a_changed_image_or_another_host_is_tested_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, monkeypatch)
    node.start()
    st = os.stat(node.test_image)
    os.utime(node.test_image, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    node.start(NOW + 1)
    assert len(node.calls) == 2
    node.start(NOW + 2)
    assert len(node.calls) == 2  # the new pass stands
    monkeypatch.setattr(testcache.socket, "gethostname", lambda: "wn002")
    node.start(NOW + 3)
    assert len(node.calls) == 3
    # A scratch directory shared by nodes: each keeps its own record.
    monkeypatch.setattr(testcache.socket, "gethostname", lambda: "wn001")
    node.start(NOW + 4)
    assert len(node.calls) == 3


def test_a_failed_test_is_never_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, monkeypatch)
    node.rc = 255
    support, config = node.start()
    assert not support.ok and 'SINGULARITY = \n' in config
    assert not node.cache.exists()
    node.rc = 0  # the node got fixed: the next pilot tests, passes and caches
    assert node.start(NOW + 1)[0].ok and len(node.calls) == 2 and node.cache.exists()


def test_a_failed_test_leaves_an_older_pass_alone_but_is_not_skipped_by_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, monkeypatch)
    node.start()
    before = node.cache.read_text()
    node.rc = 255
    node.start(NOW + TTL)  # expired: tested, fails
    assert len(node.calls) == 2 and node.cache.read_text() == before


def test_a_corrupt_cache_file_means_the_test_runs_and_is_rewritten(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, monkeypatch)
    node.start()
    node.cache.write_text(node.cache.read_text()[:-5])
    support, _ = node.start(NOW + 1)
    assert support.ok and len(node.calls) == 2
    assert json.loads(node.cache.read_text())["passed_at"] == NOW + 1


def test_a_group_writable_cache_file_is_ignored(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, monkeypatch)
    node.start()
    os.chmod(node.cache, 0o660)
    node.start(NOW + 1)
    assert len(node.calls) == 2
    assert stat.S_IMODE(os.stat(node.cache).st_mode) == 0o600  # replaced by its own


def test_ttl_zero_always_tests_and_writes_nothing(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, monkeypatch, ttl=0)
    node.start()
    assert not node.cache.parent.exists()
    cached = Node(tmp_path, monkeypatch)
    cached.start()  # a pass cached while the cache was on
    node.start(NOW + 1)
    assert len(node.calls) == 2


def test_an_unwritable_cache_does_not_stop_the_pilot(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, monkeypatch)
    node.cache.parent.write_text("not a directory")
    support, config = node.start()
    assert support.ok and "SINGULARITY = /usr/bin/apptainer\n" in config


def test_without_containers_nothing_is_tested_or_cached(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, monkeypatch, containers=False)
    support, config = node.start()
    assert support is None and config == "" and node.calls == []
    assert not node.cache.parent.exists()


# --- the setting ----------------------------------------------------------------------


def test_the_pilot_reads_the_ttl_from_its_environment_with_a_default() -> None:
    assert params_from_env(ENV, 0.0).container_test_cache_s == 21600
    assert testcache.DEFAULT_TTL_S == PilotRuntimeConfig().container_test_cache_s == 21600
    env = {**ENV, "PILOT_CONTAINER_TEST_CACHE_S": "600"}
    assert params_from_env(env, 0.0).container_test_cache_s == 600
    assert params_from_env({**env, "PILOT_CONTAINER_TEST_CACHE_S": "0"},
                           0.0).container_test_cache_s == 0
    with pytest.raises(PilotError, match="PILOT_CONTAINER_TEST_CACHE_S"):
        params_from_env({**env, "PILOT_CONTAINER_TEST_CACHE_S": "6h"}, 0.0)


@pytest.mark.parametrize(("runtime", "expected"), [("", 21600),
                                                   ("container_test_cache_s: 600, ", 600),
                                                   ("container_test_cache_s: 0, ", 0)])
def test_the_batch_script_passes_the_sites_ttl_to_the_pilot(runtime: str,
                                                            expected: int) -> None:
    cfg = parse_config(SITE_YAML.replace("runtime: {", "runtime: {" + runtime), "t.yaml")
    script = render_pilot_script(cfg, cfg.site("gpu"), 3600, gpus=0)
    head, _, _ = script.rpartition("exec ")
    out = subprocess.run(["bash", "-c", head + "env -0\n"], env={"PATH": "/usr/bin:/bin",
                         "SLURM_JOB_ID": "7"}, capture_output=True, check=True).stdout
    env = dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    assert env["PILOT_CONTAINER_TEST_CACHE_S"] == str(expected)
    assert params_from_env(env, 0.0).container_test_cache_s == expected


def test_a_negative_ttl_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(SITE_YAML.replace("runtime: {", "runtime: {container_test_cache_s: -1, "),
                     "t.yaml")
    assert "sites[0].runtime.container_test_cache_s" in str(err.value)
    assert "greater than or equal to 0" in str(err.value) and "-1" in str(err.value)
