"""Each pilot's own IDTOKEN: its identity, its authorizations, its lifetime, minted.

The identity is ``pilot-<site>-<serial>@<uid_domain>``, the serial 12 random hex digits
drawn at submit. Why not the SLURM job id: the token travels inside the sbatch request
(the batch script on sbatch's stdin), so it exists before SLURM names the job. Why
random rather than a counter: no state has to survive a restart of the service or be
shared by two of them, and nobody can guess the next pilot's name. The pilot puts the
identity into its daemons' names (``pilot-<site>-<job>@<identity>.<host>``), which is
what the collector checks an ad against (condor_config/central-manager.conf).

Minting uses HTCondor's own ``condor_token_create`` with the service's signing key
(`pilot_tokens.signing_key`), kept apart from the pool's: argv carries no secret, the
token comes back on stdout and goes nowhere but into the batch script sent on sbatch's
stdin.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from provisioner.security.jwt import payload

#: A pilot's authorizations: advertise its master and startd, register with CCB
#: (DAEMON), read the pool. The collector refuses a pilot token that asks for more.
PILOT_AUTHZ = ("READ", "ADVERTISE_MASTER", "ADVERTISE_STARTD", "DAEMON")
#: The token's scope claim as condor_token_create writes it for PILOT_AUTHZ.
PILOT_SCOPE = " ".join(f"condor:/{a}" for a in PILOT_AUTHZ)
SERIAL_HEX = 12
#: A pilot identity's user part (the collector's configuration has the same pattern).
IDENTITY_USER = re.compile(r"^pilot-([a-z][a-z0-9_-]*)-([0-9a-f]{12})$")
#: A token as it may appear in a batch script (JWT: base64url parts and dots).
TOKEN_TEXT = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$")
JTI = re.compile(r"^[0-9a-f]{16,64}$")


class TokenError(Exception):
    """A pilot token cannot be minted; the message names the key file or the tool."""


@dataclass(frozen=True)
class PilotToken:
    """One pilot's token: its claims, and the token itself (never printed)."""

    site: str
    identity: str
    jti: str
    issued_at: int
    expires_at: int
    text: str = field(repr=False)


def identity_of(site: str, uid_domain: str, serial: str | None = None) -> str:
    """A fresh pilot identity at `site` (or the one with `serial`)."""
    serial = serial or secrets.token_hex(SERIAL_HEX // 2)
    user = f"pilot-{site}-{serial}"
    if not IDENTITY_USER.match(user):
        raise ValueError(f"not a pilot identity: {user!r}")
    return f"{user}@{uid_domain}"


def claims(token: str) -> dict[str, object]:
    """The payload claims of a JWT (not verified: the collector does that)."""
    if not TOKEN_TEXT.match(token):
        raise TokenError("not an IDTOKEN (three base64url parts)")
    try:
        return payload(token)
    except ValueError as exc:
        raise TokenError(f"unreadable token: {exc}") from None


def check_key(path: str) -> str | None:
    """Why the signing key at `path` cannot be used by this account (None: it can)."""
    key = Path(path)
    try:
        st = key.stat()
        with key.open("rb") as f:
            f.read(1)
    except OSError as exc:
        return f"pilot_tokens.signing_key {path}: {exc.strerror or exc}"
    if st.st_mode & 0o077:
        return (f"pilot_tokens.signing_key {path} is readable by others (mode "
                f"{st.st_mode & 0o777:04o}): chmod 600 it, and rotate it (docs/security.md)")
    if st.st_uid != os.geteuid() and os.geteuid() != 0:
        return (f"pilot_tokens.signing_key {path} belongs to uid {st.st_uid}, not this "
                f"account ({os.geteuid()}): HTCondor reads a key only from its owner's file")
    return None


def mint(site: str, uid_domain: str, key_file: str, lifetime_s: int,
         timeout_s: float = 30.0) -> PilotToken:
    """A new token for a new pilot at `site`, valid `lifetime_s` from now."""
    problem = check_key(key_file)
    if problem:
        raise TokenError(problem)
    identity = identity_of(site, uid_domain)
    key = Path(key_file)
    argv = ["condor_token_create", "-identity", identity, "-key", key.name,
            "-lifetime", str(int(lifetime_s))]
    for authz in PILOT_AUTHZ:
        argv += ["-authz", authz]
    env = {**os.environ, "_CONDOR_SEC_PASSWORD_DIRECTORY": str(key.parent),
           "_CONDOR_TRUST_DOMAIN": uid_domain, "_CONDOR_TOOL_DEBUG": ""}
    # HTCondor reads a key only from its owner's file: root (an admin's tools, the
    # tests) mints as the key's owner.
    st = key.stat()
    as_owner: dict[str, object] = {}
    if os.geteuid() == 0 and st.st_uid != 0:
        as_owner = {"user": st.st_uid, "group": st.st_gid, "extra_groups": [], "cwd": "/"}
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env,  # type: ignore[call-overload]
                              timeout=timeout_s, check=False, **as_owner)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TokenError(f"condor_token_create failed: {exc}") from None
    text = proc.stdout.strip()
    if proc.returncode != 0 or not TOKEN_TEXT.match(text):
        said = " ".join(proc.stderr.split())[:300] or f"exit {proc.returncode}"
        raise TokenError(f"condor_token_create with pilot_tokens.signing_key {key_file} "
                         f"failed: {said}")
    doc = claims(text)
    jti, iat, exp = doc.get("jti"), doc.get("iat"), doc.get("exp")
    if (doc.get("sub") != identity or not isinstance(jti, str) or not JTI.match(jti)
            or not isinstance(iat, int) or not isinstance(exp, int)):
        raise TokenError(f"condor_token_create minted an unexpected token for {identity}")
    return PilotToken(site, identity, jti, iat, exp, text)
