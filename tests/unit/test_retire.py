"""Retiring a busy pilot end to end without a site: the provisioner's order reaches the
batch shell as a signal (`scancel --batch`), the pilot wrapper watches its own jobs and
leaves as soon as none runs (an atomic idle check in its startd), the order can be
withdrawn, and the controller remembers which pilots have one (across a restart too).
The simulator models the same pilot."""

from __future__ import annotations

import signal
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from bench.sim.scenarios import default_config, default_sites
from bench.sim.traces import JobSpec
from bench.sim.world import World
from provisioner.decide.controller import Controller
from provisioner.model import Action, JobShape, PilotState, Retire, Submit, Unretire
from provisioner.pilot import wrapper
from provisioner.pilot.params import params_from_env
from provisioner.pilot.procs import starters_below
from provisioner.pilot.wrapper import PilotRun
from provisioner.sites.executor import CommandResult
from provisioner.sites.slurm_cli import SlurmCliBackend
from provisioner.sites.slurm_jobs import RELEASE_SIGNAL, RETIRE_SIGNAL, UNRETIRE_SIGNAL

from .helpers import NOW, config, pilot, snap

ENV = {
    "PILOT_SITE": "gsi", "PILOT_PROVISIONER_ID": "t", "PILOT_COLLECTOR": "cm:9618",
    "PILOT_UID_DOMAIN": "t", "PILOT_IMAGE": "/i.sif", "PILOT_TOKEN_FILE": "/t",
    "PILOT_CONDOR_CONFIG": "/c", "SLURM_JOB_ID": "7", "PILOT_WALLTIME_S": "600",
}


# -- the signal ---------------------------------------------------------------------
class Recorder:
    def __init__(self) -> None:
        self.argvs: list[list[str]] = []

    def run(self, argv: Sequence[str], env: Mapping[str, str], stdin: str | None = None
            ) -> CommandResult:
        self.argvs.append(list(argv))
        return CommandResult(0, "", "")

    def close(self) -> None:
        pass


def test_orders_are_signals_to_the_batch_shell_that_the_wrapper_handles() -> None:
    ex = Recorder()
    b = SlurmCliBackend(name="gsi", provisioner_id="p", executor=ex)  # type: ignore[arg-type]
    b.retire("12")
    b.retire("12", False)
    b.release("12")
    assert ex.argvs == [["scancel", "--batch", "--signal=USR2", "12"],
                        ["scancel", "--batch", "--signal=CONT", "12"],
                        ["scancel", "--batch", "--signal=USR1", "12"]]
    assert signal.Signals[f"SIG{RETIRE_SIGNAL}"] is wrapper.RETIRE_SIGNAL
    assert signal.Signals[f"SIG{UNRETIRE_SIGNAL}"] is wrapper.UNRETIRE_SIGNAL
    assert RELEASE_SIGNAL == "USR1"
    # a withdrawal that reaches a process without a handler does nothing
    assert signal.getsignal(wrapper.UNRETIRE_SIGNAL) in (signal.SIG_DFL, signal.SIG_IGN)


# -- the wrapper's watch ------------------------------------------------------------
def fake_proc(root: Path, procs: dict[int, tuple[str, int]]) -> Path:
    for pid, (name, ppid) in procs.items():
        (root / str(pid)).mkdir(parents=True, exist_ok=True)
        (root / str(pid) / "stat").write_text(f"{pid} ({name}) S {ppid} {pid} {pid} 0 -1\n")
    (root / "self").mkdir(exist_ok=True)
    return root


def test_starters_are_counted_below_the_master_only(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, {
        100: ("condor_master", 1), 101: ("condor_startd", 100),
        102: ("condor_starter", 101), 103: ("condor_starter", 101),
        104: ("sleep 60) (x", 102),  # a job whose name holds ") ("
        200: ("condor_starter", 1),  # another pilot's on the same node
    })
    assert starters_below(100, proc) == 2
    assert starters_below(200, proc) == 0
    assert starters_below(999, proc) == 0


