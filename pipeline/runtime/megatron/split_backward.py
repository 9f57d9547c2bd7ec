"""A true B/W split for megatron-core: the weight-gradient GEMMs are deferred, not redone.

megatron's column- and row-parallel linears (the output head too) run one custom autograd
Function, `LinearWithGradAccumulationAndAsyncCommunication`, whose backward computes the input
and the weight gradient together. megatron looks that class up at call time, so binding a
subclass in its place (`deferred_linears`) covers every linear built on it. While a store is
deferring (inside B), the subclass's backward computes only the input gradient and the bias
gradient (a cheap sum) and queues (weight, input, grad_output); W then runs the queued GEMMs
and accumulates them (the idea of ZeroBubble's WeightGradStore). Outside B it behaves exactly
as megatron's own backward. megatron's DDP gradient hooks do not fire for deferred weights: a
caller using its DDP would have to trigger them after W (this backend reduces gradients
itself).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from pipeline.errors import BackendError
from pipeline.runtime.megatron.shim import patched

__all__ = ["WeightGradStore", "accumulate_grad", "deferred_linears"]


@dataclasses.dataclass(slots=True)
class _Deferred:
    weight: torch.Tensor
    inputs: torch.Tensor
    grad_output: torch.Tensor


class WeightGradStore:
    """Weight-gradient GEMMs queued by B, per microbatch, until that microbatch's W."""

    def __init__(self) -> None:
        self._queues: dict[int, list[_Deferred]] = {}
        self._current: list[_Deferred] | None = None
        self._linear_class: Any = None

    @property
    def deferring(self) -> bool:
        return self._current is not None

    @contextlib.contextmanager
    def defer(self, microbatch: int) -> Iterator[None]:
        """Inside: linears queue their weight GEMMs under `microbatch` instead of running them."""
        if self._current is not None:
            raise BackendError("a weight-gradient store is already deferring (nested B?)")
        if microbatch in self._queues:
            raise BackendError(
                f"microbatch {microbatch} already has deferred weight gradients (B twice?)"
            )
        queue: list[_Deferred] = []
        self._current = queue
        try:
            yield
        finally:
            self._current = None
        self._queues[microbatch] = queue

    def queue(self, weight: torch.Tensor, inputs: torch.Tensor, grad_output: torch.Tensor) -> None:
        assert self._current is not None
        self._current.append(_Deferred(weight, inputs, grad_output))

    def pending(self) -> list[int]:
        return sorted(self._queues)

    def flush(self, microbatch: int) -> int:
        """Run `microbatch`'s queued weight GEMMs and accumulate them; how many ran."""
        queue = self._queues.pop(microbatch, None)
        if queue is None:
            raise BackendError(f"microbatch {microbatch} has no deferred weight gradients (no B?)")
        for item in queue:
            # The GEMM of megatron's fused backward, on the same 2-D views: equal results.
            accumulate_grad(item.weight, item.grad_output.t().matmul(item.inputs))
        return len(queue)

    def clear(self) -> None:
        self._queues.clear()


@torch.no_grad()
def accumulate_grad(param: torch.Tensor, grad: torch.Tensor) -> None:
    """Add to `main_grad` where megatron's DDP gave the parameter one, else to `.grad`, as
    autograd's accumulation would (the first gradient is taken as it is, a view copied)."""
    main_grad = getattr(param, "main_grad", None)
    if main_grad is not None:
        main_grad.add_(grad)
    elif param.grad is None:
        param.grad = grad.clone() if grad._is_view() else grad
    else:
        param.grad.add_(grad)


def _deferring_subclass(base: Any, store: WeightGradStore) -> Any:
    """`base` (megatron's linear Function) with a backward that defers to `store` in B."""

    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if not store.deferring:
            return base.backward(ctx, grad_output)  # type: ignore[no-any-return]
        if ctx.sequence_parallel or ctx.gradient_accumulation_fusion:
            raise BackendError(
                "the deferred weight gradient supports neither sequence parallelism nor "
                "gradient-accumulation fusion; turn them off in the TransformerConfig"
            )
        inputs, weight = ctx.saved_tensors
        grad_input = grad_output.matmul(weight)
        if ctx.allreduce_dgrad:  # tensor parallelism: the input gradient is summed over TP
            dist.all_reduce(grad_input, group=ctx.tp_group)
        grad_output = grad_output.contiguous()
        inputs = inputs.contiguous()
        if grad_output.dim() == 3:  # megatron's 2-D views for the weight GEMM
            grad_output = grad_output.view(-1, grad_output.shape[2])
            inputs = inputs.view(-1, inputs.shape[2])
        store.queue(weight, inputs, grad_output)
        grad_bias = grad_output.sum(dim=0) if ctx.use_bias else None
        return grad_input, None, grad_bias, None, None, None, None, None, None

    return type("DeferredWeightGradLinear", (base,), {"backward": staticmethod(backward)})


@contextlib.contextmanager
def deferred_linears(store: WeightGradStore) -> Iterator[None]:
    """Forwards run inside build autograd nodes whose backward defers to `store` (in B)."""
    from megatron.core.tensor_parallel import layers

    name = "LinearWithGradAccumulationAndAsyncCommunication"
    if store._linear_class is None:
        store._linear_class = _deferring_subclass(getattr(layers, name), store)
    with patched(layers, name, store._linear_class):
        yield
