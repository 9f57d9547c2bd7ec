"""Measure this host's runtime costs (pipeline.host_costs) with microbenchmarks of the real
worker runtime: never the schedules a calibrated simulator is then judged on.

- per-op overhead: one stage running ops of `op_ms` back to back (no messages): the mean
  time between consecutive op starts beyond the ops' own durations (mostly an op overrunning
  its asked time, which depends on how long the op sleeps: measured at the runs' length);
- send cost: `num_stages` stages passing messages of each of `SEND_SIZES` in an order with
  traffic both ways at once (the same warm-up on every stage, then a backward and a forward
  in turn; ops of `op_ms`): how long a blocking send holds its sender, its mean at each size,
  made non-decreasing in the size (a `CostCurve`: the cost per byte is not one number here,
  it grows with the size);
- receive lag: in the same runs, from a send's return to the start of the op that was
  waiting for it (only messages whose consumer had asked for them by then: one still in an
  op or in a blocking send of its own would add that), alike;
- ring lag: healthy DP rings on `num_stages` stages x 2 replicas (after a short pipeline),
  with the first 1, 2, ... `num_stages` stages reducing a gradient in chunks of each of
  `RING_CHUNK_SIZES` (16 chunks per link direction up to 1 MB, 4 above): the mean time
  between a link direction's consecutive chunk sends, beyond what the send cost and the
  receive lag measured above make of it, by the number of rings and the chunk's size.
  Rings at once share the cores (at 125 kB: 0.2-0.3 ms with one here, 0.9-1.1 with four),
  and chunks sent back to back both ways cost more per byte than PP messages between ops
  (40 MB: about 0.8 ms per MB against 0.5 at 8 MiB);
- with delegates, in the same runs over them: the sender's copy out, the pick-up, the rest
  of the way until a message is there (measured, not the direct path's send and receive),
  and from its arrival to the start of an op that waited for it (the receiver copies a
  message as it arrives); the ring lag over them; and a failover: one iteration in
  which the fault hook has every route's NIC down, so that every sender delegate moves to
  the next NIC at its first message (the median, from noticing to taking over).

Means, not medians: an iteration adds these costs up along its critical path, so their
expected values count, long tails included (a send of 8 MiB: median 5 ms, p90 8 ms here).
The ops last `op_ms` (10 ms unless asked: longer than the largest message's send, as in
the runs to predict, where compute hides the transfers; with ops shorter than a send, the
sends queue behind each other and their cost is the queue's). A host whose vCPUs idle between
messages also wakes later after longer ops (0.13 ms a 0 B send after 1 ms ops, 0.18 after
10 ms here): measure with ops as long as those of the runs to predict.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import math
import platform
import statistics
from collections.abc import Callable

from pipeline.errors import ConfigError
from pipeline.faults import MessageFault
from pipeline.host_costs import (
    DEFAULT_CALIBRATION_OP_MS,
    NO_COST,
    CostCurve,
    HostCosts,
    RingLag,
)
from pipeline.profile import Profile
from pipeline.runtime.pool import DEFAULT_TIMEOUT_S, IterationConfig, WorkerPool
from pipeline.runtime.transport import DelegateFactory
from pipeline.schedule import Schedule
from pipeline.timeline import Timeline
from pipeline.topology import Direction, Link

__all__ = [
    "NUM_DELEGATES",
    "RING_CHUNK_SIZES",
    "SEND_SIZES",
    "busy_both_ways",
    "busy_microbatches",
    "busy_profile",
    "largest_pool",
    "lone_stage",
    "measure_host_costs",
    "message_wait_s",
    "op_overhead_ms_of",
    "receive_lags_ms",
]

SEND_SIZES = (0, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 23)
NUM_DELEGATES = 3
"""Delegates per link direction and side in the runs over delegates."""
RING_CHUNK_SIZES = (125_000, 1_000_000, 4_000_000, 16_000_000, 40_000_000)
"""The DP ring's chunk sizes measured, bytes: up to the default bucket's chunk at DP 2
(pipeline.allreduce: 80 MB buckets)."""


MESSAGE_WAIT_S = DEFAULT_TIMEOUT_S
"""The margin of a calibration's workers' wait for one message over the longest wait of a
healthy calibration: the pool's default wait."""


