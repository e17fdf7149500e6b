"""Service configuration: pydantic models loaded once from YAML and passed explicitly.

`load_config(path)` is the only entry point that touches the file system. Every problem is
raised as `ConfigError` whose message names the file, the field path (``sites[1].pilot.walltime_s``)
and the offending value, plus the YAML line when it can be found.

One module per section of the file: `pool` (pool:, metrics:), `policy` (policy:),
`pilot` (a site's pilot, caps, runtime, pilot_ad), `site` (sites[] and their backends),
`allocations` (sites[].allocations[]),
`document` (the whole file), `loading` (YAML in, errors out); `base` holds what they share.
"""

from provisioner.config.allocations import (
    GROUP_PATTERN,
    UNIT_SHORT,
    UNIT_TRES,
    AllocationConfig,
    DatedPeriod,
    utc_date,
)
from provisioner.config.base import (
    ACCOUNT_PATTERN,
    ATTRIBUTE_NAME_PATTERN,
    GPU_TYPE_PATTERN,
    HOST_PATTERN,
    PATH_PATTERN,
    SCHEDD_NAME_PATTERN,
    SITE_NAME_PATTERN,
    ConfigError,
)
from provisioner.config.document import Config
from provisioner.config.loading import field_location, load_config, parse_config
from provisioner.config.pilot import (
    GPU_DISCOVERY_OPTION,
    CapsConfig,
    PilotAdConfig,
    PilotRuntimeConfig,
    PilotShapeConfig,
)
from provisioner.config.policy import BreakerConfig, PlacementConfig, PolicyConfig, ReserveConfig
from provisioner.config.pool import MetricsConfig, PoolConfig
from provisioner.config.site import (
    BACKEND_SETTINGS,
    KNOWN_BACKENDS,
    AnySite,
    ExecutorConfig,
    LocalExecutorConfig,
    RestConfig,
    RestSiteConfig,
    SiteBase,
    SiteConfig,
    SlurmSite,
    SlurmSiteBase,
    SshExecutorConfig,
)
from provisioner.config.tokens import PilotTokensConfig

__all__ = [
    "ACCOUNT_PATTERN",
    "ATTRIBUTE_NAME_PATTERN",
    "BACKEND_SETTINGS",
    "GPU_DISCOVERY_OPTION",
    "GPU_TYPE_PATTERN",
    "GROUP_PATTERN",
    "HOST_PATTERN",
    "KNOWN_BACKENDS",
    "PATH_PATTERN",
    "SCHEDD_NAME_PATTERN",
    "SITE_NAME_PATTERN",
    "UNIT_SHORT",
    "UNIT_TRES",
    "AllocationConfig",
    "AnySite",
    "BreakerConfig",
    "CapsConfig",
    "Config",
    "ConfigError",
    "DatedPeriod",
    "ExecutorConfig",
    "LocalExecutorConfig",
    "MetricsConfig",
    "PilotAdConfig",
    "PilotRuntimeConfig",
    "PilotShapeConfig",
    "PilotTokensConfig",
    "PlacementConfig",
    "PolicyConfig",
    "PoolConfig",
    "ReserveConfig",
    "RestConfig",
    "RestSiteConfig",
    "SiteBase",
    "SiteConfig",
    "SlurmSite",
    "SlurmSiteBase",
    "SshExecutorConfig",
    "field_location",
    "load_config",
    "parse_config",
    "utc_date",
]
