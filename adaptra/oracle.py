"""Adaptra's controller as the paper evaluates it when the straggler is known: an oracle.

It reads the fault model's view (what delay is in force on each PP link, the most of any
replica's, and on each DP ring link; whether a link or NIC has failed), never the
measurements, and says so in its name. Where the PP delays in force change it plans
Adaptra's schedule for them (each delay vector once), and it runs over the delegates while
any link, PP or DP, is slow or anything has failed (the delegates fail over to another NIC:
adaptra.transport), the direct path otherwise. It makes no rank swap (the detector-driven
controller moves a slow DP link onto a PP edge: adaptra.control.swaps), which replaces it.
Its iterations are the run's (warm-up included), as the engines'; the view counts from the
first measured one (pipeline.faults.AfterWarmup).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from adaptra.plans import AdaptraPlans, adaptra_schedule
from pipeline.engines import Plan
from pipeline.faults import AfterWarmup, FaultView
from pipeline.profile import Profile
from pipeline.schedule import Schedule
from pipeline.simulator import CommMode
from pipeline.timeline import Timeline
from pipeline.topology import link_name

__all__ = ["OracleController"]


class OracleController:
    name = "oracle"

    def __init__(
        self,
        profile: Profile,
        faults: FaultView,
        *,
        num_warmup_iterations: int = 1,
        planner: Callable[[Profile], Schedule] = adaptra_schedule,
        profile_for: Callable[[Schedule], Profile] | None = None,
    ) -> None:
        """`profile`: the op times and static delays; `faults`: the run's view, counted from
        its first measured iteration, as a fault timeline is; `num_warmup_iterations`: the
        run's warm-up, healthy; `planner`: Adaptra's schedule for a profile whose delays are
        those in force; `profile_for`: the op times a schedule runs under (a cost model's
        fused or split times; default: `profile`'s)."""
        self.profile = profile
        self.faults: FaultView = AfterWarmup(faults, num_warmup_iterations)
        self._plans = AdaptraPlans(profile, planner, profile_for)

    def delays_in_force(self, iteration: int) -> tuple[float, ...]:
        extra = self.faults.pp_delays_ms(iteration, self.profile.topology)
        return tuple(a + b for a, b in zip(self.profile.delay_ms, extra, strict=True))

    def dp_delays_in_force(self, iteration: int) -> tuple[tuple[str, float], ...]:
        """Each DP ring link with a delay in force: the profile's own plus the faults'."""
        delays = {str(link): ms for link, ms in self.profile.dp_delay_ms}
        for link, ms in self.faults.dp_delays_ms(iteration, self.profile.topology):
            delays[link] = delays.get(link, 0.0) + ms
        return tuple((link, ms) for link, ms in delays.items() if ms)

    def plan(self, iteration: int) -> Plan:
        delays = self.delays_in_force(iteration)
        dp = self.dp_delays_in_force(iteration)
        failed = self.faults.has_failure(iteration, self.profile.topology)
        comm = CommMode.DELEGATED if any(delays) or dp or failed else CommMode.DIRECT
        known = tuple((link_name(i), d) for i, d in enumerate(delays) if d) + dp
        return self._plans.plan(delays, comm, known)

    def observe(self, iteration: int, timeline: Timeline) -> None:
        pass

    def restarted(self, iteration: int, *, stragglers: bool, at_ms: float = math.inf) -> None:
        """The job came back on repaired hardware, as the loop's view (FaultView.repaired):
        the failures that had started by `at_ms` into `iteration` are gone (a later one in it
        still comes); with `stragglers`, every fault that started before `iteration`."""
        self.faults = self.faults.repaired(iteration, stragglers=stragglers, at_ms=at_ms)
