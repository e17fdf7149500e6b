"""Site backends: one module per kind of site, chosen by `sites[].backend`."""

from __future__ import annotations

from collections.abc import Callable

from provisioner.config import PoolConfig, SiteConfig
from provisioner.sites.base import SiteBackend
from provisioner.sites.slurm_cli import LocalExecutor, SlurmCliBackend


def _slurm_cli(site: SiteConfig, pool: PoolConfig) -> SiteBackend:
    return SlurmCliBackend(
        name=site.name,
        provisioner_id=pool.provisioner_id,
        executor=LocalExecutor(run_as=site.submit_user),
        slurm_conf=site.slurm_conf,
        partition=site.partition,
        account=site.account,
        qos=site.qos,
        output_dir=site.runtime.log_dir or None,
    )


#: backend name (config `sites[].backend`) -> factory. The config validates names
#: against provisioner.config.KNOWN_BACKENDS; keep both in step.
BACKENDS: dict[str, Callable[[SiteConfig, PoolConfig], SiteBackend]] = {
    "slurm-cli": _slurm_cli,
}


def make_backend(site: SiteConfig, pool: PoolConfig) -> SiteBackend:
    return BACKENDS[site.backend](site, pool)
