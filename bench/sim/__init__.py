"""Trace-driven discrete-event simulator driving the same `plan()` as the service."""

from bench.sim.results import RunResult
from bench.sim.scenarios import POLICIES, default_config, default_sites, run_scenario
from bench.sim.traces import TRACES
from bench.sim.world import SiteModel, World

__all__ = ["POLICIES", "TRACES", "RunResult", "SiteModel", "World", "default_config",
           "default_sites", "run_scenario"]
