"""The B/W split is real: B leaves every parameter gradient alone, W touches only them, and
B + W do one fused backward's work (no recomputation). One process, no pipeline."""

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from pipeline.runtime.megatron.model import get_preset, microbatch_tokens
from pipeline.runtime.megatron.reference import build_whole_model, single_process_megatron
from pipeline.runtime.megatron.stage import StageRunner


@pytest.fixture(scope="module")
def megatron_process() -> Iterator[None]:
    with single_process_megatron():
        yield


def _grads(model: Any) -> dict[str, torch.Tensor | None]:
    return {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


def _params(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


TIED = "embedding.word_embeddings.weight"


def _assert_same(a: dict[str, Any], b: dict[str, Any], *, rounding: str = "") -> None:
    """Bit-equal, except `rounding`: equal up to the order of a sum."""
    assert a.keys() == b.keys()
    for name in a:
        if a[name] is None or b[name] is None:
            assert a[name] is None and b[name] is None, name
        elif name == rounding:
            torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(a[name], b[name]), f"{name} changed"


@pytest.mark.parametrize("with_input", [True, False], ids=["stage-input", "tokens"])
def test_b_leaves_gradients_and_w_only_adds_them(megatron_process: None, with_input: bool) -> None:
    preset = get_preset("tiny")
    model = build_whole_model(preset, seed=0)
    runner = StageRunner(model)
    tokens, labels = microbatch_tokens(preset, 0, 0)
    x = torch.randn(preset.message_shape(), generator=torch.Generator().manual_seed(1))
    feed = {"stage_input": x} if with_input else {"tokens": tokens}

    # The fused reference: microbatch 0 twice, torch's ordinary backward.
    for m in (0, 1):
        runner.forward(m, labels=labels, deferred=False, **feed)
        fused_input_grad = runner.backward_fused(m, None)
    fused = _grads(model)
    for p in runner.params:
        p.grad = None

    runner.forward(0, labels=labels, deferred=False, **feed)
    runner.backward_fused(0, None)  # gradients already hold one microbatch
    before, params = _grads(model), _params(model)
    runner.forward(1, labels=labels, **feed)
    input_grad = runner.backward_input(1, None)
    _assert_same(_grads(model), before)  # B: every gradient bit-unchanged
    _assert_same(_params(model), params)
    if with_input:
        assert input_grad is not None and torch.equal(input_grad, fused_input_grad)
        kept = input_grad.clone()
    else:
        assert input_grad is None
    runner.backward_weight(1)
    _assert_same(_params(model), params)  # W: parameters untouched ...
    if with_input:
        assert torch.equal(input_grad, kept)  # ... and B's result too
    after = _grads(model)
    changed = [n for n, g in after.items() if g is not None and not torch.equal(g, before[n])]
    assert len(changed) == sum(g is not None for g in fused.values())  # W adds to each one
    # The fused backward's gradients: exactly, but for the tied embedding of this one-stage
    # model with tokens: autograd adds its lookup and head gradients before accumulating them,
    # W accumulates them one by one.
    _assert_same(after, fused, rounding=TIED)
    runner.check_drained()


def test_b_plus_w_computes_one_fused_backward_s_flops(megatron_process: None) -> None:
    """B + W do exactly the fused backward's floating-point work, counted op by op, so B does
    not redo W's GEMMs (the generic split of torch.distributed.pipelining costs ~2x here:
    measured here); W holds the weight GEMMs, about half of it. What that is in time is a
    benchmark (bench_megatron_split.py), not a test: load only moves times."""
    from torch.utils.flop_counter import FlopCounterMode

    preset = get_preset("tiny")
    model = build_whole_model(preset, seed=0)
    runner = StageRunner(model)
    _, labels = microbatch_tokens(preset, 0, 0)
    x = torch.randn(preset.message_shape(), generator=torch.Generator().manual_seed(1))

    def flops(step: Any) -> int:
        with FlopCounterMode(display=False) as counter:
            step()
        return int(counter.get_total_flops())

    forward = flops(lambda: runner.forward(0, labels=labels, stage_input=x, deferred=False))
    fused = flops(lambda: runner.backward_fused(0, None))
    assert flops(lambda: runner.forward(0, labels=labels, stage_input=x)) == forward
    b = flops(lambda: runner.backward_input(0, None))
    w = flops(lambda: runner.backward_weight(0))
    assert fused == 2 * forward > 0  # a backward is two GEMMs for every forward one
    assert b + w == fused
    assert 0.4 * fused < w < 0.6 * fused and 0.4 * fused < b < 0.6 * fused
    runner.check_drained()
