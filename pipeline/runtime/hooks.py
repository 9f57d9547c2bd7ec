"""The core's two hooks, and their trivial versions (injectors/ provides the real ones).

- The fault hook runs in the sending worker before every message; it may sleep (a delay),
  or raise (a failure). It must be picklable: the pool ships it to the workers.
- The launch hook starts one worker process (e.g. inside a network namespace).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

__all__ = ["FaultHook", "FixedDelayHook", "LaunchHook", "local_launch"]


class FaultHook(Protocol):
    def __call__(
        self,
        link: str,
        direction: str,
        iteration: int,
        kind: str,
        microbatch: int,
        num_bytes: int,
    ) -> None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class FixedDelayHook:
    """Sleep a fixed time per PP link before each message, both directions (the paper's
    artifact did this on the GPU path: a sleep kernel before each send)."""

    delay_ms_by_link: dict[str, float]

    def __call__(
        self,
        link: str,
        direction: str,
        iteration: int,
        kind: str,
        microbatch: int,
        num_bytes: int,
    ) -> None:
        delay_ms = self.delay_ms_by_link.get(link, 0.0)
        if delay_ms > 0:
            time.sleep(delay_ms / 1000.0)


class LaunchHook(Protocol):
    def __call__(
        self, rank: int, target: Callable[..., None], args: tuple[Any, ...]
    ) -> BaseProcess: ...


def local_launch(rank: int, target: Callable[..., None], args: tuple[Any, ...]) -> BaseProcess:
    """A plain local process (spawned: no state inherited from the controller)."""
    process = multiprocessing.get_context("spawn").Process(
        target=target, args=args, name=f"adaptra-worker-{rank}", daemon=True
    )
    process.start()
    return process
