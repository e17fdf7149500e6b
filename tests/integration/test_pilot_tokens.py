"""Each pilot's own token, against the real collector: what a copy of one can do (a
running pilot's, an ended pilot's, an expired one) and what the pilots' signing key
can mint, from cm, a host that runs no pilot (docs/security.md).

The forged ads carry everything a job would match and `ForgedBy`; a job that asks
for `ForgedBy` shows that no such ad ever got into the pool."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import htcondor2 as htcondor
import pytest
import yaml
from conftest import WORKERS, run, service_config, split_startd
from pilottokens import (
    advertise,
    clear_test_list,
    collector_log_since,
    forged_ads,
    list_live,
    log_offset,
    mint,
    node_token,
    pilot_ad,
    reconfig_collector,
    wait_logged,
)
from test_loop import (  # noqa: F401  (clean: a fixture the tests use)
    all_pilot_jobs,
    clean,
    clean_pool,
    gated_jobs_left,
    jobs_left,
    submit_gated,
    submit_script,
    wait_for,
)

from provisioner.security.tokens import PilotToken, claims, identity_of
from provisioner.service.loop import Provisioner


@pytest.fixture
def tokens() -> Iterator[None]:
    clear_test_list()
    yield
    clear_test_list()


def marker() -> str:
    return uuid.uuid4().hex[:12]


def user_of(token: PilotToken) -> str:
    return token.identity.split("@")[0]


def own_name(token: PilotToken, job_id: str) -> str:
    """The name a pilot with `token` and SLURM job `job_id` gives its startd."""
    return f"pilot-{token.site}-{job_id}@{user_of(token)}.cm"


def accepted(mark: str, timeout: float = 10.0) -> list[dict[str, object]]:
    """The forged ads the collector took, once it has had time to take them."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if ads := forged_ads(mark):
            return ads
        time.sleep(0.5)
    return []


def invalidate(mark: str) -> None:
    query = Path(f"/tmp/invalidate-{mark}.ad")
    query.write_text('MyType = "Query"\nTargetType = "Machine"\n'
                     f'Requirements = ForgedBy =?= "{mark}"\n')
    run(["condor_advertise", "INVALIDATE_STARTD_ADS", str(query)],
        env={"_CONDOR_SEC_CLIENT_AUTHENTICATION_METHODS": "FS"})


def test_an_expired_pilot_token_is_refused(tokens: None) -> None:
    short = mint(identity_of("gsi", "testbed"), lifetime_s=1)
    good = mint(identity_of("gsi", "testbed"))
    list_live(short, good)
    time.sleep(2)
    mark = marker()
    offset = log_offset()
    advertise(short, pilot_ad(own_name(short, "901"), "gsi", "901", mark))
    wait_logged(offset, "User token has been expired for")
    # the same ad under the live token's own name is taken: the refusal was the expiry
    control = marker()
    advertise(good, pilot_ad(own_name(good, "902"), "gsi", "902", control))
    assert accepted(control), "a live pilot token's own ad was refused"
    assert not forged_ads(mark)
    invalidate(control)


def test_the_pilot_key_mints_nothing_else(tokens: None) -> None:
    """What the pilots' key holder mints beyond a live pilot's token is refused: another
    identity (the pool's own daemons'), more authorizations, no expiry, a pilot
    identity the service never listed; and the key is worth nothing at the schedd."""
    mark = marker()
    cases = {
        "condor@testbed": mint("condor@testbed", authz="READ ADVERTISE_STARTD ADMINISTRATOR"),
        "more authz": mint(identity_of("gsi", "testbed"), authz="READ ADVERTISE_MASTER "
                           "ADVERTISE_STARTD DAEMON ADMINISTRATOR"),
        "no expiry": mint(identity_of("gsi", "testbed"), lifetime_s=None),
        "not listed": mint(identity_of("gsi", "testbed")),
    }
    list_live(*(t for name, t in cases.items() if name != "not listed"))
    for name, token in cases.items():
        offset = log_offset()
        job = str(abs(hash(name)) % 100000)
        advertise(token, pilot_ad(own_name(token, job) if token.site else f"x-{job}",
                                  "gsi", job, mark))
        log = wait_logged(offset, "has been revoked")
        assert claims(token.text)["jti"] in log, name
    assert not forged_ads(mark)
    # at the schedd (which does not know the pilots' key) a pilot token is nobody
    sub = Path("/tmp/forbidden.sub")
    sub.write_text("executable = /bin/true\nqueue\n")
    good = mint(identity_of("gsi", "testbed"))
    list_live(good)
    from pilottokens import token_env
    proc = run(["condor_submit", str(sub)], env=token_env(good), check=False)
    assert proc.returncode != 0, proc.stdout


