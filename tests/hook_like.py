"""The simulator imposing no link model: what a runtime whose fault hook injects does on a
free host (it sleeps the delays and faults; latency, bandwidth and a delegate's rate are
the profile's model, not the host's). Its timelines are exact, so tests of what reads
measured message times against the model (the detector, Falcon's profiling) can assert
exact decisions."""

from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.engines import Capabilities, Outcome, Plan
from pipeline.engines.sim import SimEngine
from pipeline.faults import IterationFaults
from pipeline.link_terms import NO_LINK_TERMS
from pipeline.simulator import CommMode


class HookLikeSim(SimEngine):
    """The simulator imposing no link model (`NO_LINK_TERMS`)."""

    capabilities = Capabilities(comms=frozenset(CommMode), link_terms=NO_LINK_TERMS, restarts=True)

    def run(self, plan: Plan, iteration: int, faults: IterationFaults, **kwargs: Any) -> Outcome:
        bare = dataclasses.replace(plan, profile=NO_LINK_TERMS.kept_in(plan.profile))
        return super().run(bare, iteration, faults, **kwargs)