def message_wait_s(num_stages: int, op_ms: float) -> float:
    """How long the workers of a `busy_both_ways` run of `num_stages` stages with ops of
    `op_ms` wait for one message: MESSAGE_WAIT_S beyond the longest a healthy stage waits
    (stage 0's first backward, for the warm-up's forwards to reach the last stage and their
    gradient to come back: 2 (S - 1) ops), counted as 2 S ops. The pools' default wait alone,
    60 s, timed out every calibration with ops of 60 s / (2 (S - 1)) or more (4 stages with
    10 s ops: stage 0's first gradient), after its per-op overhead's run, though `--op-ms`
    takes up to MAX_CALIBRATION_OP_MS."""
    return MESSAGE_WAIT_S + 2 * num_stages * op_ms / 1000


def busy_both_ways(num_stages: int, num_microbatches: int) -> Schedule:
    """Every stage runs `num_stages` forwards, then alternates a backward and a forward: a
    pipeline whose links carry activations down and gradients up at once, as training does
    (the warm-up is the same on every stage: no judged schedule has this order)."""
    warmup = min(num_stages, num_microbatches)
    ops = [f"F{m}" for m in range(warmup)]
    for m in range(num_microbatches - warmup):
        ops += [f"BW{m}", f"F{m + warmup}"]
    ops += [f"BW{m}" for m in range(num_microbatches - warmup, num_microbatches)]
    return Schedule.from_dict({"stages": [ops] * num_stages})


def _runs(
    pool: WorkerPool,
    schedule: Schedule,
    profile: Profile,
    repeats: int,
    counter: list[int],
    comm: str = "direct",
) -> list[Timeline]:
    """`repeats` measured iterations after one warm-up."""
    timelines = []
    for k in range(repeats + 1):
        config = IterationConfig(counter[0], schedule, profile, comm=comm)
        timeline = pool.run_iteration(config)
        counter[0] += 1
        if k:
            timelines.append(timeline)
    return timelines


def lone_stage(op_ms: float, num_microbatches: int = 16) -> tuple[Schedule, Profile]:
    """The per-op overhead's pipeline: one stage, every forward then every BW, each op
    lasting `op_ms` (its overrun, most of the overhead, depends on how long it sleeps)."""
    profile = Profile.uniform(1, num_microbatches, op_ms, op_ms / 2, op_ms / 2)
    ops = [f"F{m}" for m in range(num_microbatches)]
    ops += [f"BW{m}" for m in range(num_microbatches)]
    return Schedule.from_dict({"stages": [ops]}), profile


def op_overhead_ms_of(timelines: list[Timeline], op_ms: float) -> float:
    """The mean time between consecutive op starts beyond `op_ms` (every op's asked
    length), never below 0."""
    gaps = []
    for timeline in timelines:
        starts = sorted(r.start_ms for r in timeline.ops)
        gaps += [b - a - op_ms for a, b in itertools.pairwise(starts)]
    return max(statistics.fmean(gaps), 0.0)


def receive_lags_ms(timeline: Timeline, from_arrival: bool = False) -> list[float]:
    """From a send's return (or, `from_arrival`, the message's arrival: a delegated one's) to
    the start of the op that takes the message in, for each message whose consumer had
    already asked for it then (`needed_ms` <= that: the stage had finished everything before
    that op, its own sends included, and sat waiting). A consumer still busy then, in an op or
    in a blocking send of its own, would add that to the lag."""
    starts = {(r.stage, r.replica, r.kind.value, r.microbatch): r.start_ms for r in timeline.ops}
    lags = []
    for message in timeline.messages:
        since_ms = message.arrival_ms if from_arrival else message.send_end_ms
        if message.needed_ms > since_ms:
            continue
        link = Link.parse(message.link)
        if not link.is_pp:  # a ring's chunk: no op takes it in
            continue
        forward = message.direction == Direction.FORWARD
        stage = link.receiver(message.direction).stage
        for kind in ("F",) if forward else ("B", "BW"):
            start = starts.get((stage, message.replica, kind, message.microbatch))
            if start is not None:
                lags.append(start - since_ms)
                break
    return lags


def _curve(samples: dict[int, list[float]]) -> CostCurve:
    """The mean cost at each size, made non-decreasing in the size (a longer message, or
    more rings at once, never costs less: where a smaller size's mean is above a larger's, a
    tail caught in one of them, the two are pooled, weighted by their counts) and never
    below 0."""
    blocks: list[tuple[list[int], float, int]] = []  # (sizes, mean, count), sizes in order
    for size in sorted(samples):
        values = samples[size]
        if not values:
            continue
        sizes, mean, count = [size], statistics.fmean(values), len(values)
        while blocks and blocks[-1][1] > mean:
            before, before_mean, before_count = blocks.pop()
            sizes = before + sizes
            mean = (before_mean * before_count + mean * count) / (before_count + count)
            count += before_count
        blocks.append((sizes, mean, count))
    points = tuple((size, max(mean, 0.0)) for sizes, mean, _ in blocks for size in sizes)
    return CostCurve(points) if points else NO_COST


