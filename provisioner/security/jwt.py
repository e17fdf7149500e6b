"""The claims of a JSON Web Token, read without checking its signature (whoever the
token is shown to checks that): HTCondor's IDTOKENs and SLURM's JWTs alike."""

from __future__ import annotations

import base64
import binascii
import json


def payload(token: str) -> dict[str, object]:
    """The claims of `token` (header.claims.signature); ValueError naming what is wrong.
    Callers check the token's form (which parts may be empty) themselves."""
    parts = token.split(".")
    if len(parts) != 3:
        raise ValueError("not a JWT (three base64url parts)")
    claims = parts[1]
    try:
        doc = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"its claims are not base64url JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError("its claims are not a JSON object")
    return doc
