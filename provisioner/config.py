"""Service configuration: pydantic models loaded once from YAML and passed explicitly.

`load_config(path)` is the only entry point that touches the file system. Every problem is
raised as `ConfigError` whose message names the file, the field path (``sites[1].pilot.walltime_s``)
and the offending value, plus the YAML line when it can be found.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

log = logging.getLogger(__name__)

SITE_NAME_PATTERN = r"^[a-z][a-z0-9_-]*$"
SCHEDD_NAME_PATTERN = r"^[A-Za-z0-9_.@-]+$"


class ConfigError(Exception):
    """The configuration file cannot be used; the message says where and why."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoolConfig(_Model):
    collector: str = Field(default="127.0.0.1:9618", pattern=r"^[A-Za-z0-9.-]+(:[0-9]+)?$")
    #: The schedds whose queues are the demand (their Name in the collector). Empty: every
    #: schedd the collector lists, each remembered once seen (`provisioner.pool.schedds`).
    schedds: tuple[Annotated[str, Field(pattern=SCHEDD_NAME_PATTERN)], ...] = ()
    #: Deprecated alias of a one-item `schedds` (kept working; a warning says so).
    schedd: str | None = Field(default=None, pattern=SCHEDD_NAME_PATTERN)
    #: A schedd seen in the collector that left it (shut down, or decommissioned) is
    #: unknown, not empty, for this long: no scale-down meanwhile. Then it is forgotten.
    #: The default is HTCondor's job lease (JobLeaseDuration, 40 min): its running jobs
    #: are gone by then anyway.
    schedd_gone_s: float = Field(default=2400.0, ge=0)
    token_file: str = "/etc/provisioner/tokens.d/provisioner"
    pilot_token_file: str = "/etc/provisioner/pilot.token"
    provisioner_id: str = Field(default="prov-1", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    #: The pool's UID_DOMAIN: identities are user@uid_domain (pilot@, provisioner@).
    uid_domain: str = Field(default="testbed", pattern=r"^[A-Za-z0-9][A-Za-z0-9.-]*$")
    #: The schedd's global event log, followed so that a submit wakes the loop at once
    #: (`provisioner.pool.submit_events`); the quick check stays the fallback. "auto": EVENT_LOG
    #: of this host's HTCondor configuration if set and its directory is here (the service
    #: runs beside the schedd), else off; "off"; or the log's absolute path.
    event_log: str = "auto"

    @model_validator(mode="after")
    def _schedd_alias(self) -> PoolConfig:
        """`schedd: X` reads as `schedds: [X]`; both set is ambiguous."""
        if self.schedd is None:
            return self
        if self.schedds:
            raise PydanticCustomError(
                "schedds", "set pool.schedds only (pool.schedd is its deprecated one-item "
                "form; got both)", {})
        log.warning("pool.schedd is deprecated: write pool.schedds: [%s]", self.schedd)
        object.__setattr__(self, "schedds", (self.schedd,))
        return self

    @field_validator("event_log")
    @classmethod
    def _event_log_setting(cls, value: str) -> str:
        if value in ("auto", "off") or re.fullmatch(r"/[A-Za-z0-9_./+@%=,-]*", value):
            return value
        raise PydanticCustomError(
            "event_log", "event_log must be auto, off or an absolute path (got {value!r})",
            {"value": value})


class ReserveConfig(_Model):
    """Predictive headroom: free job slots kept for jobs that are about to arrive.

    A job arriving while every pilot is busy waits for a new pilot: cycle delay, SLURM
    queue wait and boot (the *lead time*: ``lead_s`` until the controller has learnt the
    quickest site's, then that one). The reserve is a base stock over one lead time,
    ``min(max_jobs, ceil(growth + service))`` free job slots, where ``a`` and ``d`` are
    the matchable jobs expected to arrive and to leave the queue during one lead time
    (counted over the arrival window, scaled to one lead time; `Snapshot.recent_arrivals`
    and `CycleMemory.recent_departures`; ``d`` is counted at most up to ``a``, so a
    shrinking queue keeps the steady reserve; unknown: ``d = a``). ``growth`` is the
    expected growth ``a - d`` (a campaign ramping up) less one standard deviation of its
    estimate, never negative. ``service`` meets two service levels with ``eps`` the
    normal tail beyond ``factor`` standard deviations: the slots run out within a lead
    time with probability about ``eps`` (``factor * sqrt(a + d)``), and at most a share
    ``eps`` of the arriving jobs find none (exact Poisson sums: a sparse stream, where the
    normal approximation keeps too few; `provisioner.decide.reserve.reserve_size`).

    A reserve must pay for itself at every scale: jobs that arrived at fewer than
    ``min_arrival_times`` distinct times within ``evidence_s`` are not a rate (a batch
    submitted at once makes no reserve); sparse arrivals widen the window to
    ``window_gaps`` of their gaps; once nothing arrived for ``quiet_gaps`` gaps the
    reserve decays by e every lead time; a size the arrivals no longer ask for is held
    one lead time (noise in the estimate does not release pilots the next jobs need).
    A shape whose jobs are too rare to be likely to claim a reserve slot within the
    pilot's no-claim time gets none (``min_use_chance``), and a reserve pilot that ended
    by its no-claim shutdown is not replaced for its shape until a job of that shape
    arrives again (`provisioner.decide.reserve.NoClaimWatch`). A shape whose slot would idle
    longer than ``max_idle_leads`` lead times per use shares the room kept for quicker
    shapes instead of keeping its own (unless no such shape is kept), and a shape keeps
    no more slots than each pay that price (its k-th slot waits for its k-th job).
    Slots are split over the recent arrivals by core count in proportion to the square
    root of their numbers (a rare shape's arrivals vary relatively more, so it gets more
    than its count); a slot takes the largest memory seen for its core count. They are
    packed after all real demand: into free existing capacity first (which is then kept,
    not released), then into new pilots within what the caps leave.

    Cost: the reserve is idle allocation, about ``factor * sqrt(2 * a)`` cores at all times
    while jobs arrive at a steady rate (a few slots for a sparse stream). It buys short
    waits: the bench's frontier table (`make bench`) shows efficiency and wait p95 for
    several factors. ``enabled: false`` or ``factor: 0`` turns it off.
    """

    enabled: bool = True
    #: Window over which the service counts arrivals (jobs with QDate >= now - window_s).
    window_s: float = Field(default=900, gt=0)
    #: Expected time from a submission decision to a pilot taking jobs: cycle delay +
    #: SLURM queue wait + pilot boot. Used until a site's queue wait has been learnt;
    #: then the quickest site's learnt lead (`provisioner.decide.reserve.reserve_lead`) is.
    lead_s: float = Field(default=240, ge=0)
    #: Safety factor in standard deviations of net demand over one lead time (2.5: the
    #: slots run out, or a job finds none, with probability 0.6 %).
    factor: float = Field(default=2.5, ge=0)
    #: Upper bound on reserved job slots (over all sites).
    max_jobs: int = Field(default=64, ge=0)
    #: Jobs that arrived at fewer distinct times (cycles that saw a newer job) than this
    #: within ``evidence_s`` are not a rate (a handful submitted at once): no reserve.
    min_arrival_times: int = Field(default=3, ge=1)
    evidence_s: float = Field(default=7200, gt=0)
    #: Sparse arrivals: the window grows to span this many mean gaps between arrival
    #: times (at most ``evidence_s``), so a job every ten minutes is still a rate. More
    #: than ``quiet_gaps``, so that a quiet spell decays the reserve before it empties
    #: the window.
    window_gaps: float = Field(default=8.0, gt=0)
    #: Arrivals that stopped: once no job has arrived for ``quiet_gaps`` mean gaps between
    #: arrivals (window / arrivals), the reserve decays by e every lead time. A Poisson
    #: stream leaves a gap that long with probability exp(-quiet_gaps) (5: under 1 %).
    quiet_gaps: float = Field(default=5.0, gt=0)
    #: A shape gets reserve slots only if the next job of that shape is this likely to
    #: arrive within the pilot's no-claim time (`runtime.noclaim_shutdown_s`: a reserve
    #: pilot nobody claims ends then): ``1 - exp(-rate * noclaim) >= min_use_chance``.
    #: Rarer shapes wait for a pilot of their own; 0 = every shape.
    min_use_chance: float = Field(default=0.5, ge=0, lt=1)
    #: A reserve slot idles until its job comes (``1 / rate`` of its shape) and saves that
    #: job about one lead time of waiting (the reserve's lead: a new pilot's cycle, queue
    #: wait and boot). A shape gets slots of its own only if its idle time per use is at
    #: most this many lead times (``rate * lead * max_idle_leads >= 1``): its cores idle
    #: at most that many times as long as its jobs would otherwise wait. A rarer shape's
    #: jobs share the room kept for the quicker shapes (same GPUs, a common site; the
    #: reserve replaces what they take); with no such shape (a trickle of one kind of
    #: job) it keeps its own slots. A shape kept for this price holds only the slots that
    #: each pay it: its k-th slot idles until the shape's k-th job at the earliest, or
    #: until the pilot's no-claim shutdown, and is kept only while its expected idle time
    #: is at most this many lead times per expected use (`provisioner.decide.
    #: reserve.slots_worth`); a shape alone keeps what the size gives it. 0 = no such limit,
    #: only ``min_use_chance``. At 3 (bench, 3 seeds x 1 day): mixed-rare's 4- and 8-core
    #: slots go (efficiency 87.0 -> 90.0 %, p95 29 -> 37 s); per slot, mixed's slots
    #: that do not pay go (88.8 -> 89.7 %, p95 29 -> 30 s).
    max_idle_leads: float = Field(default=3.0, ge=0)


class PlacementConfig(_Model):
    """Where new pilots go: the site expected to give a usable slot soonest.

    Per site the controller learns the SLURM queue wait (submit -> start, from squeue) and
    the boot time (start -> startd in the pool) as moving averages; a site's expected
    lead is their sum, or the age of its oldest still-pending pilot if longer, divided by
    its weight (an admin's preference that scales the lead, not an order). Sites whose
    leads lie within ``tie_share`` of the best share a row's demand in proportion to the
    pilots they can still take. A site without history is assumed as quick as the
    quickest known one (at most ``default_wait_s``), so it is tried and learnt.
    """

    default_wait_s: float = Field(default=120, ge=0)
    default_boot_s: float = Field(default=90, ge=0)
    #: Weight of a new observation in the moving averages.
    smoothing: float = Field(default=0.3, gt=0, le=1)
    tie_share: float = Field(default=0.25, ge=0)
    #: A pending pilot counts as capacity while it is expected to be usable no later than
    #: a new pilot at the quickest site that can take one, plus this margin; after that
    #: its jobs are placed anew (once: the new pilots are capacity themselves) and it is
    #: kept pending while demand it could run is queued.
    hedge_margin_s: float = Field(default=300, ge=0)
    #: A pending pilot no demand needs is cancelled after this many such cycles in a row.
    pending_cancel_cycles: int = Field(default=3, ge=1)


class BreakerConfig(_Model):
    """Circuit breaker of a black-hole site (provisioner.decide.breaker): after `threshold`
    pilots in a row end without joining the pool, no new pilots there for `base_s`,
    then one test pilot; each failed test doubles the pause, up to `max_s`."""

    threshold: int = Field(default=3, ge=1)
    base_s: float = Field(default=600, gt=0)
    max_s: float = Field(default=4 * 3600, gt=0)


class PolicyConfig(_Model):
    interval_s: float = Field(default=300, gt=0)
    #: The cheap check between cycles; at most interval_s.
    #: An idle pilot is seen (and released) within one quick check of its last job.
    quick_check_s: float = Field(default=10, gt=0)
    #: No two cycles closer than this, less a tenth of a quick check (timer slack,
    #: `provisioner.decide.cadence.SLACK`), except when the interval has passed.
    min_cycle_gap_s: float = Field(default=5, ge=0)
    #: While pilots are on their way into the pool and jobs wait, the pilots' ads are
    #: read this often (one collector query), and a pilot seen idle that was not before
    #: asks the schedd for a negotiation at once (condor_reschedule) rather than waiting
    #: for the negotiator's next cycle (NEGOTIATOR_INTERVAL, 60 s by default). 0: off.
    #: Every second by default: a joined pilot waits half a second on average to be
    #: seen (one query of the pilots' ads a second, only while pilots join).
    join_check_s: float = Field(default=1, ge=0)
    #: Cycles an idle pilot without demand or reserve is seen idle before it is released
    #: (1: at the first; 2: flagged, then released at the next quick check if still idle).
    #: Jobs expected soon are the reserve's business, not this hysteresis'.
    idle_release_cycles: int = Field(default=1, ge=1)
    min_pilot_lifetime_s: float = Field(default=0, ge=0)
    #: A busy pilot whose free room nothing needs (the cycle places every idle job on
    #: pilots already in the pool, submits none and expects no arrival: no reserve) is
    #: asked to leave as soon as its running jobs end; it still takes jobs until then. The order is
    #: withdrawn when demand returns. False: busy pilots are released only once observed
    #: idle (up to one quick check later).
    retire_when_done: bool = True
    max_submit_per_cycle: int = Field(default=20, ge=0)
    #: A pilot running at its site whose startd has not joined the pool after this
    #: long is cancelled (broken image, authentication failure, unreachable collector).
    start_timeout_s: float = Field(default=900, gt=0)
    #: Evaluate each idle job shape's Requirements (and the pilot's START) against a
    #: prototype of every site's pilot ad (`provisioner.pool.prototype`, `sites[].pilot_ad`):
    #: a shape no site's pilot would match causes no pilot. False: any site that has the
    #: resources is taken to match, as if jobs stated no Requirements.
    match_requirements: bool = True
    #: A shape whose jobs stay idle this long while the same fitting pilot stays unclaimed
    #: (the negotiator never matches them) is stuck: reported once and not provisioned
    #: for until its shape changes, fewer of its jobs are idle or stuck_retry_s has
    #: passed. 0: never.
    stuck_after_s: float = Field(default=600, ge=0)
    #: A stuck shape is provisioned for again this long after it was found stuck (one
    #: pilot is tried; still stuck, it is reported again): a cause that goes away (a
    #: negotiator down for longer than stuck_after_s) never strands it for good.
    stuck_retry_s: float = Field(default=3600, gt=0)
    reserve: ReserveConfig = ReserveConfig()
    placement: PlacementConfig = PlacementConfig()
    breaker: BreakerConfig = BreakerConfig()

    @property
    def tick_s(self) -> float:
        """The service's timer period: the join check's, or the quick check's when the
        join check is off (each tick sees which check is due)."""
        return self.join_check_s or self.quick_check_s

    @model_validator(mode="after")
    def _join_check_within_quick_check(self) -> PolicyConfig:
        if self.join_check_s > self.quick_check_s:
            raise PydanticCustomError(
                "join_check",
                "join_check_s {value} exceeds quick_check_s {quick}: joining pilots would "
                "be looked for less often than by the quick check itself",
                {"field": "join_check_s", "value": self.join_check_s,
                 "quick": self.quick_check_s},
            )
        return self

    @model_validator(mode="after")
    def _quick_check_within_interval(self) -> PolicyConfig:
        if self.quick_check_s > self.interval_s:
            raise PydanticCustomError(
                "quick_check",
                "quick_check_s {value} exceeds interval_s {interval}: the interval would "
                "silently become {value}",
                {"field": "quick_check_s", "value": self.quick_check_s,
                 "interval": self.interval_s},
            )
        return self


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


_PATH = r"^/[A-Za-z0-9_./+@%=,-]*$"


#: One option of condor_gpu_discovery that `runtime.gpu_discovery_extra` may pass (it
#: lands in the startd's argv, never in a shell).
GPU_DISCOVERY_OPTION = re.compile(
    r"^-(simulate:[0-6],[0-9]{1,2}(,[0-6],[0-9]{1,2})*|extra|dynamic|nested|not-nested|"
    r"by-index|short-uuid|uuid|cuda|opencl|mixed)$")
#: A SLURM GPU type (gres.conf `Type=`), as it goes into ``--gres=gpu:<type>:N``.
GPU_TYPE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class PilotRuntimeConfig(_Model):
    """Where things are on the site's worker nodes, and the pilot's own timers."""

    python: str = Field(default="/opt/venv/bin/python", pattern=_PATH)
    condor_config: str = Field(default="/etc/provisioner/pilot.conf", pattern=_PATH)
    token_file: str = Field(default="/etc/provisioner/pilot.token", pattern=_PATH)
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


_HOST = r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$"
ATTRIBUTE_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"


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
_ACCOUNT = r"^[a-z_][a-z0-9_-]*$"


class LocalExecutorConfig(_Model):
    """Commands run on the provisioner's own host (a login node of the site)."""

    type: Literal["local"] = "local"
    #: Account that runs them when the service runs as root (None = the service's own).
    run_as: str | None = Field(default=None, pattern=_ACCOUNT)
    command_timeout_s: float = Field(default=60, gt=0)


class SshExecutorConfig(_Model):
    """Commands run on the site's login node over SSH (key only, strict host keys)."""

    type: Literal["ssh"]
    host: str = Field(pattern=_HOST)
    port: int = Field(default=22, ge=1, le=65535)
    #: The site account the pilots are submitted as.
    user: str = Field(pattern=_ACCOUNT)
    #: Private key (readable by the service's account only).
    key_file: str = Field(pattern=_PATH)
    #: The login node's host key(s), checked strictly.
    known_hosts: str = Field(pattern=_PATH)
    connect_timeout_s: float = Field(default=10, gt=0)
    command_timeout_s: float = Field(default=60, gt=0)
    #: How long the multiplexed connection outlives its last command.
    control_persist_s: int = Field(default=600, ge=0)
    #: Private directory (created 0700) for the connection sockets; keep it short.
    control_dir: str = Field(default="/run/provisioner", pattern=_PATH, max_length=60)


ExecutorConfig = Annotated[LocalExecutorConfig | SshExecutorConfig, Field(discriminator="type")]


class SiteBase(_Model):
    """What every site has, whatever its backend: its pilots and the provisioner's policy."""

    name: str = Field(pattern=SITE_NAME_PATTERN)
    max_walltime_s: int = Field(gt=0)
    template: str = Field(pattern=r"^[A-Za-z0-9_.-]+\.j2$")
    image: str = Field(pattern=_PATH)
    #: The site's XRootD caching proxy: jobs on its pilots read every root:// URL
    #: through it (the XRootD client proxy plugin) and find it in $XCACHE.
    xcache: str | None = Field(default=None, pattern=r"^root://[A-Za-z0-9_.:-]+$")
    #: Domains (or host names) jobs reach directly, not through the cache: the
    #: site's own storage, say. The cache itself and localhost always are.
    xcache_exclude: list[Annotated[str, Field(pattern=_HOST)]] = Field(default_factory=list)
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
    slurm_conf: str | None = Field(default=None, pattern=_PATH)
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


class MetricsConfig(_Model):
    """The Prometheus endpoint `provisioner run` serves (None: no endpoint)."""

    #: "HOST:PORT" to listen on, e.g. "127.0.0.1:9100" (IPv6 as "[::1]:9100").
    listen: str | None = Field(default=None,
                               pattern=r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]*):[0-9]{1,5}$")

    @field_validator("listen")
    @classmethod
    def _port_in_range(cls, value: str | None) -> str | None:
        if value is not None and not 1 <= int(value.rsplit(":", 1)[1]) <= 65535:
            raise PydanticCustomError("port", "port must be 1..65535 (got {value!r})",
                                      {"value": value})
        return value

    @property
    def address(self) -> tuple[str, int] | None:
        """(host, port) to bind; host "" is every address."""
        if self.listen is None:
            return None
        host, port = self.listen.rsplit(":", 1)
        return host.strip("[]"), int(port)


