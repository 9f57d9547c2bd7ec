"""Adaptra's controller as the paper evaluates it when the straggler is known: an oracle.

It reads the fault model's view (what delay is in force on which PP link), never the
measurements, and says so in its name. Where the delays in force change it plans Adaptra's
schedule for them (each delay vector once), and it runs over the delegates once any link is
slow (the direct path while none is). The detector-driven controller replaces it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from adaptra.scheduler import plan_adaptra
from pipeline.engines import Plan
from pipeline.faults import FaultView
from pipeline.profile import Profile
from pipeline.schedule import Schedule
from pipeline.simulator import CommMode
from pipeline.timeline import Timeline

__all__ = ["OracleController"]


def _adaptra_schedule(profile: Profile) -> Schedule:
    return plan_adaptra(profile).schedule


class OracleController:
    name = "oracle"

    def __init__(
        self,
        profile: Profile,
        faults: FaultView,
        *,
        planner: Callable[[Profile], Schedule] = _adaptra_schedule,
        profile_for: Callable[[Schedule], Profile] | None = None,
    ) -> None:
        """`profile`: the op times and static delays; `planner`: Adaptra's schedule for a
        profile whose delays are those in force; `profile_for`: the op times a schedule runs
        under (a cost model's fused or split times; default: `profile`'s)."""
        self.profile, self.faults = profile, faults
        self._planner = planner
        self._profile_for = profile_for
        self._schedules: dict[tuple[float, ...], Schedule] = {}

    def delays_in_force(self, iteration: int) -> tuple[float, ...]:
        extra = self.faults.pp_delays_ms(iteration, self.profile.topology)
        return tuple(a + b for a, b in zip(self.profile.delay_ms, extra, strict=True))

    def plan(self, iteration: int) -> Plan:
        delays = self.delays_in_force(iteration)
        if delays not in self._schedules:
            self._schedules[delays] = self._planner(self.profile.with_delays(delays))
        schedule = self._schedules[delays]
        profile = self.profile
        if self._profile_for is not None:
            profile = self._profile_for(schedule).with_delays(profile.delay_ms, profile.dp_delay_ms)
            profile = dataclasses.replace(profile, num_delegates=self.profile.num_delegates)
        comm = CommMode.DELEGATED if any(delays) else CommMode.DIRECT
        return Plan(schedule, profile, comm)

    def observe(self, iteration: int, timeline: Timeline) -> None:
        pass
