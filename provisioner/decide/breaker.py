"""Circuit breaker for black-hole sites (pure: the caller passes what it observed and `now`).

A site whose pilots start in SLURM and end without ever joining the pool (broken
image, wrong token, unreachable collector, a node that kills them) eats
allocation and feeds nothing. After `threshold` such pilots in a row the site's
breaker opens: no new pilots there for `base_s` seconds, and the demand goes to
the other sites. Then it is half-open: one pilot may test it. If that pilot
joins, the breaker closes; if it fails too, the breaker opens again for twice
as long (at most `max_s`). A pilot that joined once counts as a success,
whatever happens to it later.

States: closed -> open -> half-open -> closed | open (longer).

The controller (`provisioner.decide.controller.Controller`) feeds it once per cycle and is told
of every submission (`track`); the sites' states survive a restart through the journal
(`to_dict`, `load`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class BreakerState:
    failures: int = 0  # pilots in a row that ended without joining
    open_until: float | None = None  # open until then (None: not open)
    delay_s: float = 0.0  # the last opening's length
    probing: bool = False  # half-open: one pilot may test the site

    def describe(self, now: float) -> str:
        if self.open_until is not None:
            return (f"open ({self.failures} pilots in a row never joined; retried in "
                    f"{max(0.0, self.open_until - now):.0f} s)")
        if self.probing:
            return "half-open (one pilot tests the site)"
        return "closed" if not self.failures else f"closed ({self.failures} failed in a row)"


@dataclass
class SiteBreakers:
    threshold: int = 3
    base_s: float = 600.0
    max_s: float = 4 * 3600.0
    states: dict[str, BreakerState] = field(default_factory=dict)
    tracked: dict[str, bool] = field(default_factory=dict)  # pilot key -> joined yet

    def state(self, site: str) -> BreakerState:
        return self.states.setdefault(site, BreakerState())

    def track(self, keys: Iterable[str]) -> None:
        """Pilots that exist at their site (just submitted, or seen in its queue)."""
        for key in keys:
            self.tracked.setdefault(key, False)

    def withdraw(self, key: str) -> None:
        """The provisioner cancelled this pilot before it could join: no verdict."""
        self.tracked.pop(key, None)

    def observe(self, site: str, live: Iterable[str], joined: Iterable[str],
                now: float) -> list[str]:
        """One cycle's view of a known site: keys of its live SLURM jobs and of its
        pilots with a startd ad. A tracked pilot gone from SLURM is a success if it
        ever joined, else a failure (even one that lived only between two cycles).
        Returns the transitions, one line each, for the log."""
        live_set = set(live)
        joined_set = set(joined)
        self.track(live_set)
        events = []
        for key in [k for k in self.tracked if k.split("/", 1)[0] == site]:
            if key in joined_set:
                self.tracked[key] = True
            if key in live_set:
                continue
            ok = self.tracked.pop(key)
            events += self._success(site) if ok else self._failure(site, key, now)
        st = self.state(site)
        if st.open_until is not None and now >= st.open_until:
            st.open_until, st.probing = None, True
            events.append(f"site {site}: circuit breaker half-open after {st.delay_s:.0f} s: "
                          "one pilot tests the site")
        return events

    def _failure(self, site: str, key: str, now: float) -> list[str]:
        st = self.state(site)
        st.failures += 1
        if st.open_until is not None:
            return []  # already open: counted, no new transition (and no new line)
        if not st.probing and st.failures < self.threshold:
            return []
        st.delay_s = min(self.max_s, st.delay_s * 2 if st.probing else self.base_s)
        st.open_until, st.probing = now + st.delay_s, False
        return [f"site {site}: circuit breaker OPEN for {st.delay_s:.0f} s: pilot {key} and "
                f"{st.failures - 1} before it ended without joining the pool; no new pilots "
                "there, demand goes to other sites"]

    def _success(self, site: str) -> list[str]:
        st = self.state(site)
        was = st.probing or st.failures > 0
        self.states[site] = BreakerState()
        return [f"site {site}: circuit breaker closed: a pilot joined the pool"] if was and (
            st.probing) else []

    def max_new(self, site: str, now: float, untested: int) -> int | None:
        """How many new pilots the site may get this cycle (None: no limit). While
        half-open, one, and only if no pilot is already testing it (`untested`:
        its pilots pending or running that have not joined yet)."""
        st = self.states.get(site)
        if st is None:
            return None
        if st.open_until is not None and now < st.open_until:
            return 0
        if st.probing:
            return 0 if untested else 1
        return None

    def probing(self) -> frozenset[str]:
        """Sites that are half-open (a pilot tests them)."""
        return frozenset(site for site, st in self.states.items() if st.probing)

    def limits(self, now: float, untested: Mapping[str, int]) -> dict[str, int]:
        """`max_new` of every site that has a limit this cycle (the others absent);
        `untested`: site -> its pilots pending or starting."""
        out = {}
        for site in self.states:
            limit = self.max_new(site, now, untested.get(site, 0))
            if limit is not None:
                out[site] = limit
        return out

    def paused(self) -> dict[str, tuple[int, float | None]]:
        """Sites behind an open or half-open breaker: how many pilots in a row never
        joined, and when the breaker opens to a test (None: half-open, a pilot tests
        the site now)."""
        return {site: (st.failures, st.open_until) for site, st in sorted(self.states.items())
                if st.open_until is not None or st.probing}

    def snapshot(self, now: float) -> dict[str, str]:
        """Each site's breaker in words (for the journal and `provisioner status`)."""
        return {site: st.describe(now) for site, st in sorted(self.states.items())}

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The sites' states, JSON-able (pilots being tracked are not kept: after a
        restart the sites' queues name them again)."""
        return {site: {"failures": st.failures, "open_until": st.open_until,
                       "delay_s": st.delay_s, "probing": st.probing}
                for site, st in sorted(self.states.items())}

    def load(self, data: Mapping[str, Any]) -> None:
        """Restore what `to_dict()` wrote; malformed entries are skipped."""
        for site, e in data.items():
            try:
                until = e["open_until"]
                self.states[str(site)] = BreakerState(
                    int(e["failures"]), None if until is None else float(until),
                    float(e["delay_s"]), bool(e["probing"]))
            except (KeyError, TypeError, ValueError):
                continue
