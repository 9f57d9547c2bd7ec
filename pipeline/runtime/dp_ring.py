"""The emulated DP all-reduce: pipeline.allreduce's ring, message by message, over gloo.

After its last op a worker reduces its stage's gradient bytes (`Profile.allreduce_bytes`)
with its stage's other replicas: bucket by bucket, 2 (D-1) chunks to the next replica on the
ring, each through the fault hook, each step's send once the previous step's chunk has come
from the previous replica; over gloo, or over the delegates where the plan delegates the
ring's link directions (the worker's `RingTransport`). A bucket's receives are posted
before its first send (a blocking send to an unposted receive could deadlock under gloo), so
a worker holds 2 (D-1) chunk buffers, reused bucket after bucket. The chunks carry zeros:
the traffic and its timing are emulated, not the arithmetic (no compute backend's gradients
travel here).
"""

from __future__ import annotations

import torch

from pipeline.allreduce import buckets, chunk_bytes, message_index, ring_peer, ring_steps
from pipeline.profile import Profile
from pipeline.runtime.transport import RingTransport
from pipeline.topology import Position, Topology

__all__ = ["run_ring"]


def run_ring(
    transport: RingTransport,
    topology: Topology,
    position: Position,
    profile: Profile,
    iteration: int,
    timeout_s: float,
    device: torch.device,
) -> None:
    """Run this position's part of its stage's all-reduce; returns when its last chunk has
    been sent and the last one from its ring predecessor has arrived."""
    num_replicas = topology.num_replicas
    stage, replica = position.stage, position.replica
    sizes = buckets(profile.allreduce_bytes[stage], profile.dp_bucket_bytes)
    if num_replicas < 2 or not sizes:
        return
    receiver, link, direction = ring_peer(stage, replica, num_replicas)
    to_rank = topology.worker(Position(stage, receiver))
    from_rank = topology.worker(Position(stage, (replica - 1) % num_replicas))
    steps = ring_steps(num_replicas)
    largest = chunk_bytes(max(sizes), num_replicas)
    payload = torch.zeros(largest, dtype=torch.uint8, device=device)
    inbox = [torch.empty(largest, dtype=torch.uint8, device=device) for _ in range(steps)]
    for bucket, size in enumerate(sizes):
        chunk = chunk_bytes(size, num_replicas)
        indices = [message_index(bucket, k, num_replicas) for k in range(steps)]
        pending = [
            transport.post_dp_receive(from_rank, index, buffer[:chunk])
            for index, buffer in zip(indices, inbox, strict=True)
        ]
        for k, index in enumerate(indices):
            if k:
                pending[k - 1].wait(timeout_s)  # the chunk this step forwards
            transport.send_dp(to_rank, str(link), direction, iteration, index, payload[:chunk])
        pending[-1].wait(timeout_s)
