"""Measure a megatron model's per-stage tF, tB, tW and message size: a profile file for the
simulator and the schedulers.

The stages run as real workers (one process each) on a schedule with separate F, B and W ops
(by default ZB-H1's: a stage holds at most as many microbatches' activations as 1F1B, S on the
first, whatever the microbatch count); each op's duration is its median over the measured
iterations. On a machine with fewer cores than stages the workers share cores, so
the times there say little about any real machine (no performance claim comes from them).
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable

from pipeline.errors import BackendError, ConfigError
from pipeline.ops import OpKind
from pipeline.profile import Profile
from pipeline.runtime.megatron.model import GPTPreset, get_preset
from pipeline.schedule import Schedule, validate_schedule
from pipeline.timeline import Timeline
from pipeline.zero_bubble import zb_h1

__all__ = ["measure_profile", "measuring_order"]


def measuring_order(num_stages: int, num_microbatches: int) -> Schedule:
    """ZB-H1 (valid for any S <= N): separate F, B and W ops, with a memory bounded by the
    stage count. Every F, then every B, then every W (the default before) held every
    microbatch's activations at once: about 31 MiB more per microbatch for `small` at S = 2
    (benchmarks/bench_profile_memory.py)."""
    return zb_h1(Profile.uniform(num_stages, num_microbatches, 1.0, 1.0, 1.0))


def measure_profile(
    model: str | GPTPreset,
    num_stages: int,
    num_microbatches: int,
    *,
    num_iterations: int = 3,
    num_warmup_iterations: int = 1,
    schedule: Schedule | None = None,
    seed: int = 0,
    on_iteration: Callable[[], None] | None = None,
    allow_tf32: bool = False,
) -> Profile:
    """A profile of `model` split into `num_stages`: median F/B/W times per stage (ms) and the
    bytes of one stage-boundary message; nothing else is measured (delays 0, no limits).
    `on_iteration` is called as each iteration (warm-up ones too) ends; `model` is a
    preset or its name; `allow_tf32`: MegatronCompute's."""
    from pipeline.runtime import IterationConfig, WorkerPool
    from pipeline.runtime.hooks import preload_in_workers
    from pipeline.runtime.megatron import WORKER_IMPORTS
    from pipeline.runtime.megatron.backend import MegatronCompute

    preset = get_preset(model) if isinstance(model, str) else model
    preset.check_stages(num_stages)
    if num_iterations < 1 or num_warmup_iterations < 0:
        raise ConfigError("iterations must be >= 1 and warm-up iterations >= 0")
    placeholder = Profile.uniform(num_stages, num_microbatches, 1.0, 1.0, 1.0)
    order = schedule or measuring_order(num_stages, num_microbatches)
    validate_schedule(order, num_stages, num_microbatches)
    factory = functools.partial(MegatronCompute, preset, seed=seed, allow_tf32=allow_tf32)
    total = num_warmup_iterations + num_iterations
    preload_in_workers(WORKER_IMPORTS)
    with WorkerPool(num_stages, compute_factory=factory) as pool:
        parts = []
        for i in range(total):
            parts.append(pool.run_iteration(IterationConfig(i, order, placeholder)))
            if on_iteration is not None:
                on_iteration()
    timeline = Timeline.concat(parts[num_warmup_iterations:])
    times = {
        kind: _median_ms(timeline, num_stages, kind) for kind in OpKind if kind is not OpKind.BW
    }
    return Profile(
        num_stages=num_stages,
        num_microbatches=num_microbatches,
        t_f_ms=times[OpKind.F],
        t_b_ms=times[OpKind.B],
        t_w_ms=times[OpKind.W],
        message_bytes=preset.message_bytes(),
    )


def _median_ms(timeline: Timeline, num_stages: int, kind: OpKind) -> tuple[float, ...]:
    per_stage: list[list[float]] = [[] for _ in range(num_stages)]
    for op in timeline.ops:
        if op.kind is kind:
            per_stage[op.stage].append(op.end_ms - op.start_ms)
    if not all(per_stage):
        raise BackendError(f"the schedule ran no {kind.value} op on some stage")
    return tuple(round(statistics.median(d), 4) for d in per_stage)
