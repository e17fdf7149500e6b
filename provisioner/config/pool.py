"""`pool:` (the HTCondor pool the service reads) and `metrics:` (its Prometheus endpoint)."""

from __future__ import annotations

import logging
import re
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from provisioner.config.base import SCHEDD_NAME_PATTERN, _Model, drop_deprecated

log = logging.getLogger(__name__)


class PoolConfig(_Model):
    collector: str = Field(default="127.0.0.1:9618", pattern=r"^[A-Za-z0-9.-]+(:[0-9]+)?$")
    #: The schedds whose queues are the demand (their Name in the collector). Empty: every
    #: schedd the collector lists, each remembered once seen (`provisioner.pool.schedds`).
    schedds: tuple[Annotated[str, Field(pattern=SCHEDD_NAME_PATTERN)], ...] = ()
    #: Deprecated alias of a one-item `schedds` (kept working; a warning says so).
    schedd: str | None = Field(default=None, pattern=SCHEDD_NAME_PATTERN)
    #: A schedd seen in the collector that left it (shut down, or decommissioned) is
    #: unknown, not empty, for this long: no scale-down meanwhile. Then it is forgotten.
    #: The default is HTCondor's job lease (JobLeaseDuration, 40 min): its running jobs
    #: are gone by then anyway.
    schedd_gone_s: float = Field(default=2400.0, ge=0)
    token_file: str = "/etc/provisioner/tokens.d/provisioner"
    provisioner_id: str = Field(default="prov-1", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    #: The pool's UID_DOMAIN: identities are user@uid_domain (pilot@, provisioner@).
    uid_domain: str = Field(default="testbed", pattern=r"^[A-Za-z0-9][A-Za-z0-9.-]*$")
    #: The schedd's global event log, followed so that a submit wakes the loop at once
    #: (`provisioner.pool.submit_events`); the quick check stays the fallback. "auto": EVENT_LOG
    #: of this host's HTCondor configuration if set and its directory is here (the service
    #: runs beside the schedd), else off; "off"; or the log's absolute path.
    event_log: str = "auto"

    @model_validator(mode="before")
    @classmethod
    def _no_shared_pilot_token(cls, value: Any) -> Any:
        return drop_deprecated(value, "pool.pilot_token_file", "pilot_token_file")

    @model_validator(mode="after")
    def _schedd_alias(self) -> PoolConfig:
        """`schedd: X` reads as `schedds: [X]`; both set is ambiguous."""
        if self.schedd is None:
            return self
        if self.schedds:
            raise PydanticCustomError(
                "schedds", "set pool.schedds only (pool.schedd is its deprecated one-item "
                "form; got both)", {})
        log.warning("pool.schedd is deprecated: write pool.schedds: [%s]", self.schedd)
        object.__setattr__(self, "schedds", (self.schedd,))
        return self

    @field_validator("event_log")
    @classmethod
    def _event_log_setting(cls, value: str) -> str:
        if value in ("auto", "off") or re.fullmatch(r"/[A-Za-z0-9_./+@%=,-]*", value):
            return value
        raise PydanticCustomError(
            "event_log", "event_log must be auto, off or an absolute path (got {value!r})",
            {"value": value})



class MetricsConfig(_Model):
    """The Prometheus endpoint `provisioner run` serves (None: no endpoint)."""

    #: "HOST:PORT" to listen on, e.g. "127.0.0.1:9100" (IPv6 as "[::1]:9100").
    listen: str | None = Field(default=None,
                               pattern=r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]*):[0-9]{1,5}$")

    @field_validator("listen")
    @classmethod
    def _port_in_range(cls, value: str | None) -> str | None:
        if value is not None and not 1 <= int(value.rsplit(":", 1)[1]) <= 65535:
            raise PydanticCustomError("port", "port must be 1..65535 (got {value!r})",
                                      {"value": value})
        return value

    @property
    def address(self) -> tuple[str, int] | None:
        """(host, port) to bind; host "" is every address."""
        if self.listen is None:
            return None
        host, port = self.listen.rsplit(":", 1)
        return host.strip("[]"), int(port)
