"""`policy:`: the controller's timers, the reserve, placement and the circuit breaker."""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from provisioner.config.base import _Model


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
    pilot's no-claim time gets none (``min_use_chance``); a reserve pilot that ended by
    its no-claim shutdown although the forecast made that unlikely is not replaced for
    its shape until a job of that shape arrives again, while a sparse stream's slot that
    idled out as expected leaves the likely slots (`provisioner.decide.reserve.
    NoClaimWatch`, `spent_slots`). Arrivals are counted from the queue and from the
    distinct arrival times seen, whichever is more (jobs that finished within the window
    have left the queue). Slots that would wait longer than a pilot waits unclaimed go
    into shared pilots (`provisioner.decide.sizing.pack_reserve`). A shape whose slot would idle
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
    #: A submission limit learnt from SLURM's refusal is tested again this long after
    #: the refusal, by one sbatch past it while work waits for the site (refused again:
    #: twice as long, up to an hour): a limit an admin raised or removed is noticed.
    limit_probe_s: float = Field(default=300, gt=0)
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