class Config(_Model):
    pool: PoolConfig = PoolConfig()
    metrics: MetricsConfig = MetricsConfig()
    policy: PolicyConfig = PolicyConfig()
    #: Directory of the pilot batch-script templates; None = slurm_templates/ of this project.
    templates_dir: str | None = Field(default=None, pattern=_PATH)
    #: SQLite journal (audit trail and cache, never the only copy); "" = none.
    journal: str = Field(default="", pattern=r"^(|/[A-Za-z0-9_./+@%=,-]*)$")
    #: One service per provisioner id holds this lock ("" = next to the journal).
    lock_file: str = Field(default="", pattern=r"^(|/[A-Za-z0-9_./+@%=,-]*)$")
    sites: tuple[AnySite, ...] = Field(min_length=1)

    @field_validator("sites", mode="before")
    @classmethod
    def _default_backend(cls, value: Any) -> Any:
        """`backend` may be omitted: it defaults to slurm-cli."""
        if isinstance(value, list | tuple):
            return [dict(s, backend="slurm-cli") if isinstance(s, dict) and "backend" not in s
                    else s for s in value]
        return value

    @model_validator(mode="after")
    def _unique_site_names(self) -> Config:
        seen: dict[str, int] = {}
        for i, site in enumerate(self.sites):
            if site.name in seen:
                raise PydanticCustomError(
                    "duplicate",
                    "duplicate site name '{value}' (also sites[{first}].name)",
                    {"field": f"sites[{i}].name", "value": site.name, "first": seen[site.name]},
                )
            seen[site.name] = i
        return self

    @model_validator(mode="after")
    def _stuck_before_noclaim_shutdown(self) -> Config:
        """A stuck shape is one idle beside the *same* unclaimed pilot for stuck_after_s,
        seen at a cycle: a pilot whose startd ends itself unclaimed sooner is replaced by
        a new one before that, and the shape is never found stuck (a pilot after pilot,
        for ever)."""
        after = self.policy.stuck_after_s
        if after <= 0:
            return self
        for i, site in enumerate(self.sites):
            if site.runtime.noclaim_shutdown_s < after + self.policy.interval_s:
                raise PydanticCustomError(
                    "stuck_after",
                    "noclaim_shutdown_s {value} is not above policy.stuck_after_s {after} "
                    "plus policy.interval_s {interval}: an unclaimed pilot would end before "
                    "jobs no pilot matches are found stuck, and a new one would be started "
                    "for them, for ever (lower stuck_after_s or raise noclaim_shutdown_s)",
                    {"field": f"sites[{i}].runtime.noclaim_shutdown_s",
                     "value": site.runtime.noclaim_shutdown_s, "after": after,
                     "interval": self.policy.interval_s},
                )
        return self

    def site(self, name: str) -> SiteConfig:
        """The site called `name`; KeyError if it is not configured."""
        for site in self.sites:
            if site.name == name:
                return site
        raise KeyError(name)

    @property
    def site_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.sites)


