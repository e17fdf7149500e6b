"""Trace-driven discrete-event simulator running the same controller as the service."""

from bench.sim.entities import SiteModel
from bench.sim.results import RunResult
from bench.sim.scenarios import (
    POLICIES,
    SCENARIOS,
    SITE_SETS,
    default_config,
    default_sites,
    hetero_sites,
    run_scenario,
)
from bench.sim.traces import TRACES
from bench.sim.world import World

__all__ = ["POLICIES", "SCENARIOS", "SITE_SETS", "TRACES", "RunResult", "SiteModel", "World",
           "default_config", "default_sites", "hetero_sites", "run_scenario"]
