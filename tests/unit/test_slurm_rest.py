"""The slurmrestd backend's translations: version choice, token checks, replies that
are not slurmrestd's, refusals into the error kinds, pilots and end records out of
job records. HTTP is answered by a hand-written fake server (httpx's MockTransport);
that the real slurmrestd answers so is tests/integration's to show."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from provisioner.config import parse_config
from provisioner.errors import AtLimit, Misconfigured, Rejected, Transient, Unreachable
from provisioner.pilot.endrecord import EndRecord
from provisioner.sites import make_backend
from provisioner.sites.base import PilotRequest, SiteJobState
from provisioner.sites.rest_client import RestClient, pick_version, server_versions
from provisioner.sites.rest_token import TokenFile, expiry
from provisioner.sites.slurm_rest import SlurmRestBackend

NOW = 1_800_000_000.0


def jwt(exp: float | None, user: str = "pilot") -> str:
    def part(doc: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")
    claims: dict[str, Any] = {"sun": user, "iat": NOW - 10}
    if exp is not None:
        claims["exp"] = exp
    return f"{part({'alg': 'HS256', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"


def token_file(tmp_path: Path, exp: float | None = NOW + 3600, mode: int = 0o600) -> Path:
    path = tmp_path / "site.jwt"
    path.write_text(jwt(exp) + "\n")
    path.chmod(mode)
    return path


OPENAPI = {"openapi": "3.0.2", "paths": {
    "/slurm/v0.0.40/jobs/": {}, "/slurm/v0.0.41/jobs/": {}, "/slurm/v0.0.42/jobs/": {},
    "/slurm/v0.0.42/job/submit": {}, "/slurmdb/v0.0.42/jobs/": {}}}

Handler = Callable[[httpx.Request], httpx.Response]


def reply(doc: Any = None, status: int = 200, errors: list[dict[str, Any]] | None = None
          ) -> httpx.Response:
    body = dict(doc or {})
    body.setdefault("errors", errors or [])
    body.setdefault("warnings", [])
    return httpx.Response(status, json=body)


class FakeServer:
    """Answers /openapi/v3 and whatever `routes` ("METHOD path" -> handler) say;
    records every request."""

    def __init__(self, routes: dict[str, Handler] | None = None,
                 openapi: Handler | None = None) -> None:
        self.routes = routes or {}
        self.openapi = openapi or (lambda r: httpx.Response(200, json=OPENAPI))
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path == "/openapi/v3":
            return self.openapi(request)
        key = f"{request.method} {request.url.path.split('/', 3)[3]}"
        if key not in self.routes:
            return httpx.Response(404, text="not found")
        return self.routes[key](request)


def backend(tmp_path: Path, server: FakeServer, **kw: Any) -> SlurmRestBackend:
    token = TokenFile(site="fra", path=str(token_file(tmp_path)),
                      what="sites[1].rest.token_file", clock=lambda: NOW)
    client = RestClient(site="fra", url="http://rest:6820", user="pilot", token=token,
                        where="sites[1].rest.url", transport=httpx.MockTransport(server))
    return SlurmRestBackend(name="fra", provisioner_id="prov1", client=client, **kw)


def job(job_id: int, state: str = "RUNNING", name: str = "htcpilot-prov1",
        **more: Any) -> dict[str, Any]:
    num = {"set": True, "infinite": False}
    return {"job_id": job_id, "name": name, "user_name": "pilot", "job_state": [state],
            "state_reason": "None", "cpus": {**num, "number": 4},
            "memory_per_node": {**num, "number": 7800},
            "submit_time": {**num, "number": int(NOW) - 100},
            "start_time": {**num, "number": int(NOW) - 50},
            "end_time": {**num, "number": int(NOW) + 3000}, **more}


# --- the API version ------------------------------------------------------------

def test_the_newest_version_both_speak_is_chosen() -> None:
    offered = server_versions(OPENAPI)
    assert offered == {"v0.0.40", "v0.0.41", "v0.0.42"}
    assert pick_version(offered) == "v0.0.42"
    assert pick_version(offered | {"v0.0.43", "v0.0.44"}) == "v0.0.42"
    assert pick_version({"v0.0.39", "v0.0.41"}) == "v0.0.41"
    assert pick_version(offered, "v0.0.41") == "v0.0.41"


def test_no_shared_version_names_both_sides() -> None:
    with pytest.raises(ValueError, match=r"offers v0\.0\.43, v0\.0\.44; this backend speaks"):
        pick_version({"v0.0.44", "v0.0.43"})
    with pytest.raises(ValueError, match=r"api_version v0\.0\.39 is not spoken by both"):
        pick_version({"v0.0.39", "v0.0.42"}, "v0.0.39")


def test_the_version_is_asked_once_and_used_in_every_path(tmp_path: Path) -> None:
    server = FakeServer({"GET jobs": lambda r: reply({"jobs": []})})
    b = backend(tmp_path, server)
    b.list_pilots()
    b.list_pilots()
    paths = [r.url.path for r in server.requests]
    assert paths == ["/openapi/v3", "/slurm/v0.0.42/jobs", "/slurm/v0.0.42/jobs"]
    sent = server.requests[1].headers
    assert sent["X-SLURM-USER-NAME"] == "pilot"
    assert sent["X-SLURM-USER-TOKEN"].count(".") == 2


def test_a_server_without_a_shared_version_leaves_the_site_unknown(tmp_path: Path) -> None:
    server = FakeServer(openapi=lambda r: httpx.Response(
        200, json={"paths": {"/slurm/v0.0.45/jobs/": {}}}))
    with pytest.raises(Unreachable, match=r"site fra: sites\[1\]\.rest\.url .*v0\.0\.45"):
        backend(tmp_path, server).list_pilots()


# --- answers that are not slurmrestd's --------------------------------------------

@pytest.mark.parametrize(("answer", "words"), [
    (lambda r: httpx.Response(200, text="<html>hello</html>",
                              headers={"content-type": "text/html"}),
     r"text/html, not JSON .*is this slurmrestd\?"),
    (lambda r: httpx.Response(404, text="nothing here"), r"HTTP 404: is this slurmrestd\?"),
    (lambda r: httpx.Response(200, json=["a", "list"]), r"JSON list, not an object"),
    (lambda r: httpx.Response(200, json={"info": "no paths"}), r"no 'paths'"),
])
def test_a_url_that_is_not_slurmrestd_is_named(tmp_path: Path, answer: Handler,
                                               words: str) -> None:
    with pytest.raises(Unreachable, match=r"site fra: sites\[1\]\.rest\.url "
                                          r"http://rest:6820: .*" + words):
        backend(tmp_path, FakeServer(openapi=answer)).list_pilots()


def test_a_reply_missing_the_jobs_field_is_named(tmp_path: Path) -> None:
    server = FakeServer({"GET jobs": lambda r: reply({"meta": {}})})
    with pytest.raises(Unreachable, match=r"site fra: GET jobs answered no 'jobs' list"):
        backend(tmp_path, server).list_pilots()


def test_a_connection_refused_is_unreachable(tmp_path: Path) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
    with pytest.raises(Unreachable, match=r"site fra: .*Connection refused"):
        backend(tmp_path, FakeServer(openapi=refuse)).list_pilots()


def test_a_timeout_is_transient(tmp_path: Path) -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)
    with pytest.raises(Transient, match=r"timed out"):
        backend(tmp_path, FakeServer(openapi=slow)).list_pilots()


@pytest.mark.parametrize("status", [401, 511])
def test_a_refused_token_is_named(tmp_path: Path, status: int) -> None:
    """401: slurmrestd refused it; 511: the controller did (another user's token)."""
    server = FakeServer({"GET jobs": lambda r: httpx.Response(status, text="Authentication "
                                                                             "failure")})
    with pytest.raises(Unreachable, match=r"slurmrestd refused the token of pilot from "
                                          r"sites\[1\]\.rest\.token_file .*HTTP " + str(status)):
        backend(tmp_path, server).list_pilots()


# --- the token file --------------------------------------------------------------

def test_a_token_readable_by_others_is_refused_naming_site_and_field(tmp_path: Path) -> None:
    path = token_file(tmp_path, mode=0o644)
    token = TokenFile(site="fra", path=str(path), what="sites[1].rest.token_file")
    with pytest.raises(Unreachable, match=r"site fra: sites\[1\]\.rest\.token_file .*mode "
                                          r"0644.*chmod 600"):
        token.token()


def test_an_expired_token_is_named_before_it_is_sent(tmp_path: Path) -> None:
    path = token_file(tmp_path, exp=NOW - 5)
    token = TokenFile(site="fra", path=str(path), what="sites[1].rest.token_file",
                      clock=lambda: NOW)
    with pytest.raises(Unreachable, match=r"sites\[1\]\.rest\.token_file .*the token expired "
                                          r"at 2027-01-15 07:59:55 UTC"):
        token.token()


def test_a_file_that_holds_no_token_is_named(tmp_path: Path) -> None:
    path = tmp_path / "t"
    path.write_text("hello world\n")
    path.chmod(0o600)
    with pytest.raises(Unreachable, match=r"holds no usable token: not a JWT"):
        TokenFile(site="fra", path=str(path), what="w").token()
    with pytest.raises(Unreachable, match=r"No such file"):
        TokenFile(site="fra", path=str(tmp_path / "none"), what="w").token()


def test_a_changed_token_file_is_read_again(tmp_path: Path) -> None:
    path = token_file(tmp_path, exp=NOW + 100)
    token = TokenFile(site="fra", path=str(path), what="w", clock=lambda: NOW)
    first = token.token()
    path.write_text("SLURM_JWT=" + jwt(NOW + 7200) + "\n")
    os.utime(path, (NOW + 1, NOW + 1))
    assert token.token() != first
    assert token.expires_at() == NOW + 7200


def test_a_token_near_its_end_is_renewed_by_the_command(tmp_path: Path) -> None:
    path = token_file(tmp_path, exp=NOW + 60)
    fresh = jwt(NOW + 86400)
    command = [sys.executable, "-c", f"print('SLURM_JWT={fresh}')"]
    clock = [NOW]
    token = TokenFile(site="fra", path=str(path), what="w", renew_command=command,
                      renew_before_s=600, clock=lambda: clock[0])
    assert token.token() == fresh
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert path.read_text().strip() == fresh
    assert expiry(fresh) == NOW + 86400


def test_a_failed_renewal_keeps_the_valid_token_and_names_the_expired_one(
        tmp_path: Path) -> None:
    path = token_file(tmp_path, exp=NOW + 60)
    clock = [NOW]
    token = TokenFile(site="fra", path=str(path), what="w", renew_before_s=600,
                      renew_command=[sys.executable, "-c", "import sys; sys.exit(3)"],
                      clock=lambda: clock[0])
    old = token.token()  # renewal failed: the old one still serves
    clock[0] = NOW + 120
    with pytest.raises(Unreachable, match=r"expired .*its renewal failed"):
        token.token()
    assert path.read_text().strip() == old


# --- submit and its refusals -------------------------------------------------------

REQUEST = PilotRequest(cpus=4, memory_mb=7800, walltime_s=3601, shutdown_margin_s=300,
                       script="#!/bin/bash\necho hi\n", gpus=2)


def test_the_job_description_asks_what_sbatch_asks(tmp_path: Path) -> None:
    sent: list[dict[str, Any]] = []

    def submit(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return reply({"job_id": 77})

    b = backend(tmp_path, FakeServer({"POST job/submit": submit}), partition="general1",
                account="hpc", qos="normal", output_dir="/var/log/pilots", gpu_type="a100")
    assert b.submit(REQUEST) == "77"
    desc = sent[0]["job"]
    assert desc["script"] == REQUEST.script
    assert desc["name"] == "htcpilot-prov1"
    assert desc["comment"] == "htcondor-pilot provisioner=prov1"
    assert desc["cpus_per_task"] == 4
    assert desc["memory_per_node"]["number"] == 7800
    assert desc["time_limit"]["number"] == 61  # minutes, rounded up as sbatch's --time
    assert desc["kill_warning_signal"] == "TERM"
    assert desc["kill_warning_delay"]["number"] == 300
    assert desc["kill_warning_flags"] == ["BATCH_JOB"]
    assert desc["requeue"] is False and desc["current_working_directory"] == "/"
    assert desc["standard_output"] == "/var/log/pilots/%x-fra-%j.out"
    assert (desc["partition"], desc["account"], desc["qos"]) == ("general1", "hpc", "normal")
    assert desc["tres_per_node"] == "gres/gpu:a100:2"
    assert "deadline" not in desc  # none asked for


def test_a_pilot_that_could_outlive_its_token_is_dropped_unstarted(tmp_path: Path) -> None:
    """sbatch's --deadline=now+S, as slurmrestd's job description: a Unix time."""
    sent: list[dict[str, Any]] = []

    def submit(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return reply({"job_id": 78})

    b = backend(tmp_path, FakeServer({"POST job/submit": submit}))
    b.clock = lambda: 1_000_000.5
    b.submit(dataclasses.replace(REQUEST, deadline_s=90_000))
    assert sent[0]["job"]["deadline"] == 1_090_000


@pytest.mark.parametrize(("number", "error", "kind", "detail"), [
    (2050, "Job violates accounting/QOS policy (job submit limit, user's size and/or time "
     "limits)", AtLimit, "submit limit"),
    (2045, "Invalid account or account/partition combination specified", Misconfigured,
     "account (with partition)"),
    (2000, "Invalid partition name specified", Misconfigured, "partition"),
    (2051, "Requested time limit is invalid (missing or exceeds some limit)", Misconfigured,
     "pilot.walltime_s"),
    (11, "Resource temporarily unavailable", Transient, ""),
    (9999, "Something new", Rejected, ""),
])
def test_refusals_are_classified_from_slurms_words(
        tmp_path: Path, number: int, error: str, kind: type[Exception], detail: str) -> None:
    errors = [{"error_number": number, "error": error, "description": "Batch job submission "
               "failed", "source": "slurm_submit_batch_job()"}]
    server = FakeServer({"POST job/submit": lambda r: reply({}, 500, errors)})
    with pytest.raises(kind) as caught:
        backend(tmp_path, server).submit(REQUEST)
    assert type(caught.value) is kind
    assert str(caught.value).startswith("submit at fra ")
    assert error in str(caught.value)
    if isinstance(caught.value, AtLimit):
        assert caught.value.reason == detail
    if isinstance(caught.value, Misconfigured):
        assert caught.value.field == detail


@pytest.mark.parametrize("where", ["error", "job_submit_user_msg"])
def test_a_job_submit_plugins_limit_name_is_at_limit(tmp_path: Path, where: str) -> None:
    """The limit's name in the error, or in the plugin's message beside it."""
    errors = [{"error_number": 2050, "error": "Job violates accounting/QOS policy (job "
               "submit limit, user's size and/or time limits)", "description": ""}]
    doc: dict[str, Any] = {}
    if where == "error":
        errors[0]["description"] = "AssocMaxSubmitJobLimit"
    else:
        doc["job_submit_user_msg"] = "AssocMaxSubmitJobLimit"
    server = FakeServer({"POST job/submit": lambda r: reply(doc, 500, errors)})
    with pytest.raises(AtLimit) as caught:
        backend(tmp_path, server).submit(REQUEST)
    assert caught.value.reason == "AssocMaxSubmitJobLimit"


def test_a_submit_reply_without_a_job_id_is_named(tmp_path: Path) -> None:
    server = FakeServer({"POST job/submit": lambda r: reply({"result": {}})})
    with pytest.raises(Transient, match=r"site fra: submit answered no job_id"):
        backend(tmp_path, server).submit(REQUEST)


# --- list, signals, cancel ----------------------------------------------------------

def test_pilots_are_this_provisioners_live_jobs(tmp_path: Path) -> None:
    jobs = [job(1), job(2, "PENDING", state_reason="AssocMaxJobsLimit"),
            job(3, "COMPLETED"), job(4, name="other"), job(5, user_name="bob")]
    b = backend(tmp_path, FakeServer({"GET jobs": lambda r: reply({"jobs": jobs})}))
    pilots = {p.job_id: p for p in b.list_pilots()}
    assert set(pilots) == {"1", "2"}
    assert pilots["1"].state is SiteJobState.RUNNING and pilots["1"].cpus == 4
    assert pilots["1"].memory_mb == 7800 and pilots["1"].started_at == NOW - 50
    assert pilots["2"].limit_reason == "AssocMaxJobsLimit"


def test_signals_go_to_the_batch_shell_and_a_gone_job_is_no_error(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []

    def delete(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/9"):
            return reply({}, 500, [{"error_number": 2017, "error": "Invalid job id "
                                    "specified", "description": "kill job failed"}])
        return reply({})

    b = backend(tmp_path, FakeServer({"DELETE job/5": delete, "DELETE job/9": delete}))
    b.release("5")
    b.retire("5")
    b.retire("5", retire=False)
    b.cancel("5")
    b.cancel("9")  # unknown: succeeds
    assert [dict(r.url.params) for r in seen] == [
        {"signal": "USR1", "flags": "BATCH_JOB"}, {"signal": "USR2", "flags": "BATCH_JOB"},
        {"signal": "CONT", "flags": "BATCH_JOB"}, {}, {}]
    with pytest.raises(Rejected, match="not a SLURM job id"):
        b.cancel("5; rm -rf /")


def test_cancel_only_pending_leaves_the_check_to_the_controller(tmp_path: Path) -> None:
    sent: list[dict[str, Any]] = []

    def delete(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return reply({})

    backend(tmp_path, FakeServer({"DELETE jobs": delete})).cancel("5", only_pending=True)
    assert sent == [{"jobs": ["5"], "job_state": ["PENDING"]}]


# --- end records --------------------------------------------------------------------

def record(job_id: str) -> EndRecord:
    return EndRecord(job_id, "fra", "prov1", NOW - 100, NOW - 10, 4, "released")


def test_end_records_come_from_finished_jobs_comments(tmp_path: Path) -> None:
    listed = [job(1), job(3, "COMPLETED", comment=record("3").to_json().strip())]
    asked = job(4, "CANCELLED", comment=record("4").to_json().strip())
    bad = job(6, "COMPLETED", comment='{"v": 1, "job_id": "7"}')
    routes = {"GET jobs": lambda r: reply({"jobs": listed}),
              "GET job/4": lambda r: reply({"jobs": [asked]}),
              "GET job/6": lambda r: reply({"jobs": [bad]}),
              "GET job/5": lambda r: reply({}, 500, [{"error_number": 2017,
                                                      "error": "Invalid job id specified"}])}
    server = FakeServer(routes)
    b = backend(tmp_path, server)
    b.list_pilots()
    got = b.end_records(["3", "4", "5", "6"])
    assert got == {"3": record("3"), "4": record("4")}
    assert not any(r.url.path.endswith("/job/3") for r in server.requests)


def test_the_registry_builds_a_rest_backend_from_the_configuration(tmp_path: Path) -> None:
    path = token_file(tmp_path)
    cfg = parse_config(f"""
sites:
  - name: fra
    backend: slurm-rest
    rest: {{url: "https://rest.site.example:6820", user: pilot, token_file: {path}}}
    partition: general1
    max_walltime_s: 7200
    template: frankfurt.sh.j2
    image: /opt/images/pilot.sif
    pilot: {{cpus: 4, memory_mb: 7800, walltime_s: 3600, shutdown_margin_s: 300}}
""")
    b = make_backend(cfg.sites[0], cfg.pool)
    assert isinstance(b, SlurmRestBackend)
    assert b.client.url == "https://rest.site.example:6820" and b.partition == "general1"
