"""Falcon's rebalance: split the global batch's microbatches over the DP replicas so that
the slowest replica finishes first, min over splits of max_i m_i t_i with sum m_i = M
(t_i: replica i's time per microbatch)."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.errors import ConfigError

__all__ = ["rebalance"]


def rebalance(
    num_microbatches: int, per_microbatch_ms: Sequence[float], minimum: int = 1
) -> tuple[int, ...]:
    """The split of `num_microbatches` that minimises max_i m_i t_i, every m_i >= `minimum`:
    from the minimum up, each next microbatch to the replica that would finish it first
    (ties: the lower replica), which is optimal for a max of increasing costs (a greedy
    exchange argument)."""
    num_replicas = len(per_microbatch_ms)
    if num_replicas < 1 or minimum < 1 or num_microbatches < minimum * num_replicas:
        raise ConfigError(
            f"{num_microbatches} microbatches cannot give {num_replicas} replica(s) at least "
            f"{minimum} each"
        )
    if any(not t > 0 for t in per_microbatch_ms):
        raise ConfigError(f"per-microbatch times must be > 0, got {list(per_microbatch_ms)}")
    counts = [minimum] * num_replicas
    for _ in range(num_microbatches - minimum * num_replicas):
        best = min(range(num_replicas), key=lambda r: ((counts[r] + 1) * per_microbatch_ms[r], r))
        counts[best] += 1
    return tuple(counts)
