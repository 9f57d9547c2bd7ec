"""The per-iteration control loop: any engine, any controller, the faults in force.

    for k in iterations:  plan = controller.plan(k)
                          outcome = engine.run(plan, k, faults.at(k))
                          controller.observe(k, outcome.timeline)
                          on_iteration(k, outcome.timeline, measured)

Warm-up iterations come first and run healthy; a fault view counts its iterations from the
first measured one. Metrics are taken per iteration as it ends, so memory stays flat in the
number of iterations unless the caller keeps the timelines: a caller that wants some of them,
or wants to save each one as it ends, passes `on_iteration` (harness.saved).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable

from pipeline.engines import Controller, Engine, check_plan
from pipeline.errors import ConfigError
from pipeline.faults import NO_FAULTS, AfterWarmup, FaultView
from pipeline.metrics import compute_metrics
from pipeline.simulator import CommMode
from pipeline.timeline import Timeline

__all__ = ["OnIteration", "RunResult", "run_loop"]

OnIteration = Callable[[int, Timeline, bool], None]
"""Called as each iteration ends: (the engine's iteration index, warm-ups included; its
timeline; whether it is measured)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RunResult:
    """Measured iterations only: warm-up iterations are run but not reported."""

    iteration_times_ms: tuple[float, ...]
    step_times_ms: tuple[float, ...]
    bubble_ratios: tuple[float, ...]
    comms: tuple[CommMode, ...]
    """The comm mode of each measured iteration (a controller may switch it)."""
    timeline: Timeline | None
    """Every iteration's ops and messages (None when the caller did not keep it)."""
    controller: str = "fixed"
    """Which controller planned the iterations (pipeline.engines.control)."""
    losses: tuple[float, ...] = ()
    """Training loss of each measured iteration (engines that train; empty otherwise)."""
    params_sha256: str = ""
    """The trained model's parameters after the last iteration (pipeline.runtime.digest;
    engines that train; empty otherwise)."""

    @property
    def median_iteration_ms(self) -> float:
        return statistics.median(self.iteration_times_ms)

    @property
    def wall_times_ms(self) -> tuple[float, ...]:
        """Iteration plus step (DP all-reduce and optimizer): the time per training step."""
        return tuple(
            t + s for t, s in zip(self.iteration_times_ms, self.step_times_ms, strict=True)
        )

    @property
    def median_wall_ms(self) -> float:
        return statistics.median(self.wall_times_ms)

    @property
    def mean_iteration_ms(self) -> float:
        return statistics.fmean(self.iteration_times_ms)


def run_loop(
    engine: Engine,
    controller: Controller,
    *,
    num_iterations: int,
    num_warmup_iterations: int = 1,
    faults: FaultView = NO_FAULTS,
    keep_timeline: bool = True,
    on_iteration: OnIteration | None = None,
) -> RunResult:
    if num_iterations < 1 or num_warmup_iterations < 0:
        raise ConfigError("iterations must be >= 1 and warm-up iterations >= 0")
    view = AfterWarmup(faults, num_warmup_iterations)
    total = num_warmup_iterations + num_iterations
    times, steps, bubbles, comms, losses, parts = [], [], [], [], [], []
    digest = ""
    for k in range(total):
        plan = controller.plan(k)
        check_plan(engine, plan)
        outcome = engine.run(
            plan, k, view.at(k), digest=k == total - 1 and engine.capabilities.trains
        )
        controller.observe(k, outcome.timeline)
        digest = outcome.params_sha256 or digest
        if on_iteration is not None:
            on_iteration(k, outcome.timeline, k >= num_warmup_iterations)
        if keep_timeline:
            parts.append(outcome.timeline)
        if k < num_warmup_iterations:
            continue
        metrics = compute_metrics(outcome.timeline, k)
        times.append(metrics.iteration_time_ms)
        steps.append(metrics.step_time_ms)
        bubbles.append(metrics.bubble_ratio)
        comms.append(plan.comm)
        if outcome.loss is not None:
            losses.append(outcome.loss)
    return RunResult(
        iteration_times_ms=tuple(times),
        step_times_ms=tuple(steps),
        bubble_ratios=tuple(bubbles),
        comms=tuple(comms),
        timeline=Timeline.concat(parts) if keep_timeline else None,
        controller=controller.name,
        losses=tuple(losses),
        params_sha256=digest,
    )
