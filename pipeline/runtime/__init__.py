"""The multi-process runtime: real workers executing any schedule over torch.distributed."""

from pipeline.runtime.compute import ComputeBackend, EmulatedCompute
from pipeline.runtime.hooks import FaultHook, FaultViewHook, LaunchHook, local_launch
from pipeline.runtime.pool import IterationConfig, WorkerPool
from pipeline.runtime.remote_error import (
    RemoteError,
    WorkerCrash,
    WorkerDeadlock,
    WorkerError,
    WorkerLinkFailure,
    WorkerTimeout,
)

__all__ = [
    "ComputeBackend",
    "EmulatedCompute",
    "FaultHook",
    "FaultViewHook",
    "IterationConfig",
    "LaunchHook",
    "RemoteError",
    "WorkerCrash",
    "WorkerDeadlock",
    "WorkerError",
    "WorkerLinkFailure",
    "WorkerPool",
    "WorkerTimeout",
    "local_launch",
]