class Watched(PilotRun):
    """A pilot on a fake /proc (master 100, startd 101, one job's starter 102) whose
    container calls and master signals are recorded."""

    def __init__(self, tmp_path: Path, idle_check_passes: bool = True) -> None:
        params = params_from_env(ENV, 0.0)
        super().__init__(params, tmp_path / "work", tmp_path / "work" / "condor_config")
        self.pidfile.parent.mkdir(parents=True)
        self.pidfile.write_text("100\n")
        self.proc = fake_proc(tmp_path / "proc", {100: ("condor_master", 1),
                                                  101: ("condor_startd", 100),
                                                  102: ("condor_starter", 101)})
        self.passes = idle_check_passes
        self.calls: list[list[str]] = []
        self.signalled: list[int] = []
        self.checked = threading.Event()

    def _in_container(self, argv: list[str]) -> tuple[int, str]:
        self.calls.append(argv)
        self.checked.set()
        return (0, "") if self.passes else (1, "not idle")

    def _signal_master(self, sig: int) -> None:
        self.signalled.append(sig)

    def job_ends(self) -> None:
        (self.proc / "102" / "stat").unlink()
        (self.proc / "102").rmdir()

    def finish(self) -> None:
        """The master ends: the watcher stops."""
        self.ended.set()
        if self._watcher is not None:
            self._watcher.join(5)
            assert not self._watcher.is_alive()


@pytest.fixture(autouse=True)
def _fast_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wrapper, "RETIRE_POLL_S", 0.01)


def test_a_retired_pilot_leaves_when_its_job_ends_not_before(tmp_path: Path) -> None:
    p = Watched(tmp_path)
    p.on_retire(signal.SIGUSR2, None)
    assert not p.checked.wait(0.3)  # a job runs: no idle check, no drain
    assert not p.stopping
    p.job_ends()
    assert p.checked.wait(5)
    p.finish()
    assert p.calls[0][:3] == ["condor_drain", "-graceful", "-exit-on-completion"]
    assert 'State == "Unclaimed"' in p.calls[0]
    assert p.stopping and p.reason == "retired" and p.signalled == [signal.SIGTERM]
    assert p.end_reason(0) == "retired"


def test_a_withdrawn_retirement_stays(tmp_path: Path) -> None:
    p = Watched(tmp_path)
    p.on_retire(signal.SIGUSR2, None)
    p.on_unretire(signal.SIGCONT, None)
    p.job_ends()
    assert not p.checked.wait(0.3)
    p.finish()
    assert not p.stopping and p.signalled == [] and p.calls == []


def test_a_job_that_slipped_in_keeps_the_pilot(tmp_path: Path) -> None:
    """No starter yet, but the startd has a new claim: the idle check refuses; the
    pilot stays and checks again."""
    p = Watched(tmp_path, idle_check_passes=False)
    p.job_ends()
    p.on_retire(signal.SIGUSR2, None)
    assert p.checked.wait(5)
    p.finish()
    assert not p.stopping and p.signalled == [] and len(p.calls) >= 1


def test_without_a_master_pid_a_retiring_pilot_never_drains_on_a_guess(
        tmp_path: Path) -> None:
    p = Watched(tmp_path)
    p.job_ends()
    assert not p.jobs_running()
    p.pidfile.unlink()
    assert p.jobs_running()


# -- the controller's memory --------------------------------------------------------
def test_the_controller_remembers_orders_forgets_gone_pilots_and_survives_a_restart(
) -> None:
    cfg = config()
    c = Controller(cfg)
    busy = pilot("1", PilotState.BUSY)
    result = c.cycle(snap([], [busy]), NOW)
    assert [type(a) for a in result.actions] == [Retire]
    assert c.memory.retiring == {"gsi/1"}
    again = Controller(cfg)
    again.load(c.state())
    assert again.memory.retiring == {"gsi/1"}
    # a restarted service withdraws the order when demand returns
    result = again.cycle(snap([(JobShape(16, 60000), 1)], [busy]), NOW + 10)
    assert [type(a) for a in result.actions if isinstance(a, Unretire)] == [Unretire]
    assert again.memory.retiring == set()
    # a pilot that left is forgotten; an unknown site keeps what it had
    c.cycle(snap([], []), NOW + 20)
    assert c.memory.retiring == set()


