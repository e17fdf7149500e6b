"""The probe pilot of `provisioner site check`: one short, one-core SLURM job that
runs the site's real batch script and pilot wrapper in the site's image.

Before the wrapper, the script runs provisioner.onboard.nodecheck on the worker
(image readable, Apptainer starts, TCP to the collector, the site's XRootD cache
answers). The probe's startd must never take a job: its START is False
(``_CONDOR_START`` passed into the container). It carries its own provisioner id
(``<id>-probe``) so the service neither counts nor cancels it. Whatever happens
the job is cancelled and waited for until SLURM no longer lists it; a probe that
SLURM keeps pending is given up after `Limits.pending_s`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from provisioner.config import Config, SlurmSite
from provisioner.errors import BackendError
from provisioner.onboard.nodecheck import PREFIX
from provisioner.onboard.probeio import CliProbeIO, ProbeIO, RestProbeIO, trouble_line
from provisioner.onboard.table import Check, failed, passed, skipped
from provisioner.pilot.containers import RUNNING
from provisioner.pilot.endrecord import REASONS
from provisioner.pilot.script import NO_TOKEN, render_pilot_script
from provisioner.security.tokens import TokenError
from provisioner.service.pilot_tokens import CHECK_LIST, PilotTokens
from provisioner.sites.base import PilotRequest
from provisioner.sites.slurm_cli import SlurmCliBackend
from provisioner.sites.slurm_rest import SlurmRestBackend

P = "probe"
WRAPPER = "-m provisioner.pilot.wrapper"
#: Ads of the probe's startd: constraint -> ads (a collector query).
FindAds = Callable[[str], Sequence[Mapping[str, Any]]]
#: The worker's own checks (provisioner.onboard.nodecheck's steps) and their rows.
NODE_ROWS = {"image": "image readable on the worker", "apptainer": "Apptainer starts",
             "collector": "worker connects to the collector",
             "xcache": "XRootD cache answers"}
#: Node steps whose failure means the startd cannot join: the probe stops waiting.
BLOCKING = ("image", "apptainer", "collector")


class ProbeScriptError(Exception):
    """The site's batch script has no line that starts the pilot wrapper."""


@dataclass(frozen=True)
class Limits:
    pending_s: float = 300.0  # give up on a probe SLURM keeps pending
    join_s: float = 300.0  # from SLURM start to the startd's ad
    leave_s: float = 90.0  # for the ad, and then the job, to go
    poll_s: float = 3.0
    walltime_s: int = 600


def probe_script(script: str) -> str:
    """The pilot's rendered batch script with the node checks before the wrapper and
    a startd that takes no job. The check line is the wrapper's own line (already
    quoted by the template) without ``exec`` and with the other module."""
    lines = script.splitlines(keepends=True)
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        if line.startswith("exec ") and line.rstrip().endswith(WRAPPER):
            check = line[len("exec "):].replace(WRAPPER, "-m provisioner.onboard.nodecheck")
            extra = ["# provisioner site check: node checks, and a startd that takes no job\n",
                     check, "export APPTAINERENV__CONDOR_START=False\n"]
            return "".join([*lines[:i], *extra, *lines[i:]])
    raise ProbeScriptError(f"no line `exec ... {WRAPPER}` in the batch script")


def parse_node_lines(text: str) -> dict[str, tuple[bool, str, float]]:
    """nodecheck's lines in the probe's output -> {step: (ok, detail, seconds)}."""
    out: dict[str, tuple[bool, str, float]] = {}
    for line in text.splitlines():
        if not line.startswith(PREFIX):
            continue
        try:
            doc = json.loads(line[len(PREFIX):])
            out[str(doc["step"])] = (doc["ok"] is True, str(doc["detail"]),
                                     float(doc["seconds"]))
        except (ValueError, KeyError, TypeError):
            continue
    return out


