"""`pilot_tokens:` how the service mints each pilot's own IDTOKEN (provisioner.security)."""

from __future__ import annotations

from pydantic import Field

from provisioner.config.base import PATH_PATTERN, _Model


class PilotTokensConfig(_Model):
    """Each pilot gets a token of its own, minted when it is submitted (docs/security.md)."""

    #: The signing key the service mints with: a file only the service's account reads
    #: (mode 0600). Its file name is the key's name (`condor_token_create -key NAME`);
    #: the collector holds a copy under that name in its own SEC_PASSWORD_DIRECTORY.
    signing_key: str = Field(default="/etc/provisioner/pilot-keys/pilot-1",
                             pattern=PATH_PATTERN)
    #: The list of live pilot tokens (their jti, one a line) that the collector's
    #: configuration reads (condor_config/central-manager.conf): a pilot token not
    #: listed is refused. Written by the service, readable by the collector.
    live_list: str = Field(default="/var/lib/provisioner/pilot-tokens.live",
                           pattern=PATH_PATTERN)
    #: How long a pilot may wait in SLURM's queue: its token lives its walltime plus
    #: this plus `expiry_slack_s`, and SLURM drops a pilot that could no longer end
    #: before then (sbatch --deadline).
    queue_allowance_s: int = Field(default=86400, ge=60)
    #: Extra life of a token beyond the pilot's latest possible end (clocks, SLURM's kill).
    expiry_slack_s: int = Field(default=600, ge=0)
    #: The collector's log, where it says which pilot ads and tokens it refused
    #: (COLLECTOR_DEBUG with D_MACHINE and D_SECURITY): reported by `status` and the
    #: metrics. "auto": this host's COLLECTOR_LOG; "off"; or the file's path.
    collector_log: str = Field(default="auto", pattern=r"^(auto|off|/[A-Za-z0-9_./+@%=,-]*)$")
