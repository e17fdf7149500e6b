"""The onboarding subcommands: `site check`, `site discover`, `check-config --live`.

Thin: each reads what it needs and hands the pure parts (provisioner.onboard.fit,
.discover, .table) plain data.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from provisioner.config import (
    Config,
    PoolConfig,
    RestSiteConfig,
    SiteConfig,
    SshExecutorConfig,
)
from provisioner.errors import BackendError
from provisioner.onboard import check, fit
from provisioner.onboard.discover import (
    Access,
    Live,
    LiveError,
    discover,
    read_grants,
    read_live,
)
from provisioner.onboard.probe import Limits, Probe
from provisioner.onboard.restcheck import image_row, rest_checks
from provisioner.onboard.restinfo import read_grants_rest, read_live_rest
from provisioner.onboard.table import Check, as_json, failed, render, site_ok, skipped
from provisioner.security.tokens import check_key
from provisioner.sites import pilot_settings, rest_client
from provisioner.sites.executor import Executor
from provisioner.sites.slurm_cli import SlurmCliBackend
from provisioner.sites.slurm_rest import SlurmRestBackend


class CollectorAds:
    """Startd ads from the pool's collector, as the provisioner's identity."""

    def __init__(self, pool: PoolConfig) -> None:
        import htcondor2 as htcondor

        self.htcondor, self.collector = htcondor, pool.collector
        if pool.token_file:
            htcondor.param["SEC_TOKEN_DIRECTORY"] = os.path.dirname(pool.token_file)
            htcondor.param["SEC_CLIENT_AUTHENTICATION_METHODS"] = "IDTOKENS"

    def __call__(self, constraint: str) -> Sequence[Mapping[str, Any]]:
        ads = self.htcondor.Collector(self.collector).query(
            self.htcondor.AdType.Startd, constraint=constraint,
            projection=["Name", "PilotContainerTest", "PilotSlurmJobId"])
        return [dict(ad) for ad in ads]


def _backend(config: Config, site: SiteConfig, executor: Executor, probe: bool
             ) -> SlurmCliBackend:
    pid = config.pool.provisioner_id + ("-probe" if probe else "")
    return SlurmCliBackend(executor=executor, slurm_conf=site.slurm_conf,
                           log_dir=site.runtime.log_dir or None, **pilot_settings(site, pid))


def _login(config: Config, index: int, site: SiteConfig, executor: Executor) -> list[Check]:
    if isinstance(site.executor, SshExecutorConfig):
        rows = check.ssh_file_checks(index, config, site.executor)
        if any(r.ok is False for r in rows[:2]):
            return rows
        rows += check.login_checks(index, site, executor)
    else:
        result = executor.run(["id", "-un"], {"PATH": "/usr/bin:/bin"})
        rows = [check.account_check(index, site, result.returncode, result.stdout)]
    if all(r.ok is not False for r in rows):
        rows.append(check.commands_check(executor))
        if isinstance(site.executor, SshExecutorConfig):
            rows.append(check.gate_check(executor))
    return rows


def _slurm(config: Config, index: int, site: SiteConfig, executor: Executor) -> list[Check]:
    try:
        live = read_live(executor, site.slurm_conf, f"sites[{index}] ({site.name})")
    except LiveError as exc:
        return [failed("SLURM answers", str(exc), f"check sites[{index}].slurm_conf "
                             "and the site's controller", "slurm")]
    rows = fit.slurm_checks(index, site, live.partitions, live.nodes)
    if rows[0].ok:
        rows.append(check.sbatch_check(index, config, site,
                                       _backend(config, site, executor, probe=False)))
    return rows


def _rest_backend(config: Config, index: int, site: RestSiteConfig, probe: bool
                  ) -> SlurmRestBackend:
    pid = config.pool.provisioner_id + ("-probe" if probe else "")
    return SlurmRestBackend(client=rest_client(site, index), **pilot_settings(site, pid))


def check_rest_site(config: Config, index: int, site: RestSiteConfig, probe: bool,
                    limits: Limits) -> list[Check]:
    """`site check` of a slurm-rest site: token, server, version, SLURM, probe."""
    backend = _rest_backend(config, index, site, probe=True)
    try:
        rows = rest_checks(index, site, backend.client)
        if not site_ok(rows):
            return [*rows, skipped("SLURM", "cannot ask slurmrestd", "slurm")]
        try:
            live = read_live_rest(backend.client, f"sites[{index}] ({site.name})")
            rows += fit.slurm_checks(index, site, live.partitions, live.nodes)
        except LiveError as exc:
            rows.append(failed("SLURM answers", str(exc), f"check sites[{index}].rest",
                               "slurm"))
        rows.append(image_row(site))
        if not probe:
            return [*rows, skipped("probe pilot", "--no-probe", "probe")]
        if not site_ok(rows):
            return [*rows, skipped("probe pilot", "the checks above failed", "probe")]
        return rows + Probe(index, site, config, backend, CollectorAds(config.pool),
                            limits).run()
    except BackendError as exc:
        return [failed("slurmrestd", str(exc), "see the message", "rest")]
    finally:
        backend.close()


def check_site(config: Config, index: int, probe: bool, limits: Limits,
               control_dir: str) -> list[Check]:
    site = config.sites[index]
    if isinstance(site, RestSiteConfig):
        return check_rest_site(config, index, site, probe, limits)
    executor = check.site_executor(site, control_dir)
    rows: list[Check] = []
    try:
        rows += _login(config, index, site, executor)
        if not site_ok(rows):
            return [*rows, skipped("SLURM", "cannot run commands at the site", "slurm")]
        rows += _slurm(config, index, site, executor)
        rows.append(check.image_check(index, site, executor))
        if not probe:
            return [*rows, skipped("probe pilot", "--no-probe", "probe")]
        if not site_ok(rows):
            return [*rows, skipped("probe pilot", "the checks above failed", "probe")]
        prober = Probe(index, site, config, _backend(config, site, executor, probe=True),
                       CollectorAds(config.pool), limits)
        return rows + prober.run()
    except BackendError as exc:
        return [*rows, failed("site commands", str(exc), "see the message", "ssh")]
    finally:
        executor.close()


def site_check(config: Config, names: Sequence[str], as_json_out: bool, probe: bool,
               limits: Limits | None = None) -> int:
    """Check the named sites (all if none); 0 only if every check passed."""
    unknown = [n for n in names if n not in config.site_names]
    if unknown:
        print(f"provisioner: site check: no site {', '.join(map(repr, unknown))} in the "
              f"configuration (sites: {', '.join(config.site_names)})", file=sys.stderr)
        return 2
    chosen = [i for i, s in enumerate(config.sites) if not names or s.name in names]
    results: dict[str, tuple[list[Check], float]] = {}
    control_dir = check.private_dir()
    try:
        for i in chosen:
            t0 = time.monotonic()
            rows = check_site(config, i, probe, limits or Limits(), control_dir)
            results[config.sites[i].name] = (rows, time.monotonic() - t0)
            if not as_json_out:
                print(render(config.sites[i].name, rows, time.monotonic() - t0), flush=True)
    finally:
        shutil.rmtree(control_dir, ignore_errors=True)
    if as_json_out:
        print(as_json(results))
    return 0 if all(site_ok(rows) for rows, _ in results.values()) else 1


def _read_live(config: Config, index: int, control_dir: str) -> Live:
    """What SLURM says of site `index`, over its backend's way in."""
    site = config.sites[index]
    where = f"sites[{index}] ({site.name})"
    if isinstance(site, RestSiteConfig):
        client = rest_client(site, index)
        try:
            return read_live_rest(client, where)
        finally:
            client.close()
    executor = check.site_executor(site, control_dir)
    try:
        return read_live(executor, site.slurm_conf, where)
    finally:
        executor.close()


