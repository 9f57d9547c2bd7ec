"""The DP gradient all-reduce every engine runs after a stage's last op: one semantics.

Per stage, the gradient (`Profile.allreduce_bytes`) is split into buckets of
`Profile.dp_bucket_bytes` (the last one smaller), as megatron-core's DDP does. Each bucket is
reduced by a ring over the stage's replicas (`Topology.dp_ring`): 2 (D-1) steps
(reduce-scatter, then all-gather); in each step every replica r sends one chunk of
ceil(bucket / D) bytes to replica (r+1) mod D, a point-to-point message over the DP link
between them. A replica starts its step k+1 send once its step k send has gone and the step k
chunk from (r-1) mod D has arrived (it forwards what it received), and starts a bucket once it
is done with the one before (its last send gone, its last chunk in): buckets run one after
another on each replica, as NCCL runs the collectives of one communicator in issue order.

Every message passes the fault path: `IterationFaults.message_fault(link, direction, "AR",
index)`, where `direction` is "forward" when the sender is the link's lower replica (r to r+1)
and "backward" otherwise (the ring-closing message D-1 to 0; with D = 2 the message 1 to 0),
and `index` numbers the messages of that link direction in the iteration: bucket b, step k
is index b * 2 (D-1) + k. A delay on a DP link is paid per message, before it goes, and holds
its sender: a slow link costs about (messages on it) x delay.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import NamedTuple

from pipeline.errors import ConfigError
from pipeline.topology import Direction, Link

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "KIND",
    "MAX_RING_MESSAGES",
    "RingMessage",
    "SendDelay",
    "buckets",
    "check_ring_messages",
    "chunk_bytes",
    "largest_chunk_bytes",
    "message_index",
    "messages_per_link_direction",
    "num_buckets",
    "ring_peer",
    "ring_steps",
    "rings_done_ms",
]

DEFAULT_BUCKET_BYTES = 80_000_000
"""megatron-core's DDP bucket: 40,000,000 parameters (DistributedDataParallel's default,
max(40,000,000, 1,000,000 x DP size), for DP sizes up to 40) at 2 bytes per bf16/fp16
gradient (grad_reduce_in_fp32 off)."""

KIND = "AR"
"""The `kind` a DP all-reduce message has on the fault path."""


MAX_RING_MESSAGES = 4_000_000
"""The most DP ring messages the simulator times in one iteration. A ring's messages grow as
D^2: measured here, a run of one iteration of the 7B model at DP 100 (3.7 million) took 26 s
and 1.6 GB; at DP 1000 (376 million) one took all 23 GB of the machine."""


def _check_sizes(grad_bytes: int, bucket_bytes: int) -> None:
    if grad_bytes < 0 or bucket_bytes < 1:
        raise ConfigError(
            f"gradient bytes must be >= 0 and buckets >= 1 byte, got {grad_bytes} and "
            f"{bucket_bytes}"
        )


def buckets(grad_bytes: int, bucket_bytes: int) -> tuple[int, ...]:
    """The bucket sizes of a stage's gradient, in the order they are reduced (one entry per
    bucket: count them with `num_buckets` first, as `check_ring_messages` does)."""
    _check_sizes(grad_bytes, bucket_bytes)
    full, rest = divmod(grad_bytes, bucket_bytes)
    return (bucket_bytes,) * full + ((rest,) if rest else ())


def num_buckets(grad_bytes: int, bucket_bytes: int) -> int:
    """How many buckets `buckets` splits a stage's gradient into, counted without listing
    them: ceil(gradient / bucket)."""
    _check_sizes(grad_bytes, bucket_bytes)
    return -(-grad_bytes // bucket_bytes)


def ring_steps(num_replicas: int) -> int:
    """Steps of one bucket's ring: D-1 reduce-scatter and D-1 all-gather."""
    return 2 * (num_replicas - 1)


