"""Where a worker computes, where its messages live, and which process-group backend carries
them: chosen once per pool from the number of workers and of GPUs.

Every pool talks over gloo, which sends host memory: with GPUs, a worker whose backend
computes on one (`ComputeBackend.uses_gpu`: megatron's, not the emulated one's) computes on
cuda:(r mod G) and its messages (and the DP ring's chunks, the tied gradient, a rank swap's
state, the delegates' port exchange) are copied between the GPU and the host on each side.
NCCL is not used, even where every worker has a GPU of its own, until its path is proven
(no machine here has more than one GPU): the runtime's messages rely on gloo's
point-to-point semantics, and NCCL's differ in ways that break them by construction
(`WHY_NOT_NCCL`). Without a GPU everything is on the CPU.
"""

from __future__ import annotations

import dataclasses

import torch

from pipeline.errors import ConfigError

__all__ = ["WHY_NOT_NCCL", "RankDevices", "choose_devices", "describe_pool", "num_visible_gpus"]


WHY_NOT_NCCL = "not NCCL: it ignores the tags the runtime's pre-posted receives rely on"
"""Why no pool takes NCCL, in `describe_pool`'s line for a pool on GPUs. In full: a worker
posts every receive of an iteration before its first op (the receiver threads wait on them;
gloo blocks a send until its receive is posted) and tells messages apart by tag (PP messages,
the tied gradient, the DP ring's chunks, a swap's state); NCCL ignores tags and runs a pair
of ranks' sends and receives in posting order on one stream, so two neighbours that have
pre-posted their receives from each other deadlock at their first message: each one's
first receive waits for a send the other queued behind its own receives. Besides: NCCL
refuses host tensors (the delegates' port exchange sends some), and its `wait()` returns
before the data is in unless TORCH_NCCL_BLOCKING_WAIT=1 (receiver.py stamps arrivals as
waits return)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RankDevices:
    """One worker's devices and process-group backend."""

    process_group: str
    """"gloo", the one backend the runtime takes (`WHY_NOT_NCCL`)."""
    compute_device: str
    """Where the model runs: "cpu" or "cuda:<i>"."""
    message_device: str
    """Where messages live: the host ("cpu"), where gloo sends from."""

    @property
    def host_copies(self) -> bool:
        """Whether messages are copied between the compute device and the host."""
        return self.compute_device != self.message_device

    def describe(self) -> str:
        """E.g. "gloo, compute on cuda:0, messages through host copies"."""
        where = (
            "messages through host copies"
            if self.host_copies
            else f"messages on {self.message_device}"
        )
        return f"{self.process_group}, compute on {self.compute_device}, {where}"


def choose_devices(rank: int, num_workers: int, num_gpus: int) -> RankDevices:
    """Worker `rank`'s devices among `num_workers` on a host with `num_gpus` GPUs: gloo
    always, computing on GPU (rank mod num_gpus) where there are GPUs, with messages on the
    host (`WHY_NOT_NCCL`)."""
    if num_workers < 1 or not 0 <= rank < num_workers or num_gpus < 0:
        raise ConfigError(
            f"rank {rank} of {num_workers} worker(s) on {num_gpus} GPU(s) is not a placement"
        )
    if num_gpus == 0:
        return RankDevices("gloo", "cpu", "cpu")
    return RankDevices("gloo", f"cuda:{rank % num_gpus}", "cpu")


def num_visible_gpus() -> int:
    """The GPUs this process may use (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def describe_pool(devices: list[RankDevices]) -> str:
    """A pool's choice in a line: "gloo: 4 worker(s) on the CPU", "gloo: 2 worker(s), a GPU
    each, messages through host copies (not NCCL: ...)", "gloo: 4 worker(s) share 1 GPU(s),
    messages through host copies (not NCCL: ...)"."""
    if not devices:
        return ""
    backends = sorted({d.process_group for d in devices})
    gpus = sorted({d.compute_device for d in devices if d.compute_device != "cpu"})
    head = f"{'/'.join(backends)}: {len(devices)} worker(s)"
    if not gpus:
        return f"{head} on the CPU"
    where = ", a GPU each" if len(gpus) == len(devices) else f" share {len(gpus)} GPU(s)"
    return f"{head}{where}, messages through host copies ({WHY_NOT_NCCL})"