def _loc_path(loc: tuple[int | str, ...], sub: str = "") -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    if sub:
        out += sub if sub.startswith("[") or not out else f".{sub}"
    return out or "(top level)"


def _sub_loc(sub: str) -> list[int | str]:
    parts: list[int | str] = []
    for token in sub.replace("[", ".[").split("."):
        if not token:
            continue
        if token.startswith("[") and token.endswith("]"):
            parts.append(int(token[1:-1]))
        else:
            parts.append(token)
    return parts


def _node_line(root: yaml.Node | None, loc: list[int | str]) -> int | None:
    """1-based line of the YAML node at `loc` (or its deepest existing parent)."""
    node = root
    line = None if node is None else node.start_mark.line + 1
    for part in loc:
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == part:
                    node, line = value, value.start_mark.line + 1
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                return line
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


#: Discriminated unions put the chosen member's tag into an error's location.
_UNION_TAGS = frozenset({*KNOWN_BACKENDS, "local", "ssh"})


def _without_tags(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """('sites', 0, 'slurm-cli', 'executor', 'ssh', 'port') -> ('sites', 0, 'executor', 'port')."""
    out: list[int | str] = []
    for part in loc:
        if isinstance(part, str) and part in _UNION_TAGS and out and (
                isinstance(out[-1], int) or out[-1] == "executor"):
            continue
        out.append(part)
    return tuple(out)


def _iter_errors(
    exc: ValidationError, source: str, root: yaml.Node | None
) -> Iterator[str]:
    for err in exc.errors():
        loc = _without_tags(tuple(err["loc"]))
        ctx: dict[str, Any] = dict(err.get("ctx") or {})
        sub = str(ctx.get("field", ""))
        path = _loc_path(loc, sub)
        full_loc = [*loc, *_sub_loc(sub)]
        line = _node_line(root, full_loc)
        where = f"{source}:{line}" if line is not None else source
        if err["type"] == "missing":
            yield f"{where}: {path}: field required"
            continue
        if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
            # A discriminated union: sites[].backend or an executor's type.
            key = str(ctx.get("discriminator", "")).strip("'") or "type"
            path = _loc_path(loc, key)
            line = _node_line(root, [*loc, key])
            where = f"{source}:{line}" if line is not None else source
            known = ctx.get("expected_tags", "")
            if err["type"] == "union_tag_not_found":
                yield f"{where}: {path}: field required (one of {known})"
            else:
                kind = "backend" if key == "backend" else f"{key}"
                yield f"{where}: {path}: unknown {kind} {ctx.get('tag')!r}; known: {known}"
            continue
        value = ctx["value"] if "value" in ctx else err.get("input")
        yield f"{where}: {path}: {err['msg']} (got {value!r})"


def parse_config(text: str, source: str = "<string>") -> Config:
    """Validate YAML text; `source` names it in error messages."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}{line}: malformed YAML: {problem}") from exc
    if data is None:
        raise ConfigError(f"{source}: empty configuration (need at least 'sites')")
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping, got {type(data).__name__}")
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        messages = list(_iter_errors(exc, source, root))
        raise ConfigError("\n".join(messages)) from exc


def field_location(path: str | os.PathLike[str], field: str) -> str:
    """"FILE:LINE" of a field (e.g. ``sites[1].template``) in a YAML file, or "FILE"."""
    try:
        root = yaml.compose(Path(path).read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (OSError, yaml.YAMLError):
        return str(path)
    line = _node_line(root, _sub_loc(field))
    return f"{path}:{line}" if line is not None else str(path)


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate the YAML file at `path`; ConfigError on any problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read configuration: {exc.strerror or exc}") from exc
    return parse_config(text, str(p))
