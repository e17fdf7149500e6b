"""`sites[].allocations[]`: a grant of core-, node- or GPU-hours per period, charged to one
SLURM account, that named HTCondor accounting groups may spend.

A site without allocations behaves as before: its pilots go to `sites[].account` (or the
pilot account's default) and take any job. A site with allocations sends every pilot to
one allocation's account, and that pilot starts only jobs of the allocation's groups.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator
from pydantic_core import PydanticCustomError

from provisioner.config.base import _Model

#: A SLURM account name (sbatch --account, sacctmgr), as it goes into argv.
SLURM_ACCOUNT_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"
#: An HTCondor accounting group (the job's AcctGroup: `accounting_group` in the submit
#: file), as it goes into the pilot's START expression as a string literal.
GROUP_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"

Unit = Literal["core-hours", "node-hours", "gpu-hours"]
#: The SLURM TRES each unit counts (sshare's and sacctmgr's names): what the books read
#: of SLURM's charge and `site discover` of a grant.
UNIT_TRES: dict[str, str] = {"core-hours": "cpu", "node-hours": "node",
                             "gpu-hours": "gres/gpu"}
#: The short form status and logs write after a number ("310 of 1000 core-h").
UNIT_SHORT: dict[str, str] = {"core-hours": "core-h", "node-hours": "node-h",
                              "gpu-hours": "GPU-h"}


class DatedPeriod(_Model):
    """A grant for fixed dates: from `start` 00:00 UTC up to (not including) `end` 00:00
    UTC."""

    start: dt.date
    end: dt.date

    @model_validator(mode="after")
    def _end_after_start(self) -> DatedPeriod:
        if self.end <= self.start:
            raise PydanticCustomError(
                "period_end",
                "period end {value} is not after its start {start}",
                {"field": "end", "value": self.end.isoformat(),
                 "start": self.start.isoformat()})
        return self


def _period_kind(value: Any) -> str:
    return "dates" if isinstance(value, dict | DatedPeriod) else "calendar"


#: monthly / quarterly: calendar months and quarters in UTC, the grant renewed at each;
#: or {start, end} dates.
Period = Annotated[Annotated[Literal["monthly", "quarterly"], Tag("calendar")]
                   | Annotated[DatedPeriod, Tag("dates")], Discriminator(_period_kind)]


class AllocationConfig(_Model):
    """One grant: `amount` units per `period`, charged to SLURM `account`, for `groups`."""

    #: The allocation's name in status, metrics, the report and the pilots' ads.
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
    #: The SLURM account its pilots are charged to (sbatch --account).
    account: str = Field(pattern=SLURM_ACCOUNT_PATTERN)
    unit: Unit = "core-hours"
    amount: float = Field(gt=0)
    period: Period
    #: asap: spend as fast as the queue asks; even: spread the grant over its period,
    #: what is not spent carried forward within the period.
    pace: Literal["asap", "even"] = "asap"
    #: The accounting groups (AcctGroup) whose jobs may run on this allocation's pilots.
    groups: tuple[Annotated[str, Field(pattern=GROUP_PATTERN)], ...] = Field(min_length=1)
    #: At most this many pilots of this allocation at once (SLURM holds them); None:
    #: only the site's caps.
    max_pilots: int | None = Field(default=None, ge=0)

    @property
    def unit_short(self) -> str:
        return UNIT_SHORT[self.unit]

    def period_bounds(self, now: float) -> tuple[float, float]:
        """The period that `now` (epoch seconds) falls in, as [start, end) epoch seconds.
        A dated grant has one period, whether `now` is in it or not."""
        period = self.period
        if isinstance(period, DatedPeriod):
            return _utc(period.start), _utc(period.end)
        today = dt.datetime.fromtimestamp(now, tz=dt.UTC).date()
        months = 1 if period == "monthly" else 3
        first = (today.month - 1) // months * months + 1
        nxt = first + months
        end = dt.date(today.year + (nxt - 1) // 12, (nxt - 1) % 12 + 1, 1)
        return _utc(dt.date(today.year, first, 1)), _utc(end)


def _utc(day: dt.date) -> float:
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp()


def utc_date(t: float) -> str:
    """Epoch seconds as an ISO date in UTC (2026-12-01)."""
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).date().isoformat()


def check_allocations(allocations: tuple[AllocationConfig, ...], pilot_gpus: int) -> None:
    """The rules between a site's allocations: unique names and accounts, no GPU-hours
    where the pilots hold no GPU. Raises PydanticCustomError naming the field."""
    names: dict[str, int] = {}
    accounts: dict[str, int] = {}
    for i, alloc in enumerate(allocations):
        for key, seen in (("name", names), ("account", accounts)):
            value = getattr(alloc, key)
            if value in seen:
                raise PydanticCustomError(
                    "duplicate",
                    "duplicate allocation {key} '{value}' (also allocations[{first}].{key})",
                    {"field": f"allocations[{i}].{key}", "key": key, "value": value,
                     "first": seen[value]})
            seen[value] = i
        if alloc.unit == "gpu-hours" and pilot_gpus == 0:
            raise PydanticCustomError(
                "gpu_hours",
                "allocation '{value}' counts gpu-hours but pilot.gpus is 0: its pilots would "
                "hold no GPU and spend nothing of it",
                {"field": f"allocations[{i}].unit", "value": alloc.name})
