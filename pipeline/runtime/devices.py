"""Where a worker computes, where its messages live, and which process-group backend carries
them: chosen once per pool from the number of workers and of GPUs.

NCCL refuses two ranks of one communicator on the same GPU, so NCCL only where every worker
has a GPU of its own; with fewer GPUs than workers the workers share them round-robin and talk
over gloo, which sends host memory: their messages (and the DP ring's chunks, the tied
gradient, a rank swap's state) are copied between the GPU and the host on each side. Without
a GPU everything is on the CPU over gloo.
"""

from __future__ import annotations

import dataclasses

import torch

from pipeline.errors import ConfigError

__all__ = ["RankDevices", "choose_devices", "describe_pool", "num_visible_gpus"]


@dataclasses.dataclass(frozen=True, slots=True)
class RankDevices:
    """One worker's devices and process-group backend."""

    process_group: str
    """"nccl" or "gloo"."""
    compute_device: str
    """Where the model runs: "cpu" or "cuda:<i>"."""
    message_device: str
    """Where messages live: the compute device with NCCL, the host ("cpu") with gloo."""

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
    """Worker `rank`'s devices among `num_workers` on a host with `num_gpus` GPUs."""
    if num_workers < 1 or not 0 <= rank < num_workers or num_gpus < 0:
        raise ConfigError(
            f"rank {rank} of {num_workers} worker(s) on {num_gpus} GPU(s) is not a placement"
        )
    if num_gpus == 0:
        return RankDevices("gloo", "cpu", "cpu")
    gpu = f"cuda:{rank % num_gpus}"
    if num_gpus >= num_workers:  # a GPU of its own
        return RankDevices("nccl", gpu, gpu)
    return RankDevices("gloo", gpu, "cpu")


def num_visible_gpus() -> int:
    """The GPUs this process may use (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def describe_pool(devices: list[RankDevices]) -> str:
    """A pool's choice in a line: "gloo: 4 workers on the CPU", "nccl: 2 workers, a GPU
    each", "gloo: 4 workers share 1 GPU(s), messages through host copies"."""
    if not devices:
        return ""
    backends = sorted({d.process_group for d in devices})
    gpus = sorted({d.compute_device for d in devices if d.compute_device != "cpu"})
    head = f"{'/'.join(backends)}: {len(devices)} worker(s)"
    if not gpus:
        return f"{head} on the CPU"
    if len(gpus) == len(devices):
        return f"{head}, a GPU each"
    copies = ", messages through host copies" if any(d.host_copies for d in devices) else ""
    return f"{head} share {len(gpus)} GPU(s){copies}"
