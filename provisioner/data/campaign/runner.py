"""`provisioner campaign run`: submit each step's clients as HTCondor jobs and wait.

For every scenario and client count (a *step*): run the scenario's setup commands,
read every file once if the scenario says `warm`, then submit one job per client
and wait until all are done, printing progress at most every 5 s. Client i reads
file i mod count, with `benchread.py` shipped as the job's executable; its CSV,
stdout and stderr come back into DIR/<scenario>/<clients>/client-<i>.*.

The campaign does not provision: a provisioner service must be running, which
starts pilots for the jobs (they ask for `PilotSite == "<site>"` and advertise
`DesiredSites`). Every job opts out of the site's transparent cache proxy
(`+WantXCache = false`), so it reads exactly the URL its scenario names, and the
reader's reference comparison reads the origin itself; `extra_submit` may say
otherwise.

A client that exits non-zero, is held or removed, a setup command that fails, or
a step that outlives `step_timeout_s` fails the step: the error names the
scenario, the client count and the client, the campaign's jobs still queued are
removed (by the ClusterIds it submitted, nothing else), the failure is recorded
in step.json, the report is rendered, and `run` returns 1.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from provisioner.data.campaign import report
from provisioner.data.campaign.aggregate import parse_client_csv
from provisioner.data.campaign.spec import Campaign, classad_literal, resolve_jobfile, substitute

PROGRESS_S = 5.0
POLL_S = 2.0
BENCHREAD = Path(__file__).resolve().parents[1] / "benchread.py"
FIOCLIENT = Path(__file__).resolve().parent / "fioclient.py"


class StepFailed(Exception):
    """A step failed; the message names the scenario, client count and client."""

    def __init__(self, message: str, clients: list[int] | None = None) -> None:
        super().__init__(message)
        self.clients = clients or []


#: (proc, event kind, attributes) as read from a job event log.
Event = tuple[int, str, dict[str, object]]


@dataclass
class ProcState:
    status: str = "idle"  # idle | running | done | held | removed
    exit_code: int | None = None
    reason: str = ""


def fold_events(events: Iterable[Event]) -> dict[int, ProcState]:
    """PURE: each job's state after its events, in order."""
    states: dict[int, ProcState] = {}
    for proc, kind, attrs in events:
        st = states.setdefault(proc, ProcState())
        if kind == "EXECUTE":
            st.status = "running"
        elif kind in ("JOB_EVICTED", "JOB_RELEASED", "SHADOW_EXCEPTION",
                      "JOB_RECONNECT_FAILED", "SUBMIT"):
            st.status = "idle"
        elif kind == "JOB_HELD":
            st.status, st.reason = "held", str(attrs.get("HoldReason", ""))
        elif kind == "JOB_ABORTED":
            st.status, st.reason = "removed", str(attrs.get("Reason", ""))
        elif kind == "JOB_TERMINATED":
            st.status = "done"
            if attrs.get("TerminatedNormally", True):
                st.exit_code = int(attrs.get("ReturnValue", 0))  # type: ignore[call-overload]
            else:
                st.exit_code = -int(attrs.get("TerminatedBySignal", 0))  # type: ignore[call-overload]
                st.reason = f"killed by signal {-st.exit_code}"
    return states


class Pool(Protocol):
    """The schedd as the campaign uses it."""

    def submit(self, description: dict[str, str], items: list[dict[str, str]]) -> int:
        """Queue one job per item; returns the ClusterId (procs 0.. in item order)."""

    def remove(self, cluster: int, reason: str) -> None:
        """Remove the cluster's jobs still queued; removing a finished one is success."""

    def events(self, log: Path) -> list[Event]:
        """Every event in the job event log `log` so far ([] if not there yet)."""


def submit_file(description: dict[str, str], items: list[dict[str, str]]) -> str:
    """PURE: a submit file queuing one job per item, procs 0.. in item order.

    Each item's variables are set right before its own `queue 1`, so no item file
    and no quoting rules of `queue ... from` are involved. A key or value holding a
    line break would start a new submit command: refused, naming the key.
    """
    lines = []
    for source in (description, *items):
        for key, value in source.items():
            if "\n" in key or "\r" in key or "\n" in value or "\r" in value:
                raise ValueError(f"submit description: {key!r} holds a line break")
    lines += [f"{key} = {value}" for key, value in description.items()]
    for item in items:
        lines += [f"{key} = {value}" for key, value in item.items()]
        lines.append("queue 1")
    return "\n".join(lines) + "\n"


