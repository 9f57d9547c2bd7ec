"""The emulated DP all-reduce: pipeline.allreduce's ring, message by message, over gloo.

After its last op a worker reduces its stage's gradient bytes (`Profile.allreduce_bytes`)
with its stage's other replicas: bucket by bucket, 2 (D-1) chunks to the next replica on the
ring, each through the fault hook, each step's send once the previous step's chunk has come
from the previous replica; over gloo, or over the delegates where the plan delegates the
ring's link directions (the worker's `RingTransport`). What it sums is the compute backend's
(`ComputeBackend.dp_gradient_layout`): the emulated backend's chunks carry zeros (the traffic
and its timing are emulated, not the arithmetic); megatron's carry its real fp32 gradient,
summed as the ring goes (a reduce-scatter: each step adds the chunk that came in to its own
and forwards the sum; then an all-gather: each step keeps the finished chunk that came in
and forwards it), the bucket padded with zeros to a multiple of D elements. With D = 2 every
element is a + b, the bits a single all-reduce gives; with D > 2 the order of the sum is the
ring's.

Receives are posted a bucket ahead: the first bucket's as the iteration starts (`Ring.post`,
before the pipeline's ops), each next one's as the bucket before it starts, so a worker
holds 2 x 2 (D-1) chunk buffers, used bucket after bucket. A gloo send waits until its
receive is posted at the far end and the far end has said so; with receives posted only as
their bucket began, each bucket's first send waited a round trip of the link first (on the
testbed's delayed wire: 20 ms for a 20 ms delay, measured), which a ring over a link that
delays each message does not pay.

One receiver thread waits on them all, in order (its waits on the link direction never
overlap, as the delegated path needs): a thread per bucket cost its start and join, about
0.1 ms a bucket here (BENCHMARKS.md, Fig. 18). It starts with the first bucket's receives,
as the iteration starts (as the PP receivers do), so a chunk that lands while this worker
still runs its pipeline (its ring predecessor's ended first) is stamped as it lands. Started
with the ring, after the last op, it stamped such a chunk then, as late as the pipelines'
skew (0.2 s behind a 40 ms delay on the other replica's PP link), and the detector called
healthy DP links slow.

The ring's waits for its first chunks have no limit (`Receiver.take`'s None), its others
the worker's timeout for one message. In the first bucket, step k's chunk (k < D-1) leaves
replica r-1 only once replicas r-1 ... r-1-k have ended their pipelines: its wait spans what
is left of theirs, as long as their ops and their messages' delays make it, healthy or not
(a 300 ms delay on the other replica's PP link, within the 1 s timeout for one message
that the delay check asks for, failed the iteration: that replica's pipeline ran more than
1 s longer). From step D-1 on, and in later buckets, every replica is in its ring (r's
step D-2 chunk waited for r+1's pipeline), and a chunk waits for messages only. The pool's
bound on a time without progress bounds those first waits (pipeline.runtime.pool: the ranks
they wait on report their ops), its timeout naming the chunk each silent rank waits on or
sends (`Ring.doing`); the peers' own limits end them where a peer fails (its op's wait, its
send).

Every chunk is recorded, as the PP messages are (`RankResult.sends` and `receives`, the
chunk's index in place of a microbatch): the receiver thread (pipeline.runtime.receiver)
stamps each chunk's true arrival, and the ring takes a chunk from it when it forwards it
(`needed`).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable

import torch

from pipeline.allreduce import buckets, chunk_bytes, message_index, ring_peer, ring_steps
from pipeline.errors import BackendError, ConfigError
from pipeline.profile import Profile
from pipeline.runtime.compute import GradientLayout
from pipeline.runtime.receiver import Receiver
from pipeline.runtime.transport import RingTransport
from pipeline.topology import Direction, Position, Topology

__all__ = ["Ring", "RingRecords"]

_ELEMENT_DTYPES = {4: torch.float32}
"""A real gradient's element type by its size (megatron's fp32 gradients)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RingRecords:
    """A worker's ring chunks, in `RankResult`'s forms (the index in place of a microbatch;
    a delegated chunk's wire start is its send's start until the worker fills it in)."""

    sends: list[tuple[str, Direction, int, int, float, float, float, float, int]] = (
        dataclasses.field(default_factory=list)
    )
    receives: list[tuple[str, Direction, int, float, float, float]] = dataclasses.field(
        default_factory=list
    )


