"""The one metrics function: every engine's timeline is measured by `compute_metrics`."""

from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.ops import MEMORY_DELTA
from pipeline.timeline import OpRecord, Timeline

__all__ = ["Metrics", "StageMetrics", "compute_metrics"]


@dataclasses.dataclass(frozen=True, slots=True)
class StageMetrics:
    busy_ms: float
    """Time spent computing ops; time blocked on a send or a copy is idle."""
    idle_ms: float
    peak_memory: float
    """Peak running activation count (F +1, B -1/2, W -1/2, BW -1), in microbatches."""


@dataclasses.dataclass(frozen=True, slots=True)
class Metrics:
    iteration_time_ms: float
    """Latest op end, from t = 0 when stage 0 may start; excludes DP all-reduce and step."""
    max_stage_span_ms: float
    """Longest first-op-start to last-op-end span of any stage."""
    bubble_ratio: float
    """1 - sum(busy) / (S * iteration time), at least 0: with DP, replica 0's busy time
    against the iteration time over every replica (docs/design.md, "Results")."""
    step_time_ms: float
    """The part of the step after the last op: the DP all-reduce and the optimizer."""
    stages: tuple[StageMetrics, ...]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def compute_metrics(timeline: Timeline, iteration: int = 0) -> Metrics:
    """Metrics of one iteration of a timeline. With DP, the iteration time spans every
    replica; the per-stage figures (and so the bubble ratio) are replica 0's."""
    bounds = next((r for r in timeline.iterations if r.iteration == iteration), None)
    if bounds is None:
        raise ValueError(f"timeline has no iteration {iteration}")
    per_stage: list[list[OpRecord]] = [[] for _ in range(timeline.num_stages)]
    iteration_end = bounds.start_ms
    for record in timeline.ops:
        if record.iteration == iteration:
            iteration_end = max(iteration_end, record.end_ms)  # every replica counts here
            if record.replica == 0:
                per_stage[record.stage].append(record)
    iteration_time = iteration_end - bounds.start_ms
    stages = []
    max_span = 0.0
    for ops in per_stage:
        ops.sort(key=lambda r: r.start_ms)
        busy = sum(r.end_ms - r.start_ms for r in ops)
        total = peak = 0.0
        for record in ops:
            total += MEMORY_DELTA[record.kind]
            peak = max(peak, total)
        if ops:
            max_span = max(max_span, max(r.end_ms for r in ops) - ops[0].start_ms)
        stages.append(StageMetrics(busy_ms=busy, idle_ms=iteration_time - busy, peak_memory=peak))
    total_busy = sum(s.busy_ms for s in stages)
    capacity = timeline.num_stages * iteration_time
    return Metrics(
        iteration_time_ms=iteration_time,
        max_stage_span_ms=max_span,
        # at least 0: op times summed may pass the span they fill by a rounding error
        bubble_ratio=max(0.0, 1.0 - total_busy / capacity) if capacity > 0 else 0.0,
        step_time_ms=bounds.step_time_ms,
        stages=tuple(stages),
    )