def busy_microbatches(num_stages: int, at_least: int = 12) -> int:
    """The calibration's microbatches per iteration: `at_least`, or one per stage where the
    stages are more (a pipeline needs as many)."""
    return max(at_least, num_stages)


def busy_profile(num_stages: int, num_bytes: int, op_ms: float) -> Profile:
    """Forwards of `op_ms`, backwards and weight gradients of half that (BW: `op_ms`), over
    `busy_microbatches(num_stages)` microbatches."""
    return Profile.uniform(
        num_stages, busy_microbatches(num_stages), op_ms, op_ms / 2, op_ms / 2,
        message_bytes=num_bytes,
    )  # fmt: skip


def measure_host_costs(
    repeats: int = 3,
    num_stages: int = 4,
    progress: Callable[[str], None] = lambda line: None,
    delegates: DelegateFactory | None = None,
    op_ms: float = DEFAULT_CALIBRATION_OP_MS,
    dp_ring: bool = True,
) -> HostCosts:
    """Three pools (1, `num_stages` and 2 x `num_stages` workers: as many as the runs to
    predict, since concurrent transfers share the host's cores), `repeats` measured
    iterations per point; with `delegates` (adaptra.transport), two more with them, for the
    delegated path's costs; without `dp_ring`, no DP ring's lag (free: for runs with no DP
    ring to predict)."""
    if not (math.isfinite(op_ms) and op_ms > 0):
        raise ConfigError(f"calibration ops must last > 0 ms, got {op_ms!r}")
    counter = [0]
    with WorkerPool(1, timeout_s=message_wait_s(1, op_ms)) as pool:
        schedule, lone = lone_stage(op_ms)
        timelines = _runs(pool, schedule, lone, repeats, counter)
        op_overhead_ms = op_overhead_ms_of(timelines, op_ms)
    progress(f"per-op overhead: {op_overhead_ms:.3f} ms")
    sends: dict[int, list[float]] = {}
    lags: dict[int, list[float]] = {}
    counter = [0]
    with WorkerPool(num_stages, timeout_s=message_wait_s(num_stages, op_ms)) as pool:
        schedule = busy_both_ways(num_stages, busy_microbatches(num_stages))
        for num_bytes in SEND_SIZES:
            profile = busy_profile(num_stages, num_bytes, op_ms)
            timelines = _runs(pool, schedule, profile, repeats, counter)
            sends[num_bytes] = [
                m.send_end_ms - m.send_start_ms for t in timelines for m in t.messages
            ]
            lags[num_bytes] = [lag for t in timelines for lag in receive_lags_ms(t)]
            progress(
                f"{num_bytes} B, ops of {profile.t_f_ms[0]:g} ms: send "
                f"{statistics.fmean(sends[num_bytes]):.3f} ms, receive lag "
                f"{statistics.fmean(lags[num_bytes] or [0.0]):.3f} ms"
            )
    costs = HostCosts(
        send_ms_by_bytes=_curve(sends),
        receive_lag_ms_by_bytes=_curve(lags),
        op_overhead_ms=op_overhead_ms,
        host=platform.node(),
        measured_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        op_ms=op_ms,
        num_stages=num_stages,
    )
    if dp_ring:
        ring_lag = _ring_lag(costs, num_stages, repeats)
        progress(f"DP ring lag per chunk, by the rings at once: {_by_rings(ring_lag)}")
        costs = dataclasses.replace(costs, ring_lag_ms_by_rings=ring_lag)
    if delegates is None:
        return costs
    return _with_delegated_costs(costs, delegates, repeats, num_stages, progress, op_ms, dp_ring)


def _ring_step_gaps_ms(timeline: Timeline) -> list[tuple[int, float]]:
    """(chunk bytes, ms from its send's start to the next one's) for each DP chunk that a
    link direction sent after another in the same iteration."""
    by_direction: dict[tuple[int, str, str], list] = {}
    for message in timeline.dp_messages:
        key = (message.iteration, message.link, message.direction)
        by_direction.setdefault(key, []).append(message)
    gaps = []
    for messages in by_direction.values():
        messages.sort(key=lambda m: m.send_start_ms)
        gaps += [
            (b.num_bytes, b.send_start_ms - a.send_start_ms)
            for a, b in itertools.pairwise(messages)
        ]
    return gaps