class CondorPool:
    """`Pool` through `condor_submit` and `condor_rm`, as the invoking user.

    The command-line tools come with the submit host's HTCondor and so match its
    schedd; Python bindings of a newer release add requirements on the execute
    side's version (`versionGE(...CondorVersion...)`) that older pilots never meet.
    """

    def __init__(self, command: Callable[[list[str], float], subprocess.CompletedProcess[str]]
                 | None = None) -> None:
        self.command = command or _run

    def submit(self, description: dict[str, str], items: list[dict[str, str]]) -> int:
        directory = Path(description.get("initialdir") or ".")
        path = directory / "clients.sub"
        path.write_text(submit_file(description, items))
        proc = self.command(["condor_submit", "-terse", str(path)], 120.0)
        if proc.returncode != 0:
            raise RuntimeError(f"condor_submit {path}: {_tail(proc.stderr or proc.stdout)}")
        first = proc.stdout.strip().split()[0] if proc.stdout.strip() else ""
        try:
            return int(first.split(".")[0])
        except ValueError:
            raise RuntimeError(f"condor_submit {path}: unexpected output "
                               f"{proc.stdout.strip()[:200]!r}") from None

    def remove(self, cluster: int, reason: str) -> None:
        proc = self.command(["condor_rm", "-reason", reason, str(cluster)], 60.0)
        text = proc.stderr + proc.stdout
        if proc.returncode != 0 and "find/remove" not in text and "not found" not in text:
            raise RuntimeError(f"condor_rm {cluster}: {_tail(proc.stderr or proc.stdout)}")

    def events(self, log: Path) -> list[Event]:
        if not log.exists():
            return []
        import htcondor2

        with htcondor2.JobEventLog(str(log)) as jel:
            return [(e.proc, e.type.name, dict(e.items())) for e in jel.events(stop_after=0)]


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def _tail(text: str, lines: int = 5) -> str:
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    flagged = [line for line in kept if line.startswith(("bench read:", "fio client:"))]
    return " | ".join(flagged or kept[-lines:])


def csv_bytes(directory: Path) -> int:
    """Bytes in the clients' CSVs that came back so far."""
    total = 0
    for path in directory.glob("client-*.csv"):
        if path.name.endswith(".netdev.csv"):
            continue
        try:
            total += sum(parse_client_csv(path.read_text()).values())
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return total


