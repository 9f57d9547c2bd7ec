"""The step after a pipeline iteration: each stage's DP gradient all-reduce, then its optimizer.

A stage's replicas reduce over a ring of DP links ("dp<stage>:r-(r+1)") as soon as the last of
them has finished its last op, so stages that finish early overlap their all-reduce with the
others' tail (the simulator's step time).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from pipeline.errors import ConfigError
from pipeline.topology import Link

__all__ = ["AllReduce"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class AllReduce:
    """The DP gradient all-reduce and optimizer step of every stage."""

    num_replicas: int
    grad_bytes: tuple[int, ...]
    """Gradient bytes per GPU of each stage."""
    bandwidth_gbps: float
    """Achieved per-link bandwidth in Gbit/s."""
    latency_ms: float = 0.0
    optimizer_ms: tuple[float, ...] = ()
    """The optimizer step of each stage, after its all-reduce (missing: free)."""
    dp_delay_ms: Mapping[tuple[int, int], float] = dataclasses.field(default_factory=dict)
    """Injected delay per ring step on DP link (stage, r): the link "dp<stage>:r-(r+1)"."""

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ConfigError(f"num_replicas must be >= 1, got {self.num_replicas}")
        if not self.bandwidth_gbps > 0 or self.latency_ms < 0:
            raise ConfigError("all-reduce bandwidth must be > 0 and latency >= 0")
        if self.optimizer_ms and len(self.optimizer_ms) != len(self.grad_bytes):
            raise ConfigError("optimizer_ms needs one entry per stage, like grad_bytes")
        for (stage, replica), delay in self.dp_delay_ms.items():
            if not (0 <= stage < len(self.grad_bytes) and 0 <= replica < self.num_replicas - 1):
                raise ConfigError(
                    f"DP link {Link.dp(stage, replica)} does not exist with "
                    f"{len(self.grad_bytes)} stages and {self.num_replicas} replicas"
                )
            if not delay >= 0:
                raise ConfigError(f"DP link delays must be >= 0 ms, got {delay}")

    def with_delays(self, dp_delay_ms: Mapping[tuple[int, int], float]) -> AllReduce:
        return dataclasses.replace(self, dp_delay_ms=dict(dp_delay_ms))

    def ring_ms(self, stage: int) -> float:
        """2 (D-1) ring steps, each moving 1/D of the gradients over every ring link at once,
        so each step lasts as long as its slowest link (latency + injected delay + bytes/bw).
        The ring closes with link (D-1) -> 0, which takes no injected delay here."""
        num = self.num_replicas
        if num == 1:
            return 0.0
        chunk_ms = self.grad_bytes[stage] / num * 8 / (self.bandwidth_gbps * 1e6)
        slowest_ms = max((d for (s, _), d in self.dp_delay_ms.items() if s == stage), default=0.0)
        return 2 * (num - 1) * (self.latency_ms + slowest_ms + chunk_ms)

    def step_end_ms(self, stage_end_ms: Sequence[float]) -> float:
        """When the last stage has reduced its gradients and stepped, given when each stage's
        replicas were all done."""
        if len(stage_end_ms) != len(self.grad_bytes):
            raise ConfigError(
                f"all-reduce is for {len(self.grad_bytes)} stages, got {len(stage_end_ms)}"
            )
        return max(
            end + self.ring_ms(stage) + (self.optimizer_ms[stage] if self.optimizer_ms else 0.0)
            for stage, end in enumerate(stage_end_ms)
        )