def chunk_bytes(bucket: int, num_replicas: int, element_bytes: int = 1) -> int:
    """Bytes of each message of a bucket's ring: the bucket padded to a multiple of D
    elements of `element_bytes` each, as megatron pads its buckets to a multiple of the DP
    size (the simulator and the emulated ring count bytes: elements of 1 byte; a ring over a
    real fp32 gradient sends whole elements)."""
    elements = -(-bucket // element_bytes)
    return element_bytes * -(-elements // num_replicas)


def largest_chunk_bytes(
    grad_bytes: int, bucket_bytes: int, num_replicas: int, element_bytes: int = 1
) -> int:
    """Bytes of the largest message a stage's ring sends (`chunk_bytes` of its largest
    bucket, min(gradient, bucket); 0 for no gradient): what each of its DP links carries at
    most."""
    _check_sizes(grad_bytes, bucket_bytes)
    return chunk_bytes(min(grad_bytes, bucket_bytes), num_replicas, element_bytes)


def message_index(bucket: int, step: int, num_replicas: int) -> int:
    """The message's number among its link direction's messages in the iteration."""
    return bucket * ring_steps(num_replicas) + step


def messages_per_link_direction(grad_bytes: int, bucket_bytes: int, num_replicas: int) -> int:
    """How many messages each direction the ring uses of each of the stage's DP links
    carries (both directions of the one link when D = 2, one direction of each link else)."""
    if num_replicas < 2:
        return 0
    return num_buckets(grad_bytes, bucket_bytes) * ring_steps(num_replicas)


def check_ring_messages(grad_bytes: Sequence[int], bucket_bytes: int, num_replicas: int) -> None:
    """Refuse stages' rings (`grad_bytes`: each stage's gradient) of more than
    MAX_RING_MESSAGES messages in all: the simulator times each one (counted, not listed:
    `Profile` checks its own rings with this before anything lists their buckets)."""
    num_messages = num_replicas * sum(
        messages_per_link_direction(g, bucket_bytes, num_replicas) for g in grad_bytes
    )
    if num_messages > MAX_RING_MESSAGES:
        raise ConfigError(
            f"the DP all-reduce is {num_messages:,} messages an iteration ({len(grad_bytes)} "
            f"stages' rings of {num_replicas} replicas, {bucket_bytes:,}-byte buckets): more "
            f"than the simulator times ({MAX_RING_MESSAGES:,}); give fewer replicas or larger "
            "buckets (dp_bucket_bytes)"
        )


def ring_peer(stage: int, replica: int, num_replicas: int) -> tuple[int, Link, Direction]:
    """Where `replica` sends on its stage's ring: the receiving replica, the link and the
    direction (forward from the link's lower replica)."""
    receiver = (replica + 1) % num_replicas
    link = Link.dp(stage, replica, receiver)
    return receiver, link, Direction.between(replica, receiver)


class RingMessage(NamedTuple):
    """One message of a ring, as `ring_done_ms` timed it (ms)."""

    link: Link
    direction: Direction
    number: int
    """Its index among its link direction's messages (`message_index`)."""
    num_bytes: int
    sender: int
    """The sending replica."""
    send_start_ms: float
    send_end_ms: float
    """The sender is free again: its delay and its cost paid."""
    arrival_ms: float
    """The receiver can forward it."""
    needed_ms: float
    """The receiver had sent its own chunk of the step and waited for this one."""
    fault_ms: float


class SendDelay(NamedTuple):
    """What holds one ring message's sender before it goes, besides its wire and cost."""

    fault_ms: float
    """Its injected delay: its link's static DP delay plus what the fault model assigned (the
    message record's `fault_ms`)."""
    hold_ms: float = 0.0
    """Time the sender is held besides, injected by no one (a failover's move, ms)."""


MessageDelay = Callable[[Link, Direction, int, int, float], SendDelay]
"""(link, direction, index, bytes, when the send starts in ms) -> what holds its sender."""
ChunkCost = Callable[[int, int], tuple[float, float]]
"""(bytes, rings running at once) -> (how long a send holds its sender besides its delay,
ms: wire time and the host's send cost; then how long until the receiver can forward it)."""


class _Ring:
    """One stage's ring, a step at a time: every replica sends its chunk of the step when it
    is free, and is free again once its send has gone and the chunk it forwards is in."""

    def __init__(self, stage: int, start_ms: Sequence[float], grad_bytes: int, bucket_bytes: int):
        num_replicas = len(start_ms)
        self.free = list(start_ms)
        self.start_ms = max(start_ms)
        """From here on every replica is in the ring: it runs."""
        self.peers = [(r, *ring_peer(stage, r, num_replicas)) for r in range(num_replicas)]
        self.steps = [
            (message_index(b, k, num_replicas), chunk_bytes(bucket, num_replicas))
            for b, bucket in enumerate(buckets(grad_bytes, bucket_bytes))
            for k in range(ring_steps(num_replicas))
        ]
        self.done_steps = 0
        self.messages: list[RingMessage] = []

    def step(self, cost: tuple[float, float], message_delay: MessageDelay | None) -> None:
        index, chunk = self.steps[self.done_steps]
        hold_ms, lag_ms = cost
        free = self.free
        sent, arrived, delays = [0.0] * len(free), [0.0] * len(free), [0.0] * len(free)
        for sender, receiver, link, direction in self.peers:
            done = free[sender] + hold_ms
            if message_delay is not None:
                delay = message_delay(link, direction, index, chunk, free[sender])
                delays[sender] = delay.fault_ms
                done += delay.fault_ms + delay.hold_ms
            sent[sender] = done
            arrived[receiver] = done + lag_ms
        self.messages += [
            RingMessage(
                link, direction, index, chunk, sender, free[sender], sent[sender],
                arrived[receiver], sent[receiver], delays[sender],
            )
            for sender, receiver, link, direction in self.peers
        ]  # fmt: skip
        self.free = [s if s > a else a for s, a in zip(sent, arrived, strict=True)]
        self.done_steps += 1


def rings_done_ms(
    start_ms: Sequence[Sequence[float]],
    grad_bytes: Sequence[int],
    bucket_bytes: int,
    chunk_cost: ChunkCost,
    message_delay: MessageDelay | None = None,
    record: Callable[[RingMessage], None] | None = None,
) -> tuple[tuple[float, ...], ...]:
    """When each replica of each stage is done with its all-reduce, message by message,
    given when each was done with its pipeline (`start_ms[stage]`, one per replica). A
    message holds its sender for its delay (`message_delay`, asked once per message, in the
    order the steps start: its injected delay, recorded, and any other hold) and its cost;
    the receiver can forward it the cost's lag later. The cost is asked with the number of
    stages' rings that run when the step's last sender starts (a ring runs from its last
    replica's start to its last replica's end): rings at once share a host's cores.
    `record` is handed every message, stage by stage, step by step."""
    if not start_ms or len(start_ms[0]) < 2:  # one replica: nothing to reduce
        return tuple(tuple(starts) for starts in start_ms)
    check_ring_messages(grad_bytes, bucket_bytes, len(start_ms[0]))
    rings = [
        _Ring(stage, starts, grad_bytes[stage], bucket_bytes)
        for stage, starts in enumerate(start_ms)
    ]
    ring_starts = sorted(ring.start_ms for ring in rings if ring.steps)
    pending = [(max(ring.free), stage) for stage, ring in enumerate(rings) if ring.steps]
    heapq.heapify(pending)
    ends: list[float] = []  # a heap: the rings that have ended, by when
    num_started = num_ended = 0
    while pending:
        at_ms, stage = heapq.heappop(pending)  # steps in the order they start
        while num_started < len(ring_starts) and ring_starts[num_started] <= at_ms:
            num_started += 1
        while ends and ends[0] <= at_ms:
            heapq.heappop(ends)
            num_ended += 1
        ring = rings[stage]
        _, chunk = ring.steps[ring.done_steps]
        ring.step(chunk_cost(chunk, num_started - num_ended), message_delay)
        if ring.done_steps < len(ring.steps):
            heapq.heappush(pending, (max(ring.free), stage))
        else:
            heapq.heappush(ends, max(ring.free))
    if record is not None:
        for ring in rings:
            for message in ring.messages:
                record(message)
    return tuple(tuple(ring.free) for ring in rings)