def ring_profile(num_stages: int, num_rings: int, chunk_bytes: int) -> Profile:
    """The ring lag's pipeline: `num_stages` x 2 replicas, 1 ms ops, the first `num_rings`
    stages reducing a gradient in chunks of `chunk_bytes` (buckets of 2 chunks: 8 of them up
    to 1 MB chunks, 2 above)."""
    num_buckets = 8 if chunk_bytes <= 1_000_000 else 2
    gradient = [num_buckets * 2 * chunk_bytes if s < num_rings else 0 for s in range(num_stages)]
    return Profile.uniform(
        num_stages, busy_microbatches(num_stages, 4), 1.0, 0.5, 0.5, message_bytes=4096,
        num_replicas=2, allreduce_bytes=gradient, dp_bucket_bytes=2 * chunk_bytes,
    )  # fmt: skip


def largest_pool(num_stages: int) -> Profile:
    """The profile of the calibration's largest pool, the DP ring's lag over delegates (2
    replicas, `NUM_DELEGATES`): what a host's process limit is held against."""
    profile = ring_profile(num_stages, num_stages, RING_CHUNK_SIZES[0])
    return dataclasses.replace(profile, num_delegates=NUM_DELEGATES)


def _ring_lag(
    costs: HostCosts, num_stages: int, repeats: int, delegates: DelegateFactory | None = None
) -> RingLag:
    """The mean ring step beyond the simulator's for it with `costs` (a send, then the
    receive lag: `pipeline.allreduce.rings_done_ms`), by the number of stages whose rings
    run at once (1 to `num_stages`: the first n stages have a gradient) and the chunk's size
    (`RING_CHUNK_SIZES`), made non-decreasing in the size and clamped at 0; with
    `delegates`, of rings over them (3 per link direction and side)."""
    comm = "direct" if delegates is None else "delegated"
    num_delegates = 0 if delegates is None else NUM_DELEGATES
    by_rings: list[tuple[int, CostCurve]] = []
    counter = [0]
    with WorkerPool(num_stages, 2, delegates=delegates, num_delegates=num_delegates) as pool:
        schedule = busy_both_ways(num_stages, busy_microbatches(num_stages, 4))
        for num_rings in range(1, num_stages + 1):
            beyond: dict[int, list[float]] = {}  # ms by the chunk's bytes
            for chunk in RING_CHUNK_SIZES:
                profile = ring_profile(num_stages, num_rings, chunk)
                # Small chunks: three times the iterations (each lasts some 40 ms): a lone
                # ring's mean at 125 kB moved 0-0.41 ms between calibrations with 3, 0.19 in
                # both of two with 10.
                num_runs = 3 * repeats if chunk <= 1_000_000 else repeats
                timelines = _runs(pool, schedule, profile, num_runs, counter, comm=comm)
                beyond[chunk] = [
                    gap
                    - profile.dp_wire_ms(size)
                    - costs.send_ms(size)
                    - costs.receive_lag_for_ms(size)
                    for t in timelines
                    for size, gap in _ring_step_gaps_ms(t)
                ]
            by_rings.append((num_rings, _at_least_fewer_rings(_curve(beyond), by_rings)))
    return RingLag(tuple(by_rings))


def _at_least_fewer_rings(curve: CostCurve, fewer: list[tuple[int, CostCurve]]) -> CostCurve:
    """`curve` raised at each size to the lag with fewer rings at once (`fewer`'s last: more
    rings never cost less; a smaller mean with more is noise). Non-decreasing in the size
    stays so: the larger of two non-decreasing curves is."""
    if not fewer:
        return curve
    below = fewer[-1][1]
    return CostCurve(tuple((size, max(ms, below.ms(size))) for size, ms in curve.points))


def _by_rings(ring_lag: RingLag) -> str:
    return "; ".join(
        f"{rings}: " + ", ".join(f"{ms:.2f} ms at {size / 1e6:g} MB" for size, ms in curve.points)
        for rings, curve in ring_lag.by_rings
    )


