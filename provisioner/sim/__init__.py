"""Trace-driven discrete-event simulator driving the same `plan()` as the service."""

from provisioner.sim.results import RunResult
from provisioner.sim.scenarios import POLICIES, default_config, default_sites, run_scenario
from provisioner.sim.traces import TRACES
from provisioner.sim.world import SiteModel, World

__all__ = ["POLICIES", "TRACES", "RunResult", "SiteModel", "World", "default_config",
           "default_sites", "run_scenario"]
