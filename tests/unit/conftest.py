"""Unit tests: no example may fail for taking long. Hypothesis's per-example deadline
(200 ms) is a timing assertion, and this suite shares a 2-core machine with the testbed
and other work; speed is what `make bench` measures."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from provisioner.security.tokens import PilotToken, identity_of
from provisioner.service import loop, pilot_tokens

settings.register_profile("unit", deadline=None)
settings.load_profile("unit")


def fake_mint(site: str, uid_domain: str, key: str, lifetime: int) -> PilotToken:
    """A token as condor_token_create returns one (claims not signed: no collector)."""
    identity = identity_of(site, uid_domain)
    serial = identity.split("@")[0][-12:]
    return PilotToken(site, identity, serial * 2, 0, lifetime, "aGVhZA.cGF5bG9hZA.c2ln")


@pytest.fixture(autouse=True)
def _pilot_tokens(tmp_path_factory: pytest.TempPathFactory,
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The service's pilot tokens without condor_token_create and a collector: a fake
    minter, a list in a temporary directory, no reconfig (provisioner.security's own
    tests and the testbed's integration tests use the real ones)."""
    live = tmp_path_factory.mktemp("tokens") / "live"

    class Tokens(pilot_tokens.PilotTokens):
        def __init__(self, config, **kwargs):  # type: ignore[no-untyped-def]
            config = config.model_copy(update={"pilot_tokens": config.pilot_tokens.model_copy(
                update={"live_list": str(live)})})
            kwargs.setdefault("reconfig", lambda: None)
            kwargs.setdefault("minter", fake_mint)
            super().__init__(config, **kwargs)

    monkeypatch.setattr(loop, "PilotTokens", Tokens)
    yield
    Path(live).unlink(missing_ok=True)
