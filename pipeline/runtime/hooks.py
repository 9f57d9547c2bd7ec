"""The core's two hooks, and their trivial versions (injectors/ provides the real ones).

- The fault hook runs in the sending worker before every message; it may sleep (a delay), or
  raise (a failure: `RouteDown` where the sender can fail over, `failover`, and another
  NIC's route is up; else `LinkFailure`), and returns the delay it injected in ms
  (the message's `fault_ms`). It must be picklable: the pool ships it to the workers. `link`
  names the link: a PP link "i-(i+1)" (of the sender's replica) or a DP ring link
  "dp<stage>:a-b"; a PP message has `kind` "F" or "B" and its microbatch, a DP all-reduce
  message `kind` "AR" and, in place of the microbatch, its index on its link direction
  (pipeline.allreduce).
- The launch hook starts one worker process (e.g. inside a network namespace), from
  `worker_context()`.
"""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing
import multiprocessing.util
import tempfile
import time
from collections.abc import Callable
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

from pipeline.errors import ConfigError, LinkFailure, RouteDown
from pipeline.faults import NO_FAULTS, IterationFaults
from pipeline.runtime.scratch import mark_folder
from pipeline.runtime.sleep import PreciseSleep
from pipeline.topology import Link

__all__ = ["FaultHook", "FaultViewHook", "LaunchHook", "local_launch"]


class FaultHook(Protocol):
    def __call__(
        self,
        link: str,
        direction: str,
        iteration: int,
        kind: str,
        microbatch: int,
        num_bytes: int,
        *,
        wait: bool = True,
        failover: bool = False,
    ) -> float:
        """`wait` False: return the delay without waiting it (a delegate waits it on the
        wire instead of the sender). `failover`: the sender can move to another NIC (a
        delegate), so a failure another NIC's route avoids is a `RouteDown`; else every
        failure is a `LinkFailure`."""
        ...


@dataclasses.dataclass(slots=True)
class FaultViewHook:
    """The runtime's own hook: each message waits its link's delay in the profile
    (`delay_ms_by_link`, by the link's name: PP "0-1", DP "dp1:0-1") plus what a fault view
    assigns it (pipeline.faults), on time (a precise sleep), as the paper's artifact did on
    the GPU path (a sleep kernel before each send). `replica` is the sender's, to name the
    concrete PP link (a DP link's name is concrete already); `iteration_start` (host
    monotonic seconds) is when the iteration began, to tell the view how far into it a
    message goes."""

    delay_ms_by_link: dict[str, float]
    faults: IterationFaults = NO_FAULTS
    replica: int = 0
    iteration_start: float = 0.0
    _sleep: PreciseSleep = dataclasses.field(default_factory=PreciseSleep)

    def __call__(
        self,
        link: str,
        direction: str,
        iteration: int,
        kind: str,
        microbatch: int,
        num_bytes: int,
        *,
        wait: bool = True,
        failover: bool = False,
    ) -> float:
        delay_ms = self.delay_ms_by_link.get(link, 0.0)
        if self.faults is not NO_FAULTS:
            named = Link.parse(link)
            concrete = Link.pp(named.first, self.replica) if named.is_pp else named
            offset_ms = (time.monotonic() - self.iteration_start) * 1000.0
            fault = self.faults.message_fault(
                concrete, direction, kind, microbatch, num_bytes, offset_ms
            )
            if fault.failed:
                what = (
                    f"the {kind} message of microbatch {microbatch}"
                    if named.is_pp
                    else f"all-reduce message {microbatch}"
                )
                message = (
                    f"link {concrete} ({direction}) has failed: {what} in iteration {iteration} "
                    "cannot go"
                )
                if failover and not fault.stranded:
                    raise RouteDown(message, at_ms=offset_ms)
                raise LinkFailure(message, at_ms=offset_ms)
            delay_ms += fault.delay_ms
        if delay_ms > 0 and wait:
            self._sleep(delay_ms / 1000.0)
        return delay_ms


class LaunchHook(Protocol):
    def __call__(
        self, rank: int, target: Callable[..., None], args: tuple[Any, ...]
    ) -> BaseProcess: ...


WORKER_PRELOAD = ("pipeline.runtime.worker", "pipeline.runtime.fork_server")
"""What the worker processes' fork server imports once, in order: the worker (torch with it),
then what freezes all that for the garbage collector (fork_server.py)."""


@functools.cache
def worker_context() -> BaseContext:
    """Where worker processes come from: forked from a server that has imported torch and the
    worker once (no state of the controller's: the server is a fresh interpreter), so a pool
    of 4 starts in about 0.05 s where spawned workers took about 5 s here, each importing
    torch, and ends in 0.05 s where they took 2 s."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(WORKER_PRELOAD))
    return context


def local_launch(rank: int, target: Callable[..., None], args: tuple[Any, ...]) -> BaseProcess:
    """A plain local process (`worker_context`: no state inherited from the controller)."""
    process = worker_context().Process(  # type: ignore[attr-defined]
        target=target, args=args, name=f"adaptra-worker-{rank}", daemon=True
    )
    try:
        process.start()
        mark_folder(multiprocessing.util.get_temp_dir())  # the fork server's socket: cleanup
    except OSError as err:  # the fork server's socket lives under the temporary folder
        if "AF_UNIX path too long" not in str(err):
            raise
        raise ConfigError(
            f"the temporary folder {tempfile.gettempdir()} has too long a path for the "
            "worker fork server's socket (108 bytes in all): set TMPDIR to a shorter one"
        ) from err
    return process
