"""The pilot's parameters and its own HTCondor configuration.

Parameters come from ``PILOT_*`` environment variables set by the batch script
(slurm_templates/) and from SLURM's own environment (job id, cores, memory, end
time); the configuration of this one pilot follows from them and its work directory.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

from provisioner.data.xcache import proxy_environment
from provisioner.pilot import testcache
from provisioner.pilot.containers import config_string
from provisioner.pilot.workfiles import JOB_WRAPPER, TRANSFER_PLUGIN
from provisioner.security.tokens import IDENTITY_USER, TOKEN_TEXT, claims


class PilotError(Exception):
    """The pilot cannot start; the message names the missing or bad setting."""


#: An allocation's name and an accounting group, as the configuration validates them
#: (provisioner.config.allocations: AllocationConfig.name, GROUP_PATTERN; a unit test
#: keeps them equal; not imported: the pilot carries no configuration models). Checked
#: again here because both land in this pilot's HTCondor configuration and its START.
ALLOCATION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
GROUP_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
#: What an allocated pilot adds to its START: only jobs whose accounting group is one
#: of its own. stringListMember compares whole items (strcmp) of PilotGroups split at
#: commas and spaces; a job with no AcctGroup compares "" and never matches; a group
#: that is no string makes the clause ERROR, which starts nothing.
GROUPS_START = 'stringListMember(TARGET.AcctGroup ?: "", MY.PilotGroups)'


@dataclass(frozen=True)
class PilotParams:
    site: str
    provisioner_id: str
    collector: str
    uid_domain: str
    image: str
    condor_config: Path
    job_id: str
    cpus: int
    memory_mb: int
    walltime_end: int
    shutdown_margin_s: int
    noclaim_shutdown_s: int
    start_delay_max_s: int
    scratch: Path
    log_dir: Path | None
    xcache: str | None
    xcache_exclude: tuple[str, ...] = ()
    bind: tuple[str, ...] = ()
    containers: bool = False
    container_test_image: str = ""
    #: How long a passed start-up test counts on its node (0: it always runs).
    container_test_cache_s: int = testcache.DEFAULT_TTL_S
    payload_image: str = ""
    #: This pilot's place among those submitted with it (provisioner.pilot.boot.start_delay).
    start_slot: int = 0
    start_slots: int = 0
    #: When SLURM started the job (SLURM_JOB_START_TIME), if SLURM says.
    slurm_start: float | None = None
    #: This pilot's own IDTOKEN (read from PILOT_TOKEN_FD by `read_token`).
    token: str = field(default="", repr=False)
    #: The allocation it is charged to ("": none, it takes any job) and the accounting
    #: groups whose jobs alone it starts (`allocation_of`).
    allocation: str = ""
    groups: tuple[str, ...] = ()

    @property
    def identity_user(self) -> str:
        """The user part of the token's identity (pilot-<site>-<serial>), "" if none."""
        if not self.token:
            return ""
        sub = str(claims(self.token).get("sub", ""))
        return sub.split("@", 1)[0]

    @property
    def name(self) -> str:
        """Daemon name of this pilot's master and startd (unique per site job):
        ``pilot-<site>-<job>@<identity>.<host>``; the collector accepts the ads of a
        pilot token only under the name of that token's identity."""
        host = socket.gethostname()
        if self.identity_user:
            host = f"{self.identity_user}.{host}"
        return f"pilot-{self.site}-{self.job_id}@{host}"


def read_token(env: dict[str, str]) -> str:
    """The pilot's token from the descriptor PILOT_TOKEN_FD (the batch script's
    here-document), read to its end and closed."""
    raw = _env(env, "PILOT_TOKEN_FD")
    if not raw.isdigit() or int(raw) < 3:
        raise PilotError(f"PILOT_TOKEN_FD={raw!r} is not a descriptor above 2")
    fd = int(raw)
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError as exc:
        raise PilotError(f"the pilot's token cannot be read from descriptor {fd}: "
                         f"{exc}") from None
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    token = b"".join(chunks).decode("ascii", "replace").strip()
    if not TOKEN_TEXT.match(token):
        raise PilotError(f"descriptor {fd} holds no pilot token")
    user = str(claims(token).get("sub", "")).split("@", 1)[0]
    if not IDENTITY_USER.match(user):
        raise PilotError(f"the pilot's token is not a pilot identity ({user!r})")
    return token


