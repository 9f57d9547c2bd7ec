"""The `sim` engine: the event-driven simulator, one iteration after another on one clock."""

from __future__ import annotations

from types import TracebackType

from pipeline.allreduce import AllReduce
from pipeline.engines.base import Capabilities, Outcome, Plan
from pipeline.faults import IterationFaults
from pipeline.host_costs import FREE, HostCosts
from pipeline.simulator import CommMode, simulate

__all__ = ["SimEngine"]


class SimEngine:
    """`allreduce`: every DP replica runs the pipeline, then each stage's all-reduce and
    optimizer step (the step time). `host`: a host's runtime costs (a calibration)."""

    name = "sim"
    capabilities = Capabilities(
        comms=frozenset(CommMode), dp_step=True, restarts=True, placements=True
    )

    def __init__(self, *, allreduce: AllReduce | None = None, host: HostCosts = FREE) -> None:
        self.allreduce, self.host = allreduce, host
        self._clock_ms = 0.0
        self._validated: set[int] = set()

    def run(
        self, plan: Plan, iteration: int, faults: IterationFaults, *, digest: bool = False
    ) -> Outcome:
        if iteration == 0:
            self._clock_ms = 0.0
        timeline = simulate(
            plan.schedule,
            plan.profile,
            plan.comm,
            iteration=iteration,
            start_ms=self._clock_ms,
            validate=id(plan.schedule) not in self._validated,
            allreduce=self.allreduce,
            host=self.host,
            faults=faults,
        )
        self._validated.add(id(plan.schedule))
        self._clock_ms = timeline.iterations[0].end_ms
        return Outcome(timeline)

    def restart(self) -> None:
        """Nothing to restart; the clock goes on."""

    def close(self) -> None:
        self._validated.clear()

    def __enter__(self) -> SimEngine:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
