"""Site backends: one module per kind of site, chosen by `sites[].backend`.

`BACKENDS` maps each backend name of provisioner.config.BACKEND_SETTINGS (the
settings models, where the names are defined) to the factory that builds it; a
test checks that both name the same backends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from provisioner.config import (
    LocalExecutorConfig,
    PoolConfig,
    SiteConfig,
    SshExecutorConfig,
)
from provisioner.sites.base import SiteBackend
from provisioner.sites.executor import Executor, LocalExecutor, SshExecutor
from provisioner.sites.slurm_cli import SlurmCliBackend


def make_executor(site: str, cfg: LocalExecutorConfig | SshExecutorConfig) -> Executor:
    """The executor a site's settings ask for."""
    if isinstance(cfg, SshExecutorConfig):
        return SshExecutor(site=site, host=cfg.host, port=cfg.port, user=cfg.user,
                           key_file=cfg.key_file, known_hosts=cfg.known_hosts,
                           connect_timeout_s=cfg.connect_timeout_s,
                           command_timeout_s=cfg.command_timeout_s,
                           control_persist_s=cfg.control_persist_s,
                           control_dir=cfg.control_dir)
    return LocalExecutor(run_as=cfg.run_as, timeout_s=cfg.command_timeout_s)


def _slurm_cli(site: Any, pool: PoolConfig) -> SiteBackend:
    assert isinstance(site, SiteConfig)
    return SlurmCliBackend(
        name=site.name,
        provisioner_id=pool.provisioner_id,
        executor=make_executor(site.name, site.executor),
        slurm_conf=site.slurm_conf,
        partition=site.partition,
        account=site.account,
        qos=site.qos,
        output_dir=site.runtime.log_dir or None,
        gpu_request=site.gpu_request,
        gpu_type=site.gpu_type,
        log_dir=site.runtime.log_dir or None,
    )


#: backend name (config `sites[].backend`) -> factory.
BACKENDS: dict[str, Callable[[Any, PoolConfig], SiteBackend]] = {
    "slurm-cli": _slurm_cli,
}


def make_backend(site: SiteConfig, pool: PoolConfig) -> SiteBackend:
    return BACKENDS[site.backend](site, pool)
