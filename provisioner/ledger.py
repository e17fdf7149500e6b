"""After each cycle: what the allocation bought goes into the journal and the metrics.

The journal's pilot records follow each site's `squeue` (start, first join, end when
the job left `squeue`); the job runs come from the schedd's history, read
incrementally. Unmatchable job groups are logged once each, with their reason, when
they first show. None of it ever stops a cycle: a failed history read is logged once
and retried every cycle.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from provisioner.accounting import JobRun
from provisioner.condor import PoolUnreachable
from provisioner.journal import Journal, PilotEvents, SeenPilot
from provisioner.metrics import Metrics
from provisioner.model import JobShape, Unmatchable
from provisioner.sites.base import SiteJob

log = logging.getLogger(__name__)

#: A fresh journal starts with the last day of the schedd's history.
FIRST_HISTORY_S = 86400.0


class History(Protocol):
    def history(self, after: float) -> list[JobRun]:
        """Runs that ended after `after`; PoolUnreachable if the schedd cannot be read."""


class Ledger:
    def __init__(self, journal: Journal, metrics: Metrics, pool: History) -> None:
        self.journal = journal
        self.metrics = metrics
        self.pool = pool
        self.unmatchable: set[JobShape] = set()  # groups already logged, until they leave
        self.history_failing = False

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
                                  j.started_at, f"{site}/{j.job_id}" in joined)
                        for j in site_jobs]
                got = self.journal.record_pilots(site, seen, now)
                events.started += got.started
                events.joined += got.joined
                events.ended += got.ended
        except Exception:
            log.exception("pilot records not written this cycle")
        self.metrics.pilot_events(
            events.started, events.joined,
            [p.site for p in events.ended if p.start_at is not None and p.join_at is None])
        if pool_known:
            self.read_history(now)

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
        added = self.journal.add_job_runs(runs)
        self.journal.put("history_after", max(after, max(r.end_at for r in runs)))
        return added