def live_differences(config: Config) -> int:
    """`check-config --live`: every field of every site block that differs from SLURM."""
    control_dir = check.private_dir()
    key_problem = check_key(config.pilot_tokens.signing_key)
    print(f"pilot_tokens.signing_key {config.pilot_tokens.signing_key}: "
          + (key_problem or "usable by this account only"))
    problems = 1 if key_problem else 0
    try:
        for i, site in enumerate(config.sites):
            try:
                live = _read_live(config, i, control_dir)
                lines = fit.differences(i, site, live.partitions, live.nodes)
            except (LiveError, BackendError) as exc:
                lines = [f"cannot read the live site: {exc}"]
            problems += len(lines)
            print(f"sites[{i}] ({site.name}): " + ("matches the live site" if not lines
                  else f"{len(lines)} difference(s)"))
            for line in lines:
                print(f"  {line}")
    finally:
        shutil.rmtree(control_dir, ignore_errors=True)
    return 1 if problems else 0


def site_discover(access: Access, partition: str | None, image: str, account: str | None,
                  name: str | None) -> int:
    from provisioner.config import LocalExecutorConfig
    from provisioner.sites import make_executor

    if access.rest_url:
        return _discover_rest(access, partition, image, account, name)
    where = f"{access.user}@{access.host}" if access.host else "this host"
    control_dir = check.private_dir()
    cfg: SshExecutorConfig | LocalExecutorConfig
    if access.host:
        cfg = SshExecutorConfig(type="ssh", host=access.host, user=access.user or "",
                                port=access.port, key_file=access.key_file,
                                known_hosts=access.known_hosts, control_dir=control_dir,
                                control_persist_s=0)
    else:
        cfg = LocalExecutorConfig(run_as=access.user)
    executor = make_executor(name or "discover", cfg)
    try:
        def read() -> Live:
            return dataclasses.replace(
                read_live(executor, access.slurm_conf, where),
                grants=read_grants(executor, access.slurm_conf, access.user))

        return _print_block(read, partition, access, image, account, name, where)
    finally:
        executor.close()
        shutil.rmtree(control_dir, ignore_errors=True)


def _discover_rest(access: Access, partition: str | None, image: str, account: str | None,
                   name: str | None) -> int:
    from provisioner.sites.rest_client import RestClient
    from provisioner.sites.rest_token import TokenFile

    assert access.rest_url and access.user and access.token_file
    token = TokenFile(site=name or "discover", path=access.token_file, what="--token-file")
    client = RestClient(site=name or "discover", url=access.rest_url, user=access.user,
                        token=token, where="--rest-url")
    where = f"{access.user} at {access.rest_url}"
    try:
        def read() -> Live:
            return dataclasses.replace(read_live_rest(client, where),
                                       grants=read_grants_rest(client, access.user))

        return _print_block(read, partition, access, image, account, name, where)
    finally:
        client.close()


def _print_block(read: Callable[[], Live], partition: str | None, access: Access,
                 image: str, account: str | None, name: str | None, where: str) -> int:
    """The site block from what `read` finds, printed; 1 with the error if it fails."""
    try:
        print(discover(read(), partition, access, image, account, name, where), end="")
        return 0
    except (LiveError, BackendError) as exc:
        print(f"provisioner: site discover: {exc}", file=sys.stderr)
        return 1
