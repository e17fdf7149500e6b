"""The controller with allocations: a refused account stops only its allocation, and
pilots just sent count against their allocation's budget in a replan."""

from __future__ import annotations

from dataclasses import replace

from provisioner.decide.controller import Controller
from provisioner.errors import Misconfigured, Transient
from provisioner.model import Snapshot
from provisioner.sites.slurm_refusals import classify_sbatch

from .allocs import DEC10, alloc, budgeted, groups_config, gsnap, job
from .helpers import site

NOW = DEC10
ACCOUNT_TEXT = ("sbatch: error: Batch job submission failed: Invalid account or "
                "account/partition combination specified\n")


def two_allocations() -> Controller:
    cfg = groups_config(
        budgeted(site("gsi", walltime_s=3600, max_submit=10, max_pending=10),
                 alloc("alloc-a", ["group_a"], amount=1e6),
                 alloc("alloc-x", ["group_a"], account="acct-x", amount=1e6)),
        site("frankfurt", walltime_s=3600, max_submit=10, max_pending=10))
    return Controller(cfg)


def demand(jobs: int = 6) -> Snapshot:
    return gsnap([(job(16), jobs)], sites=("gsi", "frankfurt"),
                 spent={("gsi", "alloc-a"): 0.0, ("gsi", "alloc-x"): 0.0})


def test_a_refused_account_stops_only_its_allocation() -> None:
    c = two_allocations()
    first = c.cycle(demand(), NOW)
    x = next(s for s in first.submits if s.allocation == "alloc-x")
    error = classify_sbatch("gsi", ACCOUNT_TEXT)
    assert isinstance(error, Misconfigured)
    line = c.sent(x, [], error, NOW)
    why = c.stopped_allocations[("gsi", "alloc-x")]
    assert why.startswith("stopped: SLURM refused its account, field "
                          "sites[0].allocations[account=acct-x].account: Invalid account")
    assert "gsi/alloc-x" in line and "other allocations go on" in line
    assert "gsi" not in c.limits.stopped  # not the site
    # the next cycles charge nothing to alloc-x; alloc-a (same site, same group) goes on
    later = c.cycle(demand(), NOW + 60)
    assert not [s for s in later.submits if s.allocation == "alloc-x"]
    assert [s for s in later.submits if s.site == "gsi" and s.allocation == "alloc-a"]
    budget = next(b for b in later.budgets if b.name == "alloc-x")
    assert budget.stopped == why and budget.line() == f"gsi/alloc-x: {why}"


def test_a_refused_partition_still_stops_the_site() -> None:
    c = two_allocations()
    first = c.cycle(demand(), NOW)
    a = next(s for s in first.submits if s.allocation == "alloc-a")
    error = classify_sbatch("gsi", "sbatch: error: Batch job submission failed: Invalid "
                                   "partition name specified")
    c.sent(a, [], error, NOW)
    assert "gsi" in c.limits.stopped and not c.stopped_allocations


def test_a_replan_counts_the_pilots_just_sent_against_the_budget() -> None:
    c = two_allocations()
    cfg = c.config
    c.config = cfg.model_copy(update={"sites": (cfg.sites[0].model_copy(update={
        "allocations": (alloc("alloc-a", ["group_a"], amount=40),)}), cfg.sites[1])})
    snapshot = replace(demand(12), books=gsnap(spent={("gsi", "alloc-a"): 0.0}).books)
    first = c.cycle(snapshot, NOW)
    [a] = [s for s in first.submits if s.allocation == "alloc-a"]
    assert a.count == 2  # 40 core-h: two 16-core pilots of 1 h
    c.sent(a, ["101", "102"], None, NOW)
    assert {p.account for p in c.just_sent} == {"alloc-a"}
    [f] = [s for s in first.submits if s.site == "frankfurt"]
    c.sent(f, [], Transient("busy"), NOW)
    # frankfurt failed: its jobs are placed anew, but alloc-a has 8 core-h left once its
    # two pilots just sent are counted: no 16-core pilot fits
    assert c.replan(NOW) == []
