"""`sites[]`: a site, its backend's settings and where its commands run."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from provisioner.config.base import (
    ACCOUNT_PATTERN,
    GPU_TYPE_PATTERN,
    HOST_PATTERN,
    PATH_PATTERN,
    SITE_NAME_PATTERN,
    _Model,
)
from provisioner.config.pilot import CapsConfig, PilotAdConfig, PilotRuntimeConfig, PilotShapeConfig


class LocalExecutorConfig(_Model):
    """Commands run on the provisioner's own host (a login node of the site)."""

    type: Literal["local"] = "local"
    #: Account that runs them when the service runs as root (None = the service's own).
    run_as: str | None = Field(default=None, pattern=ACCOUNT_PATTERN)
    command_timeout_s: float = Field(default=60, gt=0)


class SshExecutorConfig(_Model):
    """Commands run on the site's login node over SSH (key only, strict host keys)."""

    type: Literal["ssh"]
    host: str = Field(pattern=HOST_PATTERN)
    port: int = Field(default=22, ge=1, le=65535)
    #: The site account the pilots are submitted as.
    user: str = Field(pattern=ACCOUNT_PATTERN)
    #: Private key (readable by the service's account only).
    key_file: str = Field(pattern=PATH_PATTERN)
    #: The login node's host key(s), checked strictly.
    known_hosts: str = Field(pattern=PATH_PATTERN)
    connect_timeout_s: float = Field(default=10, gt=0)
    command_timeout_s: float = Field(default=60, gt=0)
    #: How long the multiplexed connection outlives its last command.
    control_persist_s: int = Field(default=600, ge=0)
    #: Private directory (created 0700) for the connection sockets; keep it short.
    control_dir: str = Field(default="/run/provisioner", pattern=PATH_PATTERN, max_length=60)


ExecutorConfig = Annotated[LocalExecutorConfig | SshExecutorConfig, Field(discriminator="type")]


class SiteBase(_Model):
    """What every site has, whatever its backend: its pilots and the provisioner's policy."""

    name: str = Field(pattern=SITE_NAME_PATTERN)
    max_walltime_s: int = Field(gt=0)
    template: str = Field(pattern=r"^[A-Za-z0-9_.-]+\.j2$")
    image: str = Field(pattern=PATH_PATTERN)
    #: The site's XRootD caching proxy: jobs on its pilots read every root:// URL
    #: through it (the XRootD client proxy plugin) and find it in $XCACHE.
    xcache: str | None = Field(default=None, pattern=r"^root://[A-Za-z0-9_.:-]+$")
    #: Domains (or host names) jobs reach directly, not through the cache: the
    #: site's own storage, say. The cache itself and localhost always are.
    xcache_exclude: list[Annotated[str, Field(pattern=HOST_PATTERN)]] = Field(default_factory=list)
    runtime: PilotRuntimeConfig = PilotRuntimeConfig()
    weight: float = Field(default=1.0, ge=0)
    pilot: PilotShapeConfig
    caps: CapsConfig = CapsConfig()
    keep_warm: int = Field(default=0, ge=0)
    pilot_ad: PilotAdConfig = PilotAdConfig()

    @model_validator(mode="after")
    def _walltime_within_partition(self) -> SiteBase:
        if self.pilot.walltime_s > self.max_walltime_s:
            raise PydanticCustomError(
                "walltime",
                "pilot.walltime_s {value} exceeds the partition limit max_walltime_s {limit}",
                {"field": "pilot.walltime_s", "value": self.pilot.walltime_s,
                 "limit": self.max_walltime_s},
            )
        return self


class SiteConfig(SiteBase):
    """A SLURM site driven through its command-line tools (`backend: slurm-cli`)."""

    backend: Literal["slurm-cli"] = "slurm-cli"
    slurm_conf: str | None = Field(default=None, pattern=PATH_PATTERN)
    partition: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+$")
    account: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+$")
    qos: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+$")
    executor: ExecutorConfig = LocalExecutorConfig()
    #: How a pilot with GPUs asks SLURM for them: "gres" ``--gres=gpu[:type]:N`` (per
    #: node; every SLURM with GPUs knows it) or "gpus" ``--gpus=[type:]N`` (per job,
    #: SLURM's cons_tres plugin). N is the pilot's GPUs (at most `pilot.gpus`).
    gpu_request: Literal["gres", "gpus"] = "gres"
    #: The GPU type to ask for (gres.conf ``Type=``, e.g. "a100"); None: any type.
    gpu_type: str | None = Field(default=None, pattern=GPU_TYPE_PATTERN)

    @model_validator(mode="after")
    def _gpu_type_needs_gpus(self) -> SiteConfig:
        if self.gpu_type is not None and self.pilot.gpus == 0:
            raise PydanticCustomError(
                "gpu_type",
                "gpu_type {value!r} set but pilot.gpus is 0: the pilots ask for no GPUs",
                {"field": "gpu_type", "value": self.gpu_type})
        return self


#: Backend name (`sites[].backend`) -> its settings model. Each backend owns its
#: fields; provisioner.sites registers a factory for each of these names.
BACKEND_SETTINGS: dict[str, type[SiteBase]] = {"slurm-cli": SiteConfig}
KNOWN_BACKENDS: tuple[str, ...] = tuple(BACKEND_SETTINGS)
AnySite = Annotated[SiteConfig, Field(discriminator="backend")]