@dataclass
class Probe:
    """One probe at one site. `clock` and `sleep` are injected (tests run it on a
    virtual clock); `ads` queries the collector."""

    index: int
    site: SlurmSite
    config: Config
    backend: SlurmCliBackend | SlurmRestBackend
    ads: FindAds
    limits: Limits = Limits()
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    rows: dict[str, Check] = field(default_factory=dict)
    io: ProbeIO = field(init=False)

    def __post_init__(self) -> None:
        self.io = (RestProbeIO(self.backend) if isinstance(self.backend, SlurmRestBackend)
                   else CliProbeIO(self.backend, self.site.name, self.site.runtime.log_dir))
    #: Mints the probe's token and revokes it (None: the service's, provisioner.security).
    tokens: PilotTokens | None = None

    @property
    def constraint(self) -> str:
        return (f'PilotSite == "{self.site.name}" && PilotProvisionerId == '
                f'"{self.backend.provisioner_id}"')

    def _job_constraint(self, job_id: str) -> str:
        return f'{self.constraint} && PilotSlurmJobId == "{job_id}"'

    @property
    def walltime_s(self) -> int:
        return max(self.limits.walltime_s, self.site.pilot.shutdown_margin_s + 300)

    def request(self, token: str = NO_TOKEN) -> PilotRequest:
        cfg = self.config.model_copy(update={"pool": self.config.pool.model_copy(
            update={"provisioner_id": self.backend.provisioner_id})})
        wall = self.walltime_s
        script = probe_script(render_pilot_script(cfg, self.site, wall, 0, token=token))
        return PilotRequest(cpus=1, memory_mb=self.site.pilot.memory_per_cpu_mb,
                            walltime_s=wall, shutdown_margin_s=self.site.pilot.shutdown_margin_s,
                            script=script)

    def state(self, job_id: str) -> tuple[str, str] | None:
        return self.io.state(job_id)

    def pilot_said(self, job_id: str) -> str:
        """The pilot's own reason: its end record (on both kinds of site) and the line
        of its output that names a failure (where the output can be read)."""
        said = []
        try:
            record = self.backend.end_records([job_id]).get(job_id)
        except BackendError:
            record = None
        if record is not None:
            meaning = REASONS.get(record.reason, "")
            said.append(f"its end record: {record.reason}" + (f" ({meaning})" if meaning
                                                              else ""))
        output = self.io.output(job_id)[0].splitlines()
        line = trouble_line("\n".join(x for x in output if not x.startswith(PREFIX)))
        if line:
            said.append(f"its output: {line}")
        return "; ".join(said)

    def _wait(self, what: Callable[[], bool], limit: float) -> bool:
        """Poll `what` until true or `limit` seconds passed; whether it came true."""
        end = self.clock() + limit
        while True:
            if what():
                return True
            if self.clock() >= end:
                return False
            self.sleep(self.limits.poll_s)

    def run(self) -> list[Check]:
        """Submit, follow, release and cancel the probe; its rows in order."""
        start = self.clock()
        tokens = self.tokens or PilotTokens(self.config, list_suffix=CHECK_LIST)
        try:
            token = tokens.issue(self.site.name, self.walltime_s, 1)[0]
        except TokenError as exc:
            return [failed("probe submitted", f"no pilot token: {exc}",
                           "see pilot_tokens (docs/security.md)", P)]
        try:
            return self._run(token.text, start)
        finally:
            tokens.unused([token])  # the probe is gone: its token with it

    def _run(self, token: str, start: float) -> list[Check]:
        try:
            job_id = self.backend.submit(self.request(token))
        except (BackendError, ProbeScriptError) as exc:
            return [failed("probe submitted", str(exc), f"see sites[{self.index}] "
                           "(partition, account, qos) and the message", P)]
        self.rows["probe submitted"] = passed("probe submitted", f"SLURM job {job_id}", P,
                                              self.clock() - start)
        try:
            if self._follow(job_id):
                self._release(job_id)
        finally:
            self._clean_up(job_id)
        return self.report(job_id)

    def _follow(self, job_id: str) -> bool:
        """Until the job runs, then until its startd's ad appears; whether it did."""
        t0 = self.clock()
        seen: list[tuple[str, str] | None] = []

        def started() -> bool:
            seen.append(self.state(job_id))
            return seen[-1] is None or seen[-1][0] != "PENDING"

        if not self._wait(started, self.limits.pending_s):
            reason = seen[-1][1] if seen and seen[-1] else "?"
            self.rows["probe starts"] = failed(
                "probe starts", f"pending for {self.clock() - t0:.0f} s: {reason}",
                f"SLURM did not start a 1-core job at sites[{self.index}] "
                f"(partition {self.site.partition or 'default'}); run again when the "
                "site is less busy, or check its limits for the account", P)
            return False
        self.rows["probe starts"] = passed("probe starts", f"SLURM started it "
                                           f"({seen[-1][0] if seen[-1] else 'ended'})", P,
                                           self.clock() - t0)
        t1 = self.clock()
        found: list[Mapping[str, Any]] = []
        blocking: list[str] = []

        def joined() -> bool:
            found[:] = list(self.ads(self._job_constraint(job_id)))
            if found or self.state(job_id) is None:
                return True
            # the node checks run before the wrapper: a step that rules out joining
            # (no image, no Apptainer, no route to the collector) ends the wait at once
            steps = self.node_steps(job_id)[0]
            blocking[:] = [k for k in BLOCKING if k in steps and not steps[k][0]]
            return bool(blocking)

        self._wait(joined, self.limits.join_s)
        if not found:
            why = (f"the node checks failed ({', '.join(NODE_ROWS[k] for k in blocking)}), "
                   f"after {self.clock() - t1:.0f} s" if blocking else
                   f"within {self.clock() - t1:.0f} s of its start")
            said = self.pilot_said(job_id)
            self.rows["reaches the collector"] = failed(
                "reaches the collector", f"no startd ad of job {job_id}: {why}"
                + (f"; the pilot said: {said}" if said else ""),
                f"see the node checks below and the pilot's output in "
                f"{self.site.runtime.log_dir or '(runtime.log_dir unset)'}", P)
            return False
        ad = found[0]
        self.node_steps(job_id)  # read now: a REST site's comment ends as the end record
        self.rows["reaches the collector"] = passed(
            "reaches the collector", f"{ad.get('Name', '?')} in the pool through CCB", P,
            self.clock() - t1)
        self.rows["nested-container self-test"] = self._container_row(job_id, ad)
        return True

    def _container_row(self, job_id: str, ad: Mapping[str, Any]) -> Check:
        name = "nested-container self-test"
        if not self.site.runtime.containers:
            return skipped(name, f"runtime.containers is off at sites[{self.index}]", P)
        t0 = self.clock()
        result = str(ad.get("PilotContainerTest", ""))

        def ended() -> bool:
            # on a node without a cached pass the test runs beside the master: its
            # outcome comes in a later ad
            nonlocal result
            ads = list(self.ads(self._job_constraint(job_id)))
            result = str(ads[0].get("PilotContainerTest", "")) if ads else result
            return not result.startswith(RUNNING)

        if result.startswith(RUNNING) and not self._wait(ended, self.limits.join_s):
            return failed(name, f"still running after {self.clock() - t0:.0f} s: {result}",
                          "user namespaces / Apptainer on the worker nodes (see the pilot "
                          "log)", P)
        if result.startswith("ok"):
            return passed(name, result, P)
        return failed(name, result or "no PilotContainerTest in the ad",
                      "user namespaces / Apptainer on the worker nodes (see the pilot log)", P)

    def _release(self, job_id: str) -> None:
        t0 = self.clock()
        try:
            self.backend.release(job_id)
        except BackendError as exc:
            self.rows["ad leaves the collector"] = failed(
                "ad leaves the collector", f"release failed: {exc}", "see the message", P)
            return
        gone = self._wait(lambda: not self.ads(self._job_constraint(job_id)),
                          self.limits.leave_s)
        self.rows["ad leaves the collector"] = (
            passed("ad leaves the collector", "released: the startd drained and left", P,
                   self.clock() - t0) if gone else
            failed("ad leaves the collector", f"still there after {self.limits.leave_s:.0f} s",
                   "see the pilot's log", P))

    def _clean_up(self, job_id: str) -> None:
        problems = []
        try:
            self.backend.cancel(job_id)
            if not self._wait(lambda: self.state(job_id) is None, self.limits.leave_s):
                problems.append(f"job {job_id} still listed by squeue")
        except BackendError as exc:
            problems.append(f"scancel {job_id}: {exc}")
        if self.ads(self._job_constraint(job_id)):
            problems.append("its startd ad is still in the collector")
        self.rows["cleaned up"] = (
            passed("cleaned up", f"job {job_id} gone from SLURM, no ad left", P)
            if not problems else
            failed("cleaned up", "; ".join(problems), f"scancel {job_id} at the site", P))

    def node_steps(self, job_id: str) -> tuple[dict[str, tuple[bool, str, float]], str]:
        """The worker's own checks so far, from the probe's output, and where that was
        read (with the error if it could not be)."""
        text, where = self.io.output(job_id)
        return parse_node_lines(text), where

    def node_rows(self, job_id: str) -> list[Check]:
        """The worker's own checks, one row each."""
        wanted = [k for k in NODE_ROWS if k != "xcache" or self.site.xcache]
        if not self.site.runtime.log_dir and not isinstance(self.io, RestProbeIO):
            why = f"sites[{self.index}].runtime.log_dir is unset: no probe output to read"
            return [skipped(NODE_ROWS[k], why, P) for k in wanted]
        steps, path = self.node_steps(job_id)
        rows = []
        for key in wanted:
            if key not in steps:
                rows.append(skipped(NODE_ROWS[key], f"no result in {path}", P))
                continue
            ok, detail, took = steps[key]
            rows.append(passed(NODE_ROWS[key], detail, P, took) if ok else
                        failed(NODE_ROWS[key], detail, self._fix(key), P, took))
        return rows

    def _fix(self, key: str) -> str:
        i = self.index
        return {"image": f"publish the image at sites[{i}].image on the worker nodes",
                "apptainer": "install Apptainer on the worker nodes (user namespaces on)",
                "collector": f"allow outbound TCP from the worker nodes to pool.collector "
                             f"{self.config.pool.collector} (CCB: no inbound needed)",
                "xcache": f"check sites[{i}].xcache {self.site.xcache}: is the cache up "
                          "and reachable from the workers?"}[key]

    def report(self, job_id: str) -> list[Check]:
        order = ["probe submitted", "probe starts", "reaches the collector",
                 "nested-container self-test", "ad leaves the collector"]
        rows = [self.rows.get(n) or skipped(n, "earlier step failed", P) for n in order]
        if "probe starts" in self.rows and self.rows["probe starts"].ok:
            rows[3:3] = self.node_rows(job_id)
        return [*rows, self.rows["cleaned up"]]
