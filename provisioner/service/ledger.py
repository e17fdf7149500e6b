"""After each cycle: what the allocation bought goes into the journal and the metrics.

The journal's pilot records follow each site's `squeue` (start, first join, end when
the job left `squeue`); a pilot that left `squeue` then takes the end (and the start,
if `squeue` never showed it running) of the end record it wrote on its way out, read
through its site's backend in the same cycle (and, if there was none yet, in up to
RECORD_TRIES cycles within RECORD_WAIT_S: a shared file system may show it late). The
job runs come from the schedd's history, read incrementally. Unmatchable job groups
are logged once each, with their reason, when they first show. None of it ever stops
a cycle: a failed history or record read is logged once and retried every cycle; a
pilot whose record cannot be read keeps its end from `squeue`.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from provisioner.model import JobShape, Unmatchable
from provisioner.pilot.endrecord import EndRecord
from provisioner.pool.condor import PoolUnreachable
from provisioner.service.accounting import JobRun
from provisioner.service.journal import Journal, PilotEvents, SeenPilot
from provisioner.service.metrics import Metrics
from provisioner.sites.base import MAX_END_RECORDS, SiteJob

log = logging.getLogger(__name__)

#: A fresh journal starts with the last day of the schedd's history.
FIRST_HISTORY_S = 86400.0
#: A pilot's end record is looked for in at most RECORD_TRIES successful reads, within
#: RECORD_WAIT_S of the cycle that saw the pilot leave `squeue`.
RECORD_TRIES = 3
RECORD_WAIT_S = 3600.0


class History(Protocol):
    def history(self, after: float) -> list[JobRun]:
        """Runs that ended after `after`; PoolUnreachable if the schedd cannot be read."""


class EndRecords(Protocol):
    def end_records(self, job_ids: Sequence[str]) -> Mapping[str, EndRecord]:
        """As provisioner.sites.base.SiteBackend.end_records."""


class Ledger:
    def __init__(self, journal: Journal, metrics: Metrics, pool: History,
                 sites: Mapping[str, EndRecords] | None = None,
                 allocations: Mapping[tuple[str, str], str] | None = None) -> None:
        self.journal = journal
        #: (site, SLURM account) -> the allocation's name, kept in each pilot's record
        self.allocations = dict(allocations or {})
        self.metrics = metrics
        self.pool = pool
        self.sites = dict(sites or {})  # where pilots' end records are read
        self.unmatchable: set[JobShape] = set()  # groups already logged, until they leave
        self.history_failing = False
        self.records_failing: set[str] = set()  # sites whose record read failed
        self.record_tries: dict[str, int] = {}  # pilot key -> reads that found none

    def explain_unmatchable(self, pool_known: bool, groups: Sequence[Unmatchable]) -> list[str]:
        """Log each unmatchable job group once, with its reason, when it first shows
        (again after it left the queue and came back); returns the lines logged."""
        if not pool_known:
            return []
        now_groups = {u.shape: u for u in groups}
        lines = []
        for shape in sorted(set(now_groups) - self.unmatchable):
            u = now_groups[shape]
            sites = f", DesiredSites {','.join(shape.desired_sites)}" \
                if shape.desired_sites else ""
            lines.append(f"unmatchable: {u.idle} idle job(s) of {shape.cpus} cores, "
                         f"{shape.memory_mb} MB{sites}: {u.reason}")
            log.warning("%s", lines[-1])
        self.unmatchable = set(now_groups)
        return lines

    def account(self, jobs: Mapping[str, Iterable[SiteJob]], joined: frozenset[str],
                pool_known: bool, now: float) -> None:
        """Pilot records from this cycle's `squeue` views (`jobs`: the sites read;
        `joined`: pilot keys with a startd ad), then the new job runs."""
        events = PilotEvents()
        try:
            for site, site_jobs in jobs.items():
                seen = [SeenPilot(j.job_id, j.cpus, j.memory_mb, j.submitted_at,
                                  j.started_at, f"{site}/{j.job_id}" in joined, j.gpus,
                                  j.account, self.allocations.get((site, j.account), ""))
                        for j in site_jobs]
                got = self.journal.record_pilots(site, seen, now)
                events.started += got.started
                events.joined += got.joined
                events.ended += got.ended
            for site in jobs:
                self.read_end_records(site, now, events)
        except sqlite3.Error:
            raise  # the journal's own fault: the caller's (service.journal_health)
        except Exception:
            log.exception("pilot records not written this cycle")
        self.metrics.pilot_events(
            events.started, events.joined,
            [p.site for p in events.ended if p.start_at is not None and p.join_at is None])
        self.metrics.gpu_hours(events.ended, [])
        if pool_known:
            self.read_history(now)

    def read_end_records(self, site: str, now: float, events: PilotEvents) -> int:
        """The end records of the site's pilots that left `squeue` lately into the
        journal (their updated records replace those in `events.ended`); returns how
        many were applied. A failed read is logged once until a read works again."""
        reader = self.sites.get(site)
        if reader is None:
            return 0
        waiting = self.journal.awaiting_end_record(site, now - RECORD_WAIT_S)
        keys = {job_id: f"{site}/{job_id}" for job_id in waiting}
        for key in [k for k in self.record_tries if k.startswith(f"{site}/")]:
            if key not in keys.values():
                del self.record_tries[key]
        ask = [j for j in waiting if self.record_tries.get(keys[j], 0) < RECORD_TRIES]
        # The least asked first (then the most recent end): none waits behind a
        # crowd that left no record.
        ask.sort(key=lambda j: self.record_tries.get(keys[j], 0))
        ask = ask[:MAX_END_RECORDS]
        if not ask:
            return 0
        try:
            records = reader.end_records(ask)
        except Exception as exc:  # BackendError or worse: ends stay as squeue saw them
            self.metrics.count("end_record_read_errors", site)
            if site not in self.records_failing:
                log.error("end records at %s unreadable (pilot ends stay as squeue saw "
                          "them; logged once until it works again): %s", site, exc)
            self.records_failing.add(site)
            return 0
        if site in self.records_failing:
            log.warning("end records at %s readable again", site)
            self.records_failing.discard(site)
        for job_id in ask:
            self.record_tries[keys[job_id]] = self.record_tries.get(keys[job_id], 0) + 1
        applied = self.journal.apply_end_records(
            site, [r for j, r in records.items() if j in keys])
        for job_id, why in applied.refused.items():
            log.warning("end record of %s/%s not used: %s", site, job_id, why)
            self.record_tries[f"{site}/{job_id}"] = RECORD_TRIES
        updated = {p.key: p for p in applied.updated}
        events.ended = [updated.pop(p.key, p) for p in events.ended]
        events.started += applied.started
        self.metrics.count("pilot_end_records", site, len(applied.updated))
        return len(applied.updated)

    def read_history(self, now: float) -> int:
        """Add the runs that ended since the last read; returns how many were new."""
        after = self.journal.get("history_after")
        after = float(after) if isinstance(after, int | float) else now - FIRST_HISTORY_S
        try:
            runs = self.pool.history(after)
        except PoolUnreachable as exc:
            self.metrics.count("history_read_errors")
            if not self.history_failing:
                log.error("job history unreadable (accounting waits, provisioning goes "
                          "on; logged once until it works again): %s", exc)
            self.history_failing = True
            return 0
        except Exception:
            log.exception("job history read failed")
            return 0
        if self.history_failing:
            log.warning("job history readable again")
        self.history_failing = False
        if not runs:
            return 0
        added = self.journal.new_job_runs(runs)
        self.journal.put("history_after", max(after, max(r.end_at for r in runs)))
        # GPU-hours of GPU jobs on this provisioner's pilots (a fresh journal reads a
        # day of history: runs on pilots it never saw are not its allocation's)
        gpu_runs = [r for r in added if r.gpus > 0 and r.site]
        ours = self.journal.known_pilots((r.site, r.pilot_job_id) for r in gpu_runs)
        self.metrics.gpu_hours([], [r for r in gpu_runs if (r.site, r.pilot_job_id) in ours])
        return len(added)
