"""The startd's capability query (``condor_starter -classad``) answered from the node's
record: the starter runs two nested containers before it answers, seconds of every
pilot's boot. The pilot's STARTER script gives the answer kept for this node, images
and configuration, or asks the real starter and leaves the answer for the wrapper to
keep; only an answer that says containers work is kept, and it is served only while
the record of a passed container test stands."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from provisioner.pilot import testcache, workfiles
from provisioner.pilot.params import params_from_env
from provisioner.pilot.wrapper import PilotRun
from tests.unit.test_container_cache import NOW, TTL, images, key, passed
from tests.unit.test_wrapper import ENV

ANSWER = ("HasFileTransfer = true\nHasSingularity = True\nHasSIF = True\n"
          'SingularityVersion = "apptainer version 1.4.5"\nHasSingularityPidNamespaces = True\n')
SCRIPT = Path(__file__).parents[2] / "provisioner" / "pilot" / "files" / "starter.sh"


# --- what is kept, and when it stands -------------------------------------------------


def test_an_answer_that_says_containers_work_is_kept() -> None:
    assert testcache.starter_classad_ok(ANSWER)


@pytest.mark.parametrize("text", [
    "", "HasFileTransfer = true\n",  # nothing, or containers not working
    ANSWER.replace("HasSingularity = True", "HasSingularity = False"),
    ANSWER + "not a classad line\n", ANSWER + "X = \n",
    ANSWER + "Big = " + "x" * testcache.MAX_BYTES + "\n",
])
def test_an_empty_odd_or_negative_answer_is_not(text: str) -> None:
    assert not testcache.starter_classad_ok(text)


def test_the_answer_stands_for_its_key_configuration_and_ttl(tmp_path: Path) -> None:
    k = key(tmp_path)
    record = testcache.with_starter_classad(passed(k), "digest-a", ANSWER)
    assert testcache.valid(record, k, NOW, TTL)  # still a passed test's record
    assert testcache.cached_starter_classad(record, k, NOW, TTL, "digest-a") == ANSWER
    assert testcache.cached_starter_classad(record, k, NOW, TTL, "digest-b") is None
    assert testcache.cached_starter_classad(record, k, NOW + TTL, TTL, "digest-a") is None
    assert testcache.cached_starter_classad(record, key(tmp_path, "wn002"), NOW, TTL,
                                            "digest-a") is None
    assert testcache.cached_starter_classad(passed(k), k, NOW, TTL, "digest-a") is None
    planted = testcache.with_starter_classad(passed(k), "digest-a", "Evil = 1\n")
    assert testcache.cached_starter_classad(planted, k, NOW, TTL, "digest-a") is None


def test_the_configuration_digest_tells_its_parts_apart() -> None:
    assert testcache.config_digest("a", "b") == testcache.config_digest("a", "b")
    assert testcache.config_digest("a", "b") != testcache.config_digest("ab", "")
    assert testcache.config_digest("a", "b") != testcache.config_digest("a", "c")


# --- the pilot ------------------------------------------------------------------------


class Node:
    """A worker node whose pilots have their work directory and scripts."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp = tmp_path
        test_image, pilot_image = images(tmp_path)
        self.site_config = tmp_path / "pilot.conf"
        self.site_config.write_text("UPDATE_INTERVAL = 30\n")
        self.params = dataclasses.replace(
            params_from_env(ENV, 0.0), scratch=tmp_path / "scratch", containers=True,
            image=pilot_image, container_test_image=test_image, container_test_cache_s=TTL,
            condor_config=self.site_config)
        self.params.scratch.mkdir()
        monkeypatch.setattr(testcache.socket, "gethostname", lambda: "wn001")
        self.monkeypatch = monkeypatch
        self.cache = testcache.cache_file(self.params.scratch)
        self.tests = 0
        self.n = 0

    def start(self, now: float = NOW) -> tuple[PilotRun, str]:
        """One pilot up to its master's start: (the pilot, its configuration)."""
        self.n += 1
        workdir = self.params.scratch / f"pilot-{self.n}"
        workdir.mkdir(mode=0o700)
        workfiles.install(workdir, self.params.scratch)
        config = workdir / "condor_config"
        config.write_text("")
        pilot = PilotRun(self.params, workdir, config)

        def execute(argv: list[str]) -> tuple[int, str]:
            self.tests += 1
            return 0, ""

        self.monkeypatch.setattr(pilot, "_in_container", execute)
        pilot.clock = lambda: now
        assert pilot.enable_containers() is not None
        return pilot, config.read_text()

    def starter_answers(self, pilot: PilotRun, text: str = ANSWER) -> None:
        """The real starter answered the startd (starter.sh leaves this file)."""
        (pilot.workdir / workfiles.STARTER_CLASSAD_NEW).write_text(text)
        pilot.keep_starter_answer()


def _record(node: Node) -> dict[str, Any]:
    return dict(json.loads(node.cache.read_text()))


