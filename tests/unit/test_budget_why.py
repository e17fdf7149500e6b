"""Why a group's jobs wait for its allocations: the reasons' words, the report of a
cycle with allocations, the status ad and `provisioner why` (pure parts, plain data)."""

from __future__ import annotations

import dataclasses

from provisioner.config import Config
from provisioner.decide.budget import budget_of
from provisioner.decide.budget_why import paced_until
from provisioner.decide.explain import SiteWords, explain, shape_key
from provisioner.decide.plan import plan
from provisioner.decide.reasons import Reason, Why, sentence
from provisioner.model import CycleMemory, Pilot, PilotState
from provisioner.pool.job_ads import JobFacts
from provisioner.pool.status_ad import from_ad, to_ad
from provisioner.service.why import answer

from .allocs import DEC10, alloc, budgeted, groups_config, gsnap, job
from .helpers import site

NOW = DEC10


def cfg() -> Config:
    return groups_config(
        budgeted(site("gsi", walltime_s=3600, max_submit=20, max_pending=20, max_pilots=40),
                 alloc("alloc-a", ["group_a"], amount=1000),
                 alloc("alloc-b", ["group_b"], amount=31 * 24, pace="even")))


def spent(a: float, b: float) -> dict[tuple[str, str], float | None]:
    return {("gsi", "alloc-a"): a, ("gsi", "alloc-b"): b}


def test_the_words_of_each_group_reason() -> None:
    text = sentence(Why(Reason.GROUP_SPENT, {
        "group": "group_a", "budgets": "gsi/alloc-a: spent, 0 of 1000 core-h left for "
                                       "12 days"}), NOW)
    assert text.startswith("the allocations of group group_a are spent (gsi/alloc-a: spent, "
                           "0 of 1000 core-h left")
    text = sentence(Why(Reason.GROUP_PACED, {
        "group": "group_a", "allocation": "gsi/alloc-a", "unit": "core-h", "allows": 1,
        "needs": 16, "until": NOW + 15 * 3600}), NOW)
    assert text == ("group group_a is paced: gsi/alloc-a allows 1 core-h more now, and its "
                    "next pilot needs 16 core-h; the even pace lets it in at 15:00 UTC (in "
                    "about 15.0 h)")
    text = sentence(Why(Reason.GROUP_UNSERVED, {"group": "group_x",
                                                "groups": "group_a, group_b"}), NOW)
    assert text.startswith("accounting group group_x is served by no allocation "
                           "(configured groups: group_a, group_b)")
    text = sentence(Why(Reason.GROUP_UNSERVED, {"group": "", "groups": "group_a"}), NOW)
    assert text.startswith("the job names no accounting group")
    text = sentence(Why(Reason.GROUP_MAX_PILOTS, {"group": "group_a", "max_pilots": 2,
                                                  "allocation": "gsi/alloc-a"}), NOW)
    assert "max_pilots 2" in text and "gsi/alloc-a" in text
    text = sentence(Why(Reason.GROUP_CLOSED, {"group": "group_a", "budgets":
                                              "gsi/alloc-a: ended (2026-12-01), no new "
                                              "pilot"}), NOW)
    assert text.startswith("the allocations of group group_a take no new pilot (gsi/alloc-a: "
                           "ended")


def test_paced_until_is_when_the_ideal_line_covers_the_next_pilot() -> None:
    a = alloc(amount=31 * 24, pace="even")  # 1 core-h per hour in December
    b = budget_of("gsi", a, 9 * 24.0, [], 3600, NOW)  # on the line: 1 core-h allowed now
    assert b.allowance == 1.0
    # a 4-core pilot of 1 h needs the line at 220 core-h at its latest end, 4 h from
    # now: it may start 3 h from now
    assert paced_until(b, 0.0, 4.0) == NOW + 3 * 3600
    assert paced_until(b, 0.0, 1.0) == NOW
    assert paced_until(b, 0.0, 10_000.0) is None


def test_the_report_names_a_groups_reason_and_its_own_pilots() -> None:
    config = cfg()
    pilot_a = Pilot("gsi", "7", PilotState.IDLE, 16, 64000, NOW - 600, started_at=NOW - 500,
                    walltime_end=NOW + 3000, free_cpus=16, free_memory_mb=64000,
                    account="alloc-a")
    snapshot = gsnap([(job(4, "group_a"), 2), (job(4, "group_b"), 3), (job(2, "group_x"), 1)],
                     [pilot_a], spent=spent(0.0, 9 * 24 - 1))
    p = plan(snapshot, CycleMemory(), config, NOW)
    report = explain(snapshot, p, config, NOW, SiteWords())
    a = report.entry(shape_key(job(4, "group_a")))
    assert a is not None and a.why.reason is Reason.PILOT_READY
    b = report.entry(shape_key(job(4, "group_b")))
    # alloc-b's pilot is not group_b's: its jobs are paced, not told of alloc-a's pilot
    assert b is not None and b.why.reason is Reason.GROUP_PACED, b
    x = report.entry(shape_key(job(2, "group_x")))
    assert x is not None and x.why.reason is Reason.GROUP_UNSERVED and x.then is None
    assert {g.group for g in report.groups} == {"group_b", "group_x"}
    again = from_ad(to_ad(report))
    assert again is not None and again.groups == report.groups


def test_why_answers_a_job_from_its_group() -> None:
    config = cfg()
    snapshot = gsnap([(job(4, "group_a"), 2)], spent=spent(1000.0, 0.0))
    p = plan(snapshot, CycleMemory(), config, NOW)
    report = from_ad(to_ad(explain(snapshot, p, config, NOW, SiteWords())))
    assert report is not None
    facts = JobFacts(cluster=12, proc=0, owner="alice", status=1, qdate=NOW - 600,
                     shape=dataclasses.replace(job(4, "group_a"), group=""),
                     group="group_a")
    a = answer(facts, [report], NOW, "alice")
    assert a["reason"] == "group_spent"
    assert a["text"].startswith("The allocations of group group_a are spent (gsi/alloc-a: "
                                "spent, 0 of 1000 core-h left")
    # a job of the group whose shape the report does not hold yet: its group's reason
    newer = dataclasses.replace(facts, shape=job(8, ""), qdate=NOW + 5)
    assert answer(newer, [report], NOW, "alice")["reason"] == "group_spent"
