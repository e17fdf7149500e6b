"""The whole configuration file: `Config`, and the rules that span its sections."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from provisioner.config.base import PATH_PATTERN, _Model
from provisioner.config.policy import PolicyConfig
from provisioner.config.pool import MetricsConfig, PoolConfig
from provisioner.config.site import AnySite, SlurmSite
from provisioner.config.tokens import PilotTokensConfig


class Config(_Model):
    pool: PoolConfig = PoolConfig()
    metrics: MetricsConfig = MetricsConfig()
    policy: PolicyConfig = PolicyConfig()
    pilot_tokens: PilotTokensConfig = PilotTokensConfig()
    #: Directory of the pilot batch-script templates; None = slurm_templates/ of this project.
    templates_dir: str | None = Field(default=None, pattern=PATH_PATTERN)
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
    def _allocations_need_a_journal(self) -> Config:
        """The allocations' ledger lives in the journal: without one, a restart would
        forget what was spent and could spend it again."""
        budgeted = [s.name for s in self.sites if s.allocations]
        if budgeted and not self.journal:
            raise PydanticCustomError(
                "journal_needed",
                "journal is empty, but site(s) {value} have allocations, whose ledger lives "
                "in the journal: set journal to a file path",
                {"field": "journal", "value": ", ".join(budgeted)})
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

    def site(self, name: str) -> SlurmSite:
        """The site called `name`; KeyError if it is not configured."""
        for site in self.sites:
            if site.name == name:
                return site
        raise KeyError(name)

    @property
    def groups_in_use(self) -> bool:
        """Some site has allocations: jobs are told apart by their accounting group."""
        return any(s.allocations for s in self.sites)

    @property
    def site_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.sites)
