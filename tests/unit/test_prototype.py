"""Idle demand against a prototype of each site's pilot ad, with HTCondor's own ClassAd
matching (classad2 from the htcondor wheel) and real Requirements expressions: only what a
pilot could actually run is demand."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.config import PilotAdConfig, PilotRuntimeConfig, PoolConfig
from provisioner.decide.plan import plan
from provisioner.model import Demand, JobShape, PilotState
from provisioner.pool.classads import queue_view
from provisioner.pool.prototype import (
    PILOT_START,
    SiteMatcher,
    conjuncts,
    prototype_ad,
    site_verdict,
)
from tests.unit.helpers import NOW, config, memory, pilot, site, snap

#: What condor_submit writes for a vanilla job with file transfer.
DEFAULT = ('(TARGET.Arch == "X86_64") && (TARGET.OpSys == "LINUX") && '
           '(TARGET.Disk >= RequestDisk) && (TARGET.Memory >= RequestMemory) && '
           '((TARGET.FileSystemDomain == MY.FileSystemDomain) || (TARGET.HasFileTransfer))')
FSD = (("FileSystemDomain", '"cm"'),)


def shape(extra: str = "", cpus: int = 1, memory: int = 2000, runtime: int | None = None
          ) -> JobShape:
    req = f"({DEFAULT}) && ({extra})" if extra else DEFAULT
    return JobShape(cpus, memory, disk_kb=1000, runtime_s=runtime, requirements=req,
                    match_attrs=FSD)


def two_sites(**fra_ad: object):  # type: ignore[no-untyped-def]
    fra = site("frankfurt").model_copy(update={"pilot_ad": PilotAdConfig(**fra_ad)})
    return config(site("gsi"), fra)


def annotate(cfg, *shapes: JobShape) -> list[Demand]:  # type: ignore[no-untyped-def]
    return list(SiteMatcher(cfg).annotate(Demand(s, 3) for s in shapes))


def test_a_normal_job_matches_every_site() -> None:
    [d] = annotate(two_sites(), shape())
    assert d.sites == frozenset({"gsi", "frankfurt"}) and d.mismatch == ""


def test_a_container_job_matches_only_where_pilots_offer_containers() -> None:
    """The container job condor_submit writes for `container_image = x.sif`."""
    container = shape("TARGET.HasContainer && TARGET.HasSIF")
    no_containers = PilotRuntimeConfig(containers=False)
    fra = site("frankfurt").model_copy(update={"runtime": no_containers})
    gsi = site("gsi").model_copy(update={"runtime": no_containers})
    [none] = annotate(config(gsi, fra), container)
    assert none.sites == frozenset()
    assert none.mismatch == ("Requirements not met by any site's pilot ad: "
                             "TARGET.HasContainer (undefined: TARGET.HasContainer)")
    [one] = annotate(config(gsi, site("frankfurt")), container)
    assert one.sites == frozenset({"frankfurt"})
    [docker] = annotate(config(gsi, site("frankfurt")),
                        shape("TARGET.HasContainer && TARGET.HasDockerURL"))
    assert docker.sites == frozenset()


def test_opsys_mismatch_and_an_attribute_pilots_lack_are_unmatchable() -> None:
    windows, custom = shape('TARGET.OpSys == "WINDOWS"'), shape("TARGET.HasCVMFS_atlas")
    d_win, d_custom = annotate(two_sites(), windows, custom)
    assert d_win.sites == frozenset()
    assert d_win.mismatch.endswith(': TARGET.OpSys == "WINDOWS"')
    assert d_custom.sites == frozenset()
    [declared] = annotate(two_sites(extra_attributes={"HasCVMFS_atlas": True}), custom)
    assert declared.sites == frozenset({"frankfurt"})


def test_pilot_site_restricts_a_job_to_one_site() -> None:
    [d] = annotate(two_sites(), shape('TARGET.PilotSite == "gsi"'))
    assert d.sites == frozenset({"gsi"})
    [os_ver] = annotate(two_sites(opsys_and_ver="AlmaLinux9"),
                        shape('TARGET.OpSysAndVer == "AlmaLinux9"'))
    assert os_ver.sites == frozenset({"frankfurt"})


def test_sites_failing_on_different_clauses_are_named_each() -> None:
    [d] = annotate(two_sites(opsys_and_ver="AlmaLinux9"),
                   shape('TARGET.PilotSite == "gsi" && TARGET.OpSysAndVer == "AlmaLinux9"'))
    assert d.sites == frozenset()
    assert "gsi: TARGET.OpSysAndVer" in d.mismatch
    assert 'frankfurt: TARGET.PilotSite == "gsi"' in d.mismatch


def test_a_clause_on_what_only_a_real_node_knows_does_not_exclude() -> None:
    [d] = annotate(two_sites(), shape('TARGET.Machine == "gsi-n1.gsi"'))
    assert d.sites == frozenset({"gsi", "frankfurt"})


def test_the_pilot_start_expression_takes_part() -> None:
    m = prototype_ad(site("gsi", walltime_s=3600, margin=600), PoolConfig())
    assert site_verdict(shape(runtime=2000), m) == ""
    assert site_verdict(shape(runtime=3000), m).startswith("pilot START: ")
    # START wants the job done before the pilot stops: a runtime of exactly the usable
    # walltime is refused (the packing alone would take it)
    assert site_verdict(shape(runtime=3000 - 1), m) == ""
    assert site_verdict(shape(runtime=3000), m) != ""


def test_rows_without_requirements_are_left_as_they_were() -> None:
    plain = JobShape(1, 2000)
    assert annotate(two_sites(), plain) == [Demand(plain, 3)]
    off = two_sites().model_copy(update={"policy": two_sites().policy.model_copy(
        update={"match_requirements": False})})
    assert annotate(off, shape("TARGET.HasCVMFS_atlas")) == [
        Demand(shape("TARGET.HasCVMFS_atlas"), 3)]


def test_one_evaluation_per_shape_and_site_across_cycles() -> None:
    matcher = SiteMatcher(two_sites())
    rows = [Demand(shape(), 3), Demand(shape("TARGET.HasCVMFS_atlas"), 1)]
    matcher.annotate(rows)
    matcher.annotate(rows)
    assert matcher.evaluations == 4


def test_plan_provisions_nothing_for_an_unmatchable_group_and_keeps_no_pilot() -> None:
    cfg = two_sites()
    demand = annotate(cfg, shape("TARGET.HasCVMFS_atlas"))
    s = snap(pilots=[pilot("7", PilotState.IDLE)], sites=("gsi", "frankfurt"))
    s = s.__class__(**{**s.__dict__, "demand": tuple(demand)})
    result = plan(s, memory(), cfg, NOW)
    assert not result.submits
    assert [u.reason for u in result.unmatchable] == [demand[0].mismatch]
    assert [type(a).__name__ for a in result.actions] == ["Flag"]  # the idle pilot goes


def test_a_group_restricted_to_one_site_gets_pilots_there_only() -> None:
    cfg = two_sites()
    demand = annotate(cfg, shape('TARGET.PilotSite == "frankfurt"'))
    s = snap(sites=("gsi", "frankfurt"))
    result = plan(s.__class__(**{**s.__dict__, "demand": tuple(demand)}), memory(), cfg, NOW)
    assert {a.site for a in result.submits} == {"frankfurt"}


def test_the_queue_reads_requirements_and_the_job_attributes_they_name() -> None:
    import classad2

    job = classad2.ClassAd({"JobStatus": 1, "RequestCpus": 1, "RequestMemory": 2000,
                            "RequestDisk": 1000, "FileSystemDomain": "cm", "QDate": 5})
    job["Requirements"] = classad2.ExprTree(DEFAULT)
    [d] = queue_view([job, job]).demand
    assert d.idle == 2 and d.shape.requirements == DEFAULT
    assert d.shape.match_attrs == FSD
    [annotated] = SiteMatcher(two_sites()).annotate([d])
    assert annotated.sites == frozenset({"gsi", "frankfurt"})


def test_prototype_start_is_pilot_conf_start() -> None:
    conf = (Path(__file__).parents[2] / "condor_config" / "pilot.conf").read_text()
    start = re.search(r"^START = (.*?)(?<!\\)$", conf, re.S | re.M)
    assert start is not None
    text = start.group(1).replace("\\\n", " ")
    text = text.replace("$(PILOT_STOP_AT)", "PilotStopAt").replace("time()", "PilotStartTime")
    # the GPU clause (a pilot with GPUs keeps their cores for GPU jobs) is not the
    # prototype's: a CPU-only job's pilot asks for no GPUs (tests/unit/test_gpu_share.py)
    text = " ".join(text.split())
    gpu = " && $(PILOT_GPU_START)"
    assert text.endswith(gpu)
    text = text[:-len(gpu)]
    assert " ".join(text.split()) == " ".join(PILOT_START.split())


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from(["A", "(B || C)", '(D == "x&&y")', "(E && F)"]),
                min_size=1, max_size=5))
def test_conjuncts_split_top_level_ands_only(parts: list[str]) -> None:
    text = " && ".join(parts)
    expected: list[str] = []
    for p in parts:
        expected += ["E", "F"] if p == "(E && F)" else [p.strip("()") if p == "A" else
                                                        p[1:-1]]
    assert conjuncts(f"({text})") == expected


def test_extra_attribute_names_are_validated() -> None:
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="not a ClassAd attribute name"):
        PilotAdConfig(extra_attributes={"bad name": 1})


def test_transfer_plugins_are_unknowable_unless_the_site_declares_them() -> None:
    url = shape('stringListIMember("root", TARGET.HasFileTransferPluginMethods)')
    [d] = annotate(two_sites(), url)
    assert d.sites == frozenset({"gsi", "frankfurt"})  # only a real pilot can tell
    [declared] = annotate(two_sites(extra_attributes={"HasFileTransferPluginMethods":
                                                      "http,https,file"}), url)
    assert declared.sites == frozenset({"gsi"})


def test_a_group_no_site_matches_is_logged_once(caplog) -> None:  # type: ignore[no-untyped-def]
    matcher = SiteMatcher(two_sites())
    rows = [Demand(shape("TARGET.HasCVMFS_atlas"), 2)]
    matcher.annotate(rows)
    matcher.annotate(rows)
    assert caplog.text.count("cause no pilot: Requirements not met") == 1


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 24), st.integers(100, 90_000),
                          # (a runtime of exactly the usable walltime: START refuses it,
                          # the packing takes it; see test_the_pilot_start_expression...)
                          st.one_of(st.none(), st.integers(60, 100_000).filter(
                              lambda r: r not in (6600, 85800))),
                          st.integers(1, 30)), min_size=1, max_size=6))
def test_a_plain_jobs_requirements_change_no_decision(rows: list[tuple]) -> None:  # type: ignore[type-arg]
    """condor_submit's default Requirements match every site that has the resources:
    the plan is the one for the same jobs read without Requirements."""
    cfg = config(site("gsi", cpus=16, memory_mb=64000, walltime_s=7200),
                 site("frankfurt", cpus=8, memory_mb=30000, walltime_s=86400))
    plain = [Demand(JobShape(c, m, disk_kb=1000, runtime_s=r), n) for c, m, r, n in rows]
    evaluated = SiteMatcher(cfg).annotate(
        Demand(replace(d.shape, requirements=DEFAULT, match_attrs=FSD), d.idle) for d in plain)
    base = snap(pilots=[pilot("7", PilotState.IDLE, cpus=4, memory_mb=8000)],
                sites=("gsi", "frankfurt"))
    a = plan(replace(base, demand=tuple(plain)), memory(), cfg, NOW)
    b = plan(replace(base, demand=evaluated), memory(), cfg, NOW)
    assert a.actions == b.actions
    assert sorted((u.idle, u.reason) for u in a.unmatchable) == sorted(
        (u.idle, u.reason) for u in b.unmatchable)