def pilot_tokens_on_nodes(prov: Provisioner) -> dict[str, tuple[str, str, PilotToken]]:
    """Each running pilot's startd name -> (its key, its node, the token on its node)."""
    out = {}
    for key, ad in prov.pool.pilot_ads().items():
        _name, node = split_startd(ad.name)
        text = node_token(node, ad.site, ad.job_id)
        doc = claims(text)
        token = PilotToken(ad.site, str(doc["sub"]), str(doc["jti"]), int(doc["iat"]),  # type: ignore[call-overload]
                           int(doc["exp"]), text)  # type: ignore[call-overload]
        out[ad.name] = (key, node, token)
    return out


@pytest.mark.usefixtures("clean")
def test_a_pilots_token_advertises_only_its_own_pilot_and_dies_with_it(tokens: None) -> None:
    """Two real pilots (one per site). A's token, copied off its node, used from cm:
    under B's name, refused while both run; once A has ended and the service has seen
    it, refused whatever the name, and a job asking for the forged startd never runs."""
    prov = Provisioner(service_config())
    cluster = submit_gated("tokens", 5)
    wait_for("pilots at both sites", lambda: prov.run_cycle("test") and len(
        prov.pool.pilot_ads()) >= 2 and {a.site for a in prov.pool.pilot_ads().values()}
        == {"gsi", "frankfurt"}, 180, step=3)
    found = pilot_tokens_on_nodes(prov)
    (a_name, (a_key, a_node, a_token)), (b_name, (_b_key, _b_node, b_token)) = sorted(
        found.items(), key=lambda kv: kv[1][0])[:2]
    assert a_token.identity != b_token.identity
    a_site, a_job = a_key.split("/")
    a_file = f"/tmp/pilot-{a_site}-{a_job}/tokens.d/pilot"
    assert run(["stat", "-c", "%a %U", a_file], host=a_node).stdout.split() == ["600",
                                                                                 "pilot"]
    assert user_of(a_token) in a_name and user_of(b_token) in b_name
    ads = prov.pool.pilot_ads()
    assert {i for ad in ads.values() for i in ad.identities} >= {a_token.identity,
                                                                 b_token.identity}
    # A's token under B's name (B's own site and job): refused
    b_site, b_job = next((ad.site, ad.job_id) for ad in ads.values() if ad.name == b_name)
    mark = marker()
    offset = log_offset()
    advertise(a_token, pilot_ad(b_name, b_site, b_job, mark))
    wait_logged(offset, "COLLECTOR_REQUIREMENTS VIOLATION")
    assert not forged_ads(mark)
    assert prov.pool.pilot_ads()[next(k for k, ad in ads.items() if ad.name == b_name)
                                 ].identities == (b_token.identity,)
    # the jobs end, the pilots are released and leave; the service sees A gone
    wait_for("the jobs done", lambda: gated_jobs_left(cluster) == 0, 180, step=2)
    wait_for(f"pilot {a_key} gone and its token revoked",
             lambda: prov.run_cycle("test") and a_token.jti not in prov.tokens.live.entries
             and not any(k == a_key for k in prov.pool.pilot_ads()), 240, step=3)
    assert a_token.jti not in Path("/var/lib/provisioner/pilot-tokens.live").read_text()
    assert run(["test", "-e", a_file], host=a_node, check=False).returncode == 1
    # A's copy from cm, under A's own name: refused; a job asking for it stays idle
    site, job = a_key.split("/")
    mark = marker()
    offset = log_offset()
    advertise(a_token, pilot_ad(a_name, site, job, mark))
    log = wait_logged(offset, "has been revoked")
    assert a_token.jti in log
    waiting = submit_script("forged", "echo ran-on-a-forged-startd\n", 1,
                            f'requirements = ForgedBy =?= "{mark}"\n')
    run(["condor_reschedule"], env={"_CONDOR_SEC_CLIENT_AUTHENTICATION_METHODS": "FS"})
    time.sleep(15)  # several negotiation cycles (2 s apart)
    assert not forged_ads(mark)
    assert [ad["JobStatus"] for ad in htcondor.Schedd().query(
        constraint=f"ClusterId == {waiting}", projection=["JobStatus"])] == [1]
    run(["condor_rm", waiting])
    assert WORKERS  # the copy was used from cm, which is no worker
    wait_for("no pilots left", lambda: prov.run_cycle("test") and not prov.pool.pilot_ads(),
             120, step=3)
    assert jobs_left(cluster) == 0