def _env(env: dict[str, str], key: str) -> str:
    value = env.get(key, "")
    if not value:
        raise PilotError(f"environment variable {key} is not set")
    return value


def _int_env(env: dict[str, str], key: str, default: int | None = None) -> int:
    raw = env.get(key)
    if raw in (None, ""):
        if default is None:
            raise PilotError(f"environment variable {key} is not set")
        return default
    try:
        return int(raw)
    except ValueError:
        raise PilotError(f"environment variable {key}={raw!r} is not an integer") from None


def allocation_of(env: dict[str, str]) -> tuple[str, tuple[str, ...]]:
    """The allocation (PILOT_ALLOCATION) and its groups (PILOT_GROUPS, comma-separated)
    from the batch script; ("", ()) for a pilot of no allocation. PilotError for a name
    or group outside the configuration's patterns, or one set without the other."""
    allocation = env.get("PILOT_ALLOCATION", "")
    raw = env.get("PILOT_GROUPS", "")
    if not allocation and not raw:
        return "", ()
    if not ALLOCATION_NAME.fullmatch(allocation):
        raise PilotError(f"PILOT_ALLOCATION={allocation!r} is not an allocation name")
    groups = tuple(raw.split(","))
    bad = [g for g in groups if not GROUP_NAME.fullmatch(g)]
    if bad or not raw:
        raise PilotError(f"PILOT_GROUPS={raw!r} is not a comma-separated list of "
                         f"accounting groups (bad: {bad or [raw]!r})")
    return allocation, groups


def params_from_env(env: dict[str, str], now: float) -> PilotParams:
    """Read the pilot's parameters from the batch script's and SLURM's environment."""
    cpus = _int_env(env, "SLURM_CPUS_ON_NODE", _int_env(env, "SLURM_CPUS_PER_TASK", 1))
    mem = _int_env(env, "SLURM_MEM_PER_NODE", 0)
    if mem <= 0:
        mem = cpus * _int_env(env, "SLURM_MEM_PER_CPU", 1024)
    walltime_end = _int_env(env, "SLURM_JOB_END_TIME", 0)
    if walltime_end <= 0:
        walltime_end = int(now) + _int_env(env, "PILOT_WALLTIME_S")
    log_dir = env.get("PILOT_LOG_DIR") or None
    allocation, groups = allocation_of(env)
    return PilotParams(
        site=_env(env, "PILOT_SITE"),
        provisioner_id=_env(env, "PILOT_PROVISIONER_ID"),
        collector=_env(env, "PILOT_COLLECTOR"),
        uid_domain=_env(env, "PILOT_UID_DOMAIN"),
        image=_env(env, "PILOT_IMAGE"),
        condor_config=Path(_env(env, "PILOT_CONDOR_CONFIG")),
        job_id=_env(env, "SLURM_JOB_ID"),
        cpus=cpus,
        memory_mb=mem,
        walltime_end=walltime_end,
        shutdown_margin_s=_int_env(env, "PILOT_SHUTDOWN_MARGIN_S", 120),
        noclaim_shutdown_s=_int_env(env, "PILOT_NOCLAIM_SHUTDOWN_S", 1200),
        start_delay_max_s=_int_env(env, "PILOT_START_DELAY_MAX_S", 0),
        scratch=Path(env.get("PILOT_SCRATCH") or env.get("TMPDIR") or "/tmp"),
        log_dir=Path(log_dir) if log_dir else None,
        xcache=env.get("PILOT_XCACHE") or None,
        xcache_exclude=tuple(d for d in env.get("PILOT_XCACHE_EXCLUDE", "").split(",") if d),
        bind=tuple(d for d in env.get("PILOT_BIND", "").split(",") if d),
        containers=env.get("PILOT_CONTAINERS", "0") == "1",
        container_test_image=env.get("PILOT_CONTAINER_TEST_IMAGE") or env.get("PILOT_IMAGE", ""),
        container_test_cache_s=_int_env(env, "PILOT_CONTAINER_TEST_CACHE_S",
                                        testcache.DEFAULT_TTL_S),
        payload_image=env.get("PILOT_PAYLOAD_IMAGE", ""),
        start_slot=_int_env(env, "PILOT_START_SLOT", 0),
        start_slots=_int_env(env, "PILOT_START_SLOTS", 0),
        slurm_start=float(_int_env(env, "SLURM_JOB_START_TIME", 0)) or None,
        allocation=allocation,
        groups=groups,
    )


