"""The pilot's container support: its start-up test, before the master or beside it,
and the starter's capability answer kept per node.

Before the master: where this node's record holds a pass (provisioner.pilot.testcache)
or the site sets a payload image, the pilot configures its startd by the outcome
(`ContainerSteps.enable_containers`), as provisioner.pilot.containers describes.

Beside the master (`containers.defer_test`: no cached pass, no payload image): the
startd starts with ``SINGULARITY`` empty and ``PilotContainerTest`` saying the test
runs, so plain jobs match at once and container jobs not yet. The test runs in a thread
(`ContainerSteps.enable_containers_later`); its outcome's settings are added to the
pilot's configuration (replaced whole, never half-written) and the startd is
reconfigured (``condor_reconfig -daemon startd`` in the pilot's container, to the local
startd by its address file). HTCondor's startd asks its starter again what the node
can run on every reconfig (condor_startd.V6/startd_main.cpp: ``finish_main_config``
calls ``Starter::config``, which runs ``STARTER -classad``), and publishes that answer
in each ad it sends after (``Resource::publish_single_slot_ad`` -> ``publish_static``
-> ``Starter::publish``). A reconfig leaves claims and running jobs alone
(``ResMgr::reconfig_resources``: device ids and hook keywords per slot, the same slot
types; a job's starter read its configuration when it started).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from provisioner.pilot import boot, testcache, workfiles
from provisioner.pilot.containers import (
    ContainerSupport,
    container_config,
    defer_test,
    pending_config,
    self_test,
    self_test_argv,
)
from provisioner.pilot.params import PilotParams

log = logging.getLogger("provisioner.pilot")

#: How long the wrapper looks for the starter's first capability answer, to keep it
#: in the node's record (testcache); the startd asks within seconds of its start.
STARTER_ANSWER_WAIT_S = 300.0
STARTER_ANSWER_POLL_S = 0.5
#: After a test beside the master: how long the wrapper waits for its startd (its
#: address file) to reconfigure it, how often it looks, and how often it tries.
STARTD_WAIT_S = 300.0
STARTD_POLL_S = 0.2
RECONFIG_TRIES = 5
#: The startd's address file in the pilot's LOG directory (HTCondor's default name).
STARTD_ADDRESS_FILE = ".startd_address"


def _lines(settings: dict[str, str]) -> str:
    return "".join(f"{k} = {v}\n" for k, v in settings.items())


class ContainerSteps:
    """The container part of a pilot (`provisioner.pilot.wrapper.PilotRun`): what it
    needs of the pilot is declared here."""

    p: PilotParams
    workdir: Path
    config: Path
    clock: Callable[[], float]
    ended: threading.Event
    stopping: bool
    _test_key: dict[str, Any] | None
    _starter_digest: str
    _keep_answer: bool

    def _in_container(self, argv: list[str]) -> tuple[int, str]:
        raise NotImplementedError

    def test_later(self) -> bool:
        """Whether the start-up test runs beside the master (`containers.defer_test`);
        if so, the startd's configuration says so (containers off) from here on."""
        if not self.p.containers or not defer_test(self.p.payload_image,
                                                   self._cached_test() is not None):
            return False
        self._add_config("container support (start-up test beside the master)",
                         _lines(pending_config(self.p.container_test_image)))
        log.info("container support: the start-up test runs beside the master (no cached "
                 "pass, no payload image); container jobs match once it passed")
        return True

    def enable_containers(self) -> ContainerSupport | None:
        """Test nested Apptainer on this node; configure the startd by the outcome."""
        if not self.p.containers:
            return None
        support = self._container_test()
        self._add_config("container support (start-up test)", _lines(self._settings(support)))
        return support

    def enable_containers_later(self) -> ContainerSupport | None:
        """The test beside the master (a thread's): `_test_beside`; None if that broke
        off (logged; containers stay off unless the startd reads the passed test's
        settings at a restart)."""
        try:
            return self._test_beside()
        except Exception as exc:  # spython's errors, OSError: a thread must say why
            log.warning("the container test beside the master broke off: %s", exc)
            return None

    def _test_beside(self) -> ContainerSupport:
        """Once the startd is ready (its first ad sent: the test's nested container takes
        CPU the startd's start-up needs), run the test, configure by its outcome,
        reconfigure the startd, then keep the starter's answer (as
        `keep_starter_answer`). A failed test leaves containers off, and says so in the
        ad."""
        self._wait_for_startd()
        support = self._fresh_test()
        settings = self._settings(support)
        settings.pop("STARTD_ATTRS")  # named in the ad since the master's start
        self._add_config("container support (start-up test, done beside the master)",
                         _lines(settings) + boot.config_lines({"PilotBootTested": self.clock()}))
        if self._reconfigure_startd():
            log.info("the startd reconfigured with the test's outcome (%s)",
                     "containers on" if support.ok else "containers off")
            if self._keep_answer:
                self.keep_starter_answer()
        return support

    def _settings(self, support: ContainerSupport) -> dict[str, str]:
        """The startd's settings for the test's `support`, with STARTER where it runs
        containers."""
        if not support.ok:
            log.warning("no container support on this node: %s", support.detail)
        settings = container_config(support, self.p.payload_image)
        if support.ok:
            settings.update(self._starter(settings))
        return settings

    def _add_config(self, title: str, lines: str) -> None:
        """Add `lines` to the pilot's configuration under `title`. The file is replaced
        whole: a daemon that reads it meanwhile reads the old one or the new one."""
        text = self.config.read_text() + f"# --- {title} ---\n" + lines
        tmp = self.config.with_name(f".{self.config.name}.new")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, self.config)

    def _wait_for_startd(self) -> None:
        """Until the master says its daemons are ready (``condor_who -wait``: the startd
        tells the master once its first ad went to the collector), at most
        `STARTD_WAIT_S`; the test then runs anyway."""
        rc, out = self._in_container(["condor_who", f"-wait:{STARTD_WAIT_S:.0f}", "IsReady"])
        if rc != 0:
            log.info("the startd's readiness not known (the test runs now): %s",
                     out.strip()[-300:])

    def _reconfigure_startd(self) -> bool:
        """``condor_reconfig`` of the pilot's own startd once it is up (its address file
        exists); False if the pilot ended or began to stop first, the startd did not
        come up within `STARTD_WAIT_S`, or `RECONFIG_TRIES` tries failed."""
        address = self.workdir / "local" / "log" / STARTD_ADDRESS_FILE
        deadline = time.monotonic() + STARTD_WAIT_S
        while not address.is_file():
            if self.ended.wait(STARTD_POLL_S) or time.monotonic() > deadline:
                log.warning("the startd was not reconfigured with the test's outcome: "
                            "it is not up")
                return False
        out = ""
        for attempt in range(RECONFIG_TRIES):
            if (attempt and self.ended.wait(2.0 * attempt)) or self.stopping:
                return False
            rc, out = self._in_container(["condor_reconfig", "-daemon", "startd"])
            if rc == 0:
                return True
        log.warning("the startd was not reconfigured with the test's outcome: %s",
                    out.strip())
        return False

    def _cached_test(self) -> ContainerSupport | None:
        """A pass this node's record holds for the test now (testcache), or None."""
        image = self.p.container_test_image
        ttl = self.p.container_test_cache_s
        self._test_key = None
        if ttl > 0 and image:
            try:
                self._test_key = testcache.node_key(image, self.p.image,
                                                    self_test_argv(image))
            except OSError as exc:
                log.info("container test cache not used: %s", exc)
        if self._test_key is None:
            return None
        return testcache.lookup(testcache.read_record(testcache.cache_file(self.p.scratch)),
                                self._test_key, self.clock(), ttl, image)

    def _container_test(self) -> ContainerSupport:
        """The start-up test's outcome: a pass of this node's cache, or the test itself,
        whose pass is then cached."""
        cached = self._cached_test()
        if cached is not None:
            log.info("container support (start-up test skipped, cached): %s", cached.detail)
            return cached
        return self._fresh_test()

    def _fresh_test(self) -> ContainerSupport:
        """The start-up test, run now; a pass is cached under the key `_cached_test`
        made (none: not cached)."""
        support = self_test(self._in_container, self.p.container_test_image)
        if support.ok:
            log.info("container support: %s", support.detail)
        if support.ok and self._test_key is not None:
            cache = testcache.cache_file(self.p.scratch)
            try:
                testcache.write_record(cache, testcache.new_record(
                    self._test_key, self.clock(), support.seconds))
            except OSError as exc:
                log.warning("could not cache the container test in %s: %s", cache, exc)
        return support

    def _starter(self, settings: dict[str, str]) -> dict[str, str]:
        """STARTER for a node that runs containers: the work directory's starter
        (workfiles), which answers the startd's capability query from this node's
        record when it holds an answer for this configuration, else asks the real
        starter and leaves its answer for `keep_starter_answer`. {} where no record
        is kept (the cache is off, or the script is not there)."""
        script = self.workdir / workfiles.STARTER
        if self._test_key is None or not script.is_file():
            return {}
        try:
            # the outcome's wording (PilotContainerTest) differs from pilot to pilot
            # and is no input of the starter's
            shaping = {k: v for k, v in settings.items() if k != "PilotContainerTest"}
            self._starter_digest = testcache.config_digest(
                self.p.condor_config.read_text(), json.dumps(shaping, sort_keys=True))
            text = testcache.cached_starter_classad(
                testcache.read_record(testcache.cache_file(self.p.scratch)), self._test_key,
                self.clock(), self.p.container_test_cache_s, self._starter_digest)
            if text is not None:
                answer = self.workdir / workfiles.STARTER_CLASSAD
                fd = os.open(answer, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(text)
                log.info("the starter's capabilities: this node's record (the startd "
                         "does not run the starter's container tests)")
            else:
                self._keep_answer = True
        except OSError as exc:
            log.info("the starter's capabilities are not cached: %s", exc)
            return {}
        return {"STARTER": str(script)}

    def keep_starter_answer(self) -> None:
        """Once the real starter has answered the startd's capability query, keep the
        answer in this node's record (if it still stands for this key) for the next
        pilot."""
        new = self.workdir / workfiles.STARTER_CLASSAD_NEW
        deadline = time.monotonic() + STARTER_ANSWER_WAIT_S
        while not new.is_file():
            if self.ended.wait(STARTER_ANSWER_POLL_S) or time.monotonic() > deadline:
                return
        cache = testcache.cache_file(self.p.scratch)
        try:
            text = new.read_text(errors="replace")
            if not testcache.starter_classad_ok(text):
                log.info("the starter's capabilities not kept: its answer does not say "
                         "that containers work, or is not a plain ClassAd")
                return
            record = testcache.read_record(cache)
            if (record is None or self._test_key is None or not testcache.valid(
                    record, self._test_key, self.clock(), self.p.container_test_cache_s)):
                return
            testcache.write_record(cache, testcache.with_starter_classad(
                record, self._starter_digest, text))
        except OSError as exc:
            log.warning("could not keep the starter's capabilities in %s: %s", cache, exc)
            return
        log.info("the starter's capabilities kept in this node's record (%s)", cache)
