"""Plain-data builders for the unit tests of allocations and groups."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from provisioner.config import AllocationConfig, Config, SiteBase
from provisioner.model import AllocationBooks, JobShape, Pilot, Snapshot

from .helpers import config, snap

S = TypeVar("S", bound=SiteBase)

#: 2026-12-10 00:00 UTC: day 9 of a 31-day month.
DEC10 = dt.datetime(2026, 12, 10, tzinfo=dt.UTC).timestamp()


def alloc(name: str = "alloc-a", groups: Sequence[str] = ("group_a",), **kw: Any
          ) -> AllocationConfig:
    """An allocation; its account is its name unless `account` says otherwise."""
    base: dict[str, Any] = {"name": name, "account": name, "amount": 1000.0,
                            "period": "monthly", "groups": list(groups)}
    base.update(kw)
    return AllocationConfig.model_validate(base)


def budgeted(s: S, *allocations: AllocationConfig) -> S:
    return s.model_copy(update={"allocations": tuple(allocations)})


def groups_config(*sites: Any, **kw: Any) -> Config:
    """`helpers.config`, with a journal (allocations need one)."""
    bare = [s.model_copy(update={"allocations": ()}) for s in sites]
    base = config(*bare, **kw)
    return Config(policy=base.policy, sites=sites, journal="/var/lib/p/journal.db")


def books(spent: Mapping[tuple[str, str], float | None]) -> tuple[AllocationBooks, ...]:
    """(site, allocation) -> spent (None: the books unknown)."""
    return tuple(AllocationBooks(site, name, value or 0.0, known=value is not None)
                 for (site, name), value in spent.items())


def gsnap(demand: Sequence[tuple[JobShape, int]] = (), pilots: Sequence[Pilot] = (),
          sites: tuple[str, ...] = ("gsi",),
          spent: Mapping[tuple[str, str], float | None] | None = None,
          arrivals: Sequence[tuple[JobShape, int]] = ()) -> Snapshot:
    return replace(snap(list(demand), list(pilots), sites=sites, arrivals=list(arrivals)),
                   books=books(spent or {}))


def job(cpus: int = 4, group: str = "group_a", memory_mb: int = 1000, **kw: Any
        ) -> JobShape:
    return JobShape(cpus, memory_mb, group=group, **kw)
