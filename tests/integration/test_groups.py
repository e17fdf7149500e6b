"""Allocations on real pilots: a pilot charged to an allocation's SLURM account starts only
jobs of that allocation's accounting groups.

Pilots are started by hand through the site interface (gsi over SSH, frankfurt through
slurmrestd), each with its own token, as the service starts them for `Submit.allocation`:
alloc-a (SLURM account alloc-a) serves group_a, alloc-b (account alloc-b) group_b. alice
submits with `accounting_group`. The START clause the pilot appends is also evaluated by
HTCondor's own `classad_eval` against hostile AcctGroup values.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import htcondor2 as htcondor
import pytest
from conftest import run, service_config, slurm
from pilottokens import list_live, mint
from test_loop import clean_pool, completions, submit_script, wait_for

from provisioner.config import AllocationConfig, Config
from provisioner.pilot.params import local_config, params_from_env
from provisioner.pilot.script import render_pilot_script
from provisioner.service.loop import Provisioner
from provisioner.sites import make_backend
from provisioner.sites.base import PilotRequest, SiteBackend

#: The testbed's SLURM accounts of the two grants (slurmdbd's associations of user pilot
#: where the testbed runs SLURM's accounting; any account string is accepted without).
ALLOC_A = AllocationConfig(name="alloc-a", account="alloc-a", amount=6000 / 60,
                           period="monthly", groups=("group_a",))
ALLOC_B = AllocationConfig(name="alloc-b", account="alloc-b", amount=3000 / 60,
                           period="monthly", groups=("group_b",))


def allocated_config() -> Config:
    """The testbed's configuration with both grants at both sites (their pilots charged
    to the allocations' accounts, not the sites')."""
    config = service_config()
    sites = tuple(s.model_copy(update={"account": None, "allocations": (ALLOC_A, ALLOC_B)})
                  for s in config.sites)
    return config.model_copy(update={"sites": sites})


@pytest.fixture
def clean() -> Iterator[None]:
    clean_pool()
    yield
    list_live()
    clean_pool()


class Started:
    """A pilot started by hand at `site`, charged to `alloc`."""

    def __init__(self, config: Config, site: str, alloc: AllocationConfig) -> None:
        self.site, self.alloc = site, alloc
        cfg = config.site(site)
        self.backend: SiteBackend = make_backend(cfg, config.pool)
        self.token = mint(f"pilot-{site}-{uuid.uuid4().hex[:12]}@testbed", lifetime_s=1800)
        cpus = max(2, cfg.pilot.min_cpus)
        self.cpus = cpus
        self.request = PilotRequest(
            cpus=cpus, memory_mb=cfg.pilot.memory_per_cpu_mb * cpus, walltime_s=1200,
            shutdown_margin_s=cfg.pilot.shutdown_margin_s, account=alloc.account,
            script=render_pilot_script(config, cfg, 1200, 0, token=self.token.text,
                                       allocation=alloc.name))
        self.job_id = ""

    def submit(self) -> str:
        self.job_id = self.backend.submit(self.request)
        return self.job_id

    @property
    def key(self) -> str:
        return f"{self.site}/{self.job_id}"

    def slot(self) -> dict[str, Any] | None:
        """Its partitionable slot's ad, once in the collector."""
        ads = htcondor.Collector().query(
            htcondor.AdType.Startd, constraint=f'PilotSite == "{self.site}" && '
            f'PilotSlurmJobId == "{self.job_id}" && PartitionableSlot =?= true',
            projection=["Name", "Cpus", "TotalSlotCpus", "PilotAllocation", "PilotGroups",
                        "ChildCpus"])
        return dict(ads[0]) if ads else None

    def all_free(self) -> bool:
        slot = self.slot()
        return slot is not None and slot["Cpus"] == slot["TotalSlotCpus"] == self.cpus