def local_config(p: PilotParams, workdir: Path) -> str:
    """The HTCondor settings of this one pilot (appended after pilot.conf)."""
    host = p.collector.rsplit(":", 1)[0]
    lines = {
        "CONDOR_HOST": host,
        "COLLECTOR_HOST": p.collector,
        "UID_DOMAIN": p.uid_domain,
        "TRUST_DOMAIN": p.uid_domain,
        # Jobs never share a file system with the submit host: transfer files.
        "FILESYSTEM_DOMAIN": p.name,
        "MASTER_NAME": p.name,
        "STARTD_NAME": p.name,
        "LOCAL_DIR": str(workdir / "local"),
        "LOG": str(workdir / "local" / "log"),
        "SPOOL": str(workdir / "local" / "spool"),
        "EXECUTE": str(workdir / "local" / "execute"),
        "LOCK": str(workdir / "local" / "lock"),
        "RUN": str(workdir / "local" / "run"),
        "SEC_TOKEN_DIRECTORY": str(workdir / "tokens.d"),
        "SEC_PASSWORD_DIRECTORY": str(workdir / "passwords.d"),
        # FS authentication between the pilot's own processes happens here, not
        # in /tmp, so that a payload (hidden from this directory) cannot use it.
        "FS_LOCAL_DIR": str(workdir / "fsauth"),
        "USER_JOB_WRAPPER": str(workdir / JOB_WRAPPER),
        "NUM_CPUS": str(p.cpus),
        "MEMORY": str(p.memory_mb),
        "PILOT_SHUTDOWN_MARGIN": str(p.shutdown_margin_s),
        "PILOT_NOCLAIM_SHUTDOWN": str(p.noclaim_shutdown_s),
        "PilotSite": config_string(p.site),
        "PilotSlurmJobId": config_string(p.job_id),
        "PilotProvisionerId": config_string(p.provisioner_id),
        "PilotWalltimeEnd": str(p.walltime_end),
    }
    advertised = []
    if p.xcache:
        # Every job reads root:// URLs through the site's cache (the XRootD client
        # proxy plugin), and so does HTCondor's own transfer of root:// input files.
        lines["PilotXCache"] = config_string(p.xcache)
        advertised.append("PilotXCache")
        env = proxy_environment(p.xcache, p.xcache_exclude)
        lines["STARTER_JOB_ENVIRONMENT"] = config_string(
            " ".join(f"{k}={v}" for k, v in env.items()))
    if p.allocation:
        lines.update(allocation_config(p.allocation, p.groups))
        advertised += ["PilotAllocation", "PilotGroups"]
    if advertised:
        lines["STARTD_ATTRS"] = "$(STARTD_ATTRS) " + " ".join(advertised)
    # root:// input files: xrdcp, through the cache where the site has one.
    lines["FILETRANSFER_PLUGINS"] = f"$(FILETRANSFER_PLUGINS) {workdir / TRANSFER_PLUGIN}"
    return "".join(f"{k} = {v}\n" for k, v in lines.items())


def allocation_config(allocation: str, groups: tuple[str, ...]) -> dict[str, str]:
    """The settings of a pilot charged to `allocation`: its name and groups in its ad,
    and its START narrowed to jobs of those groups (GROUPS_START). The values are
    checked against the patterns again (ValueError): they are written as string
    literals, and a group holding a quote or a `$` would change the configuration."""
    if not ALLOCATION_NAME.fullmatch(allocation):
        raise ValueError(f"not an allocation name: {allocation!r}")
    if not groups or not all(GROUP_NAME.fullmatch(g) for g in groups):
        raise ValueError(f"not a list of accounting groups: {groups!r}")
    return {"PilotAllocation": config_string(allocation),
            "PilotGroups": config_string(",".join(groups)),
            "START": f"$(START) && {GROUPS_START}"}


def container_env(p: PilotParams) -> dict[str, str]:
    """Environment of the pilot's daemons in the container (besides CONDOR_CONFIG):
    the cache's proxy settings, which the root:// transfer plugin inherits."""
    return proxy_environment(p.xcache, p.xcache_exclude) if p.xcache else {}