@pytest.mark.usefixtures("clean")
def test_rotating_the_pilot_key_keeps_running_pilots(tokens: None) -> None:
    """A new key while a pilot runs: the running pilot keeps working with its token of
    the old key, new pilots get tokens of the new one (docs/security.md)."""
    new = "/etc/provisioner/pilot-keys/pilot-2"
    run(["sh", "-c", f"umask 077; head -c 64 /dev/urandom > {new}"])
    run(["chown", "provisioner:", new])
    run(["install", "-m", "0600", new, "/etc/condor/pilot-keys.d/pilot-2"])
    reconfig_collector()
    try:
        prov = Provisioner(service_config())
        first = submit_gated("rotate-1", 1, 'requirements = PilotSite == "gsi"\n')
        wait_for("a gsi pilot running the job", lambda: prov.run_cycle("test") and
                 htcondor.Schedd().query(constraint=f"ClusterId == {first} && JobStatus == 2",
                                         projection=["ClusterId"]), 180, step=3)
        old = next(iter(pilot_tokens_on_nodes(prov).values()))[2]
        cfg = service_config()
        rotated = cfg.model_copy(update={"pilot_tokens": cfg.pilot_tokens.model_copy(
            update={"signing_key": new})})
        prov = Provisioner(rotated)  # the service restarted with the new key
        second = submit_gated("rotate-2", 1, 'requirements = PilotSite == "frankfurt"\n')
        wait_for("a frankfurt pilot running the second job", lambda: prov.run_cycle("test")
                 and htcondor.Schedd().query(
                     constraint=f"ClusterId == {second} && JobStatus == 2",
                     projection=["ClusterId"]), 180, step=3)
        tokens = {t.site: t for _k, _n, t in pilot_tokens_on_nodes(prov).values()}
        assert tokens["gsi"].jti == old.jti
        header = tokens["frankfurt"].text.split(".")[0]
        import base64
        import json
        kid = json.loads(base64.urlsafe_b64decode(header + "=" * (-len(header) % 4)))["kid"]
        assert kid == "pilot-2"
        # a token of the old key that authenticates anew (as a running pilot's startd
        # does when its session ends) is still taken
        mark = marker()
        again = mint(identity_of("gsi", "testbed"), key="pilot-1")
        list_live(again)
        advertise(again, pilot_ad(own_name(again, "903"), "gsi", "903", mark))
        assert accepted(mark), "a token of the old key was refused during the rotation"
        invalidate(mark)
        # the old pilot's job ends normally
        wait_for("both jobs done", lambda: gated_jobs_left(first) + gated_jobs_left(second)
                 == 0, 120, step=2)
        # the last step: the old key leaves the collector, and its tokens with it
        Path("/etc/condor/pilot-keys.d/pilot-1").unlink()
        reconfig_collector()
        mark = marker()
        offset = log_offset()
        advertise(again, pilot_ad(own_name(again, "904"), "gsi", "904", mark))
        time.sleep(3)
        assert not forged_ads(mark), collector_log_since(offset)[-2000:]
    finally:
        clean_pool()
        for path in (new, "/etc/condor/pilot-keys.d/pilot-2"):
            Path(path).unlink(missing_ok=True)
        run(["install", "-m", "0600", "/etc/provisioner/pilot-keys/pilot-1",
             "/etc/condor/pilot-keys.d/pilot-1"])
        reconfig_collector()


@pytest.mark.usefixtures("clean")
def test_a_missing_signing_key_is_named_and_nothing_is_submitted(tmp_path: Path) -> None:
    """check-config --live names the key; the service submits no pilot, and `status`
    says why (from the service's journal)."""
    cfg = service_config()
    missing = cfg.model_copy(update={
        "pilot_tokens": cfg.pilot_tokens.model_copy(
            update={"signing_key": "/etc/provisioner/pilot-keys/none"}),
        "journal": str(tmp_path / "journal.sqlite")})
    path = tmp_path / "missing.yaml"
    data = yaml.safe_load(Path("/src/deploy/testbed/provisioner.yaml").read_text())
    data["pilot_tokens"]["signing_key"] = "/etc/provisioner/pilot-keys/none"
    data["journal"] = str(tmp_path / "journal.sqlite")
    path.write_text(yaml.safe_dump(data))
    live = run(["provisioner", "-c", str(path), "check-config", "--live"], check=False)
    assert live.returncode == 1
    assert "pilot_tokens.signing_key /etc/provisioner/pilot-keys/none: No such file" \
        in live.stdout, live.stdout
    prov = Provisioner(missing)
    cluster = submit_gated("no-key", 1)
    prov.run_cycle("test")
    assert not any(all_pilot_jobs().values()) and jobs_left(cluster) == 1
    status = run(["provisioner", "-c", str(path), "status"], check=False).stdout
    print(status)
    assert "no pilot can be submitted: pilot_tokens.signing_key" in status
    assert "/etc/provisioner/pilot-keys/none" in status