def negotiation_cycles() -> list[dict[str, int]]:
    """The negotiator's last cycles as its ad in the collector tells them (it keeps a few,
    newest first, and is sent every NEGOTIATOR_UPDATE_INTERVAL): when each started, the
    slots and idle jobs it saw."""
    (ad,) = htcondor.Collector().query(htcondor.AdType.Negotiator)
    out = []
    for i in range(10):
        if f"LastNegotiationCycleTime{i}" not in ad:
            break
        out.append({key: int(ad.get(f"LastNegotiationCycle{attr}{i}", 0)) for key, attr in
                    (("start", "Time"), ("slots", "CandidateSlots"), ("idle", "NumIdleJobs"))})
    return out


def job_status(cluster: str) -> int | None:
    ads = htcondor.Schedd().query(constraint=f"ClusterId == {cluster}",
                                  projection=["JobStatus"])
    return int(ads[0]["JobStatus"]) if ads else None


def never_matched(cluster: str) -> bool:
    """The job is in the queue and the negotiator never gave it a slot (the schedd
    counts every match it was handed, NumJobMatches, and stamps each start)."""
    ads = htcondor.Schedd().query(constraint=f"ClusterId == {cluster}",
                                  projection=["NumJobMatches", "JobStartDate"])
    return bool(ads) and not ads[0].get("NumJobMatches") and not ads[0].get("JobStartDate")


def wait_idle_beside(pilot: Started, clusters: list[str], cycles: int = 2
                     ) -> tuple[list[dict[str, int]], list[object]]:
    """Wait for `cycles` negotiation cycles that began after `pilot`'s ad was in the
    collector (so their negotiator had its slot). Returns those cycles and whatever was
    seen meanwhile that breaks the rule: the pilot with a core taken, or one of the jobs
    `clusters` no longer idle."""
    mark = int(time.time())  # the ad is in the collector now: a later cycle has it
    broken: list[object] = []

    def after() -> list[dict[str, int]]:
        if not pilot.all_free():
            broken.append(pilot.slot())
        broken.extend((c, s) for c in clusters if (s := job_status(c)) != 1)
        new = [c for c in negotiation_cycles() if c["start"] > mark]
        return new if len(new) >= cycles else []

    seen = wait_for(f"{cycles} negotiation cycles beside {pilot.key}", after, 90, step=0.5)
    assert isinstance(seen, list)
    return seen, broken


def squeue_account(site: str, job_id: str) -> str:
    return slurm(site, ["squeue", "-h", "-j", job_id, "-o", "%a"]).stdout.strip()


def test_an_allocations_pilot_runs_only_its_groups_jobs(clean: None) -> None:
    config = allocated_config()
    a = Started(config, "gsi", ALLOC_A)
    b = Started(config, "frankfurt", ALLOC_B)
    list_live(a.token, b.token)
    other = submit_script("group-b", "echo job-$1-ok\n", extra="accounting_group = group_b\n")
    plain = submit_script("no-group", "echo job-$1-ok\n")
    a.submit()
    slot = wait_for("alloc-a's pilot in the pool", a.slot, 120)
    assert isinstance(slot, dict)
    assert (slot["PilotAllocation"], slot["PilotGroups"]) == ("alloc-a", "group_a"), slot
    # SLURM charges it to the allocation's account; the pool reads the groups apart
    assert squeue_account("gsi", a.job_id) == "alloc-a"
    snapshot = Provisioner(config).observe().snapshot
    (pilot,) = [p for p in snapshot.pilots if p.key == a.key]
    assert pilot.account == "alloc-a", pilot
    assert sorted((d.shape.group, d.idle) for d in snapshot.demand) == [
        ("", 1), ("group_b", 1)], snapshot.demand

    cycles, broken = wait_idle_beside(a, [other, plain])
    assert broken == [], broken  # both jobs idle beside all its free cores...
    assert never_matched(other) and never_matched(plain)
    for cycle in cycles:  # ...through cycles that each had its slot and both jobs
        assert cycle["slots"] >= 1 and cycle["idle"] >= 2, cycles

    mine = submit_script("group-a", "echo job-$1-ok\n", extra="accounting_group = group_a\n")
    wait_for("group_a's job done", lambda: job_status(mine) is None, 120)
    assert list(completions(mine)) == [a.key]
    assert (job_status(other), job_status(plain)) == (1, 1)

    b.submit()
    wait_for("group_b's job done", lambda: job_status(other) is None, 180)
    assert list(completions(other)) == [b.key]
    assert squeue_account("frankfurt", b.job_id) == "alloc-b"
    assert {j.job_id: j.account for j in b.backend.list_pilots()}[b.job_id] == "alloc-b"
    snapshot = Provisioner(config).observe().snapshot
    accounts = {p.key: p.account for p in snapshot.pilots}
    assert (accounts[a.key], accounts[b.key]) == ("alloc-a", "alloc-b"), accounts
    # the job of no group has had two pilots of free cores and neither took it
    wait_for("alloc-b's pilot idle again", b.all_free, 60)
    assert never_matched(plain)
    for name in ("group-a", "group-b"):
        assert Path(f"/home/alice/out/{name}/0.out").read_text().strip() == "job-0-ok"


