"""What every section shares: the error, the frozen model base, the name patterns."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, ConfigDict

log = logging.getLogger(__name__)

SITE_NAME_PATTERN = r"^[a-z][a-z0-9_-]*$"
SCHEDD_NAME_PATTERN = r"^[A-Za-z0-9_.@-]+$"


class ConfigError(Exception):
    """The configuration file cannot be used; the message says where and why."""


#: What a configuration that still names the shared pilot token is told.
SHARED_PILOT_TOKEN_GONE = ("{field} is no longer used and is ignored: each pilot now gets "
                           "its own short-lived token, minted at submit (pilot_tokens; "
                           "docs/security.md); remove the field and the shared token file")


def drop_deprecated(value: Any, field: str, key: str) -> Any:
    """`value` (a section's raw mapping) without `key`, with a warning naming `field`."""
    if isinstance(value, dict) and key in value:
        log.warning(SHARED_PILOT_TOKEN_GONE.format(field=field))
        value = {k: v for k, v in value.items() if k != key}
    return value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


PATH_PATTERN = r"^/[A-Za-z0-9_./+@%=,-]*$"
HOST_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$"
ACCOUNT_PATTERN = r"^[a-z_][a-z0-9_-]*$"
ATTRIBUTE_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
#: A SLURM GPU type (gres.conf `Type=`), as it goes into ``--gres=gpu:<type>:N``.
GPU_TYPE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
