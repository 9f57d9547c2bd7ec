"""The baselines' controller: one plan, decided before the run, every iteration."""

from __future__ import annotations

import dataclasses
import math

from pipeline.engines import Plan
from pipeline.timeline import Timeline

__all__ = ["FixedPlan"]


@dataclasses.dataclass(frozen=True, slots=True)
class FixedPlan:
    """1F1B and ZeroBubble as deployed: the same schedule and comm whatever happens (faults
    reach the engine through the fault model, never through this plan). It reads nothing."""

    fixed: Plan
    name: str = "fixed"

    def plan(self, iteration: int) -> Plan:
        return self.fixed

    def observe(self, iteration: int, timeline: Timeline) -> None:
        pass

    def restarted(self, iteration: int, *, stragglers: bool, at_ms: float = math.inf) -> None:
        pass
