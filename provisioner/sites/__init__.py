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
    RestSiteConfig,
    SiteConfig,
    SlurmSite,
    SlurmSiteBase,
    SshExecutorConfig,
)
from provisioner.sites.base import SiteBackend
from provisioner.sites.executor import Executor, LocalExecutor, SshExecutor
from provisioner.sites.rest_client import RestClient
from provisioner.sites.rest_token import TokenFile
from provisioner.sites.slurm_cli import SlurmCliBackend
from provisioner.sites.slurm_rest import SlurmRestBackend


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


def pilot_settings(site: SlurmSiteBase, provisioner_id: str) -> dict[str, Any]:
    """What every SLURM backend is built with: who submits, and where the pilots go."""
    return {"name": site.name, "provisioner_id": provisioner_id,
            "partition": site.partition, "account": site.account, "qos": site.qos,
            "output_dir": site.runtime.log_dir or None, "gpu_request": site.gpu_request,
            "gpu_type": site.gpu_type}


def _slurm_cli(site: Any, pool: PoolConfig) -> SiteBackend:
    assert isinstance(site, SiteConfig)
    return SlurmCliBackend(executor=make_executor(site.name, site.executor),
                           slurm_conf=site.slurm_conf, log_dir=site.runtime.log_dir or None,
                           **pilot_settings(site, pool.provisioner_id))


def rest_client(site: RestSiteConfig, index: int | None = None) -> RestClient:
    """The HTTP side of a slurm-rest site (`index`: its place in `sites`, for errors)."""
    rest = site.rest
    where = f"sites[{index if index is not None else site.name}].rest"
    token = TokenFile(site=site.name, path=rest.token_file, what=f"{where}.token_file",
                      renew_command=rest.renew_command, renew_before_s=rest.renew_before_s)
    return RestClient(site=site.name, url=rest.url, user=rest.user, token=token,
                      where=f"{where}.url", api_version=rest.api_version,
                      timeout_s=rest.timeout_s, verify=rest.ca_file or True)


def _slurm_rest(site: Any, pool: PoolConfig) -> SiteBackend:
    assert isinstance(site, RestSiteConfig)
    return SlurmRestBackend(client=rest_client(site),
                            **pilot_settings(site, pool.provisioner_id))


#: backend name (config `sites[].backend`) -> factory.
BACKENDS: dict[str, Callable[[Any, PoolConfig], SiteBackend]] = {
    "slurm-cli": _slurm_cli,
    "slurm-rest": _slurm_rest,
}


def make_backend(site: SlurmSite, pool: PoolConfig) -> SiteBackend:
    return BACKENDS[site.backend](site, pool)
