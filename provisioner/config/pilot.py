"""`sites[].pilot`, `.caps`, `.runtime`, `.pilot_ad`: what a site's pilots are and advertise."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from provisioner.config.base import (
    ATTRIBUTE_NAME_PATTERN,
    PATH_PATTERN,
    _Model,
    drop_deprecated,
)


class PilotShapeConfig(_Model):
    cpus: int = Field(gt=0)
    min_cpus: int = Field(default=1, gt=0)
    memory_mb: int = Field(gt=0)
    memory_per_cpu_mb: int = Field(default=2000, gt=0)
    gpus: int = Field(default=0, ge=0)
    walltime_s: int = Field(gt=0)
    shutdown_margin_s: int = Field(default=120, ge=0)
    # New pilots are packed with idle jobs up to this many cores (at least one job, at most
    # `cpus`); None = `cpus`. Smaller pilots leave less idle tail when their last job runs
    # on alone, at the price of more sbatch calls.
    target_cpus: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> PilotShapeConfig:
        if self.min_cpus > self.cpus:
            raise PydanticCustomError(
                "min_cpus",
                "min_cpus {value} > cpus {cpus}",
                {"field": "min_cpus", "value": self.min_cpus, "cpus": self.cpus},
            )
        if self.shutdown_margin_s >= self.walltime_s:
            raise PydanticCustomError(
                "margin",
                "shutdown_margin_s {value} must be < walltime_s {walltime}",
                {"field": "shutdown_margin_s", "value": self.shutdown_margin_s,
                 "walltime": self.walltime_s},
            )
        if self.target_cpus is not None and self.target_cpus > self.cpus:
            raise PydanticCustomError(
                "target_cpus",
                "target_cpus {value} > cpus {cpus}",
                {"field": "target_cpus", "value": self.target_cpus, "cpus": self.cpus},
            )
        return self

    @property
    def pack_cpus(self) -> int:
        """Cores new pilots are packed up to (before sizing down to what they hold)."""
        return max(self.min_cpus, self.target_cpus or self.cpus)

    @property
    def usable_s(self) -> int:
        """Seconds of a fresh pilot during which it takes new work."""
        return self.walltime_s - self.shutdown_margin_s


class CapsConfig(_Model):
    max_pilots: int = Field(default=10, ge=0)
    max_pending: int = Field(default=4, ge=0)
    max_submit_per_cycle: int = Field(default=5, ge=0)



#: One option of condor_gpu_discovery that `runtime.gpu_discovery_extra` may pass (it
#: lands in the startd's argv, never in a shell).
GPU_DISCOVERY_OPTION = re.compile(
    r"^-(simulate:[0-6],[0-9]{1,2}(,[0-6],[0-9]{1,2})*|extra|dynamic|nested|not-nested|"
    r"by-index|short-uuid|uuid|cuda|opencl|mixed)$")


class PilotRuntimeConfig(_Model):
    """Where things are on the site's worker nodes, and the pilot's own timers."""

    python: str = Field(default="/opt/venv/bin/python", pattern=PATH_PATTERN)
    condor_config: str = Field(default="/etc/provisioner/pilot.conf", pattern=PATH_PATTERN)
    scratch: str = Field(default="", pattern=r"^(|/[A-Za-z0-9_./+@%=,-]*)$")  # "" = $TMPDIR
    log_dir: str = Field(default="", pattern=r"^(|/[A-Za-z0-9_./+@%=,-]*)$")  # "" = no copy
    #: Directories of the node that jobs see inside the pilot's container at the same
    #: path: the site's shared file system (where a cache with direct access keeps
    #: its files), software areas. Read-only.
    bind: list[Annotated[str, Field(pattern=r"^/[A-Za-z0-9_./+@%=-]*$")]] = Field(
        default_factory=list)
    start_delay_max_s: int = Field(default=30, ge=0)
    noclaim_shutdown_s: int = Field(default=1200, gt=0)
    #: Jobs in their own containers (container_image, +SingularityImage), nested in
    #: the pilot's: on where the node passes the pilot's start-up test.
    containers: bool = True
    #: The image that start-up test runs ("" = the pilot image itself).
    container_test_image: str = Field(default="", pattern=r"^(|/[A-Za-z0-9_./+@%=,-]*)$")
    #: Seconds a passed start-up test counts on its node: pilots there skip it meanwhile
    #: (provisioner.pilot.testcache; a failed test is never cached). 0 = always test.
    container_test_cache_s: int = Field(default=21600, ge=0)
    #: The image jobs that name none run in ("" = none: they run in the pilot's).
    payload_image: str = Field(default="", pattern=r"^(|/[A-Za-z0-9_./+@%=,-]*)$")
    #: Extra options of the pilot startd's condor_gpu_discovery (HTCondor's
    #: GPU_DISCOVERY_EXTRA), space-separated, from a fixed set (`GPU_DISCOVERY_OPTION`).
    #: ``-simulate:D,N`` makes a node without GPUs report N simulated GPUs of type D
    #: (0..6, see ``condor_gpu_discovery -help``): for a testbed; the pilot's slot still
    #: takes only the GPUs it was given (`pilot.gpus`). Used only by pilots with GPUs.
    gpu_discovery_extra: str = ""

    @model_validator(mode="before")
    @classmethod
    def _no_shared_pilot_token(cls, value: Any) -> Any:
        return drop_deprecated(value, "sites[].runtime.token_file", "token_file")

    @field_validator("gpu_discovery_extra")
    @classmethod
    def _gpu_discovery_options(cls, value: str) -> str:
        for token in value.split():
            if not GPU_DISCOVERY_OPTION.match(token):
                raise PydanticCustomError(
                    "gpu_discovery_option",
                    "not a condor_gpu_discovery option this provisioner passes: {value!r} "
                    "(one of -simulate:D,N[,D,N...], -extra, -dynamic, -nested, -not-nested, "
                    "-by-index, -short-uuid, -uuid, -cuda, -opencl, -mixed)",
                    {"value": token})
        return " ".join(value.split())

    @property
    def simulates_gpus(self) -> bool:
        """The GPUs are simulated by condor_gpu_discovery (no devices, no driver)."""
        return any(t.startswith("-simulate:") for t in self.gpu_discovery_extra.split())



class PilotAdConfig(_Model):
    """What a site's pilot startds advertise that the provisioner cannot derive (the
    node's platform, what its image offers). With the pilot's own attributes (site,
    size, file transfer, START) it makes the prototype ad that idle jobs' Requirements
    are evaluated against before a pilot is started for them (`provisioner.pool.prototype`).
    An attribute a job requires and the prototype lacks makes the job unmatchable, as
    the negotiator would: declare in `extra_attributes` what the site's pilots really
    advertise (``condor_status -l`` on one of them), e.g. ``HasSingularity: true``."""

    arch: str = Field(default="X86_64", pattern=r"^[A-Za-z0-9_]+$")
    opsys: str = Field(default="LINUX", pattern=r"^[A-Za-z0-9_]+$")
    #: e.g. "Debian13", "AlmaLinux9"; None: not advertised by the prototype.
    opsys_and_ver: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.]+$")
    #: Attribute name -> literal value (bool, number or string); overrides the above.
    extra_attributes: dict[str, bool | int | float | str] = Field(default_factory=dict)

    @field_validator("extra_attributes")
    @classmethod
    def _attribute_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if not re.match(ATTRIBUTE_NAME_PATTERN, name):
                raise PydanticCustomError(
                    "attribute_name", "not a ClassAd attribute name: {value}",
                    {"value": name})
        return value
