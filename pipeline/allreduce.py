"""The step after a pipeline iteration: each stage's DP gradient all-reduce, then its optimizer.

A stage's replicas reduce over a ring of DP links ("dp<stage>:r-(r+1)") as soon as the last of
them has finished its last op, so stages that finish early overlap their all-reduce with the
others' tail (the simulator's step time).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pipeline.errors import ConfigError

__all__ = ["AllReduce", "dp_link_name"]


def dp_link_name(stage: int, replica: int) -> str:
    """DP ring link of `stage` from `replica` to the next one (DESIGN.md's link names)."""
    return f"dp{stage}:{replica}-{replica + 1}"


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

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ConfigError(f"num_replicas must be >= 1, got {self.num_replicas}")
        if not self.bandwidth_gbps > 0 or self.latency_ms < 0:
            raise ConfigError("all-reduce bandwidth must be > 0 and latency >= 0")
        if self.optimizer_ms and len(self.optimizer_ms) != len(self.grad_bytes):
            raise ConfigError("optimizer_ms needs one entry per stage, like grad_bytes")

    def ring_ms(self, stage: int, link_delays_ms: Sequence[float] = ()) -> float:
        """2 (D-1) ring steps, each moving 1/D of the gradients over every ring link at once,
        so each step lasts as long as its slowest link (latency + injected delay + bytes/bw)."""
        num = self.num_replicas
        if num == 1:
            return 0.0
        chunk_ms = self.grad_bytes[stage] / num * 8 / (self.bandwidth_gbps * 1e6)
        return 2 * (num - 1) * (self.latency_ms + max(link_delays_ms, default=0.0) + chunk_ms)

    def step_end_ms(
        self,
        stage_end_ms: Sequence[float],
        dp_delay_ms: Sequence[Sequence[float]] = (),
    ) -> float:
        """When the last stage has reduced its gradients and stepped, given when each stage's
        replicas were all done; `dp_delay_ms[stage]` are its ring links' injected delays."""
        if len(stage_end_ms) != len(self.grad_bytes):
            raise ConfigError(
                f"all-reduce is for {len(self.grad_bytes)} stages, got {len(stage_end_ms)}"
            )
        return max(
            end
            + self.ring_ms(stage, dp_delay_ms[stage] if dp_delay_ms else ())
            + (self.optimizer_ms[stage] if self.optimizer_ms else 0.0)
            for stage, end in enumerate(stage_end_ms)
        )
