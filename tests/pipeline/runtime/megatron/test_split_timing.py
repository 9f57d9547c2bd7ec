"""The backward timing (bench_megatron_split.py, the GPU check's split_ratio) times each
backward from no gradients."""

from typing import Any

import pytest
import torch

from pipeline.runtime.megatron.model import get_preset, microbatch_tokens
from pipeline.runtime.megatron.reference import build_whole_model, single_process_megatron
from pipeline.runtime.megatron.split_timing import NUM_WARMUPS, time_backwards
from pipeline.runtime.megatron.stage import StageRunner


def _record_backwards(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """What the fused and weight backwards find, in the order they run: ("fused" or "W",
    whether any parameter already had a gradient)."""
    fused, weight = StageRunner.backward_fused, StageRunner.backward_weight
    seen: list[tuple[str, bool]] = []

    def had_grads(runner: StageRunner) -> bool:
        return any(p.grad is not None for p in runner.params)

    def backward_fused(runner: StageRunner, *args: Any) -> Any:
        seen.append(("fused", had_grads(runner)))
        return fused(runner, *args)

    def backward_weight(runner: StageRunner, *args: Any) -> None:
        seen.append(("W", had_grads(runner)))
        weight(runner, *args)

    monkeypatch.setattr(StageRunner, "backward_fused", backward_fused)
    monkeypatch.setattr(StageRunner, "backward_weight", backward_weight)
    return seen


def test_every_backward_starts_from_no_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    """(B + W) / fused compares like with like. The fused backward once ran onto the last
    repeat's W's gradients, and W onto the fused backward's: each added to gradients there (a
    pass over every gradient; on a GPU about half a weight GEMM's time again) where a backward
    from none, autograd handing its results over, makes no such pass."""
    seen = _record_backwards(monkeypatch)
    preset = get_preset("tiny")
    _, labels = microbatch_tokens(preset, 0, 0)
    x = torch.randn(preset.message_shape(), generator=torch.Generator().manual_seed(1))
    with single_process_megatron():
        runner = StageRunner(build_whole_model(preset, seed=0))
        times = time_backwards(runner, labels, x, num_repeats=2)
    assert seen == [("fused", False), ("W", False)] * (NUM_WARMUPS + 2)
    assert times.fused_ms > 0 and times.b_ms > 0 and times.w_ms > 0
    assert times.split_over_fused == (times.b_ms + times.w_ms) / times.fused_ms
    assert all(p.grad is None for p in runner.params)  # nothing left behind
