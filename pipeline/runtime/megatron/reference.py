"""One process training the whole model: the reference a pipelined run must equal."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from pipeline.errors import BackendError
from pipeline.runtime.megatron.backend import build_initial_stage
from pipeline.runtime.megatron.model import (
    GPTPreset,
    global_param_name,
    microbatch_tokens,
)
from pipeline.runtime.megatron.shim import cpu_shim, quiet_megatron
from pipeline.runtime.megatron.stage import StageRunner, sgd_step

__all__ = ["ReferenceIteration", "build_whole_model", "single_process_megatron", "train_reference"]


@contextlib.contextmanager
def single_process_megatron(device: str = "cpu") -> Iterator[None]:
    """A one-rank gloo group and megatron's parallel state (TP = PP = DP = 1), torn down on
    exit. For a model on the CPU (`device`), megatron's CUDA-only spots are patched for the
    duration; on a GPU they are megatron's own."""
    with quiet_megatron():
        from megatron.core import parallel_state

    if dist.is_initialized():
        raise BackendError("a process group already exists in this process")
    with (
        tempfile.TemporaryDirectory(prefix="adaptra-megatron-") as tmp,
        _environ("GLOO_SOCKET_IFNAME", "lo"),
    ):
        dist.init_process_group(
            "gloo",
            init_method=f"file://{Path(tmp) / 'rendezvous'}",
            rank=0,
            world_size=1,
            timeout=dt.timedelta(seconds=60),
        )
        try:
            parallel_state.initialize_model_parallel(create_gloo_process_groups=False)
            with cpu_shim() if device == "cpu" else contextlib.nullcontext():
                yield
        finally:
            parallel_state.destroy_model_parallel()
            dist.destroy_process_group()


@contextlib.contextmanager
def _environ(name: str, default: str) -> Iterator[None]:
    """`name` set to `default` unless already set; restored on exit."""
    old = os.environ.get(name)
    os.environ.setdefault(name, default)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)


def build_whole_model(preset: GPTPreset, seed: int) -> Any:
    """The whole model as one stage, initialised as every stage count initialises it;
    inside `single_process_megatron()`."""
    with quiet_megatron():
        return build_initial_stage(preset, 0, 1, seed=seed, device=torch.device("cpu"))


@dataclasses.dataclass(frozen=True, slots=True)
class ReferenceIteration:
    loss: float
    """Mean loss over the iteration's microbatches (all replicas)."""
    grads: dict[str, np.ndarray]
    """Accumulated gradients before the optimizer step, by parameter name."""


def train_reference(
    model: Any,
    preset: GPTPreset,
    *,
    num_microbatches: int,
    num_replicas: int,
    num_iterations: int,
    seed: int,
    lr: float,
) -> list[ReferenceIteration]:
    """Fused forward/backward of replica 0's microbatches, then replica 1's, ...; one SGD
    step per iteration (what a PP x DP run with averaged DP gradients must equal)."""
    total = num_microbatches * num_replicas
    runner = StageRunner(model, loss_scale=1.0 / total)
    results = []
    for _ in range(num_iterations):
        runner.reset()
        for replica in range(num_replicas):
            for m in range(num_microbatches):
                idx = replica * num_microbatches + m
                tokens, labels = microbatch_tokens(preset, seed, idx)
                runner.forward(idx, tokens=tokens, labels=labels, deferred=False)
                runner.backward_fused(idx, None)
        grads = {
            global_param_name(name, 0): p.grad.detach().numpy().copy()
            for name, p in model.named_parameters()
            if p.grad is not None
        }
        results.append(ReferenceIteration(sum(runner.losses.values()) / total, grads))
        sgd_step(runner.params, lr)
    return results