def test_the_first_pilot_asks_the_starter_and_the_next_one_does_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, monkeypatch)
    first, config = node.start()
    script = first.workdir / workfiles.STARTER
    assert f"STARTER = {script}\n" in config
    assert not (first.workdir / workfiles.STARTER_CLASSAD).exists()  # the starter answers
    node.starter_answers(first)
    assert _record(node)["starter"]["classad"] == ANSWER
    second, config = node.start(NOW + 60)
    assert f"STARTER = {second.workdir / workfiles.STARTER}\n" in config
    answer = second.workdir / workfiles.STARTER_CLASSAD
    assert answer.read_text() == ANSWER and (answer.stat().st_mode & 0o777) == 0o600
    assert node.tests == 1  # and the pilot's own container test was cached too


def test_another_configuration_asks_the_starter_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, monkeypatch)
    first, _ = node.start()
    node.starter_answers(first)
    node.site_config.write_text("UPDATE_INTERVAL = 30\nSINGULARITY_BIND_EXPR = \"/cvmfs\"\n")
    second, _ = node.start(NOW + 60)
    assert not (second.workdir / workfiles.STARTER_CLASSAD).exists()
    node.starter_answers(second, ANSWER + "HasFoo = True\n")
    third, _ = node.start(NOW + 120)
    assert (third.workdir / workfiles.STARTER_CLASSAD).read_text() == ANSWER + "HasFoo = True\n"


def test_an_answer_without_containers_is_not_kept_nor_one_past_the_ttl(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, monkeypatch)
    first, _ = node.start()
    node.starter_answers(first, ANSWER.replace("= True", "= False"))
    assert "starter" not in _record(node)
    node.starter_answers(first)
    late, _ = node.start(NOW + TTL)  # the pass expired: tested again, answer asked again
    assert node.tests == 2 and not (late.workdir / workfiles.STARTER_CLASSAD).exists()


def test_no_answer_once_the_master_ended_keeps_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, monkeypatch)
    first, _ = node.start()
    first.ended.set()
    first.keep_starter_answer()  # returns at once: the pilot is over
    assert "starter" not in _record(node)


def test_with_the_cache_off_the_starter_is_htcondors_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, monkeypatch)
    node.params = dataclasses.replace(node.params, container_test_cache_s=0)
    _, config = node.start()
    assert "STARTER" not in config


# --- the script -----------------------------------------------------------------------


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A work directory with the STARTER script and a fake real starter that counts its
    calls and prints its argv, or the answer for -classad (exit status from a file)."""
    work = tmp_path / "work"
    work.mkdir()
    workfiles.install(work, tmp_path)
    real = tmp_path / "condor_starter"
    real.write_text('#!/bin/sh\necho x >> "$(dirname "$0")/calls"\n'
                    'if [ "$1" = -classad ]; then printf "%s" "$ANSWER"; '
                    'exit "$(cat "$(dirname "$0")/rc" 2>/dev/null || echo 0)"; fi\n'
                    'echo "args: $*"\n')
    real.chmod(0o755)
    return work


def _starter(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "PILOT_REAL_STARTER": str(work.parent / "condor_starter"),
           "ANSWER": ANSWER}
    return subprocess.run([str(work / workfiles.STARTER), *args], env=env,
                          capture_output=True, text=True, check=False, timeout=30)


def _calls(work: Path) -> int:
    calls = work.parent / "calls"
    return len(calls.read_text().splitlines()) if calls.exists() else 0


def test_script_without_an_answer_asks_the_starter_and_leaves_its_answer(workdir: Path) -> None:
    res = _starter(workdir, "-classad")
    assert res.returncode == 0 and res.stdout == ANSWER and _calls(workdir) == 1
    assert (workdir / workfiles.STARTER_CLASSAD_NEW).read_text() == ANSWER
    assert not list(workdir.glob(".starter-classad.*"))


def test_script_with_an_answer_gives_it_without_the_starter(workdir: Path) -> None:
    (workdir / workfiles.STARTER_CLASSAD).write_text("HasSingularity = True\n")
    res = _starter(workdir, "-classad")
    assert res.returncode == 0 and res.stdout == "HasSingularity = True\n"
    assert _calls(workdir) == 0


def test_script_runs_every_job_s_starter_as_the_starter(workdir: Path) -> None:
    (workdir / workfiles.STARTER_CLASSAD).write_text("HasSingularity = True\n")
    res = _starter(workdir, "-f", "-a", "slot1_1", "cm")
    assert res.returncode == 0 and res.stdout == "args: -f -a slot1_1 cm\n"
    assert _calls(workdir) == 1


def test_script_a_failed_answer_is_passed_on_and_not_left(workdir: Path) -> None:
    (workdir.parent / "rc").write_text("3\n")
    res = _starter(workdir, "-classad")
    assert res.returncode == 3 and res.stdout == ANSWER
    assert not (workdir / workfiles.STARTER_CLASSAD_NEW).exists()
    assert not list(workdir.glob(".starter-classad.*"))
