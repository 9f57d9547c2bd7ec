"""The core's two hooks, and their trivial versions (injectors/ provides the real ones).

- The fault hook runs in the sending worker before every message; it may sleep (a delay), or
  raise `LinkFailure` (a failure), and returns the delay it injected in ms (the message's
  `fault_ms`). A delegated message asks it `route` instead: the NIC the message goes over
  (its link direction fails over where the NIC it was on has its route down) and its delay,
  which the delegate waits. It must be picklable: the pool ships it to the workers. `link`
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
import multiprocessing.context
import multiprocessing.forkserver
import multiprocessing.util
import tempfile
import time
from collections.abc import Callable, Sequence
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any, NamedTuple, Protocol

from pipeline.errors import ConfigError, LinkFailure
from pipeline.faults import NO_FAULTS, IterationFaults, route_over
from pipeline.runtime.scratch import mark_folder
from pipeline.runtime.sleep import PreciseSleep
from pipeline.signals import sigint_blocked
from pipeline.topology import Direction, Link, is_tied_link

__all__ = [
    "FaultHook",
    "FaultViewHook",
    "HookRoute",
    "LaunchHook",
    "local_launch",
    "preload_in_workers",
]


class HookRoute(NamedTuple):
    """A delegated message's NIC and delay (`FaultHook.route`)."""

    nic: int | None
    """The data-plane NIC it goes over, by index (None: the hook has no fault view: the
    delegates' own failover, by what they see of the NICs, decides)."""
    fault_ms: float


class FaultHook(Protocol):
    def __call__(
        self,
        link: str,
        direction: Direction,
        iteration: int,
        kind: str,
        microbatch: int,
        num_bytes: int,
    ) -> float:
        """Wait the message's delay (the first NIC's route: gloo has one) and return it."""
        ...

    def route(
        self,
        link: str,
        direction: Direction,
        iteration: int,
        kind: str,
        microbatch: int,
        num_bytes: int,
        nic: int,
        num_nics: int,
    ) -> HookRoute:
        """A delegated message's route and delay, not waited (its delegate waits it on the
        wire): over `nic` (of `num_nics`), the NIC its link direction is on, while that route
        is up, else over the first NIC whose route is up (the direction fails over to it);
        `LinkFailure` where no route is up."""
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
        direction: Direction,
        iteration: int,
        kind: str,
        microbatch: int,
        num_bytes: int,
    ) -> float:
        fault_ms = self.route(
            link, direction, iteration, kind, microbatch, num_bytes, 0, 1
        ).fault_ms
        if fault_ms > 0:
            self._sleep(fault_ms / 1000.0)
        return fault_ms

    def route(
        self,
        link: str,
        direction: Direction,
        iteration: int,
        kind: str,
        microbatch: int,
        num_bytes: int,
        nic: int,
        num_nics: int,
    ) -> HookRoute:
        delay_ms = self.delay_ms_by_link.get(link, 0.0)
        if self.faults is NO_FAULTS:
            return HookRoute(None, delay_ms)
        named = Link.parse(link)
        concrete = named.in_replica(self.replica)
        offset_ms = (time.monotonic() - self.iteration_start) * 1000.0
        routed = route_over(
            self.faults, nic, num_nics, concrete, direction, kind, microbatch, num_bytes,
            offset_ms,
        )  # fmt: skip
        if routed.fault.failed:
            what = (
                f"the {kind} message of microbatch {microbatch}"
                if named.is_pp
                else f"all-reduce message {microbatch}"
            )
            raise LinkFailure(
                f"link {concrete} ({direction}) has failed: {what} in iteration {iteration} "
                "cannot go",
                at_ms=offset_ms,
            )
        return HookRoute(routed.nic, delay_ms + routed.fault.delay_ms)

    def routes_down(self, link: str, num_nics: int) -> tuple[int, ...]:
        """The NICs (by index, of `num_nics`) over which the view has the route of `link`
        (concrete as in `route`) failed at the iteration's start, where a rank swap is its
        first work (as the simulator asks, whatever each worker's clock says by then): those
        a new pair of delegates passes over as it connects, as over a NIC down at either
        host, so that it meets no failover (none on the tied route, which no fault names)."""
        if self.faults is NO_FAULTS or is_tied_link(link):
            return ()
        concrete = Link.parse(link).in_replica(self.replica)
        return tuple(n for n in range(num_nics) if self.faults.route_failed(concrete, n, 0.0))


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


def preload_in_workers(modules: Sequence[str]) -> None:
    """The workers' fork server also imports `modules` (after the worker, before it freezes
    what it holds) if it starts after this call, in place of an earlier call's. A server that
    has started keeps what it imported, and its workers import the rest themselves, as they
    would without this: a megatron pool's workers share one import of megatron-core (2.5 s of
    CPU here; `pipeline.runtime.megatron.WORKER_IMPORTS`) when theirs is the process's first
    pool. Not for every pool: another backend's first pool would start 2.5 s later."""
    worker, freeze = WORKER_PRELOAD
    worker_context().set_forkserver_preload([worker, *modules, freeze])


def local_launch(rank: int, target: Callable[..., None], args: tuple[Any, ...]) -> BaseProcess:
    """A plain local process (`worker_context`: no state inherited from the controller)."""
    return start_worker(rank, target, args)


def start_worker(rank: int, target: Callable[..., None], args: tuple[Any, ...]) -> BaseProcess:
    """Rank `rank`'s worker process, started from the fork server (`worker_context`), whose
    socket's folder is marked as this process's (`adaptra-bench cleanup` removes it once this
    process is gone: a killed run leaves it). The mark comes first: the first start makes
    the folder and then waits for the server to import its preloads (about a second, torch),
    and a SIGKILL then left an unmarked folder, which cleanup leaves as another program's.
    The folder is made before the process object, which takes this process's multiprocessing
    settings as they are then: made after, the process's first worker knew of no folder and
    made one of its own wherever it needed one (unmarked, and left where the worker is
    terminated or killed, as a failed pool's busy workers are)."""
    context = worker_context()
    try:
        mark_folder(multiprocessing.util.get_temp_dir())
        process = context.Process(  # type: ignore[attr-defined]
            target=target, args=args, name=f"adaptra-worker-{rank}", daemon=True
        )
        # The first start spawns the fork server, which ignores SIGINT only once it has
        # imported its preloads (torch: a second or more): born with SIGINT blocked, a
        # terminal's Ctrl-C meanwhile does not print its KeyboardInterrupt traceback (its
        # workers ignore SIGINT too: worker.py). Blocked here across its spawn only: the
        # start then waits for those imports, which a Ctrl-C still interrupts.
        if isinstance(context, multiprocessing.context.ForkServerContext):
            with sigint_blocked():
                multiprocessing.forkserver.ensure_running()
        process.start()
    except OSError as err:  # the fork server's socket lives under the temporary folder
        if "AF_UNIX path too long" not in str(err):
            raise
        raise ConfigError(
            f"the temporary folder {tempfile.gettempdir()} has too long a path for the "
            "worker fork server's socket (108 bytes in all): set TMPDIR to a shorter one"
        ) from err
    return process
