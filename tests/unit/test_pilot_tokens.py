"""Per-pilot tokens: identities, the live list, the collector's filter, how a token
travels (the batch script's descriptor 3, never argv or the environment)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provisioner.config import parse_config
from provisioner.pilot import leftovers
from provisioner.pilot.params import PilotError, read_token
from provisioner.pilot.script import render_pilot_script
from provisioner.security import collector_list
from provisioner.security.jwt import payload as jwt_payload
from provisioner.security.livelist import UNBOUND_KEEP_S, Entry, LiveTokens
from provisioner.security.refusals import CollectorLog
from provisioner.security.tokens import IDENTITY_USER, PilotToken, check_key, claims, identity_of
from provisioner.service.pilot_tokens import PilotTokens
from provisioner.sites.base import PilotRequest
from provisioner.sites.executor import LocalExecutor
from provisioner.sites.slurm_cli import SlurmCliBackend

REPO = Path(__file__).resolve().parents[2]


def jwt(payload: dict[str, object]) -> str:
    body = base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")
    return f"eyJhbGciOiJIUzI1NiJ9.{body}.c2lnbmF0dXJl"


def config(tmp_path: Path, pool_extra: str = "", site_extra: str = "") -> Any:
    return parse_config(f"""
templates_dir: {REPO}/slurm_templates
pool: {{collector: "cm:9618", provisioner_id: t, uid_domain: example.org{pool_extra}}}
pilot_tokens: {{live_list: {tmp_path}/live, signing_key: {tmp_path}/key}}
sites:
  - name: gsi
    max_walltime_s: 7200
    template: gsi.sh.j2
    image: /images/pilot.sif
    pilot: {{cpus: 4, memory_mb: 8000, walltime_s: 3600}}
{site_extra}""", "t.yaml")


@given(st.from_regex(r"[a-z][a-z0-9_-]{0,20}", fullmatch=True))
def test_every_site_gets_a_fresh_pilot_identity_of_the_collectors_pattern(site: str) -> None:
    a, b = identity_of(site, "example.org"), identity_of(site, "example.org")
    assert a != b
    user, domain = a.split("@")
    assert domain == "example.org"
    found = IDENTITY_USER.match(user)
    assert found and found.group(1) == site


def test_claims_of_a_token_and_refusal_of_anything_else() -> None:
    assert claims(jwt({"sub": "pilot-gsi-0123456789ab@d", "jti": "ab"}))["jti"] == "ab"
    with pytest.raises(Exception, match="IDTOKEN"):
        claims("not a token; rm -rf /")


def test_a_signing_key_others_can_read_is_refused(tmp_path: Path) -> None:
    key = tmp_path / "pilot-1"
    assert "No such file" in (check_key(str(key)) or "")
    key.write_bytes(os.urandom(64))
    key.chmod(0o644)
    assert "readable by others" in (check_key(str(key)) or "")
    key.chmod(0o600)
    assert check_key(str(key)) is None


def test_the_token_reaches_the_pilot_on_descriptor_3_only(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    token = jwt({"sub": "pilot-gsi-0123456789ab@example.org", "jti": "ab" * 16})
    script = render_pilot_script(cfg, cfg.site("gsi"), 3600, token=token)  # type: ignore[attr-defined]
    # in a here-document on descriptor 3, nowhere in an export or the exec line
    assert f"exec 3<<'END_OF_PILOT_TOKEN'\n{token}\nEND_OF_PILOT_TOKEN\n" in script
    assert all(token not in line for line in script.splitlines()
               if line.startswith(("export", "exec "))), script
    request = PilotRequest(4, 8000, 3600, 120, script, deadline_s=90000)
    backend = SlurmCliBackend("gsi", "t", LocalExecutor())
    argv = backend.sbatch_argv(request)
    assert token not in " ".join(argv) and "--deadline=now+90000seconds" in argv
    with pytest.raises(ValueError, match="base64url"):
        render_pilot_script(cfg, cfg.site("gsi"), 3600,  # type: ignore[attr-defined]
                            token="a.b.c\nrm -rf ~\n")


def test_the_batch_script_gives_the_wrapper_its_token_on_descriptor_3(tmp_path: Path) -> None:
    """bash runs the rendered block: the child reads exactly the token from fd 3."""
    token = jwt({"sub": "pilot-gsi-0123456789ab@example.org", "jti": "ab" * 16})
    cfg = config(tmp_path)
    script = render_pilot_script(cfg, cfg.site("gsi"), 3600, token=token)  # type: ignore[attr-defined]
    block = script[script.index("export PILOT_TOKEN_FD"):script.index("END_OF_PILOT_TOKEN\n",
                                                                      script.index(token))]
    reader = f"{sys.executable} -c 'import os; print(os.read(3, 4096).decode().strip())'"
    out = subprocess.run(["bash", "-c", block + "END_OF_PILOT_TOKEN\nexec " + reader],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == token
    read, write = os.pipe()
    os.write(write, (token + "\n").encode())
    os.close(write)
    assert read_token({"PILOT_TOKEN_FD": str(read)}) == token
    with pytest.raises(OSError):
        os.fstat(read)  # closed once read
    read, write = os.pipe()
    os.write(write, jwt({"sub": "condor@example.org"}).encode())
    os.close(write)
    with pytest.raises(PilotError, match="not a pilot identity"):
        read_token({"PILOT_TOKEN_FD": str(read)})


def entry(jti: str, site: str = "gsi", job: str = "1", iat: int = 0, exp: int = 10**6
          ) -> Entry:
    return Entry(jti, f"pilot-{site}-0123456789ab@d", site, job, iat, exp)


def test_the_live_list_revokes_what_ended_and_keeps_what_is_unknown(tmp_path: Path) -> None:
    reconfigs: list[int] = []
    live = LiveTokens(str(tmp_path / "live"), lambda: reconfigs.append(1))
    now = 10_000
    live.entries = {e.jti: e for e in [
        entry("a" * 32, job="1"),                     # running at gsi
        entry("b" * 32, job="2"),                     # gone from gsi's squeue
        entry("c" * 32, site="fra", job="3"),         # fra not read: unknown
        entry("d" * 32, job=""),                      # sbatch never answered, old
        entry("e" * 32, job="", iat=now - 10),        # sbatch answering now
        entry("f" * 32, job="4", exp=now - 1),        # expired
        entry("0" * 32, job="5", iat=now),            # minted after the list was read
    ]}
    live.ended({"gsi": ["1"]}, now)
    assert sorted(live.entries) == ["0" * 32, "a" * 32, "c" * 32, "e" * 32]
    assert now > UNBOUND_KEEP_S
    live.commit()
    assert reconfigs == [1]
    assert (tmp_path / "live").stat().st_mode & 0o777 == 0o644
    again = LiveTokens(str(tmp_path / "live"), lambda: None)
    again.load()
    assert again.entries == live.entries
    live.commit()
    assert reconfigs == [1]  # nothing changed: the collector is not bothered


def test_the_collectors_filter_lets_only_jtis_through(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    (tmp_path / "live").write_text(
        "ab" * 16 + " pilot-gsi-0123456789ab@d gsi 1 0 9\n"
        "ALLOW_ADVERTISE_STARTD = *\n"
        "cd" * 16 + "\" || true || \"\n"
        "include command : /bin/sh -c evil\n")
    (tmp_path / "check").write_text("ef" * 16 + "\n")
    collector_list.main(["x", str(tmp_path / "live"), str(tmp_path / "missing"),
                         str(tmp_path / "check")])
    out = capsys.readouterr().out
    assert out == f"PROVISIONER_LIVE_PILOT_TOKENS = {'ab' * 16} {'ef' * 16}\n"


def test_a_token_that_cannot_be_minted_is_named_and_nothing_is_listed(tmp_path: Path) -> None:
    tokens = PilotTokens(config(tmp_path), reconfig=lambda: None)  # type: ignore[arg-type]
    with pytest.raises(Exception, match=r"pilot_tokens\.signing_key"):
        tokens.issue("gsi", 3600, 2)
    assert tokens.problem and "pilot_tokens.signing_key" in tokens.problem
    assert tokens.live.entries == {}


def test_issued_tokens_are_live_before_sbatch_and_revoked_when_unused(tmp_path: Path) -> None:
    order: list[str] = []

    def minter(site: str, domain: str, key: str, lifetime: int) -> PilotToken:
        order.append("mint")
        identity = identity_of(site, domain)
        return PilotToken(site, identity, identity.split("@")[0][-12:] * 2, 0, lifetime, "a.b.c")

    tokens = PilotTokens(config(tmp_path), reconfig=lambda: order.append("reconfig"),  # type: ignore[arg-type]
                         minter=minter)
    issued = tokens.issue("gsi", 3600, 2)
    assert order == ["mint", "mint", "reconfig"]
    assert all(t.expires_at == 3600 + 86400 + 600 for t in issued)
    tokens.bound(issued[0], "17")
    tokens.unused(issued[1:])
    assert [e.job_id for e in tokens.live.entries.values()] == ["17"]
    tokens.cancelled("gsi", "17")
    assert tokens.live.entries == {}
    assert order[-2:] == ["reconfig", "reconfig"]


def test_a_starting_pilot_removes_what_gone_pilots_left(tmp_path: Path) -> None:
    for name in ("pilot-gsi-1", "pilot-gsi-2", "pilot-gsi-3", "pilot-fra-4", "testcache"):
        (tmp_path / name / "tokens.d").mkdir(parents=True)
    removed = leftovers.remove_stale(tmp_path, "gsi", own_job="3", live={"2", "3"})
    assert removed == ["pilot-gsi-1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "pilot-fra-4", "pilot-gsi-2", "pilot-gsi-3", "testcache"]


#: The collector's own lines (HTCondor 23.9, COLLECTOR_DEBUG = D_MACHINE D_SECURITY).
REVOKED = ('11/28/26 08:38:45 User token with payload {"exp":1795858724,"iat":1795855124,'
           '"iss":"testbed","jti":"ac258524fbe7173ee147d02ce0ef8ced","scope":"condor:\\/READ '
           'condor:\\/ADVERTISE_MASTER","sub":"pilot-gsi-e9642035c6ce@testbed"} has been '
           'revoked.\n')
EXPIRED = "11/28/26 08:38:42 User token has been expired for 2 seconds.\n"
VIOLATION = ("11/28/26 08:42:23 COLLECTOR_REQUIREMENTS VIOLATION: requirements do not match "
             "ad from <10.10.0.10:11657>.\n")


def test_the_collectors_refusals_are_read_from_its_log_as_it_grows(tmp_path: Path) -> None:
    log = tmp_path / "CollectorLog"
    log.write_text(REVOKED)  # before the service started: not reported
    follower = CollectorLog(str(log))
    assert follower.read() == []
    with log.open("a") as f:
        f.write("11/28/26 08:40:00 DC_AUTHENTICATE: Success.\n" + EXPIRED + VIOLATION
                + REVOKED + "11/28/26 08:43:00 User token with pay")  # a line being written
    got = follower.read()
    assert [(r.kind, r.detail) for r in got] == [
        ("expired", "expired 2 s ago"), ("ad", "<10.10.0.10:11657>."),
        ("revoked", "pilot-gsi-e9642035c6ce@testbed")]
    assert got[2].jti == "ac258524fbe7173ee147d02ce0ef8ced" and got[2].at == "11/28/26 08:38:45"
    log.rename(tmp_path / "CollectorLog.old")  # rotated
    log.write_text(EXPIRED)
    assert [r.kind for r in follower.read()] == ["expired"]
    log.unlink()
    assert follower.read() == [] and follower.problem and "CollectorLog" in follower.problem


def test_status_and_metrics_name_a_refused_token_of_a_submitted_pilot_and_a_foreign_ad(
        tmp_path: Path) -> None:
    from provisioner.pool.condor import PilotAd
    from provisioner.service.metrics import Metrics
    from provisioner.service.status import tokens_text

    cfg = config(tmp_path)
    log = tmp_path / "CollectorLog"
    log.write_text("")
    tokens = PilotTokens(cfg, reconfig=lambda: None)  # type: ignore[arg-type]
    tokens.collector_log = CollectorLog(str(log))
    tokens.collector_log.read()
    mine = Entry("ac258524fbe7173ee147d02ce0ef8ced", "pilot-gsi-e9642035c6ce@testbed", "gsi",
                 "17", 0, 10**10)
    other = Entry("b" * 32, "pilot-gsi-0123456789ab@testbed", "gsi", "18", 0, 10**10)
    tokens.live.entries = {mine.jti: mine, other.jti: other}
    log.write_text(REVOKED + VIOLATION)

    def ad(job: str, *identities: str) -> PilotAd:
        return PilotAd("gsi", job, f"pilot-gsi-{job}@x", None, 4, 8000, 4, 8000, 0, False,
                       identities=identities)

    ads = {"gsi/17": ad("17", mine.identity),
           "gsi/18": ad("18", other.identity, mine.identity)}  # a second, forged ad
    metrics = Metrics()
    report = tokens.report(ads, metrics)
    assert report["foreign"] == [f"gsi/18: advertised by {other.identity}, {mine.identity}; "
                                 f"minted for {other.identity}"]
    assert any("pilot gsi/17 that this service submitted" in r for r in report["refused"])
    text = "\n".join(tokens_text(report, str, str))
    assert "2 live" in text and "foreign ad: gsi/18" in text and "revoked:" in text
    assert "pilot_tokens.signing_key" in text  # no key in this test: named
    scrape = {s.name: s for s in metrics.registry.collect()}
    assert scrape["provisioner_pilot_ads_foreign"].samples[0].value == 1
    refused = {s.labels["kind"]: s.value for s in
               scrape["provisioner_collector_refusals"].samples if s.name.endswith("_total")}
    assert refused == {"revoked": 1.0, "ad": 1.0}


def test_a_configuration_with_the_shared_pilot_token_loads_and_names_the_field(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING"):
        cfg = config(tmp_path, pool_extra=", pilot_token_file: /etc/provisioner/pilot.token",
                     site_extra="    runtime: {token_file: /etc/provisioner/pilot.token}\n")
    assert not hasattr(cfg.pool, "pilot_token_file")
    assert not hasattr(cfg.sites[0].runtime, "token_file")
    said = caplog.text
    assert "pool.pilot_token_file is no longer used" in said
    assert "sites[].runtime.token_file is no longer used" in said


@pytest.mark.parametrize(("text", "words"), [
    ("a.b", "three base64url parts"),
    ("eyJ.!!!.c", "not base64url JSON"),
    ("h." + "WzFd" + ".s", "not a JSON object"),  # [1]
])
def test_a_malformed_jwt_is_named(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        jwt_payload(text)


def test_the_claims_of_a_jwt_are_read_unverified() -> None:
    body = base64.urlsafe_b64encode(b'{"sub":"x","exp":7}').decode().rstrip("=")
    assert jwt_payload(f"h.{body}.") == {"sub": "x", "exp": 7}
