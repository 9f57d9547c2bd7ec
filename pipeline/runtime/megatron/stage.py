"""One stage's ops on one microbatch: F, B (input gradient), W (weight gradients), fused BW."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch

from pipeline.errors import BackendError
from pipeline.runtime.megatron.split_backward import (
    WeightGradStore,
    accumulate_grad,
    deferred_linears,
)

__all__ = ["StageRunner", "sgd_step"]


@dataclasses.dataclass(slots=True)
class _Saved:
    stage_input: torch.Tensor | None
    """The received activation (a leaf that wants its gradient); None on stage 0."""
    output: torch.Tensor
    """The activation sent on, or on the last stage the microbatch's scaled loss."""


class StageRunner:
    """Runs a megatron GPTModel stage microbatch by microbatch, keeping what B and W need.

    The last stage's loss for a microbatch is the mean per-token loss times `loss_scale`
    (1 / the number of microbatches in the global batch), so gradients accumulated over the
    iteration are those of the batch's mean loss.
    """

    def __init__(self, model: Any, loss_scale: float = 1.0) -> None:
        self.model = model
        self.first, self.last = bool(model.pre_process), bool(model.post_process)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.loss_scale = loss_scale
        self.store = WeightGradStore()
        self.losses: dict[int, float] = {}
        """Unscaled mean loss per microbatch (last stage)."""
        self._saved: dict[int, _Saved] = {}
        self._param_grads: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def forward(
        self,
        microbatch: int,
        *,
        tokens: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        stage_input: torch.Tensor | None = None,
        deferred: bool = True,
    ) -> torch.Tensor | None:
        """F: the activation to send on (None on the last stage). Stage 0 takes `tokens`, or a
        `stage_input` in their place (the embedding is then skipped); the last takes `labels`."""
        if microbatch in self._saved:
            raise BackendError(f"F{microbatch} ran twice before its backward")
        x = None if stage_input is None else stage_input.detach().clone().requires_grad_(True)
        kwargs: dict[str, Any] = {"attention_mask": None}
        if self.first and x is None:
            if tokens is None:
                raise BackendError("the first stage needs tokens (or a stage input)")
            batch, seq = tokens.shape
            kwargs["input_ids"] = tokens
            kwargs["position_ids"] = torch.arange(seq, device=tokens.device).expand(batch, seq)
        else:
            kwargs["input_ids"] = kwargs["position_ids"] = None
            if x is None:
                raise BackendError("a stage after the first needs its input activation")
            if self.first:
                kwargs["decoder_input"] = x
            else:
                self.model.set_input_tensor(x)
        if self.last:
            if labels is None:
                raise BackendError("the last stage needs labels")
            kwargs["labels"] = labels
        with deferred_linears(self.store) if deferred else contextlib.nullcontext():
            output = self.model(**kwargs)
        if self.last:
            loss = output.float().mean()
            self.losses[microbatch] = float(loss.detach())
            output = loss * self.loss_scale
        self._saved[microbatch] = _Saved(x, output)
        return None if self.last else output.detach().contiguous()

    def _take(self, microbatch: int) -> _Saved:
        saved = self._saved.pop(microbatch, None)
        if saved is None:
            raise BackendError(f"backward of microbatch {microbatch} before its F (or twice)")
        return saved

    def backward_input(
        self, microbatch: int, grad_output: torch.Tensor | None
    ) -> torch.Tensor | None:
        """B: only the gradient w.r.t. the stage input (None on stage 0). Parameter gradients
        stay untouched: the linears' weight GEMMs are queued and the other parameters'
        gradients (norms, embeddings, biases: cheap to compute) are kept for W. A first
        stage's word-embedding gradient is dense, vocabulary x hidden, and held per
        microbatch until its W (gpt2-124m: 154 MB each in float32). `grad_output` must stay
        as it is until the microbatch's W: the last layer's queued GEMM reads it, uncopied
        (the worker receives each microbatch into a buffer of its own)."""
        saved = self._take(microbatch)
        lead = [] if saved.stage_input is None else [saved.stage_input]
        with self.store.defer(microbatch):
            grads = torch.autograd.grad(
                saved.output,
                lead + self.params,
                grad_outputs=None if self.last else grad_output,
                allow_unused=True,
            )
        self._param_grads[microbatch] = [
            (p, g) for p, g in zip(self.params, grads[len(lead) :], strict=True) if g is not None
        ]
        return grads[0] if lead else None

    def backward_weight(self, microbatch: int) -> None:
        """W: the queued weight GEMMs and the kept gradients, accumulated into the parameters."""
        if microbatch not in self._param_grads:
            raise BackendError(f"W{microbatch} before its B")
        self.store.flush(microbatch)
        for param, grad in self._param_grads.pop(microbatch):
            accumulate_grad(param, grad)

    def backward_fused(
        self, microbatch: int, grad_output: torch.Tensor | None
    ) -> torch.Tensor | None:
        """torch's ordinary backward (input and weight gradients together), for references and
        measurements; run the forward with `deferred=False`."""
        saved = self._take(microbatch)
        torch.autograd.backward(saved.output, None if self.last else grad_output)
        return None if saved.stage_input is None else saved.stage_input.grad

    def check_drained(self) -> None:
        """Every F had its backward and every B its W."""
        left = sorted(self._saved) + sorted(self._param_grads)
        if left:
            raise BackendError(f"microbatch(es) {left} still wait for a backward or a W")

    def reset(self) -> None:
        self._saved.clear()
        self._param_grads.clear()
        self.store.clear()
        self.losses.clear()


@torch.no_grad()
def sgd_step(params: list[torch.Tensor], lr: float) -> None:
    """Plain SGD, then the gradients are cleared."""
    for param in params:
        if param.grad is not None:
            param.add_(param.grad, alpha=-lr)
            param.grad = None
