"""`sites[]`: a site, its backend's settings and where its commands run."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from provisioner.config.allocations import AllocationConfig, check_allocations
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
    #: Grants this site's pilots are charged to (`provisioner.config.allocations`);
    #: empty: no budget, every pilot takes any job.
    allocations: tuple[AllocationConfig, ...] = ()

    @model_validator(mode="after")
    def _allocations_consistent(self) -> SiteBase:
        check_allocations(self.allocations, self.pilot.gpus)
        return self

    def allocation(self, name: str) -> AllocationConfig:
        """The allocation called `name`; KeyError if the site has none of that name."""
        for alloc in self.allocations:
            if alloc.name == name:
                return alloc
        raise KeyError(name)

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


class SlurmSiteBase(SiteBase):
    """What every SLURM site has, whichever way it is reached: where its pilots go."""

    partition: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+$")
    account: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+$")
    qos: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+$")
    #: How a pilot with GPUs asks SLURM for them: "gres" ``--gres=gpu[:type]:N`` (per
    #: node; every SLURM with GPUs knows it) or "gpus" ``--gpus=[type:]N`` (per job,
    #: SLURM's cons_tres plugin). N is the pilot's GPUs (at most `pilot.gpus`).
    gpu_request: Literal["gres", "gpus"] = "gres"
    #: The GPU type to ask for (gres.conf ``Type=``, e.g. "a100"); None: any type.
    gpu_type: str | None = Field(default=None, pattern=GPU_TYPE_PATTERN)

    @model_validator(mode="after")
    def _account_or_allocations(self) -> SlurmSiteBase:
        if self.account is not None and self.allocations:
            raise PydanticCustomError(
                "account_and_allocations",
                "account {value!r} set beside allocations: each allocation names the SLURM "
                "account its pilots are charged to (allocations[].account); remove account",
                {"field": "account", "value": self.account})
        return self

    @model_validator(mode="after")
    def _gpu_type_needs_gpus(self) -> SlurmSiteBase:
        if self.gpu_type is not None and self.pilot.gpus == 0:
            raise PydanticCustomError(
                "gpu_type",
                "gpu_type {value!r} set but pilot.gpus is 0: the pilots ask for no GPUs",
                {"field": "gpu_type", "value": self.gpu_type})
        return self


class SiteConfig(SlurmSiteBase):
    """A SLURM site driven through its command-line tools (`backend: slurm-cli`)."""

    backend: Literal["slurm-cli"] = "slurm-cli"
    slurm_conf: str | None = Field(default=None, pattern=PATH_PATTERN)
    executor: ExecutorConfig = LocalExecutorConfig()


#: slurmrestd's API versions (its data_parser plugins) this backend speaks.
REST_API_VERSION_PATTERN = r"^v0\.0\.[0-9]{2}$"


class RestConfig(_Model):
    """How a `slurm-rest` site's slurmrestd is reached: its URL, the account and its JWT."""

    #: slurmrestd's base URL (http or https), e.g. https://rest.site.example:6820.
    url: str = Field(pattern=r"^https?://[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?"
                             r"(/[A-Za-z0-9_./-]*)?$")
    #: The site account the pilots are submitted as (X-SLURM-USER-NAME).
    user: str = Field(pattern=ACCOUNT_PATTERN)
    #: The account's JWT (X-SLURM-USER-TOKEN), in a file only the service's account may
    #: read; read again whenever it changes, so that whoever renews it may replace it.
    token_file: str = Field(pattern=PATH_PATTERN)
    #: A command (argv, no shell) that prints a fresh token for `user` on stdout; run
    #: when the token expires within `renew_before_s`, its output written to
    #: token_file. None: the token is renewed elsewhere (or not at all).
    renew_command: list[Annotated[str, Field(pattern=r"^[^\x00\n]+$")]] | None = None
    renew_before_s: int = Field(default=900, ge=0)
    #: The API version to use; None: the newest that slurmrestd and this backend both
    #: speak, from the server's OpenAPI description.
    api_version: str | None = Field(default=None, pattern=REST_API_VERSION_PATTERN)
    #: CA bundle that signs the server's certificate (https); None: the system's.
    ca_file: str | None = Field(default=None, pattern=PATH_PATTERN)
    timeout_s: float = Field(default=30, gt=0)


class RestSiteConfig(SlurmSiteBase):
    """A SLURM site reached through slurmrestd with a JWT (`backend: slurm-rest`)."""

    backend: Literal["slurm-rest"]
    rest: RestConfig


#: Backend name (`sites[].backend`) -> its settings model. Each backend owns its
#: fields; provisioner.sites registers a factory for each of these names.
BACKEND_SETTINGS: dict[str, type[SlurmSiteBase]] = {"slurm-cli": SiteConfig,
                                                     "slurm-rest": RestSiteConfig}
KNOWN_BACKENDS: tuple[str, ...] = tuple(BACKEND_SETTINGS)
#: A site of any backend, as `Config.sites` holds it.
SlurmSite = SiteConfig | RestSiteConfig
AnySite = Annotated[SlurmSite, Field(discriminator="backend")]
