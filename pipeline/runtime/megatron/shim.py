"""Make megatron-core 0.16.1 run on a CPU: a few CUDA-only spots, patched only while needed.

megatron-core assumes CUDA in a handful of places on the path this backend takes (a GPTModel
with the local layer spec, forward and backward, no megatron schedule or optimizer):
- the CUDA RNG tracker that attention and embedding dropout fork
  (`tensor_parallel/random.py`): mapped to the CPU's default generator;
- `GlobalMemoryBuffer.get_tensor` (`utils.py`), which allocates on `torch.cuda.current_device()`;
- the default causal mask (`transformer/utils.py`, imported by `fusions/fused_softmax.py`),
  built with `device="cuda"`;
- while a model is built: the tied-embedding copy on the last pipeline stage calls
  `Tensor.cuda()` before its all-reduce.
`cpu_shim()` patches exactly these attributes and restores them on exit (also on errors), so a
process that never enters it, or a GPU run, sees megatron unchanged. `gpu_stand_in()` lets a
CPU check what a build on a GPU places where (the meta device in the GPU's place).
"""

from __future__ import annotations

import contextlib
import functools
import operator
import warnings
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["cpu_shim", "gpu_stand_in", "patched", "quiet_megatron", "seed_cpu_rng_tracker"]

_MISSING = object()


@contextlib.contextmanager
def patched(target: Any, name: str, value: Any) -> Iterator[None]:
    """Set `target.name = value` for the duration; restore (or remove) it afterwards."""
    own = vars(target).get(name, _MISSING) if isinstance(target, type) else _MISSING
    old = getattr(target, name, _MISSING) if own is _MISSING else own
    setattr(target, name, value)
    try:
        yield
    finally:
        if isinstance(target, type) and own is _MISSING:
            delattr(target, name)  # it was inherited: uncover the parent's again
        elif old is _MISSING:
            delattr(target, name)
        else:
            setattr(target, name, old)


def _get_rng_state(*args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.get_rng_state()


def _set_rng_state(new_state: torch.Tensor, *args: Any, **kwargs: Any) -> None:
    torch.set_rng_state(new_state)


def _get_tensor(
    self: Any, tensor_shape: Any, dtype: torch.dtype, name: str, mem_alloc_context: Any = None
) -> torch.Tensor:
    """`GlobalMemoryBuffer.get_tensor` on the CPU: the same reuse of one buffer per name."""
    required_len = functools.reduce(operator.mul, tensor_shape, 1)
    buffer = self.buffer.get((name, dtype))
    if buffer is None or buffer.numel() < required_len:
        buffer = torch.empty(required_len, dtype=dtype, requires_grad=False)
        self.buffer[(name, dtype)] = buffer
    return buffer[0:required_len].view(*tensor_shape)


@functools.lru_cache(maxsize=8)
def _causal_mask(sq: int) -> torch.Tensor:
    return torch.triu(torch.ones(sq, sq), diagonal=1).bool()


def _no_cuda(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return self


@contextlib.contextmanager
def cpu_shim(*, building: bool = False) -> Iterator[None]:
    """Patch megatron's CUDA-only spots for the duration; `building` also while a model is
    constructed (the tied-embedding copy). Cheap: a handful of attribute swaps."""
    from megatron.core import utils as mcore_utils
    from megatron.core.fusions import fused_softmax
    from megatron.core.tensor_parallel import random as mcore_random
    from megatron.core.transformer import utils as transformer_utils

    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(mcore_random, "_get_cuda_rng_state", _get_rng_state))
        stack.enter_context(patched(mcore_random, "_set_cuda_rng_state", _set_rng_state))
        stack.enter_context(patched(mcore_utils.GlobalMemoryBuffer, "get_tensor", _get_tensor))
        stack.enter_context(patched(fused_softmax, "get_default_causal_mask", _causal_mask))
        stack.enter_context(patched(transformer_utils, "get_default_causal_mask", _causal_mask))
        if building:
            stack.enter_context(patched(torch.Tensor, "cuda", _no_cuda))
        yield


def seed_cpu_rng_tracker(seed: int) -> None:
    """What `model_parallel_cuda_manual_seed` does with TP = EP = 1, with CPU generator states:
    the tracker's named states exist (attention forks one) and are seeded as megatron seeds them."""
    from megatron.core.tensor_parallel import random as mcore_random

    def state(value: int) -> torch.Tensor:
        return torch.Generator().manual_seed(value).get_state()

    tracker = mcore_random.get_cuda_rng_tracker()
    tracker.reset()
    tracker.set_states(
        {
            mcore_random._DATA_PARALLEL_RNG_TRACKER_NAME: state(seed),
            mcore_random._MODEL_PARALLEL_RNG_TRACKER_NAME: state(seed + 2718),
            mcore_random._EXPERT_PARALLEL_RNG_TRACKER_NAME: state(seed + 1024),
        }
    )


STAND_IN_DEVICE = "meta"
"""The device `gpu_stand_in` puts in a GPU's place: distinct from the host, so whatever a
build leaves there shows, and free (its tensors hold no data)."""


@contextlib.contextmanager
def gpu_stand_in() -> Iterator[None]:
    """For the duration, megatron builds "on the GPU" on a CPU: `torch.cuda.current_device()`
    answers `STAND_IN_DEVICE` (where megatron allocates its parallel layers off the CPU) and
    megatron's CUDA seeding (`model_parallel_cuda_manual_seed`) is `seed_cpu_rng_tracker`,
    which needs no CUDA. Inside `cpu_shim()` (megatron's RNG tracker forks CPU states): a
    model built for device `STAND_IN_DEVICE` then goes down the GPU path, short of kernels."""
    from megatron.core import tensor_parallel

    def current_device() -> str:
        return STAND_IN_DEVICE

    with (
        patched(torch.cuda, "current_device", current_device),
        patched(tensor_parallel, "model_parallel_cuda_manual_seed", seed_cpu_rng_tracker),
    ):
        yield


@contextlib.contextmanager
def quiet_megatron() -> Iterator[None]:
    """Silence megatron's import- and build-time UserWarnings (Apex and Transformer Engine not
    installed, deprecated defaults): every worker would print them all."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.")
        yield
