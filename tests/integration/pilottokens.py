"""Pilot tokens for the integration tests: minted with the testbed's pilot signing key
(as the service mints them), listed live in a list of the tests' own, and used from a
host that runs no pilot to advertise a startd as HTCondor's own tools do."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import htcondor2 as htcondor
from conftest import run

from provisioner.security.tokens import PilotToken, claims

SERVICE_USER = "provisioner"
KEY_DIR = "/etc/provisioner/pilot-keys"
#: The collector also reads this list in the testbed (deploy/testbed/etc/condor-testbed.conf).
TEST_LIST = "/var/lib/provisioner/pilot-tokens.live.test"
COLLECTOR_LOG = Path("/var/log/condor/CollectorLog")
SCOPE = "READ ADVERTISE_MASTER ADVERTISE_STARTD DAEMON"


def mint(identity: str, lifetime_s: int | None = 3600, key: str = "pilot-1",
         authz: str = SCOPE) -> PilotToken:
    """A token as the service's account mints it (its key, condor_token_create)."""
    argv = ["condor_token_create", "-identity", identity, "-key", key]
    if lifetime_s is not None:
        argv += ["-lifetime", str(lifetime_s)]
    for a in authz.split():
        argv += ["-authz", a]
    out = run(argv, user=SERVICE_USER, env={"_CONDOR_SEC_PASSWORD_DIRECTORY": KEY_DIR,
                                            "_CONDOR_TRUST_DOMAIN": "testbed"}).stdout.strip()
    doc = claims(out)
    site = identity.split("-")[1] if identity.startswith("pilot-") else ""
    return PilotToken(site, identity, str(doc["jti"]), int(doc["iat"]),  # type: ignore[call-overload]
                      int(doc.get("exp", 0)), out)  # type: ignore[call-overload]


def list_live(*tokens: PilotToken) -> None:
    """Make exactly `tokens` the tests' live list, and have the collector read it."""
    Path(TEST_LIST).write_text("".join(f"{t.jti} {t.identity} {t.site} - {t.issued_at} "
                                       f"{t.expires_at}\n" for t in tokens))
    reconfig_collector()


def reconfig_collector() -> None:
    run(["condor_reconfig", "-collector"], env={"_CONDOR_SEC_CLIENT_AUTHENTICATION_METHODS":
                                                "FS"})
    time.sleep(1)  # the collector handles the command after it answered


def token_env(token: PilotToken) -> dict[str, str]:
    """Environment for HTCondor tools run by root that authenticate with `token` only."""
    directory = tempfile.mkdtemp(prefix="pilot-token.")
    path = Path(directory) / "pilot"
    path.write_text(token.text + "\n")
    path.chmod(0o600)
    return {"_CONDOR_SEC_TOKEN_DIRECTORY": directory,
            "_CONDOR_SEC_CLIENT_AUTHENTICATION_METHODS": "IDTOKENS"}


def pilot_ad(name: str, site: str, job_id: str, marker: str) -> str:
    """A pilot's startd ad as a forger writes it: everything a job would match."""
    return "\n".join([
        'MyType = "Machine"', f'Name = "slot1@{name}"', 'Machine = "cm"',
        'MyAddress = "<10.10.0.10:1>"', 'StartdIpAddr = "<10.10.0.10:1>"',
        f'PilotSite = "{site}"', f'PilotSlurmJobId = "{job_id}"',
        'PilotProvisionerId = "forged"', f'ForgedBy = "{marker}"', 'State = "Unclaimed"',
        'Activity = "Idle"', 'Cpus = 4', 'Memory = 8000', 'Disk = 1000000',
        'OpSys = "LINUX"', 'Arch = "X86_64"', 'PartitionableSlot = true',
        'Requirements = true', 'Start = true', 'Rank = 0', 'CurrentRank = 0', ""])


def advertise(token: PilotToken, ad: str) -> str:
    """condor_advertise UPDATE_STARTD_AD with `token`, from cm (no pilot runs there);
    its output."""
    path = Path(tempfile.mkdtemp(prefix="forged.")) / "startd.ad"
    path.write_text(ad)
    proc = run(["condor_advertise", "UPDATE_STARTD_AD", str(path)], env=token_env(token),
               check=False)
    return proc.stdout + proc.stderr


def forged_ads(marker: str) -> list[dict[str, object]]:
    ads = htcondor.Collector().query(htcondor.AdType.Startd,
                                     constraint=f'ForgedBy =?= "{marker}"',
                                     projection=["Name", "AuthenticatedIdentity"])
    return [dict(ad) for ad in ads]


def collector_log_since(offset: int) -> str:
    with COLLECTOR_LOG.open("rb") as f:
        f.seek(offset)
        return f.read().decode("utf-8", "replace")


def log_offset() -> int:
    return COLLECTOR_LOG.stat().st_size


def wait_logged(offset: int, text: str, timeout: float = 15.0) -> str:
    """The collector's log since `offset` once it holds `text` (AssertionError if not)."""
    deadline = time.time() + timeout
    while True:
        log = collector_log_since(offset)
        if text in log:
            return log
        if time.time() > deadline:
            raise AssertionError(f"{text!r} not in the collector's log:\n{log[-3000:]}")
        time.sleep(0.3)


def node_token(host: str, site: str, job_id: str) -> str:
    """The token a running pilot keeps on its node, read as root (the node's /tmp)."""
    out = run(["cat", f"/tmp/pilot-{site}-{job_id}/tokens.d/pilot"], host=host).stdout
    return out.strip()


def as_json(token: PilotToken) -> str:
    return json.dumps({"identity": token.identity, "jti": token.jti})


def clear_test_list() -> None:
    if os.path.exists(TEST_LIST):
        os.unlink(TEST_LIST)
        reconfig_collector()
