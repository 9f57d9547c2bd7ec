"""The `sim` engine: the event-driven simulator, one iteration after another on one clock."""

from __future__ import annotations

from typing import Any

from pipeline.engines.base import Capabilities, Closing, Outcome, Plan
from pipeline.faults import IterationFaults
from pipeline.host_costs import FREE, HostCosts
from pipeline.simulator import CommMode, simulate
from pipeline.timeline import Timeline

__all__ = ["SimEngine"]

_CACHED_ITERATIONS = 64
"""Distinct iterations kept for reuse (oldest dropped first): memory stays flat."""


class SimEngine(Closing):
    """Every DP replica of a plan's profile runs the pipeline, then each stage's all-reduce
    and optimizer step (the step time: pipeline.simulator). `host`: a host's runtime costs
    (a calibration)."""

    name = "sim"
    capabilities = Capabilities(comms=frozenset(CommMode), dp_step=True, restarts=True)

    def __init__(self, *, host: HostCosts = FREE) -> None:
        self.host = host
        self._clock_ms = 0.0
        self._failed_over: frozenset[tuple[int, str, str]] = frozenset()
        """The link directions whose delegates moved to another NIC (until a restart)."""
        self._validated: set[int] = set()
        self._cache: dict[tuple[Any, ...], tuple[Plan, Timeline, int]] = {}

    def run(
        self,
        plan: Plan,
        iteration: int,
        faults: IterationFaults,
        *,
        digest: bool = False,
        checkpoint: bool = False,
    ) -> Outcome:
        """An iteration whose plan and faults equal an earlier one's (faults' `cache_key`) is
        that iteration again, moved to now (`Outcome.same_as`)."""
        if iteration == 0:
            self._clock_ms, self._failed_over = 0.0, frozenset()
        faults_key = faults.cache_key()
        key = None if faults_key is None else (plan, faults_key, self._failed_over)
        cached = None if key is None else self._cache.get(key)
        if cached is not None:
            timeline = cached[1].moved(iteration, self._clock_ms)
            same_as: int | None = cached[2]
        else:
            timeline = simulate(
                plan.schedule,
                plan.profile,
                plan.comm,
                iteration=iteration,
                start_ms=self._clock_ms,
                validate=id(plan.schedule) not in self._validated,
                host=self.host,
                faults=faults,
                link_comms=plan.link_comms,
                failed_over=self._failed_over,
            )
            self._validated.add(id(plan.schedule))
            same_as = None
            if key is not None:
                if len(self._cache) >= _CACHED_ITERATIONS:
                    self._cache.pop(next(iter(self._cache)))
                self._cache[key] = (plan, timeline, iteration)
        self._clock_ms = timeline.iterations[0].end_ms
        moved = {(f.replica, f.link, f.direction) for f in timeline.failovers}
        self._failed_over = self._failed_over | moved
        return Outcome(timeline, same_as=same_as)

    def restart(self) -> None:
        """Nothing to restart but the NICs: the clock goes on, on repaired hardware."""
        self._failed_over = frozenset()

    def close(self) -> None:
        self._validated.clear()
        self._cache.clear()