class Runner:
    def __init__(self, campaign: Campaign, campaign_file: Path, out: Path,
                 pool: Pool | None = None, echo: Callable[[str], None] = print,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 command: Callable[[list[str], float], subprocess.CompletedProcess[str]] = _run
                 ) -> None:
        self.c, self.file, self.out = campaign, campaign_file, out
        self._pool = pool
        self.echo, self.clock, self.sleep, self.command = echo, clock, sleep, command
        self.clusters: list[int] = []

    @property
    def pool(self) -> Pool:
        if self._pool is None:
            self._pool = CondorPool()
        return self._pool

    # -- the campaign ---------------------------------------------------------------
    def run(self) -> int:
        """Run every step in order; 0 if all succeeded, 1 at the first failure."""
        self.out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.file, self.out / report.SPEC_COPY)
        code = 0
        current: tuple[str, int] | None = None
        try:
            self.prepare()
            for scenario, counts in self.c.steps():
                for n in counts:
                    current = (scenario, n)
                    try:
                        self.step(scenario, n)
                    except StepFailed as exc:
                        self.record(scenario, n, error=str(exc), failed_clients=exc.clients)
                        raise
                    current = None
        except StepFailed as exc:
            self.echo(f"campaign {self.c.name}: FAILED: {exc}")
            self.remove_all("campaign failed")
            code = 1
        except BaseException as exc:  # interrupted: leave nothing of ours in the queue
            self.remove_all("campaign interrupted")
            self.interrupted(current, exc)
            raise
        written = report.render(self.out, self.c.name)
        self.echo(f"campaign {self.c.name}: {'failed' if code else 'done'}; report "
                  f"{self.out / 'report.md'} ({len(written)} files)")
        return code

    def interrupted(self, current: tuple[str, int] | None, exc: BaseException) -> None:
        """The step that was running is recorded as interrupted, and the report of what
        finished is written: it says it is partial (report.completeness)."""
        why = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else (
            f"{type(exc).__name__}: {exc}".strip().rstrip(":"))
        if current is not None:
            scenario, n = current
            self.record(scenario, n, error=f"scenario {scenario}, {report.clients_text(n)}: "
                        f"interrupted ({why}) before the step finished; its jobs were removed",
                        status="interrupted")
        try:
            report.render(self.out, self.c.name)
        except Exception as err:  # the interruption is what the user must see
            self.echo(f"campaign {self.c.name}: interrupted; no partial report: {err}")
            return
        self.echo(f"campaign {self.c.name}: interrupted ({why}); partial report "
                  f"{self.out / 'report.md'}")

    def values(self, scenario: str = "", clients: int = 0, site: str = "") -> dict[str, str]:
        f = self.c.files
        return {"prefix": f.prefix if f else "", "count": str(f.count) if f else "",
                "size": f.size if f else "", "scenario": scenario, "clients": str(clients),
                "site": site}

    def prepare(self) -> None:
        if self.c.files is None or not self.c.files.prepare:
            return
        argv = substitute(self.c.files.prepare, self.values())
        self.echo(f"prepare: {' '.join(argv)}")
        self.check_command(argv, "prepare")

    def check_command(self, argv: list[str], what: str) -> str:
        try:
            proc = self.command(argv, self.c.step_timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise StepFailed(f"{what}: {argv[0]} timed out after {exc.timeout:.0f} s") from exc
        except OSError as exc:
            raise StepFailed(f"{what}: cannot run {argv[0]}: {exc.strerror or exc}") from exc
        if proc.returncode != 0:
            raise StepFailed(f"{what}: {' '.join(argv)} exited {proc.returncode}: "
                             f"{_tail(proc.stderr or proc.stdout)}")
        return proc.stdout

    # -- one step ---------------------------------------------------------------------
    def step(self, scenario: str, n: int) -> None:
        label = f"scenario {scenario}, {report.clients_text(n)}"
        directory = self.out / scenario / str(n)
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        deadline = self.clock() + self.c.step_timeout_s
        spec = next((s for s in self.c.scenarios if s.name == scenario), None)
        site = spec.site if spec else self.c.fio.site if self.c.fio else ""
        values = self.values(scenario, n, site)
        for argv in (spec.setup if spec else self.c.fio.setup if self.c.fio else []):
            self.check_command(substitute(argv, values), f"{label}: setup")
        if spec and spec.warm and self.c.files:
            names = self.c.files.names()
            warm = directory / "warm"
            warm.mkdir()
            self.echo(f"{label}: warm-up, reading {len(names)} file(s) once")
            self.wait(self.submit(warm, site, scenario, n, [spec.url_of(x) for x in names],
                                  warm=True),
                      warm, len(names), f"{label}, warm-up of file", deadline)
        if spec and self.c.files:
            names = self.c.files.names()
            urls = [spec.url_of(names[i % len(names)]) for i in range(n)]
        else:
            urls = [""] * n
        self.echo(f"{label}: submitting")
        self.wait(self.submit(directory, site, scenario, n, urls), directory, n,
                  f"{label}, client", deadline)
        ratio = None
        if spec and spec.hit_ratio:
            try:
                ratio = float(self.check_command(substitute(spec.hit_ratio, values),
                                                 f"{label}: hit ratio").strip())
            except (StepFailed, ValueError) as exc:
                self.echo(f"{label}: no hit ratio: {exc}")
        self.record(scenario, n, hit_ratio=ratio)
        self.echo(f"{label}: done, {csv_bytes(directory)} bytes")

    def description(self, directory: Path, site: str, scenario: str, n: int,
                    warm: bool) -> dict[str, str]:
        """The submit description of a step's clients (item variables: client, url)."""
        common = {
            "universe": "vanilla", "initialdir": str(directory),
            "output": "client-$(client).out", "error": "client-$(client).err",
            "log": "jobs.log", "should_transfer_files": "YES",
            "when_to_transfer_output": "ON_EXIT", "transfer_executable": "true",
            "request_memory": str(self.c.request_memory_mb),
            "requirements": f"PilotSite == {classad_literal(site)}",
            "+DesiredSites": classad_literal(site), "+WantXCache": "false",
            "+CampaignName": classad_literal(self.c.name),
            "+CampaignStep": classad_literal(f"{scenario}/{n}" + ("/warm" if warm else "")),
        }
        if self.c.kind == "fio" and self.c.fio:
            jobfile = resolve_jobfile(self.c.fio.jobfile, self.file)
            extra = self.c.fio.extra_submit
            common.update({
                "executable": str(FIOCLIENT), "transfer_input_files": str(jobfile),
                "arguments": f"{jobfile.name} --json fio.json --netdev netdev.csv "
                             "--bwlog bw.csv",
                # Only these: fio's own data files in the scratch directory stay there.
                "transfer_output_files": "fio.json, netdev.csv, bw.csv",
                "transfer_output_remaps": '"fio.json = client-$(client).json; '
                                          'netdev.csv = client-$(client).netdev.csv; '
                                          'bw.csv = client-$(client).bw.csv"',
                "request_cpus": str(self.c.fio.request_cpus)})
        else:
            spec = next(s for s in self.c.scenarios if s.name == scenario)
            extra = spec.extra_submit
            reader = self.c.reader
            args = ["$(url)", "--csv", "reads.csv"]
            if warm:
                args += reader.warm_argv()
            else:
                args += reader.argv()
                if self.c.files and self.c.files.sha256:
                    args += ["--sha256", self.c.files.sha256]
            if reader.environment:
                common["environment"] = '"' + " ".join(
                    f"{k}={v}" for k, v in reader.environment.items()) + '"'
            common.update({
                "executable": str(BENCHREAD), "arguments": " ".join(args),
                "transfer_output_remaps": '"reads.csv = client-$(client).csv"',
                "request_cpus": "1"})
        for key, value in extra.items():
            common[f"+{key}"] = classad_literal(value)
        return common

    def submit(self, directory: Path, site: str, scenario: str, n: int, urls: list[str],
               warm: bool = False) -> int:
        items = [{"client": str(i), "url": url} if url else {"client": str(i)}
                 for i, url in enumerate(urls)]
        cluster = self.pool.submit(self.description(directory, site, scenario, n, warm), items)
        self.clusters.append(cluster)
        return cluster

    def wait(self, cluster: int, directory: Path, n: int, label: str, deadline: float) -> None:
        """Until all `n` jobs of `cluster` are done; StepFailed on the first failure."""
        last = -PROGRESS_S
        started = self.clock()
        while True:
            states = fold_events(e for e in self.pool.events(directory / "jobs.log"))
            for proc, st in sorted(states.items()):
                detail = ""
                if st.status in ("held", "removed"):
                    detail = f"{st.status}: {st.reason}"
                elif st.status == "done" and st.exit_code != 0:
                    detail = (st.reason or f"exited {st.exit_code}")
                if detail:
                    err = directory / f"client-{proc}.err"
                    stderr = _tail(err.read_text(errors="replace")) if err.exists() else ""
                    raise StepFailed(f"{label} {proc}: {stderr or detail}"
                                     + (f" ({detail})" if stderr else ""), [proc])
            counts = {k: sum(1 for s in states.values() if s.status == k)
                      for k in ("idle", "running", "done", "held")}
            counts["idle"] += n - len(states)
            if counts["done"] == n:
                return
            now = self.clock()
            if now >= deadline:
                raise StepFailed(f"{label.rsplit(',', 1)[0]}: timed out after "
                                 f"{self.c.step_timeout_s:.0f} s ({counts['idle']} idle, "
                                 f"{counts['running']} running, {counts['done']} done)")
            if now - last >= PROGRESS_S:
                last = now
                self.echo(f"{label.rsplit(',', 1)[0]}: {counts['idle']} idle, "
                          f"{counts['running']} running, {counts['done']} done, "
                          f"{counts['held']} held; {csv_bytes(directory) / 2**20:.1f} MiB "
                          f"from finished clients; {now - started:.0f} s")
            self.sleep(POLL_S)

    def record(self, scenario: str, n: int, error: str = "", hit_ratio: float | None = None,
               failed_clients: list[int] | None = None, status: str = "") -> None:
        directory = self.out / scenario / str(n)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / report.STEP_FILE).write_text(json.dumps({
            "scenario": scenario, "clients": n,
            "status": status or ("failed" if error else "ok"),
            "error": error, "hit_ratio": hit_ratio, "failed_clients": failed_clients or [],
            "clusters": self.clusters}, indent=1) + "\n")

    def remove_all(self, reason: str) -> None:
        """Remove this campaign's own jobs still queued (by its ClusterIds only)."""
        for cluster in self.clusters:
            try:
                self.pool.remove(cluster, reason)
            except Exception as exc:  # a cluster already gone is fine; say anything else
                self.echo(f"campaign {self.c.name}: could not remove cluster {cluster}: {exc}")
