"""Adaptra's plans for a delay vector: each vector planned once, the run's profile passed
through (what the engine injects), with a cost model's op times where a schedule has its own,
and a delegated plan's delegate count sized for the delays believed. The oracle
(adaptra.oracle) and the detector-driven controller (adaptra.control) plan here."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from adaptra.scheduler import plan_adaptra
from pipeline.engines import Plan
from pipeline.profile import Profile
from pipeline.schedule import Schedule
from pipeline.simulator import CommMode

__all__ = ["AdaptraPlans", "adaptra_schedule"]


def adaptra_schedule(profile: Profile) -> Schedule:
    """Adaptra's schedule for `profile`'s delays (Algorithm 1 where there are none)."""
    return plan_adaptra(profile).schedule


class AdaptraPlans:
    def __init__(
        self,
        profile: Profile,
        planner: Callable[[Profile], Schedule] = adaptra_schedule,
        profile_for: Callable[[Schedule], Profile] | None = None,
    ) -> None:
        """`profile`: the run's; `planner`: Adaptra's schedule for a profile whose delays
        are those to plan for; `profile_for`: the op times a schedule runs under (a cost
        model's fused or split times; default: `profile`'s)."""
        self.profile = profile
        self._planner = planner
        self._profile_for = profile_for
        self._schedules: dict[tuple[float, ...], Schedule] = {}

    def plan(
        self, delays: tuple[float, ...], comm: CommMode, believed_ms: tuple[tuple[str, float], ...]
    ) -> Plan:
        """The plan for PP link delays `delays` over `comm`; `believed_ms` is reported with it
        (`Plan.believed_ms`)."""
        if delays not in self._schedules:
            self._schedules[delays] = self._planner(self.profile.with_delays(delays))
        schedule = self._schedules[delays]
        profile = self.profile
        if self._profile_for is not None:
            profile = self._profile_for(schedule).with_delays(profile.delay_ms, profile.dp_delay_ms)
            profile = dataclasses.replace(profile, num_delegates=self.profile.num_delegates)
        num_delegates = None
        if comm is CommMode.DELEGATED:
            num_delegates = self.delegates_for(profile, believed_ms)
        # `adaptra` with no delay too: Algorithm 1's plan, searched (not `adaptra-initial`,
        # Algorithm 1 and the generator alone, which may be slower).
        return Plan(
            schedule,
            profile,
            comm,
            policy="adaptra",
            believed_ms=believed_ms,
            num_delegates=num_delegates,
        )

    @staticmethod
    def delegates_for(profile: Profile, believed_ms: tuple[tuple[str, float], ...]) -> int:
        """The delegates a delegated iteration uses: the paper's rule
        (`Profile.delegates_needed`) for the longest delay believed on any link (PP or DP
        ring), at most those started (`profile.delegate_count()`: provisioned for the run)."""
        longest_ms = max((ms for _, ms in believed_ms), default=0.0)
        needed = profile.with_delays(()).delegates_needed(longest_ms)
        return min(needed, profile.delegate_count())
