"""The multi-process runtime: real workers executing any schedule over torch.distributed."""

from pipeline.runtime.compute import ComputeBackend, EmulatedCompute
from pipeline.runtime.hooks import FaultHook, FaultViewHook, LaunchHook, local_launch
from pipeline.runtime.pool import IterationConfig, WorkerError, WorkerPool

__all__ = [
    "ComputeBackend",
    "EmulatedCompute",
    "FaultHook",
    "FaultViewHook",
    "IterationConfig",
    "LaunchHook",
    "WorkerError",
    "WorkerPool",
    "local_launch",
]
