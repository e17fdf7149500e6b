"""The reconcile loop: observe (I/O, batched) -> plan (pure) -> act (I/O, idempotent).

Observe reads one schedd query, one collector query and one `squeue` per site
and builds an immutable Snapshot. The controller hands it, with its `CycleMemory` of
earlier cycles, to `provisioner.decide.plan.plan()`, which decides. Act applies
the decisions: submits, releases (re-checked against a fresh collector read
right before), cancels of pending pilots. A site or pool that cannot be read is
unknown, never empty: plan() then takes no action there.

When to observe is the tick sequence of `provisioner.service.ticker`, which the simulator
runs too: the `Provisioner` is its `Senses` (the quick check, the join check, a
negotiation asked for, the full observation).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from provisioner.config import Config
from provisioner.decide.backoff import SiteBackoff
from provisioner.decide.cadence import Probe, gap_holds
from provisioner.decide.controller import Controller, QueueSize
from provisioner.errors import BackendError, Transient
from provisioner.model import (
    Demand,
    FailingStarts,
    Plan,
    Release,
    SiteView,
    Snapshot,
    Submit,
)
from provisioner.pilot.script import render_pilot_script
from provisioner.pool.classads import PilotAd
from provisioner.pool.condor import Pool, PoolUnreachable, QueueView
from provisioner.pool.pilot_view import (
    SLURM_SIGNAL_SLOP_S,
    Disagreements,
    ad_busy,
    ad_only_pilots,
    idle_ad_keys,
    merge_pilots,
    pilot_state,
    runs_jobs,
)
from provisioner.pool.prototype import SiteMatcher
from provisioner.pool.submit_events import Wakeup
from provisioner.security.tokens import PilotToken, TokenError
from provisioner.service.actions import HANDLERS, Fresh, cancel_lingering
from provisioner.service.books import (
    Books,
    account_names,
    allocation_rows,
    stopped_of,
    stopped_record,
)
from provisioner.service.cycle import CycleResult, Observation
from provisioner.service.cycle_text import action_target, breakers_of, describe, summary_line
from provisioner.service.journal import Journal
from provisioner.service.journal_health import WAITING, JournalHealth
from provisioner.service.ledger import Ledger
from provisioner.service.metrics import Metrics, MetricsError, circuit_codes, limit_codes
from provisioner.service.pilot_tokens import PilotTokens
from provisioner.service.publish import Publisher
from provisioner.service.submitter import refusal_kind, submit_all
from provisioner.service.ticker import decide, tick
from provisioner.sites import make_backend
from provisioner.sites.base import PilotRequest, SiteBackend, SiteJob

log = logging.getLogger(__name__)

__all__ = ["CycleResult", "Observation", "Provisioner", "action_target", "ad_busy",
           "breakers_of", "describe", "idle_ad_keys", "merge_pilots", "pilot_state",
           "runs_jobs", "summary_line"]


def _list_pilots(backend: SiteBackend) -> list[SiteJob]:
    """A site's pilot jobs (run in a reader thread: one site's backend at a time)."""
    return list(backend.list_pilots())

class Provisioner:
    """Holds the backends, the pool reader and the hysteresis state between cycles."""

    def __init__(self, config: Config, pool: Pool | None = None,
                 backends: Mapping[str, SiteBackend] | None = None,
                 journal: Journal | None = None,
                 clock: Callable[[], float] = time.time,
                 fault_file: Path | None = None) -> None:
        self.config = config
        self.pool = pool or Pool(config.pool, groups=config.groups_in_use)
        self.backends = dict(backends) if backends is not None else {
            s.name: make_backend(s, config.pool) for s in config.sites}
        self.clock = clock
        self.metrics = Metrics()  # served only by start_metrics() (`provisioner run`)
        # the journal's faults (`fault_file`: where `provisioner status` reads them)
        self.journal_health = JournalHealth(config.journal, fault_file,
                                            self.metrics.gauge("journal_writable"))
        self.journal = journal or self._open_journal()
        self.controller = Controller(config)
        self.controller.load(self.journal.get("controller"))  # learnt site estimates
        self.matcher = SiteMatcher(config)  # demand's Requirements vs each site's pilot
        self.last_jobs: dict[str, list[SiteJob]] = {}
        self.disagreements = Disagreements()  # SLURM vs collector, each logged once
        # A site that keeps failing is asked again after a growing delay.
        self.backoff = SiteBackoff(base_s=min(config.policy.interval_s, 60.0), max_s=600.0)
        self.ledger = Ledger(self.journal, self.metrics, self.pool, self.backends,
                             account_names(config))
        self.books = Books(config, self.backends)  # what each allocation spent
        self.wakeup = Wakeup()  # an early quick check, asked for by the event log follower
        # why each shape waits, advertised for `provisioner why` (not by a fake pool)
        self.publisher = Publisher(config, getattr(self.pool, "htcondor", None), self.metrics)
        self.tokens = PilotTokens(config)  # each pilot's own token (provisioner.security)

    def _open_journal(self) -> Journal:
        """The configured journal, or, if it cannot be opened (a corrupt file, no
        permission), one in memory until it can (`_record_cycle` tries again)."""
        try:
            return Journal(self.config.journal)
        except (sqlite3.Error, OSError) as exc:
            self.journal_health.failed(exc, self.clock())
            self.journal_health.unopened = True
            return Journal("")

    def start_metrics(self) -> bool:
        """Serve the Prometheus endpoint if configured. A failure (address in use) is
        logged and the service provisions on without metrics; returns whether it serves."""
        try:
            self.metrics.serve(self.config.metrics)
        except MetricsError as exc:
            log.error("%s; provisioning goes on without metrics", exc)
            return False
        if self.config.metrics.listen:
            log.info("metrics on http://%s/metrics", self.config.metrics.listen)
        return self.config.metrics.listen is not None

    # The decision state lives in the controller; these read it.
    @property
    def flagged(self) -> dict[str, float]:
        return self.controller.memory.flagged

    @property
    def released(self) -> Mapping[str, object]:
        return self.controller.releases

    @property
    def cycles(self) -> int:
        return self.controller.cycles

    # --- observe ---------------------------------------------------------
    def observe(self, now: float | None = None, since: float | None = None) -> Observation:
        """Read the pool and every site at `now` (default: the clock) into a Snapshot,
        with the jobs submitted since `since` as the recent arrivals (None: none read).
        Only what is seen now: the controller's memory goes beside it."""
        now = self.clock() if now is None else now
        due = [site.name for site in self.config.sites if self.backoff.due(site.name, now)]
        charged = [s.name for s in self.config.sites if s.allocations]
        with ThreadPoolExecutor(max_workers=max(1, len(due) + len(charged)),
                                thread_name_prefix="site-read") as reader:
            # Each site's squeue (a command over SSH) while the pool is read here.
            reads = {name: reader.submit(_list_pilots, self.backends[name]) for name in due}
            self.books.start(now, reader, reads)  # SLURM's charge, at most once a minute
            read = self._read_pool(since)
            return self._observed(now, read, reads)

    def _observed(self, now: float, read: tuple[QueueView, dict[str, PilotAd]] | None,
                  reads: Mapping[str, Future[list[SiteJob]]]) -> Observation:
        """The observation from the pool's `read` and the sites' `reads` (a site not
        in them is backed off)."""
        demand: tuple[Demand, ...] = ()
        ads: dict[str, PilotAd] = {}
        running_on: frozenset[str] = frozenset()
        arrivals: tuple[Demand, ...] = ()
        failing: tuple[FailingStarts, ...] = ()
        size: QueueSize | None = None
        newest: float | None = None
        lacking: tuple[str, ...] = ()
        pool_known = read is not None
        if read is not None:
            queue, ads = read
            demand, running_on = self.matcher.annotate(queue.demand), queue.running_on
            arrivals = self.matcher.annotate(queue.recent_arrivals)
            failing, newest = queue.failing, queue.newest
            lacking = tuple(name for name, _ in queue.unknown)
            # a queue read in part says nothing of the queue's growth
            size = QueueSize(queue.total, queue.older) if queue.whole else None
        views, pilots, jobs = [], [], {}
        for site in self.config.sites:
            error = ""
            # a pilot's allocation, where SLURM does not name its account, from its ad
            accounts = {a.name: a.account for a in site.allocations}
            if site.name not in reads:
                error = (f"backed off after {self.backoff.failures[site.name]} failed reads; "
                         f"next try in {self.backoff.retry_at[site.name] - now:.0f} s")
            else:
                try:
                    site_jobs = reads[site.name].result()
                except BackendError as exc:
                    delay = self.backoff.failed(site.name, now)
                    self.metrics.count("site_read_errors", site.name)
                    error = str(exc)
                    log.error("site %s unknown this cycle (failed read %d, next try in %.0f s): "
                              "%s", site.name, self.backoff.failures[site.name], delay, exc)
            if error:
                views.append(SiteView(site.name, known=False, error=error))
                # Counted as last seen (pending and starting pilots included), so
                # their demand is not provisioned again elsewhere; no action is
                # taken at an unknown site.
                last = self.last_jobs.get(site.name)
                if last is not None:
                    pilots.extend(merge_pilots(site.name, last, ads, running_on, now,
                                               self._margin(site.name), accounts))
                else:
                    pilots.extend(ad_only_pilots(site.name, ads, now, running_on, accounts))
                continue
            if self.backoff.succeeded(site.name):
                log.warning("site %s readable again", site.name)
            jobs[site.name] = site_jobs
            self.last_jobs[site.name] = site_jobs
            views.append(SiteView(site.name, known=True))
            pilots.extend(merge_pilots(site.name, site_jobs, ads, running_on, now,
                                       self._margin(site.name), accounts))
        snapshot = Snapshot(
            demand=demand, pilots=tuple(pilots), sites=tuple(views), pool_known=pool_known,
            schedds_unknown=lacking, recent_arrivals=arrivals, last_arrival_at=newest,
            failing=failing, books=self.books.observe(now, self.journal, jobs,
                                                      not self.journal_health.unopened))
        if pool_known:
            for line in self.disagreements.report(snapshot.pilots, ads, jobs, now, self._margin,
                                                  running_on):
                log.warning("%s", line)
        return Observation(snapshot, ads, jobs, running_on, size)

    def _read_pool(self, since: float | None) -> tuple[QueueView, dict[str, PilotAd]] | None:
        """Every schedd (arrivals since `since`) and the pilot ads; None: the pool is
        unknown. A schedd not read is logged, and named in the view."""
        try:
            queue = self.pool.queue(since)
            ads = self.pool.pilot_ads()
        except PoolUnreachable as exc:
            log.error("pool unknown this cycle (no scale-down, no submissions): %s", exc)
            return None
        for name, why in queue.unknown:
            log.error("schedd %s unknown this cycle (its demand unknown: no scale-down; "
                      "the other schedds' demand is provisioned for): %s", name, why)
        return queue, ads

    def _margin(self, site: str) -> float:
        """How long before its walltime a site's pilot may stop: SLURM's warning signal
        comes shutdown_margin_s before the end, up to SLURM_SIGNAL_SLOP_S early."""
        return self.config.site(site).pilot.shutdown_margin_s + SLURM_SIGNAL_SLOP_S

    # --- act -------------------------------------------------------------
    def _submit(self, action: Submit) -> tuple[list[str], BackendError | None]:
        """sbatch `action.count` pilots, stopping at the first failure: (ids, error).
        Pilots of an allocation (`action.allocation`) are charged to its account and
        serve only its groups (their batch script says so)."""
        site = self.config.site(action.site)
        backend = self.backends[action.site]
        account = site.allocation(action.allocation).account if action.allocation else None
        ids: list[str] = []
        error: BackendError | None = None
        tokens: list[PilotToken] = []
        try:
            tokens = self.tokens.issue(action.site, action.walltime_s, action.count)
            for i, token in enumerate(tokens):
                # pilots sent together spread their starts; the first starts at once
                script = render_pilot_script(self.config, site, action.walltime_s,
                                             action.gpus, i, action.count, token.text,
                                             allocation=action.allocation)
                ids.append(backend.submit(PilotRequest(
                    cpus=action.cpus, memory_mb=action.memory_mb,
                    walltime_s=action.walltime_s,
                    shutdown_margin_s=site.pilot.shutdown_margin_s, script=script,
                    gpus=action.gpus, account=account,
                    deadline_s=self.tokens.deadline_s(action.walltime_s))))
                self.tokens.bound(token, ids[-1])
        except TokenError as exc:  # retried (status says why meanwhile)
            error = Transient(str(exc))
            log.error("no pilot submitted at %s: %s", action.site, exc)
        except BackendError as exc:
            error = exc
            self.metrics.refused(action.site, refusal_kind(exc))
            log.error("submission at %s stopped after %d of %d: %s", action.site, len(ids),
                      action.count, exc)
        finally:
            self.tokens.unused(tokens[len(ids):])
            if ids:  # followed by the circuit breaker from now on
                self.controller.submitted(f"{action.site}/{i}" for i in ids)
                self.metrics.count("pilots_submitted", action.site, len(ids))
        return ids, error

    def _submit_all(self, submits: list[Submit]) -> list[tuple[str, str]]:
        """This cycle's submissions, a refused site's share placed anew elsewhere;
        none while the journal cannot record them (they wait)."""
        if not self.journal_health.writable:
            self.journal_health.waiting([describe(a) for a in submits])
            return [(describe(a), WAITING) for a in submits]
        out = []
        for sent in submit_all(self.controller, submits, self._submit, self.clock()):
            text = describe(sent.action) + (" (placed anew)" if sent.replanned else "")
            if sent.skipped:
                outcome = "skipped: sbatch at this site failed earlier this cycle"
            elif sent.error is not None:
                outcome = f"submitted {list(sent.ids)}; failed: {sent.error}"
            else:
                outcome = f"submitted {list(sent.ids)}"
            if sent.replanned and not sent.skipped:
                log.info("%s: %s", text, outcome)
            out.append((text, outcome))
        return out

    def act(self, obs: Observation, result: Plan) -> list[tuple[str, str]]:
        outcomes: list[tuple[str, str]] = []
        releases = [a for a in result.actions if isinstance(a, Release)]
        fresh: Fresh = None
        if releases:
            try:  # one fresh read of the schedds and the collector for all releases
                queue = self.pool.queue()
                if queue.whole:
                    fresh = (self.pool.pilot_ads(), queue.running_on)
                else:
                    log.error("no release this cycle, schedd(s) unreadable: %s",
                              ", ".join(n for n, _ in queue.unknown))
            except PoolUnreachable as exc:
                log.error("no release this cycle, pool unreadable: %s", exc)
        outcomes += self._submit_all([a for a in result.actions if isinstance(a, Submit)])
        for action in result.actions:
            if isinstance(action, Submit):
                continue
            text = describe(action)
            handler = HANDLERS.get(type(action))
            try:
                outcome = handler(self, action, fresh) if handler else "unknown action"
            except BackendError as exc:
                outcome = f"failed: {exc}"
                log.error("%s: %s", text, outcome)
                self.controller.not_sent(action)
            except Exception as exc:  # one broken action must not stop the others
                outcome = f"failed: {type(exc).__name__}: {exc}"
                log.exception("%s: %s", text, outcome)
                self.controller.not_sent(action)
            outcomes.append((text, outcome))
        outcomes.extend(cancel_lingering(self, obs))
        return outcomes

    # --- one cycle -------------------------------------------------------
    def run_cycle(self, reason: str = "manual", dry_run: bool = False,
                  now: float | None = None) -> CycleResult:
        """One full cycle. `now` is the cycle's time, taken before observing (default: the
        clock now), so the cadence counts its periods from when the cycle began."""
        now = self.clock() if now is None else now
        decided = decide(self.controller, self, now, commit=not dry_run)
        obs, result = decided.seen, decided.plan
        cycle = CycleResult(reason, obs, result, memory=decided.memory)
        t2 = time.monotonic()
        if not dry_run:
            cycle.outcomes = self.act(obs, result)
            self.tokens.observed(obs.jobs, now)  # the tokens of pilots SLURM no longer lists
        t3 = time.monotonic()
        cycle.timings = {**decided.timings, "act": t3 - t2}
        line = summary_line(cycle)
        if not dry_run:
            self._record_cycle(cycle, result, line, now, reason)
            self.publisher.publish(self.controller, result, now)
        # Logged once the journal holds the cycle: `provisioner status` (which reads the
        # journal) agrees with a log line from the moment it is written.
        for change in self.controller.transitions if not dry_run else ():
            log.warning("%s", change)
        log.info("cycle %d (%s): %s", self.cycles, reason, line)
        return cycle

    def _record_cycle(self, cycle: CycleResult, result: Plan, line: str, now: float,
                      reason: str) -> None:
        """The cycle's metrics, then its records, if the journal can take them
        (`provisioner.service.journal_health`)."""
        self._cycle_metrics(cycle, result, now)
        if self.journal_health.unopened:
            try:
                self.journal = self.ledger.journal = Journal(self.config.journal)
            except (sqlite3.Error, OSError):
                self.journal_health.missed(cycle.outcomes, now)
                return
            self.journal_health.unopened = False
        self.journal_health.record(self.journal, lambda: self._record(
            cycle, result, line, now, reason), cycle.outcomes, now)

    def _cycle_metrics(self, cycle: CycleResult, result: Plan, now: float) -> None:
        obs = cycle.observation
        self.metrics.cycle(
            now=now, timings=cycle.timings, sites=self.config.sites,
            pool_known=obs.snapshot.pool_known, demand=obs.snapshot.demand,
            unmatchable=result.unmatchable, pilots=obs.snapshot.pilots,
            circuit=circuit_codes(self.controller.breakers.states, now),
            known_sites=[v.name for v in obs.snapshot.sites if v.known],
            schedds_unknown=len(obs.snapshot.schedds_unknown),
            limits=limit_codes(self.controller.limits, self.controller.held_now(obs.snapshot),
                               self.config.site_names, self.clock()))
        self.metrics.allocations(allocation_rows(
            self.config, obs.snapshot, self.books.entries, now,
            stopped_of(self.controller)), self.books.groups)

    def _record(self, cycle: CycleResult, result: Plan, line: str, now: float,
                reason: str) -> None:
        """The cycle into the journal (the caller's one commit) and the accounting."""
        obs = cycle.observation
        self.ledger.explain_unmatchable(obs.snapshot.pool_known, result.unmatchable)
        self.ledger.account(obs.jobs, frozenset(obs.ads), obs.snapshot.pool_known, now)
        self.books.record(self.journal)
        if self.books.sites:  # for `provisioner status`, another process
            self.journal.put("stopped_allocations", stopped_record(stopped_of(self.controller)))
        cid = self.journal.cycle(reason, line, cycle.timings)
        for text, outcome in cycle.outcomes:
            kind = text.split(" ", 1)[0]
            site, job_id = action_target(text)
            self.journal.action(cid, kind, site, job_id, text, outcome)
        self.journal.put("pilot_tokens", self.tokens.report(obs.ads, self.metrics))
        self.journal.put("flagged", self.flagged)
        self.journal.put("controller", self.controller.state())
        self.journal.put("breakers", self.controller.breakers.snapshot(now))
        self.journal.put("limits", self.controller.limits.snapshot(
            self.controller.held_now(obs.snapshot), self.clock()))
        self.journal.put("last_cycle", {
            "at": now, "summary": line, "timings": cycle.timings,
            "actions": [[text, outcome] for text, outcome in cycle.outcomes]})

    def tick(self) -> CycleResult | None:
        """The cheap check (every `quick_check_s`); runs a full cycle when cadence says one
        is due. Between quick checks, while pilots are joining, only the join check. A
        wake-up (`self.wakeup`: a submit in the schedd's event log) makes it a quick check.
        The sequence is `provisioner.service.ticker.tick`'s."""
        now = self.clock()
        woken = self.wakeup.take()
        # a failed start's cool-down that ended: its schedd offers the job again
        self.metrics.count("cool_down_nudges", n=len(self.pool.offer_cooled(now)))
        done = tick(self.controller, self, now, woken)
        if done.reason:
            return self.run_cycle(done.reason, now=now)
        if done.reason == "" and woken and gap_holds(now, self.controller.mark,
                                                     self.config.policy):
            self.wakeup.hold()  # look again at the next timer tick
        return None

    # --- what the tick sequence reads (`provisioner.service.ticker.Senses`) ----------
    def probe(self) -> Probe | None:
        """The quick check: the idle jobs and the idle pilots' ads."""
        try:
            idle = self.pool.idle_count()
            idle_pilots = idle_ad_keys(self.pool.pilot_ads())
        except PoolUnreachable as exc:
            log.warning("quick check failed: %s", exc)
            return None
        return Probe(idle, idle_pilots)

    def idle_pilots(self) -> frozenset[str] | None:
        """The join check: the idle pilots' ads."""
        try:
            return idle_ad_keys(self.pool.pilot_ads())
        except PoolUnreachable as exc:
            log.debug("join check failed: %s", exc)
            return None

    def reschedule(self) -> None:
        """A pilot became idle while jobs wait: ask for a negotiation now."""
        try:
            self.pool.reschedule()
        except PoolUnreachable as exc:
            log.warning("could not ask for a negotiation: %s", exc)
            return
        self.metrics.count("negotiations_requested")
        log.info("pilot(s) idle while jobs wait: negotiation asked for")
