"""A group idle beside a fitting pilot that stays unclaimed is stuck after
`policy.stuck_after_s`: reported once, not provisioned for, its pilot released; it is
provisioned for again once fewer of its jobs are idle or its shape changes."""

from __future__ import annotations

from dataclasses import replace

from provisioner.decide.controller import Controller
from provisioner.model import Demand, JobShape, PilotState, Release, Snapshot
from tests.unit.helpers import NOW, config, pilot, site, snap

SHAPE = JobShape(1, 2000, requirements='TARGET.Arch == "X86_64" && TARGET.HasMagic =?= true')


def controller(after: float = 600, retry: float = 3600) -> Controller:
    cfg = config(site("gsi"))
    policy = cfg.policy.model_copy(update={"stuck_after_s": after, "stuck_retry_s": retry})
    return Controller(cfg.model_copy(update={"policy": policy}))


def world(idle: int = 4, state: PilotState = PilotState.IDLE, job_id: str = "7",
          shape: JobShape = SHAPE) -> Snapshot:
    s = snap(pilots=[pilot(job_id, state)])
    return replace(s, demand=(Demand(shape, idle, frozenset({"gsi"})),))


def test_a_group_idle_beside_the_same_unclaimed_pilot_gets_stuck_once() -> None:
    ctl = controller()
    for t in (0, 300):
        result = ctl.cycle(world(), NOW + t)
        assert not result.unmatchable and ctl.transitions == []
        assert not any(isinstance(a, Release) for a in result.actions)  # kept for the group
    result = ctl.cycle(world(), NOW + 600)
    assert [u.reason for u in result.unmatchable] == [
        "stuck: matches no pilot in practice (idle 600 s while pilot gsi/7 stayed unclaimed)"]
    assert len(ctl.transitions) == 1 and "not provisioned for" in ctl.transitions[0]
    assert [type(a).__name__ for a in result.actions] == ["Flag"]  # no longer kept
    result = ctl.cycle(world(), NOW + 620)
    assert ctl.transitions == []  # reported once
    assert [type(a).__name__ for a in result.actions] == ["Release"]
    # its pilot gone, the group still causes no new pilot
    result = ctl.cycle(replace(world(), pilots=()), NOW + 900)
    assert not result.submits and result.unmatchable


def test_fewer_idle_jobs_or_a_new_shape_are_provisioned_for_again() -> None:
    ctl = controller()
    for t in (0, 300, 600):
        ctl.cycle(world(), NOW + t)
    assert ctl.stuck.stuck
    empty = replace(world(idle=3), pilots=())
    result = ctl.cycle(empty, NOW + 900)  # one of them started (or was removed)
    assert result.submits and not result.unmatchable
    assert ctl.transitions and ctl.transitions[0].startswith("no longer stuck")
    other = replace(SHAPE, requirements=SHAPE.requirements + " && true")
    ctl2 = controller()
    for t in (0, 300, 600):
        ctl2.cycle(world(), NOW + t)
    result = ctl2.cycle(replace(world(shape=other), pilots=()), NOW + 900)
    assert result.submits and not result.unmatchable


def test_a_pilot_that_takes_work_or_a_group_that_starts_resets_the_clock() -> None:
    ctl = controller()
    ctl.cycle(world(), NOW)
    ctl.cycle(world(state=PilotState.BUSY), NOW + 300)  # the pilot was claimed meanwhile
    ctl.cycle(world(), NOW + 600)
    assert not ctl.stuck.stuck
    ctl = controller()
    ctl.cycle(world(idle=4), NOW)
    ctl.cycle(world(idle=3), NOW + 300)  # a job started
    result = ctl.cycle(world(idle=3), NOW + 600)
    assert not ctl.stuck.stuck and not result.unmatchable
    ctl = controller()
    ctl.cycle(world(job_id="7"), NOW)
    ctl.cycle(world(job_id="8"), NOW + 600)  # a different pilot: no evidence yet
    assert not ctl.stuck.stuck


def test_a_pilot_too_small_or_elsewhere_is_no_evidence_and_zero_turns_it_off() -> None:
    big = replace(SHAPE, cpus=32)
    ctl = controller()
    for t in (0, 300, 600, 900):
        ctl.cycle(world(shape=big), NOW + t)
    assert not ctl.stuck.stuck
    ctl = controller()
    for t in (0, 300, 600, 900):
        ctl.cycle(replace(world(), demand=(Demand(SHAPE, 4, frozenset({"fra"})),)), NOW + t)
    assert not ctl.stuck.stuck
    ctl = controller(after=0)
    for t in (0, 300, 600, 900):
        ctl.cycle(world(), NOW + t)
    assert not ctl.stuck.stuck


def test_stuck_shapes_survive_a_restart_through_the_controller_state() -> None:
    import json

    shape = replace(SHAPE, desired_sites=("gsi",), runtime_s=60,
                    match_attrs=(("Owner", '"alice"'),))
    ctl = controller()
    for t in (0, 300, 600):
        ctl.cycle(world(shape=shape), NOW + t)
    assert ctl.stuck.stuck
    restarted = controller()
    restarted.load(json.loads(json.dumps(ctl.state())))  # as the journal keeps it
    assert restarted.stuck.stuck == ctl.stuck.stuck
    # the restarted service starts no pilot for them
    result = restarted.cycle(replace(world(shape=shape), pilots=()), NOW + 900)
    assert not result.submits and [u.reason for u in result.unmatchable] == [
        ctl.stuck.stuck[shape].reason]
    broken = controller()
    broken.load({"stuck": [{"shape": {"cpus": "x"}, "idle": 1, "reason": "r"}, "junk"]})
    assert not broken.stuck.stuck


def test_a_stuck_group_is_tried_again_after_the_retry_period() -> None:
    # e.g. the negotiator was down longer than stuck_after_s: without a retry the group
    # would never get a pilot again (no job of it can start, so its idle count never drops)
    ctl = controller(after=600, retry=3600)
    for t in (0, 300, 600):
        ctl.cycle(world(), NOW + t)
    assert ctl.stuck.stuck
    gone = replace(world(), pilots=())
    result = ctl.cycle(gone, NOW + 600 + 3599)
    assert not result.submits and result.unmatchable
    result = ctl.cycle(gone, NOW + 600 + 3600)
    assert result.submits and not result.unmatchable and not ctl.stuck.stuck
    assert ctl.transitions and "provisioned for again" in ctl.transitions[0]
    # still stuck on the new pilot: found stuck again after stuck_after_s, reported again
    t0 = NOW + 600 + 3700
    for t in (0, 300, 600):
        result = ctl.cycle(world(job_id="9"), t0 + t)
    assert ctl.stuck.stuck and result.unmatchable
