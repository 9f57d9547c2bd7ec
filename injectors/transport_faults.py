"""Transport-level faults: the core's fault hook, per link and direction, no privileges needed.

Each message on a faulty link direction pays, before it is sent: a one-off stall (the first
message of each iteration), a fixed delay plus a seeded jitter, and its bytes at the capped
rate; or it fails (`pipeline.errors.LinkFailure`). The hook is picklable and deterministic:
the jitter of a message depends only on the seed and the message's (link, direction,
iteration, microbatch).
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Mapping

from pipeline.errors import ConfigError, LinkFailure

__all__ = ["LinkFault", "TransportFaultHook"]

DIRECTIONS = ("forward", "backward")


@dataclasses.dataclass(frozen=True, slots=True)
class LinkFault:
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    """Uniform in [-jitter, +jitter], clipped so the total delay stays >= 0."""
    bandwidth_mbps: float | None = None
    stall_ms: float = 0.0
    failed: bool = False

    def __post_init__(self) -> None:
        for name in ("delay_ms", "jitter_ms", "stall_ms"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} must be finite and >= 0, got {value!r}")
        if self.bandwidth_mbps is not None and not (
            math.isfinite(self.bandwidth_mbps) and self.bandwidth_mbps > 0
        ):
            raise ConfigError(f"bandwidth_mbps must be > 0, got {self.bandwidth_mbps!r}")

    def wait_ms(self, jitter_draw: float, num_bytes: int, first_in_iteration: bool) -> float:
        """How long a message waits before it goes; `jitter_draw` is uniform in [-1, 1]."""
        wait = max(0.0, self.delay_ms + self.jitter_ms * jitter_draw)
        if self.bandwidth_mbps is not None:
            wait += num_bytes * 8 / (self.bandwidth_mbps * 1e3)
        if first_in_iteration:
            wait += self.stall_ms
        return wait


@dataclasses.dataclass(slots=True)
class TransportFaultHook:
    """The fault hook for the runtime's transports: faults keyed by (link, direction)."""

    faults: Mapping[tuple[str, str], LinkFault]
    seed: int = 0
    _seen: set[tuple[str, str, int]] = dataclasses.field(default_factory=set)

    @classmethod
    def on_links(cls, faults: Mapping[str, LinkFault], seed: int = 0) -> TransportFaultHook:
        """The same fault in both directions of each named link ("0-1")."""
        return cls({(link, d): f for link, f in faults.items() for d in DIRECTIONS}, seed)

    def __call__(
        self,
        link: str,
        direction: str,
        iteration: int,
        kind: str,
        microbatch: int,
        num_bytes: int,
    ) -> float:
        fault = self.faults.get((link, direction))
        if fault is None:
            return 0.0
        if fault.failed:
            raise LinkFailure(
                f"link {link} ({direction}) has failed: the {kind} message of "
                f"microbatch {microbatch} in iteration {iteration} cannot go"
            )
        first = (link, direction, iteration) not in self._seen
        self._seen.add((link, direction, iteration))
        draw = random.Random(f"{self.seed}:{link}:{direction}:{iteration}:{microbatch}")
        wait_ms = fault.wait_ms(draw.uniform(-1.0, 1.0), num_bytes, first)
        if wait_ms > 0:
            time.sleep(wait_ms / 1000.0)
        return wait_ms