class Ring:
    """This position's part of its stage's all-reduce in one iteration: `post` as the
    iteration starts, `run` after the last op, `stop` if the iteration fails."""

    def __init__(
        self,
        transport: RingTransport,
        topology: Topology,
        position: Position,
        profile: Profile,
        layout: GradientLayout,
        iteration: int,
        timeout_s: float,
        device: torch.device,
        on_chunk: Callable[[], None] = lambda: None,
        check: Callable[[], None] | None = None,
    ) -> None:
        """`on_chunk`: called as each chunk from the ring predecessor is taken in; `check`:
        called while a chunk is waited for (`Receiver`)."""
        num_replicas = topology.num_replicas
        stage, replica = position.stage, position.replica
        self._transport, self._iteration, self._timeout_s = transport, iteration, timeout_s
        self._on_chunk, self._check = on_chunk, check
        self._num_replicas, self._layout = num_replicas, layout
        self._stage, self._replica = stage, replica
        self._sizes: tuple[int, ...] = ()
        self._doing: tuple[bool, int] | None = None
        """The chunk it sends (True) or waits for (False) now, by index; None: neither."""
        self._incoming: Receiver | None = None
        """The receiver thread of the ring predecessor's chunks, once a bucket is posted."""
        if num_replicas < 2:
            return  # no ring
        element_bytes = layout.element_bytes
        if profile.dp_bucket_bytes % element_bytes or layout.num_bytes % element_bytes:
            raise ConfigError(
                f"a ring over a gradient of {layout.element_bytes}-byte elements needs whole "
                f"elements: dp_bucket_bytes {profile.dp_bucket_bytes} and the gradient's "
                f"{layout.num_bytes} bytes must be multiples of {layout.element_bytes}"
            )
        self._sizes = buckets(layout.num_bytes, profile.dp_bucket_bytes)
        receiver, self._link, self._direction = ring_peer(stage, replica, num_replicas)
        sender = (replica - 1) % num_replicas
        _, self._in_link, self._in_direction = ring_peer(stage, sender, num_replicas)
        self._to_rank = topology.worker(Position(stage, receiver))
        self._from_rank = topology.worker(Position(stage, sender))
        largest = self._chunk_bytes(max(self._sizes, default=0))
        steps = ring_steps(num_replicas)
        real = layout.element_bytes > 1
        self._payload = torch.zeros(
            num_replicas * largest if real else largest, dtype=torch.uint8, device=device
        )
        """The emulated chunks' zeros; with a real gradient, a bucket padded to D chunks."""
        self._inboxes = [
            [torch.empty(largest, dtype=torch.uint8, device=device) for _ in range(steps)]
            for _ in range(min(2, len(self._sizes)))
        ]

    def _chunk_bytes(self, bucket: int) -> int:
        return chunk_bytes(bucket, self._num_replicas, self._layout.element_bytes)

    def post(self) -> None:
        """Post the first bucket's receives and start the receiver thread on them (none
        without a ring)."""
        if self._sizes:
            self._post(0)
            assert self._incoming is not None
            self._incoming.start()

    def run(self, gradient: torch.Tensor | None = None) -> RingRecords:
        """The all-reduce (of `gradient` in place: a flat tensor of the layout's size; None:
        zeros); returns, with its records, when this position's last chunk has been sent and
        the last one from its ring predecessor has arrived."""
        records = RingRecords()
        if not self._sizes:
            return records
        if (gradient is None) != (self._layout.element_bytes == 1) or (
            gradient is not None
            and (gradient.element_size(), gradient.numel() * gradient.element_size())
            != (self._layout.element_bytes, self._layout.num_bytes)
        ):
            raise BackendError(
                f"the DP ring was set up for {self._layout}, and is given "
                + ("no gradient" if gradient is None else f"{gradient.numel()} x {gradient.dtype}")
            )
        pid = os.getpid()
        link, direction = str(self._link), self._direction
        incoming = self._incoming
        assert incoming is not None, "post() first"
        first_byte = 0
        for bucket, size in enumerate(self._sizes):
            if bucket + 1 < len(self._sizes):
                self._post(bucket + 1)
            chunk = self._chunk_bytes(size)
            indices = self._indices(bucket)
            sums = None if gradient is None else self._load(gradient, first_byte, size, chunk)
            for k, index in enumerate(indices):
                if k:
                    self._take(incoming, indices[k - 1], records, self._limit_s(bucket, k - 1))
                    if sums is not None:
                        self._combine(sums, k - 1, self._inboxes[bucket % 2][k - 1][:chunk])
                payload = self._payload[:chunk] if sums is None else sums[self._sent_chunk(k)]
                self._doing = (True, index)
                start = time.monotonic()
                fault_ms = self._transport.send_dp(
                    self._to_rank, link, direction, self._iteration, index, payload
                )
                records.sends.append(
                    (link, direction, index, chunk, start, time.monotonic(), fault_ms, start, pid)
                )
            self._take(incoming, indices[-1], records, self._limit_s(bucket, len(indices) - 1))
            if gradient is not None and sums is not None:  # sums: the bucket's, loaded
                last = len(indices) - 1
                self._combine(sums, last, self._inboxes[bucket % 2][last][:chunk])
                gradient.view(torch.uint8)[first_byte : first_byte + size].copy_(
                    self._payload[:size]
                )
            first_byte += size
        self._doing = None
        incoming.finish(self._timeout_s)
        self._incoming = None
        return records

    def _load(
        self, gradient: torch.Tensor, first_byte: int, size: int, chunk: int
    ) -> list[torch.Tensor]:
        """The bucket's bytes of `gradient` in the padded work buffer, as its D chunks."""
        work = self._payload[: self._num_replicas * chunk]
        work[:size].copy_(gradient.view(torch.uint8)[first_byte : first_byte + size])
        work[size:].zero_()
        return list(work.split(chunk))

    def _sent_chunk(self, step: int) -> int:
        """Which of the bucket's chunks replica r sends at `step`: r - k in the reduce-scatter
        (k < D-1), then r + 1 - (k - (D-1)): each step forwards what the step before
        finished."""
        d = self._num_replicas
        return (self._replica - step if step < d - 1 else self._replica + d - step) % d

    def _combine(self, sums: list[torch.Tensor], step: int, received: torch.Tensor) -> None:
        """Step `step`'s chunk from the predecessor (its own chunk `_sent_chunk(step)`, one
        below ours) into ours: added in the reduce-scatter, kept in the all-gather."""
        target = sums[(self._sent_chunk(step) - 1) % self._num_replicas]
        if step < self._num_replicas - 1:
            dtype = _ELEMENT_DTYPES[self._layout.element_bytes]
            target.view(dtype).add_(received.view(dtype))
        else:
            target.copy_(received)

    def doing(self) -> str:
        """What this position does in its ring now, in words: "in the DP ring of stage 0,
        waiting for chunk 5 (of chunks 0-7) from rank 3 over dp0:0-1" (the chunk's index on
        its link direction, as in the records), or "sending chunk 5 ... to rank 1 over
        ...". Called from another thread: it reads what `run` sets, one attribute."""
        doing = self._doing
        where = f"in the DP ring of stage {self._stage}"
        if not self._sizes:
            return f"{where} (none: one replica)"
        if doing is None:
            return where
        sending, index = doing
        last = len(self._sizes) * ring_steps(self._num_replicas) - 1
        chunk = f"chunk {index} (of chunks 0-{last})"
        if sending:
            return f"{where}, sending {chunk} to rank {self._to_rank} over {self._link}"
        return f"{where}, waiting for {chunk} from rank {self._from_rank} over {self._in_link}"

    def stop(self) -> None:
        """Let the receiver thread end (a daemon: one still inside a wait ends with the
        process)."""
        if self._incoming is not None:
            self._incoming.stop(0.0)
            self._incoming = None

    def _indices(self, bucket: int) -> list[int]:
        return [
            message_index(bucket, k, self._num_replicas)
            for k in range(ring_steps(self._num_replicas))
        ]

    def _post(self, bucket: int) -> None:
        chunk = self._chunk_bytes(self._sizes[bucket])
        inbox = self._inboxes[bucket % 2]
        receives = [
            (index, self._transport.post_dp_receive(self._from_rank, index, buffer[:chunk]))
            for index, buffer in zip(self._indices(bucket), inbox, strict=True)
        ]
        if self._incoming is None:
            self._incoming = Receiver(self._from_rank, None, receives, more=True, check=self._check)
        else:
            self._incoming.add(receives)

    def _limit_s(self, bucket: int, step: int) -> float | None:
        """How long the ring waits for the chunk of `step` in `bucket`: the timeout for one
        message, but no limit where the chunk comes only once other replicas' pipelines have
        ended (the first bucket's steps before D-1: the module's docstring)."""
        return None if bucket == 0 and step < self._num_replicas - 1 else self._timeout_s

    def _take(
        self, incoming: Receiver, index: int, records: RingRecords, limit_s: float | None
    ) -> None:
        """Wait for chunk `index` from the ring predecessor (for up to `limit_s`; None: no
        limit) and record it."""
        self._doing = (False, index)
        needed = time.monotonic()
        arrival = incoming.take(index, limit_s)
        records.receives.append(
            (
                str(self._in_link),
                self._in_direction,
                index,
                arrival.arrived_s,
                needed,
                arrival.copy_in_s,
            )
        )
        self._on_chunk()