def test_an_order_that_could_not_be_sent_is_decided_again() -> None:
    c = Controller(config())
    busy = pilot("1", PilotState.BUSY)
    retire = c.cycle(snap([], [busy]), NOW).actions[0]
    c.not_sent(retire)
    assert c.memory.retiring == set()
    assert [type(a) for a in c.cycle(snap([], [busy]), NOW + 10).actions] == [Retire]
    unretire = c.cycle(snap([(JobShape(16, 60000), 1)], [busy]), NOW + 20).actions
    withdrawal = next(a for a in unretire if isinstance(a, Unretire))
    c.not_sent(withdrawal)
    assert c.memory.retiring == {"gsi/1"}


# -- the simulator ------------------------------------------------------------------
class RetireWhenBusy:
    """One pilot at the first tick; retired as soon as it runs a job."""

    name = "retire-when-busy"
    tick_s = 5.0

    def __init__(self, site: str) -> None:
        self.site = site

    def tick(self, world: World, now: float) -> list[Action]:
        if not world.all_pilots:
            return [Submit(self.site, 1, 4, 8000, 86400)]
        return [Retire(world.model_pilot(p)) for p in world.pilots.values()
                if p.jobs and not p.retiring]


def test_the_simulated_retired_pilot_takes_jobs_and_ends_with_its_last() -> None:
    sites = default_sites()
    world = World(sites, default_config(sites), seed=1, negotiate_s=10)
    shape = JobShape(1, 1000)
    trace = [JobSpec(0, 0.0, shape, 100.0), JobSpec(1, 0.0, shape, 100.0)]
    world.run(RetireWhenBusy("gsi"), trace, duration=0.0, drain_s=3600)
    p = world.all_pilots[0]
    assert all(j.end is not None for j in world.jobs)
    assert p.ended_at == max(j.end for j in world.jobs if j.end is not None)


def test_a_simulated_retiring_pilot_still_takes_a_job_that_arrives() -> None:
    sites = default_sites()
    world = World(sites, default_config(sites), seed=1, negotiate_s=10)
    shape = JobShape(1, 1000)
    # the third job arrives while the pilot retires (its first two run 600 s)
    world.run(RetireWhenBusy("gsi"), [JobSpec(0, 0.0, shape, 600.0),
                                     JobSpec(1, 0.0, shape, 600.0),
                                     JobSpec(2, 400.0, shape, 100.0)],
              duration=400.0, drain_s=3600)
    assert len(world.all_pilots) == 1
    third = world.jobs[2]
    assert third.end is not None and third.start is not None
    first = world.jobs[0]
    assert first.start is not None and first.end is not None
    assert first.start + RetireWhenBusy.tick_s < third.start < first.end  # while retiring
    p = world.all_pilots[0]
    assert p.ended_at == max(j.end for j in world.jobs if j.end is not None)


# -- the startd's retirement time ----------------------------------------------------
def test_a_running_job_may_retire_until_the_pilots_last_minute_however_long_it_has_run() -> None:
    """The startd grants MAXJOBRETIREMENTTIME less the job's run time: evaluated as the
    startd does (in the slot's ad, which carries JobStart), what is left of a job's
    retirement is the time to the pilot's last minute, for a job just started and one
    that has run longer than that; and no soft-kill time is held back from it."""
    import re
    import time

    import classad2 as classad

    conf = (Path(__file__).parents[2] / "condor_config" / "pilot.conf").read_text()
    found = re.search(r"^MAXJOBRETIREMENTTIME = (.*)$", conf, re.M)
    assert found is not None
    now = int(time.time())
    end = now + 300
    text = found.group(1).replace("$(PILOT_JOBS_END)", f"({end} - 60)")
    assert re.search(r"^PILOT_JOBS_END = \(\$\(PilotWalltimeEnd\) - 60\)$", conf, re.M)
    for age in (0, 120, 299, 2000):
        slot = classad.ClassAd({"JobStart": now - age})
        slot["MaxJobRetirementTime"] = classad.ExprTree(text)
        granted = slot.eval("MaxJobRetirementTime")
        assert abs((granted - age) - (end - 60 - now)) <= 2, (age, granted)
    # no job started: nothing to retire, and never an error
    assert classad.ClassAd({"MaxJobRetirementTime": classad.ExprTree(text)}).eval(
        "MaxJobRetirementTime") >= 238
    assert re.search(r"^MachineMaxVacateTime = 0$", conf, re.M)
