"""After each full cycle: why each shape of idle job waits, into the collector and the
metrics.

The report (`provisioner.decide.explain`) is built from the snapshot the plan saw, its
plan and what the controller knows of the sites; it goes to the collector as the
service's status ad (`provisioner.pool.status_ad`), which `provisioner why` reads, and
its counts per reason to the metrics. A failed advertisement is logged (once until it
works again) and never stops the cycle.
"""

from __future__ import annotations

import logging
from typing import Any

from provisioner.config import Config
from provisioner.decide.controller import Controller
from provisioner.decide.explain import Report, SiteWords, explain
from provisioner.decide.placement import estimate_of
from provisioner.model import Plan
from provisioner.pool.status_ad import advertise
from provisioner.service.metrics import Metrics

log = logging.getLogger(__name__)


def site_words(controller: Controller, config: Config, now: float) -> SiteWords:
    """The controller's knowledge of each site, as the report names it."""
    held = controller.held_now(controller.planned[0]) if controller.planned else {}
    placement = config.policy.placement
    leads = {}
    for s in config.sites:
        est = estimate_of(s.name, controller.memory.estimates, placement)
        leads[s.name] = est.wait_s + est.boot_s
    return SiteWords(limits=controller.limits.snapshot(held, now),
                     breakers=controller.breakers.snapshot(now),
                     paused=controller.breakers.paused(), lead_s=leads)


def report_of(controller: Controller, config: Config, plan: Plan, now: float) -> Report | None:
    """This cycle's report; None before the controller planned one."""
    if controller.planned is None:
        return None
    snapshot, _memory = controller.planned
    return explain(snapshot, plan, config, now, site_words(controller, config, now),
                   sent=controller.just_sent)


class Publisher:
    """Advertises each cycle's report through the bindings `htcondor` (None: the pool
    reader has none, as in the unit tests' fakes: nothing is advertised)."""

    def __init__(self, config: Config, htcondor: Any, metrics: Metrics) -> None:
        self.config = config
        self.htcondor = htcondor
        self.metrics = metrics
        self.failing = False

    def publish(self, controller: Controller, plan: Plan, now: float) -> Report | None:
        """This cycle's report, advertised and counted (None: none could be built; the
        cycle goes on either way)."""
        try:
            report = report_of(controller, self.config, plan, now)
        except Exception:  # a report is no reason to stop provisioning
            log.exception("the cycle's status report could not be built")
            return None
        if report is None:
            return None
        if report.pool_known:
            self.metrics.waiting(report.waiting())
        if self.htcondor is None:
            return report
        try:
            advertise(self.htcondor, self.config.pool.collector, report)
        except Exception as exc:  # the bindings raise HTCondorException and friends
            if not self.failing:
                log.error("status ad not advertised (provisioner why cannot tell users "
                          "why their jobs wait; the provisioner's token needs -authz "
                          "DAEMON and the collector COLLECTOR.ALLOW_DAEMON for it): %s", exc)
            self.failing = True
            return report
        if self.failing:
            log.warning("status ad advertised again")
        self.failing = False
        return report