def _with_delegated_costs(
    costs: HostCosts,
    delegates: DelegateFactory,
    repeats: int,
    num_stages: int,
    progress: Callable[[str], None],
    op_ms: float,
    dp_ring: bool,
) -> HostCosts:
    """The same runs over delegates (3 per link direction and side: each free when its next
    message comes): the sender's hand-over, the delegate's pick-up (one mean at every size),
    the rest of the way until the message is there, and from there to its op's start (for
    ops that waited for it: the receiver's notice and copy in)."""
    copies_out: dict[int, list[float]] = {}
    copies_in: dict[int, list[float]] = {}
    pickups: list[float] = []
    handed_to_arrival: dict[int, list[float]] = {}
    counter = [0]
    wait_s = message_wait_s(num_stages, op_ms)
    with WorkerPool(
        num_stages, delegates=delegates, num_delegates=NUM_DELEGATES, timeout_s=wait_s
    ) as pool:
        schedule = busy_both_ways(num_stages, busy_microbatches(num_stages))
        for num_bytes in SEND_SIZES:
            profile = busy_profile(num_stages, num_bytes, op_ms)
            timelines = _runs(pool, schedule, profile, repeats, counter, comm="delegated")
            messages = [m for t in timelines for m in t.messages]
            copies_out[num_bytes] = [m.send_end_ms - m.send_start_ms for m in messages]
            copies_in[num_bytes] = [
                lag for t in timelines for lag in receive_lags_ms(t, from_arrival=True)
            ]
            pickups += [m.wire_start_ms - m.send_end_ms for m in messages]
            # the wire's time (its latency, its bandwidth's) is the simulator's own term
            handed_to_arrival[num_bytes] = [
                m.arrival_ms - m.send_end_ms - profile.delegated_wire_ms() for m in messages
            ]
            progress(
                f"{num_bytes} B delegated: copy out "
                f"{statistics.fmean(copies_out[num_bytes]):.3f} ms, hand-over to arrival "
                f"{statistics.fmean(handed_to_arrival[num_bytes]):.3f} ms, arrival to its op "
                f"{statistics.fmean(copies_in[num_bytes] or [0.0]):.3f} ms"
            )
        failover_ms = _failover_ms(pool, schedule, num_stages, counter)
        progress(f"failover to the next NIC: {failover_ms:.3f} ms")
    # The transfer is from the hand-over's return less the pick-up charged (0 where its mean
    # is negative: a pick-up can come before the hand-over returns, which posts the job, then
    # returns), so that free delegates' arrivals come out as measured on average.
    pickup_ms = statistics.fmean(pickups)
    transfers = {
        size: [ms - max(pickup_ms, 0.0) for ms in samples]
        for size, samples in handed_to_arrival.items()
    }
    costs = dataclasses.replace(
        costs,
        copy_out_ms_by_bytes=_curve(copies_out),
        delegate_pickup_ms=max(pickup_ms, 0.0),
        delegate_transfer_ms_by_bytes=_curve(transfers),
        copy_in_ms_by_bytes=_curve(copies_in),
        failover_ms=failover_ms,
    )
    if not dp_ring:
        return costs
    ring_lag = _ring_lag(costs, num_stages, repeats, delegates)
    progress(f"DP ring lag over the delegates, by the rings at once: {_by_rings(ring_lag)}")
    return dataclasses.replace(costs, delegated_ring_lag_ms_by_rings=ring_lag)


@dataclasses.dataclass(frozen=True, slots=True)
class _EveryRouteDown:
    """Faults in which every PP message's route over the first NIC is down (picklable)."""

    def message_fault(
        self,
        link: Link,
        direction: Direction,
        kind: str,
        microbatch: int,
        num_bytes: int = 0,
        offset_ms: float = 0.0,
        nic: int = 0,
    ) -> MessageFault:
        return MessageFault(failed=self.route_failed(link, nic))

    def route_failed(self, link: Link, nic: int, offset_ms: float = 0.0) -> bool:
        return link.is_pp and nic == 0

    def affects(self, link: Link) -> bool:
        return True

    def cache_key(self) -> None:
        return None


def _failover_ms(
    pool: WorkerPool, schedule: Schedule, num_stages: int, counter: list[int]
) -> float:
    """The median failover of the pool's sender delegates, each moving once (a pool's last
    measurement: its delegates stay on the next NIC)."""
    num_microbatches = busy_microbatches(num_stages)
    profile = Profile.uniform(num_stages, num_microbatches, 1.0, 0.5, 0.5, message_bytes=1 << 16)
    config = IterationConfig(
        counter[0], schedule, profile, comm="delegated", faults=_EveryRouteDown()
    )
    timeline = pool.run_iteration(config)
    counter[0] += 1
    return statistics.median(f.resumed_ms - f.noticed_ms for f in timeline.failovers)
