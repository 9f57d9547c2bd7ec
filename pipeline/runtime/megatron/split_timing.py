"""How long one microbatch's backward takes fused and split into B then W, on one stage: the
measurement of the B/W split's cost (benchmarks/bench_megatron_split.py on CPUs, the GPU
check's `split_ratio`). A property of the split (nothing recomputed: a ratio of about 1), not a
speed claim on a machine with no GPU."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

import torch

from pipeline.runtime.megatron.stage import StageRunner

__all__ = ["BackwardTimes", "time_backwards"]

NUM_WARMUPS = 2


@dataclasses.dataclass(frozen=True)
class BackwardTimes:
    """Medians (ms) of a fused backward, of B and of W after it."""

    fused_ms: float
    b_ms: float
    w_ms: float

    @property
    def split_over_fused(self) -> float:
        return (self.b_ms + self.w_ms) / self.fused_ms


def time_backwards(
    runner: StageRunner, labels: torch.Tensor, stage_input: torch.Tensor, num_repeats: int
) -> BackwardTimes:
    """Per repeat, after `NUM_WARMUPS` unrecorded: a forward with megatron's own linear
    Function and its fused backward, then a forward with the deferring linear, B, then W.
    Each backward starts from no gradients: one onto earlier gradients adds to them, a pass
    over every gradient that a backward from none (autograd handing its results over) does
    not make. On a GPU each time ends at a synchronisation (`stage_input`'s device)."""
    device = stage_input.device
    fused_ms: list[float] = []
    b_ms: list[float] = []
    w_ms: list[float] = []
    for k in range(NUM_WARMUPS + num_repeats):
        _clear_grads(runner)
        runner.forward(0, labels=labels, stage_input=stage_input, deferred=False)
        fused = _timed(device, lambda: runner.backward_fused(0, None))
        _clear_grads(runner)
        runner.forward(0, labels=labels, stage_input=stage_input)
        b = _timed(device, lambda: runner.backward_input(0, None))
        w = _timed(device, lambda: runner.backward_weight(0))
        if k >= NUM_WARMUPS:
            fused_ms.append(fused)
            b_ms.append(b)
            w_ms.append(w)
    _clear_grads(runner)
    return BackwardTimes(
        statistics.median(fused_ms), statistics.median(b_ms), statistics.median(w_ms)
    )


def _timed(device: torch.device, call: Callable[[], object]) -> float:
    """`call`'s time in ms, from a device with no work queued to one with none left."""
    _sync(device)
    start = time.perf_counter()
    call()
    _sync(device)
    return (time.perf_counter() - start) * 1e3


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _clear_grads(runner: StageRunner) -> None:
    for param in runner.params:
        param.grad = None
