"""Reading a big queue without grouping all of it each cycle.

The schedd's GroupBy query (`provisioner.pool.condor.read_queue`) costs the schedd a
pass over every job with a signature of its shape: 0.4-0.6 s at 20,000 jobs, most of
a cycle. Most of a big queue is idle jobs that have not moved since the last read.

The schedd stamps a job's EnteredCurrentStatus when it changes its JobStatus (start,
eviction, hold, release), and a job materialized late (a `max_idle` submission) carries
its JobMaterializeDate. So the idle jobs in their status since a cut time and not
materialized after it (the *settled* ones) leave that set and, but for a change made
without a stamp, never join it. They are read in groups once, with their ClusterId, and
kept. Each cycle then asks the schedd:

1. how many settled jobs each cluster still has, with its first and last job id: a
   GroupBy on ClusterId alone, no shapes to sign (0.1 s at 20,000 jobs in few clusters).
   A cluster whose count or ids differ from the kept ones is read again in groups (only
   its jobs are signed);
2. every other job (running, held, transferring, idle since the cut), in groups.

A job that leaves the settled set between the two queries is counted twice that cycle,
as idle and as what it became (never missed: a running job's pilot is never taken for
idle). What the counts cannot see: an attribute changed in place (`condor_qedit` of a
settled job's request), or a job that joins without a stamp while another of its
cluster with the ids between leaves. Every `resync_s` the whole queue is read again and
a new cut taken, and so it is when the fresh jobs have grown to a quarter of the settled
ones (a big submission), after a failed query, and when most of the settled jobs would
have to be read again anyway.

Two queues gain nothing from this, and are read with the plain GroupBy instead (one
query, what the service did before): one of more than `MAX_KEPT_CLUSTERS` clusters (many
small submissions: the count alone would return an ad per cluster), until the next
resync; and one whose settled jobs mostly moved at the last count (a busy big cluster),
for a fifth of `resync_s`.

The schedd tests its group ads against the query's constraint too, and a group ad has
its JobCount and none of the jobs' EnteredCurrentStatus; the constraints say so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

#: query(constraint, projection) -> the schedd's group ads
Query = Callable[[str, list[str]], list[Any]]
#: the schedd's clock (epoch s), None if it does not say
ServerTime = Callable[[], "int | None"]

#: True on the schedd's group ads only (a job ad has no JobCount).
IS_GROUP = "JobCount isnt undefined"


def _old(cut: int) -> str:
    # =?= true: a job without the attribute is never settled (and so always read)
    return f"(EnteredCurrentStatus <= {cut}) =?= true && (JobMaterializeDate ?: 0) <= {cut}"


def settled_constraint(cut: int) -> str:
    """Idle jobs in their status since `cut` or before (and the schedd's groups of them)."""
    return f"JobStatus == 1 && ({_old(cut)} || {IS_GROUP})"


def fresh_constraint(cut: int, queue: str) -> str:
    """Every job of `queue` that is not settled at `cut`."""
    return f"({queue}) && !(JobStatus == 1 && {_old(cut)})"


def _literal(ad: Any, attr: str, default: int) -> int:
    value = ad.get(attr, default)
    return value if type(value) is int else default


def _ids(ad: Any) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The first and last job id a group ad names (its JobIds: "c.p", "c.p c.q" or
    "c.p ... c.q"), None if it names none (a job ad)."""
    text = ad.get("JobIds")
    if not isinstance(text, str):
        return None
    try:
        ids = [tuple(int(x) for x in t.split(".", 1)) for t in text.split() if t != "..."]
    except ValueError:
        return None
    if not ids or any(len(i) != 2 for i in ids):
        return None
    return min(ids), max(ids)  # type: ignore[return-value]


#: (jobs, first id, last id) of a cluster's settled jobs (ids None when not told)
Signature = tuple[int, "tuple[int, int] | None", "tuple[int, int] | None"]


def signatures(ads: list[Any]) -> dict[int, Signature]:
    """Per ClusterId: its jobs and the first and last id over `ads`."""
    out: dict[int, list[Any]] = {}
    for ad in ads:
        c = _literal(ad, "ClusterId", -1)
        ids = _ids(ad)
        got = out.setdefault(c, [0, None, None, False])
        got[0] += _jobs(ad)
        if ids is None:
            got[3] = True  # some ad without ids: the ids say nothing
        else:
            got[1] = ids[0] if got[1] is None else min(got[1], ids[0])
            got[2] = ids[1] if got[2] is None else max(got[2], ids[1])
    return {c: (n, None, None) if blind else (n, lo, hi) for c, (n, lo, hi, blind) in out.items()}


def _jobs(ad: Any) -> int:
    """How many jobs an ad stands for: its JobCount (a group) or one (a schedd that
    ignored the grouping answers job by job)."""
    return _literal(ad, "JobCount", 1)


@dataclass
class Settled:
    """One schedd's settled idle jobs as last read: their groups and counts by cluster."""

    cut: int
    taken_at: float
    groups: dict[int, list[Any]] = field(default_factory=dict)
    counts: dict[int, Signature] = field(default_factory=dict)

    def keep(self, ads: list[Any], clusters: set[int] | None = None) -> None:
        """Take `ads` (groups with their ClusterId) as the settled jobs of `clusters`
        (None: of every cluster)."""
        if clusters is None:
            self.groups, self.counts = {}, {}
        else:
            for c in clusters:
                self.groups.pop(c, None)
                self.counts.pop(c, None)
        for ad in ads:
            self.groups.setdefault(_literal(ad, "ClusterId", -1), []).append(ad)
        self.counts.update(signatures(ads))

    @property
    def jobs(self) -> int:
        return sum(n for n, _, _ in self.counts.values())

    def ads(self) -> list[Any]:
        return [ad for groups in self.groups.values() for ad in groups]


@dataclass(frozen=True)
class Read:
    """What one read asked: 'full' (why), or 'kept' with the clusters read again."""

    how: str
    why: str = ""
    reread: int = 0


class SettledReads:
    """The settled part of each schedd's queue, kept between cycles (module docstring).

    The cut is taken on the schedd's clock (`server_time`, its summary ad's ServerTime)
    a second before the full read: whatever changes after is stamped later. A schedd
    that does not tell its time gets a cut `lag_s` before ours, so a clock that runs
    behind ours by less still sees the settled set only shrink (behind by more, a
    cluster's count grows and the cluster is read again: slower, not wrong)."""

    #: re-read in full rather than cluster by cluster beyond this many clusters
    MAX_CLUSTERS = 64
    #: beyond this many clusters of settled jobs, read the queue plainly (docstring)
    MAX_KEPT_CLUSTERS = 500

    def __init__(self, group_attrs: list[str], queue_constraint: str,
                 resync_s: float = 300.0, lag_s: int = 60) -> None:
        self.group_attrs = list(group_attrs)
        self.attrs = [*group_attrs, "ClusterId"]
        self.queue = queue_constraint
        self.resync_s = resync_s
        self.lag_s = lag_s
        self.memory: dict[str, Settled] = {}
        self.last: dict[str, Read] = {}
        #: schedd -> until when its queue is read plainly, and why
        self.plain: dict[str, tuple[float, str]] = {}

    def forget(self, schedd: str) -> None:
        self.memory.pop(schedd, None)
        self.last.pop(schedd, None)

    def keep_only(self, schedds: set[str]) -> None:
        """Forget the schedds not among `schedds` (gone from the pool's roster)."""
        for name in (set(self.memory) | set(self.plain)) - schedds:
            self.forget(name)
            self.plain.pop(name, None)

    def read(self, schedd: str, query: Query, now: float,
             server_time: ServerTime = lambda: None) -> list[Any]:
        """Every job of `queue` on `schedd` as group ads: the settled ones kept or read
        again, the rest read now. A failed query forgets the schedd (its next read is
        full) and raises."""
        until, why = self.plain.get(schedd, (float("-inf"), ""))
        if now < until:
            self.last[schedd] = Read("plain", why)
            return query(self.queue, self.group_attrs)
        try:
            settled, how = self._settled(schedd, query, now, server_time)
            if settled is None:  # most settled jobs moved: a busy queue
                self._go_plain(schedd, now, self.resync_s / 5, how.why)
                return query(self.queue, self.group_attrs)
            fresh = query(fresh_constraint(settled.cut, self.queue), self.group_attrs)
        except Exception:
            self.forget(schedd)
            raise
        if how.how == "full" and len(settled.counts) > self.MAX_KEPT_CLUSTERS:
            self._go_plain(schedd, now, self.resync_s, f"{len(settled.counts)} clusters")
            return settled.ads() + fresh
        fresh_idle = sum(_jobs(ad) for ad in fresh if _literal(ad, "JobStatus", 0) == 1)
        if fresh_idle > max(100, settled.jobs // 4):
            settled.taken_at = float("-inf")  # a new cut at the next read
        self.memory[schedd] = settled
        self.last[schedd] = how
        log.debug("queue of %s: %s %s (%d settled idle jobs kept, %d fresh idle)", schedd,
                  how.how, how.why or f"{how.reread} clusters read again", settled.jobs,
                  fresh_idle)
        return settled.ads() + fresh

    def _go_plain(self, schedd: str, now: float, seconds: float, why: str) -> None:
        """Read `schedd`'s queue plainly for `seconds` (its kept jobs dropped)."""
        self.forget(schedd)
        self.plain[schedd] = (now + seconds, why)
        self.last[schedd] = Read("plain", why)
        log.info("queue of %s read plainly for %.0f s: %s", schedd, seconds, why)

    def _settled(self, schedd: str, query: Query, now: float, server_time: ServerTime
                 ) -> tuple[Settled | None, Read]:
        """The settled jobs, kept, read again in part or in full; None when most of them
        moved since the last read (the queue is then read plainly for a while)."""
        kept = self.memory.get(schedd)

        def full(why: str) -> tuple[Settled, Read]:
            told = server_time()
            settled = Settled(cut=int(now) - self.lag_s if told is None else told - 1,
                              taken_at=now)
            settled.keep(query(settled_constraint(settled.cut), self.attrs))
            return settled, Read("full", why)

        if kept is None:
            return full("first read")
        if now - kept.taken_at >= self.resync_s:
            return full("resync")
        counts = signatures(query(settled_constraint(kept.cut), ["ClusterId", "JobStatus"]))
        none: Signature = (0, None, None)
        changed = {c for c in counts.keys() | kept.counts.keys()
                   if _differ(counts.get(c, none), kept.counts.get(c, none))}
        if not changed:
            return kept, Read("kept")
        jobs = {c: n for c, (n, _, _) in counts.items()}
        if len(changed) > self.MAX_CLUSTERS or \
                2 * sum(jobs.get(c, 0) for c in changed) > sum(jobs.values()):
            return None, Read("plain", f"{len(changed)} clusters of settled jobs changed")
        ids = " || ".join(f"ClusterId == {c}" for c in sorted(changed))
        kept.keep(query(f"{settled_constraint(kept.cut)} && ({ids})", self.attrs), changed)
        return kept, Read("kept", reread=len(changed))


def _differ(now: Signature, kept: Signature) -> bool:
    """Whether a cluster's settled jobs changed: their count, or an id where both say."""
    return now[0] != kept[0] or any(a is not None and b is not None and a != b
                                    for a, b in zip(now[1:], kept[1:], strict=True))
