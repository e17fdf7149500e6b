"""`provisioner why`: the vocabulary of reasons, the service's report by shape, the status
ad's round trip, and the answer a job gets (pure parts, plain data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.decide.explain import MAX_SHAPES, Report, ShapeEntry, SiteWords, explain, shape_key
from provisioner.decide.failed_starts import START_ERROR, start_error
from provisioner.decide.plan import plan
from provisioner.decide.reasons import (
    Reason,
    Why,
    duration,
    largest_offer,
    memory,
    sentence,
    shape_words,
    unmatchable_reason,
    utc_clock,
)
from provisioner.model import Demand, JobShape, PilotState
from provisioner.pool import job_ads
from provisioner.pool.job_ads import JobFacts
from provisioner.pool.status_ad import constraint as ad_constraint
from provisioner.pool.status_ad import from_ad, to_ad
from provisioner.service import why
from provisioner.service.why import answer, parse_ids, redact
from tests.unit.fakes import FakePool
from tests.unit.helpers import NOW, config, pilot, site, snap
from tests.unit.helpers import memory as cycle_memory
from tests.unit.test_service_act import make_world

GSI = site("gsi", cpus=4, memory_mb=7800, max_pilots=2)
FRA = site("frankfurt", cpus=8, memory_mb=192 * 1024)
CONF = config(GSI, FRA)
ONE = JobShape(1, 500)
TERA = JobShape(1, 1024 * 1024)


def report_of(demand: list[tuple[JobShape, int]], pilots: list = (),  # type: ignore[assignment]
              words: SiteWords | None = None, **mem: object) -> Report:
    s = snap(demand, pilots, sites=("gsi", "frankfurt"))
    p = plan(s, cycle_memory(**mem), CONF, NOW)
    return explain(s, p, CONF, NOW, words or SiteWords(lead_s={"gsi": 90.0, "frankfurt": 300.0}))


# --- the vocabulary --------------------------------------------------------------------


@pytest.mark.parametrize("reason", list(Reason))
def test_every_reason_has_words_without_its_parameters(reason: Reason) -> None:
    text = sentence(Why(reason), NOW)
    assert text and "{" not in text and "None" not in text


def test_words_of_common_values() -> None:
    assert duration(40) == "40 s" and duration(720) == "12 min" and duration(9000) == "2.5 h"
    assert memory(500) == "500 MB" and memory(192 * 1024) == "192 GB"
    assert memory(1024 * 1024) == "1 TB"
    assert shape_words(4, 8192, 1, "cms") == "4 cores, 8 GB, 1 GPU, group cms"
    assert shape_words(1, 500) == "1 core, 500 MB"


def test_largest_offer_names_the_site_that_offers_most() -> None:
    offer = largest_offer(TERA, CONF.sites)
    assert offer == {"resource": "memory", "asked": 1024 * 1024, "largest": 192 * 1024,
                     "site": "frankfurt"}
    text = sentence(Why(Reason.NO_SITE, offer), NOW)
    assert text.startswith("no site offers 1 TB per job; the largest is frankfurt's 192 GB")
    assert largest_offer(JobShape(16, 100), CONF.sites)["site"] == "frankfurt"
    assert largest_offer(ONE, CONF.sites) == {}


def test_unmatchable_texts_map_to_codes() -> None:
    assert unmatchable_reason("RequestMemory 10 MB > largest pilot 1 MB") is Reason.NO_SITE
    assert unmatchable_reason("stuck: matches no pilot in practice (idle 1 s)") is Reason.STUCK
    assert unmatchable_reason("Requirements not met by any site's pilot ad") is \
        Reason.REQUIREMENTS


# --- the service's report ----------------------------------------------------------------


def test_a_pending_pilot_is_named_with_its_age_and_the_sites_lead() -> None:
    pending = pilot("41", PilotState.PENDING, site="gsi", cpus=4, memory_mb=7800,
                    submitted=NOW - 40)
    r = report_of([(ONE, 1)], [pending])
    e = r.entry(shape_key(ONE))
    assert e is not None and e.why.reason is Reason.PILOT_PENDING
    assert sentence(e.why, NOW) == ("a pilot for 4 cores is pending at gsi (40 s so far; "
                                    "this site's pilots start in about 90 s)")


def test_a_pilot_with_room_and_a_starting_one() -> None:
    idle = pilot("7", PilotState.IDLE, site="gsi", cpus=4, memory_mb=7800)
    e = report_of([(ONE, 1)], [idle]).entry(shape_key(ONE))
    assert e is not None and e.why.reason is Reason.PILOT_READY and e.why.get("pilot") == "7"
    starting = pilot("8", PilotState.STARTING, site="frankfurt", cpus=8, memory_mb=8000)
    e = report_of([(ONE, 1)], [starting]).entry(shape_key(ONE))
    assert e is not None and e.why.reason is Reason.PILOT_STARTING


def test_a_new_pilot_this_cycle_is_pending_from_now() -> None:
    s = snap([(ONE, 1)], [], sites=("gsi", "frankfurt"))
    p = plan(s, cycle_memory(), CONF, NOW)
    sent = [pilot("99", PilotState.PENDING, site=a.site, cpus=a.cpus, memory_mb=a.memory_mb,
                  submitted=NOW) for a in p.submits]
    assert sent
    e = explain(s, p, CONF, NOW, SiteWords(), sent=sent).entry(shape_key(ONE))
    assert e is not None and e.why.reason is Reason.PILOT_PENDING


def test_a_shape_no_site_fits_names_the_largest_offer() -> None:
    e = report_of([(TERA, 1), (ONE, 2)]).entry(shape_key(TERA))
    assert e is not None and e.why.reason is Reason.NO_SITE
    assert e.why.get("site") == "frankfurt" and e.why.get("largest") == 192 * 1024


def test_a_site_at_its_submission_limit_is_the_reason() -> None:
    only_gsi = JobShape(4, 4000, desired_sites=("gsi",))
    words = SiteWords(limits={"gsi": "at its submission limit (1 jobs, AssocMaxSubmitJobLimit)"})
    busy = pilot("5", PilotState.BUSY, site="gsi", cpus=4, memory_mb=7800)
    r = report_of([(only_gsi, 1)], [busy], words, limit_room={"gsi": 0})
    e = r.entry(shape_key(only_gsi))
    assert e is not None and e.why.reason is Reason.SITE_LIMIT and e.unplaced == 1
    assert sentence(e.why, NOW) == ("gsi is at its submission limit (1 jobs, "
                                    "AssocMaxSubmitJobLimit); waiting for a pilot there to end")


def test_a_paused_site_says_how_many_pilots_failed_and_when_it_is_tried_again() -> None:
    only_fra = JobShape(1, 500, desired_sites=("frankfurt",))
    words = SiteWords(breakers={"frankfurt": "open (2 pilots in a row never joined; "
                                             "retried in 900 s)"},
                      paused={"frankfurt": (2, NOW + 900)})
    e = report_of([(only_fra, 1)], [], words, submit_limit={"frankfurt": 0}).entry(
        shape_key(only_fra))
    assert e is not None and e.why.reason is Reason.SITE_PAUSED
    assert sentence(e.why, NOW + 300) == (
        "frankfurt is paused: its last 2 pilots ended without joining the pool; one pilot "
        f"tests it again at {utc_clock(NOW + 900)} (in about 10 min)")
    assert sentence(e.why, NOW + 901).endswith("one pilot tests it at the provisioner's "
                                               "next cycle")
    testing = Why(Reason.SITE_PAUSED, {"site": "frankfurt", "failures": 3})
    assert sentence(testing, NOW).endswith("one pilot tests it now, and more follow once "
                                           "it joins")
    # a report without the breaker's numbers still says why
    old = Why(Reason.SITE_PAUSED, {"site": "frankfurt", "breaker": "open"})
    assert sentence(old, NOW) == "frankfurt is paused: its last pilots never joined the pool (open)"


def test_a_completed_job_kept_in_the_queue_is_not_said_to_leave() -> None:
    a = answer(facts(status=4), [fresh()], NOW, "alice")
    assert a["reason"] == "done" and a["text"].startswith("Completed; nothing more is "
                                                          "provisioned for it")
    assert "leaves the queue" not in a["text"]
    assert answer(facts(status=3), [], NOW, "alice")["text"] == (
        "Removed; it leaves the queue shortly.")


def test_a_site_at_its_cap_and_the_per_cycle_budget() -> None:
    only_gsi = JobShape(4, 4000, desired_sites=("gsi",))
    busy = [pilot(str(i), PilotState.BUSY, site="gsi", cpus=4, memory_mb=7800)
            for i in range(2)]
    e = report_of([(only_gsi, 1)], busy).entry(shape_key(only_gsi))
    assert e is not None and e.why.reason is Reason.SITE_CAP and e.why.get("cap") == "max_pilots"


def test_an_unknown_pool_reports_no_shapes() -> None:
    s = snap([(ONE, 1)], pool_known=False)
    r = explain(s, plan(s, cycle_memory(), CONF, NOW), CONF, NOW, SiteWords())
    assert not r.pool_known and r.shapes == ()


@settings(max_examples=20, deadline=None)
@given(st.integers(min_value=1, max_value=3 * MAX_SHAPES))
def test_the_report_is_bounded_by_shape_whatever_the_queue(n: int) -> None:
    demand = [(JobShape(1, 100 + i), 1 + i % 7) for i in range(n)]
    r = report_of(demand)
    assert len(r.shapes) == min(n, MAX_SHAPES) and r.left_out == max(0, n - MAX_SHAPES)
    # the most idle shapes are the ones kept
    idles = sorted((i % 7 + 1 for i in range(n)), reverse=True)
    if n > MAX_SHAPES:
        assert min(e.idle for e in r.shapes) >= idles[MAX_SHAPES]


def test_shape_keys_are_stable_and_tell_shapes_apart() -> None:
    assert shape_key(ONE) == shape_key(JobShape(1, 500))
    assert len({shape_key(JobShape(1, 500, requirements=r)) for r in ("", "a", "b")}) == 3


# --- the ad ---------------------------------------------------------------------------


whys = st.builds(Why, st.sampled_from(list(Reason)), st.dictionaries(
    st.sampled_from(["site", "pilot", "cores", "since", "limit", "cause"]),
    st.one_of(st.integers(0, 10**6), st.text(max_size=20)), max_size=4))


@given(st.lists(st.tuples(st.text("0123456789abcdef", min_size=16, max_size=16),
                          st.integers(0, 10**5), whys, st.none() | whys), max_size=20))
def test_the_ad_round_trips(entries: list) -> None:  # type: ignore[type-arg]
    shapes = tuple(ShapeEntry(k, n, w, t, 1 if t else 0) for k, n, w, t in entries)
    r = Report("testbed", float(int(NOW)), 10.0, True, shapes, 3)
    back = from_ad(json.loads(json.dumps(to_ad(r))))
    assert back == r


def test_only_ads_of_the_provisioners_identity_are_read() -> None:
    assert ad_constraint("testbed") == ('MyType == "ProvisionerStatus" && '
                                        'AuthenticatedIdentity == "provisioner@testbed"')
    assert ad_constraint('x" || true || "').endswith("false")
    assert from_ad({"MyType": "ProvisionerStatus", "Schema": 99, "WrittenAt": 1}) is None


def test_the_service_publishes_its_report_and_counts_the_reasons() -> None:
    prov, pool, _backends, _clock = make_world()
    assert isinstance(pool, FakePool)
    pool.demand = (Demand(JobShape(1, 1000), 3), Demand(JobShape(1, 10**7), 2))
    prov.run_cycle()
    r = prov.metrics.registry.get_sample_value
    assert r("provisioner_waiting_jobs", {"reason": "no_site_fits"}) == 2
    assert r("provisioner_waiting_jobs", {"reason": "pilot_pending"}) == 3
    assert r("provisioner_waiting_jobs", {"reason": "stuck"}) == 0


# --- the answer -----------------------------------------------------------------------


def facts(**kw: object) -> JobFacts:
    base: dict[str, object] = {"cluster": 12, "proc": 0, "owner": "alice", "status": 1,
                               "shape": ONE, "qdate": NOW - 600}
    return JobFacts(**{**base, **kw})  # type: ignore[arg-type]


def fresh(entry: ShapeEntry | None = None, at: float = NOW - 5, known: bool = True) -> Report:
    return Report("testbed", at, 10.0, known, (entry,) if entry else ())


def test_malformed_ids_are_refused_with_status_2() -> None:
    assert parse_ids(["12", "12.3"]) == [(12, None), (12, 3)]
    for bad in ("12x", "-1", "1.2.3", "", "1;rm"):
        with pytest.raises(why.WhyError) as exc:
            parse_ids([bad])
        assert exc.value.status == why.MALFORMED and repr(bad) in str(exc.value)
    assert job_ads.constraint([(12, None), (13, 1)]) == \
        "(ClusterId == 12) || (ClusterId == 13 && ProcId == 1)"


def test_missing_ids() -> None:
    jobs = [facts(), facts(proc=1)]
    assert why.missing([(12, None), (12, 1), (12, 5), (13, None)], jobs) == ["12.5", "13"]


def test_an_idle_job_gets_its_shapes_reason() -> None:
    pending = Why(Reason.PILOT_PENDING, {"site": "gsi", "cores": 4, "since": NOW - 40})
    a = answer(facts(), [fresh(ShapeEntry(shape_key(ONE), 1, pending))], NOW, "alice")
    assert a["reason"] == "pilot_pending" and a["text"].startswith("A pilot for 4 cores")
    assert not a["report"]["stale"]


def test_a_stale_report_says_how_old_it_is() -> None:
    pending = Why(Reason.PILOT_PENDING, {"site": "gsi", "cores": 4, "since": NOW - 900})
    a = answer(facts(), [fresh(ShapeEntry(shape_key(ONE), 1, pending), at=NOW - 720)], NOW,
               "alice")
    assert a["text"].startswith("The provisioner has not reported for 12 min; what it last "
                                "said: a pilot for 4 cores")
    assert a["report"]["stale"]


def test_unseen_shapes_no_report_and_an_unknown_pool() -> None:
    assert answer(facts(), [], NOW, "alice")["reason"] == "no_report"
    a = answer(facts(qdate=NOW - 1), [fresh()], NOW, "alice")
    assert a["reason"] == "not_seen" and a["text"].startswith("Submitted after")
    a = answer(facts(qdate=NOW - 60), [fresh()], NOW, "alice")
    assert "never seen" in a["text"]
    assert answer(facts(), [fresh(known=False)], NOW, "alice")["reason"] == "pool_unknown"


def test_running_and_held_come_from_the_jobs_own_ad() -> None:
    a = answer(facts(status=2, site="gsi", pilot="1234", started=NOW - 60), [], NOW, "alice")
    assert a["reason"] == "running" and a["text"].startswith("Running on pilot gsi/1234 since")
    reason = ("container image /home/alice/bad.sif could not be used: FATAL: no such file "
              "(3 failed starts; release the job once fixed)")
    held = facts(status=5, hold_reason=reason, hold_subcode=1007, cool_downs=3)
    a = answer(held, [], NOW, "alice")
    assert a["text"].startswith("Held after 3 failed starts: container image /home/alice/")
    other = answer(held, [], NOW, "bob")
    assert "/home/alice" not in json.dumps(other) and "<path>" in other["text"]


def test_a_job_cooling_after_a_failed_start() -> None:
    job = facts(failed_starts=2, failure="Error from slot1@x: Singularity test failed: boom",
                cooling=True)
    a = answer(job, [fresh()], NOW, "alice")
    assert a["reason"] == "failed_starts" and a["text"].startswith(
        "Its last start failed (2 failed starts): container image could not be used: boom;")
    # its cool-down over, not yet retried: still its failed start, not the pilot's room
    ready = fresh(ShapeEntry(shape_key(ONE), 1, Why(Reason.PILOT_READY, {"site": "gsi",
                                                                     "pilot": "7"})))
    a = answer(facts(failed_starts=1, failure="Error from slot1@x: Singularity test failed: "
                     "boom", cooling=False), [ready], NOW, "alice")
    assert a["reason"] == "failed_starts" and a["text"].startswith(
        "Its last start failed (1 failed start): container image could not be used: boom")


def test_a_failed_starts_error_is_worded_as_the_pools_hold_words_it() -> None:
    for conf in ("submit.conf", "central-manager.conf"):
        policy = Path(__file__).resolve().parents[2] / "condor_config" / conf
        knob = next(line for line in policy.read_text().splitlines()
                    if line.startswith("PROVISIONER_START_ERROR = "))
        assert f'regexps("{START_ERROR}", VacateReason' in knob, conf
    assert start_error("Error from slot1_2@pilot-gsi-2@gsi-n1: Singularity test failed:FATAL:"
                       "   while extracting broken.sif: failed") == (
        "container image could not be used: while extracting broken.sif: failed")
    assert start_error("Error from slot1@n: The job wrapper failed to execute the job: "
                       "executable /x does not exist") == (
        "the job could not be started: executable /x does not exist")
    assert start_error("odd") == "the job could not be started: odd"


def test_redact_hides_paths_and_urls() -> None:
    assert redact("open /home/bob/x.sif: no; root://o//data/f") == "open <path>: no; <path>"
    assert redact("3 failed starts, the last on slot1@n1") == \
        "3 failed starts, the last on slot1@n1"


def test_the_pools_own_tools_are_asked_with_argv_lists() -> None:
    argv = job_ads.queue_argv([(12, None)], "submit2")
    assert argv[:4] == ["condor_q", "-allusers", "-json", "-constraint"]
    assert argv[4] == "(ClusterId == 12)" and argv[-2:] == ["-name", "submit2"]
    assert "Requirements" in argv[6].split(",") and "Cmd" not in argv[6].split(",")
    from provisioner.pool.status_ad import status_argv

    assert status_argv("testbed")[:3] == ["condor_status", "-any", "-json"]


def test_a_tool_that_fails_names_what() -> None:
    with pytest.raises(job_ads.ToolFailed) as exc:
        job_ads.tool(["python3", "-c", "import sys; sys.exit('no schedd here')"], "the queue")
    assert str(exc.value) == "cannot read the queue: no schedd here"
    ads = job_ads.tool(["python3", "-c", "print('[{\"A\": 1}, {\"A\": 2}]')"], "ads")
    assert [ad["A"] for ad in ads] == [1, 2]


#: A job as condor_q -json prints it (expressions as "/Expr(...)/").
JOB = {"ClusterId": 12, "ProcId": 3, "Owner": "alice", "JobStatus": 1, "QDate": 5,
       "RequestCpus": 2, "RequestMemory": "/Expr(ImageSize * 2)/", "ImageSize": 300,
       "RequestDisk": "/Expr(DiskUsage)/", "DiskUsage": 45,
       "Requirements": '/Expr((TARGET.Memory >= RequestMemory) && '
                       '(TARGET.FileSystemDomain == MY.FileSystemDomain))/',
       "FileSystemDomain": "cm", "HoldReason": "/Expr(undefined)/"}


def test_a_jobs_shape_from_json_is_the_services_from_the_same_ad() -> None:
    import classad2

    from provisioner.pool.classads import shape_of

    shapes = job_ads.Shapes(job_ads.job_attrs())
    facts = job_ads.facts_of(JOB, shapes.of(JOB), NOW)
    assert (facts.cluster, facts.proc, facts.owner, facts.hold_reason) == (12, 3, "alice", "")
    ad = classad2.parseOne("\n".join(
        f"{k} = {v[6:-2] if isinstance(v, str) and v.startswith('/Expr(') else json.dumps(v)}"
        for k, v in JOB.items()))
    assert facts.shape == shape_of(ad)
    assert facts.shape.memory_mb == 600 and facts.shape.disk_kb == 45
    assert facts.shape.match_attrs == (("FileSystemDomain", '"cm"'),)
    for i in range(100):  # alike jobs share one evaluation
        shapes.of({**JOB, "ProcId": i})
    assert len(shapes.ads) == 1


def test_attributes_a_request_reads_are_found() -> None:
    shapes = job_ads.Shapes(["RequestDisk", "RequestCpus", "RequestMemory"])
    shapes.ad({"RequestDisk": "/Expr(DiskUsage)/", "RequestMemory": 500})
    shapes.ad({"RequestDisk": "/Expr(DiskUsage)/", "RequestCpus": "/Expr(NumCores * 2)/"})
    assert shapes.unread() == {"DiskUsage", "NumCores"}
    assert "DiskUsage" in job_ads.job_attrs()