#: AcctGroup values a job may carry (ClassAd text; None: no AcctGroup at all), and
#: whether a pilot of groups group_a and group_c starts it.
HOSTILE = [
    ('"group_a"', True), ('"group_c"', True),
    (None, False), ("undefined", False), ('""', False), ('"GROUP_A"', False),
    ('"group_a_evil"', False), ('"evil_group_a"', False), ('"group_"', False),
    ('"group_a,group_b"', False), ('"group_b,group_a"', False), ('"group_a group_b"', False),
    ('" group_a"', False), ('"group_a,"', False), ('"group_a\\""', False),
    ('"group_a\\" || true || \\""', False), ('"group_a.sub"', False),
    ("5", None), ("error", None), ("true", None), ('{"group_a"}', None),
]


def pilot_start_clause(groups: str) -> str:
    """What a pilot of `groups` appends to its START, as its wrapper writes it."""
    env = {"PILOT_SITE": "gsi", "PILOT_PROVISIONER_ID": "testbed", "PILOT_COLLECTOR":
           "cm:9618", "PILOT_UID_DOMAIN": "testbed", "PILOT_IMAGE": "/i.sif",
           "PILOT_CONDOR_CONFIG": "/c", "PILOT_WALLTIME_S": "600", "SLURM_JOB_ID": "1",
           "PILOT_ALLOCATION": "alloc-a", "PILOT_GROUPS": groups}
    conf = local_config(params_from_env(env, now=0.0), Path("/w"))
    (clause,) = re.findall(r"^START = \$\(START\) && (.*)$", conf, re.M)
    return clause


def test_the_start_clause_under_classad_eval_admits_only_a_whole_own_group() -> None:
    """HTCondor's own evaluation (the pool's version) of the clause a pilot appends:
    only a job whose AcctGroup is exactly one of the pilot's groups starts; no group, a
    list, a substring or a quote does not, and a value that is no string is an error
    (which starts nothing either)."""
    clause = pilot_start_clause("group_a,group_c")
    directory = Path(tempfile.mkdtemp(prefix="groups."))

    def evaluate(i: int, value: str | None) -> str:
        job = directory / f"job{i}.ad"
        job.write_text("" if value is None else f"AcctGroup = {value}\n")
        # the ClassAd language alone: no configuration needed
        out = run(["classad_eval", "-quiet", 'PilotGroups = "group_a,group_c"',
                   "-target-file", str(job), clause],
                  env={"CONDOR_CONFIG": "ONLY_ENV"}).stdout.split()
        return out[-1] if out else ""

    with ThreadPoolExecutor(4) as pool:
        results = pool.map(evaluate, range(len(HOSTILE)), [v for v, _ in HOSTILE])
        got = dict(zip([v for v, _ in HOSTILE], results, strict=True))
    want = {v: {True: "true", False: "false", None: "error"}[s] for v, s in HOSTILE}
    assert got == want, json.dumps(got, indent=1)
