"""What every section shares: the error, the frozen model base, the name patterns."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

SITE_NAME_PATTERN = r"^[a-z][a-z0-9_-]*$"
SCHEDD_NAME_PATTERN = r"^[A-Za-z0-9_.@-]+$"


class ConfigError(Exception):
    """The configuration file cannot be used; the message says where and why."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


PATH_PATTERN = r"^/[A-Za-z0-9_./+@%=,-]*$"
HOST_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$"
ACCOUNT_PATTERN = r"^[a-z_][a-z0-9_-]*$"
ATTRIBUTE_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
#: A SLURM GPU type (gres.conf `Type=`), as it goes into ``--gres=gpu:<type>:N``.
GPU_TYPE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
