"""A failed start's cool-down that ended is passed on to its schedd once: a JobPrio
write to the provisioner's own held job (the schedd rebuilds its runnable list), then a
negotiation asked for; nothing at a schedd with the upstream fix; the job of ours
removed once nothing cools down. A hand-written schedd that records its calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from provisioner.pool.cooldowns import (
    AFTER_END_S,
    KEEP_S,
    MARK_ATTR,
    CoolDownEnds,
    Nudger,
    fixed_upstream,
    submit_description,
)

OLD = "$CondorVersion: 23.9.6 2026-07-12 PackageID: 23.9.6+dfsg-2.1+b10 $"
NEW = "$CondorVersion: 24.10.2 2025-05-20 BuildID: 1 $"


@dataclass
class RecordingSchedd:
    jobs: list[dict[str, Any]] = field(default_factory=list)
    calls: list[tuple[str, ...]] = field(default_factory=list)
    fail: bool = False

    def query(self, constraint: str, projection: list[str]) -> list[dict[str, Any]]:
        self.calls.append(("query", constraint))
        return [j for j in self.jobs if f'"{j.get(MARK_ATTR)}"' in constraint]

    def submit(self, description: dict[str, str]) -> Any:
        self.calls.append(("submit",))
        cluster = 40 + len(self.jobs)
        self.jobs.append({"ClusterId": cluster, "ProcId": 0,
                          MARK_ATTR: description[f"+{MARK_ATTR}"].strip('"')})
        return SimpleNamespace(cluster=lambda: cluster)

    def edit(self, job: str, attr: str, value: str) -> None:
        if self.fail:
            raise RuntimeError("permission denied")
        self.calls.append(("edit", job, attr, value))

    def reschedule(self) -> None:
        self.calls.append(("reschedule",))

    def act(self, action: str, constraint: str) -> None:
        self.calls.append(("act", action, constraint))
        self.jobs.clear()


BINDINGS = SimpleNamespace(Submit=lambda d: d, JobAction=SimpleNamespace(Remove="Remove"))


def test_versions_with_the_upstream_fix() -> None:
    assert not fixed_upstream(OLD)
    assert not fixed_upstream("$CondorVersion: 24.10.1 2025-04-01 $")
    assert not fixed_upstream("$CondorVersion: 24.0.9 2025-06-01 $")  # LTS: not fixed
    assert fixed_upstream(NEW) and fixed_upstream("$CondorVersion: 25.0.0 2025-09-01 $")
    assert not fixed_upstream("") and not fixed_upstream("unknown")


@given(st.lists(st.floats(min_value=1, max_value=1e4), max_size=6),
       st.floats(min_value=0, max_value=2e4))
def test_an_end_is_due_once_passed_and_done_once_passed_on(ends: list[float],
                                                           now: float) -> None:
    e = CoolDownEnds()
    e.seen("cm", ends)
    due = any(x + AFTER_END_S <= now for x in ends)
    assert e.due(now) == (("cm",) if due else ())
    e.passed_on("cm", now)
    assert e.due(now) == ()
    assert e.cooling("cm") == any(x + AFTER_END_S > now for x in ends)


def test_an_end_a_later_read_no_longer_shows_is_still_passed_on() -> None:
    """The cycle that reads the queue a moment after the end sees the job idle and out
    of its cool-down; the schedd still does not offer it until its list is rebuilt."""
    e = CoolDownEnds()
    e.seen("cm", [100.0])
    e.seen("cm", [])  # read at 100.5: not cooling any more
    assert e.due(100.5) == () and e.due(101.0) == ("cm",)


def test_a_job_leaving_its_cool_down_is_offered_again_through_our_own_job() -> None:
    schedd = RecordingSchedd()
    nudger = Nudger(BINDINGS, "testbed")
    nudger.ends.seen("cm", [100.0, 300.0])
    assert nudger.nudge({"cm": (schedd, OLD)}, 100.5) == []  # the schedd still cools it
    assert schedd.calls == []
    assert nudger.nudge({"cm": (schedd, OLD)}, 101.0) == ["cm"]
    assert [c[0] for c in schedd.calls] == ["query", "submit", "edit", "reschedule"]
    assert schedd.calls[2] == ("edit", "40.0", "JobPrio", "0")  # the value it has
    desc = submit_description("testbed")
    assert desc["hold"] == "true" and desc["requirements"] == "false"
    schedd.calls.clear()
    assert nudger.nudge({"cm": (schedd, OLD)}, 150.0) == []  # 100 was passed on
    assert schedd.calls == []
    assert nudger.nudge({"cm": (schedd, OLD)}, 301.0) == ["cm"]
    assert [c[0] for c in schedd.calls] == ["edit", "reschedule"]  # one job reused
    assert nudger.nudge({"cm": (schedd, OLD)}, 301.0 + KEEP_S - 1) == []
    assert schedd.jobs != []  # kept for the next failed start a while
    assert nudger.nudge({"cm": (schedd, OLD)}, 301.0 + KEEP_S) == []
    assert schedd.calls[-1][0] == "act" and "testbed" in schedd.calls[-1][2]
    assert schedd.jobs == []  # then removed


def test_a_job_of_ours_left_by_an_earlier_run_is_reused() -> None:
    schedd = RecordingSchedd(jobs=[{"ClusterId": 7, "ProcId": 0, MARK_ATTR: "testbed"}])
    nudger = Nudger(BINDINGS, "testbed")
    nudger.ends.seen("cm", [10.0])
    assert nudger.nudge({"cm": (schedd, OLD)}, 20.0) == ["cm"]
    assert ("edit", "7.0", "JobPrio", "0") in schedd.calls
    assert not any(c[0] == "submit" for c in schedd.calls)


def test_nothing_is_done_at_a_schedd_with_the_fix_and_a_failure_is_tried_again() -> None:
    fixed, old = RecordingSchedd(), RecordingSchedd(fail=True)
    nudger = Nudger(BINDINGS, "testbed")
    nudger.ends.seen("new", [10.0])
    nudger.ends.seen("old", [10.0])
    assert nudger.nudge({"new": (fixed, NEW), "old": (old, OLD)}, 20.0) == []
    assert fixed.calls == [] and nudger.ends.due(20.0) == ("old",)
    old.fail = False
    assert nudger.nudge({"new": (fixed, NEW), "old": (old, OLD)}, 21.0) == ["old"]
