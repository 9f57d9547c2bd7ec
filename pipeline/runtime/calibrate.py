"""Measure this host's runtime costs (pipeline.host_costs) with microbenchmarks of the real
worker runtime: never the schedules a calibrated simulator is then judged on.

- per-op overhead: one stage running 2 ms ops back to back (no messages): the mean time
  between consecutive op starts beyond the ops' own durations;
- send cost: `num_stages` stages passing messages of 0, 1/4, 1, 4 and 8 MiB in an order with
  traffic both ways at once (the same warm-up on every stage, then a backward and a forward
  in turn; 1 ms ops): how long a blocking send holds its sender, fitted as a fixed cost plus
  a cost per MiB (Theil-Sen over the sizes);
- receive lag: in the same runs, from a send's return to the start of the op that was
  waiting for it (only ops whose stage was idle when the send returned), fitted alike;
- ring lag: a healthy DP ring on `num_stages` stages x 2 replicas (every stage's ring at
  once, as in training; 16 chunks of 125 kB per link direction after a short 1F1B): the mean
  time between a link direction's consecutive chunk sends, beyond what the send cost and the
  receive lag fitted above make of it;
- with delegates, the delegated path's copies and pick-up, the ring lag over them, and a
  failover: one iteration in
  which the fault hook has every route's NIC down, so that every sender delegate moves to
  the next NIC at its first message (the median, from noticing to taking over).

Means, not medians: an iteration adds these costs up along its critical path, so their
expected values count, long tails included (a send of 8 MiB: median 5 ms, p90 8 ms here).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import platform
import statistics
from collections.abc import Callable

from pipeline.faults import MessageFault
from pipeline.host_costs import HostCosts
from pipeline.profile import Profile
from pipeline.runtime.pool import IterationConfig, WorkerPool
from pipeline.runtime.transport import DelegateFactory
from pipeline.schedule import Schedule
from pipeline.timeline import Timeline
from pipeline.topology import Link

__all__ = ["SEND_SIZES", "measure_host_costs", "receive_lags_ms"]

SEND_SIZES = (0, 1 << 18, 1 << 20, 1 << 22, 1 << 23)
_MIB = 1 << 20


def _busy_both_ways(num_stages: int, num_microbatches: int) -> Schedule:
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


def _op_overhead_ms(timelines: list[Timeline], op_ms: float) -> float:
    gaps = []
    for timeline in timelines:
        starts = sorted(r.start_ms for r in timeline.ops)
        gaps += [b - a - op_ms for a, b in itertools.pairwise(starts)]
    return max(statistics.fmean(gaps), 0.0)


def _fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """y = a + b x by Theil-Sen (the median of the pairwise slopes, then the median
    intercept): one noisy point does not move it. Both clamped at 0 (they are costs)."""
    slopes = [(y2 - y1) / (x2 - x1) for (x1, y1), (x2, y2) in itertools.combinations(points, 2)]
    slope = max(statistics.median(slopes), 0.0)
    return max(statistics.median(y - slope * x for x, y in points), 0.0), slope


def receive_lags_ms(timeline: Timeline) -> list[float]:
    """Send return to the consuming op's start, where the consumer sat idle waiting."""
    by_stage: dict[int, list] = {}
    for record in sorted(timeline.ops, key=lambda r: r.start_ms):
        by_stage.setdefault(record.stage, []).append(record)
    lags = []
    for message in timeline.messages:
        link = Link.parse(message.link)
        stage = link.second if message.direction == "forward" else link.first
        wanted = "F" if message.direction == "forward" else "BW"
        ops = by_stage[stage]
        for before, op in itertools.pairwise(ops):
            if op.kind.value == wanted and op.microbatch == message.microbatch:
                if before.end_ms < message.send_end_ms:  # it was waiting
                    lags.append(op.start_ms - message.send_end_ms)
                break
    return lags


def measure_host_costs(
    repeats: int = 3,
    num_stages: int = 4,
    progress: Callable[[str], None] = lambda line: None,
    delegates: DelegateFactory | None = None,
) -> HostCosts:
    """About 20 s: three pools (1, `num_stages` and 2 x `num_stages` workers: as many as
    the runs to predict, since concurrent transfers share the host's cores), `repeats`
    measured iterations per point; with `delegates` (adaptra.transport), two more with them,
    for the delegated path's costs (about 15 s more)."""
    counter = [0]
    op_ms = 2.0
    with WorkerPool(1) as pool:
        lone = Profile.uniform(1, 16, op_ms, op_ms / 2, op_ms / 2)  # every op 2 ms
        ops = [f"F{m}" for m in range(16)] + [f"BW{m}" for m in range(16)]
        schedule = Schedule.from_dict({"stages": [ops]})
        op_overhead_ms = _op_overhead_ms(_runs(pool, schedule, lone, repeats, counter), op_ms)
    progress(f"per-op overhead: {op_overhead_ms:.3f} ms")
    sends: list[tuple[float, float]] = []
    lags: list[tuple[float, float]] = []
    counter = [0]
    with WorkerPool(num_stages) as pool:
        schedule = _busy_both_ways(num_stages, 12)
        for num_bytes in SEND_SIZES:
            profile = Profile.uniform(num_stages, 12, 1.0, 0.5, 0.5, message_bytes=num_bytes)
            timelines = _runs(pool, schedule, profile, repeats, counter)
            durations = [m.send_end_ms - m.send_start_ms for t in timelines for m in t.messages]
            sends.append((num_bytes / _MIB, statistics.fmean(durations)))
            waited = [lag for t in timelines for lag in receive_lags_ms(t)]
            lag_ms = statistics.fmean(waited) if waited else 0.0
            if waited:
                lags.append((num_bytes / _MIB, lag_ms))
            progress(f"{num_bytes} B: send {sends[-1][1]:.3f} ms, receive lag {lag_ms:.3f} ms")
    send_fixed_ms, send_ms_per_mib = _fit_line(sends)
    receive_lag_ms, receive_lag_ms_per_mib = _fit_line(lags) if len(lags) > 1 else (0.0, 0.0)
    costs = HostCosts(
        send_fixed_ms=send_fixed_ms,
        send_ms_per_mib=send_ms_per_mib,
        receive_lag_ms=receive_lag_ms,
        receive_lag_ms_per_mib=receive_lag_ms_per_mib,
        op_overhead_ms=op_overhead_ms,
        host=platform.node(),
        measured_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )
    costs = dataclasses.replace(costs, ring_lag_ms=_ring_lag_ms(costs, num_stages, repeats))
    progress(f"DP ring lag: {costs.ring_lag_ms:.3f} ms per chunk")
    if delegates is None:
        return costs
    return _with_delegated_costs(costs, delegates, repeats, num_stages, progress)


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


def _ring_lag_ms(
    costs: HostCosts, num_stages: int, repeats: int, delegates: DelegateFactory | None = None
) -> float:
    """The mean ring step beyond the simulator's for it with `costs` (a send, then the
    receive lag: `pipeline.allreduce.ring_done_ms`), clamped at 0; with `delegates`, of a
    ring over them (3 per link direction and side)."""
    chunk = 125_000  # bytes: 8 buckets of 2 chunks each way
    profile = Profile.uniform(
        num_stages, 4, 1.0, 0.5, 0.5, message_bytes=4096, num_replicas=2,
        allreduce_bytes=8 * 2 * chunk, dp_bucket_bytes=2 * chunk,
    )  # fmt: skip
    counter = [0]
    comm = "direct" if delegates is None else "delegated"
    num_delegates = 0 if delegates is None else 3
    with WorkerPool(num_stages, 2, delegates=delegates, num_delegates=num_delegates) as pool:
        schedule = _busy_both_ways(num_stages, 4)
        timelines = _runs(pool, schedule, profile, repeats, counter, comm=comm)
    beyond = [
        gap - profile.dp_wire_ms(size) - costs.send_ms(size) - costs.receive_lag_for_ms(size)
        for timeline in timelines
        for size, gap in _ring_step_gaps_ms(timeline)
    ]
    return max(statistics.fmean(beyond), 0.0)


def _with_delegated_costs(
    costs: HostCosts,
    delegates: DelegateFactory,
    repeats: int,
    num_stages: int,
    progress: Callable[[str], None],
) -> HostCosts:
    """The same runs over delegates (3 per link direction and side: each free when its next
    message comes): the sender's hand-over, the delegate's pick-up, the copy in."""
    copies_out: list[tuple[float, float]] = []
    copies_in: list[tuple[float, float]] = []
    pickups: list[float] = []
    counter = [0]
    with WorkerPool(num_stages, delegates=delegates, num_delegates=3) as pool:
        schedule = _busy_both_ways(num_stages, 12)
        for num_bytes in SEND_SIZES:
            profile = Profile.uniform(num_stages, 12, 1.0, 0.5, 0.5, message_bytes=num_bytes)
            timelines = _runs(pool, schedule, profile, repeats, counter, comm="delegated")
            messages = [m for t in timelines for m in t.messages]
            mib = num_bytes / _MIB
            copies_out.append(
                (mib, statistics.fmean(m.send_end_ms - m.send_start_ms for m in messages))
            )
            copies_in.append((mib, statistics.fmean(m.copy_in_ms for m in messages)))
            pickups += [m.wire_start_ms - m.send_end_ms for m in messages]
            progress(
                f"{num_bytes} B delegated: copy out {copies_out[-1][1]:.3f} ms, copy in "
                f"{copies_in[-1][1]:.3f} ms"
            )
        failover_ms = _failover_ms(pool, schedule, num_stages, counter)
        progress(f"failover to the next NIC: {failover_ms:.3f} ms")
    out_fixed, out_per_mib = _fit_line(copies_out)
    in_fixed, in_per_mib = _fit_line(copies_in)
    ring_lag_ms = _ring_lag_ms(costs, num_stages, repeats, delegates)
    progress(f"DP ring lag over the delegates: {ring_lag_ms:.3f} ms per chunk")
    return dataclasses.replace(
        costs,
        copy_out_fixed_ms=out_fixed,
        copy_out_ms_per_mib=out_per_mib,
        delegate_pickup_ms=max(statistics.fmean(pickups), 0.0),
        copy_in_fixed_ms=in_fixed,
        copy_in_ms_per_mib=in_per_mib,
        failover_ms=failover_ms,
        delegated_ring_lag_ms=ring_lag_ms,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _EveryRouteDown:
    """Faults in which every PP message's route has its NIC down (picklable)."""

    def message_fault(
        self,
        link: Link,
        direction: str,
        kind: str,
        microbatch: int,
        num_bytes: int = 0,
        offset_ms: float = 0.0,
    ) -> MessageFault:
        return MessageFault(failed=link.is_pp)

    def affects(self, link: Link) -> bool:
        return True

    def cache_key(self) -> None:
        return None


def _failover_ms(
    pool: WorkerPool, schedule: Schedule, num_stages: int, counter: list[int]
) -> float:
    """The median failover of the pool's sender delegates, each moving once (a pool's last
    measurement: its delegates stay on the next NIC)."""
    profile = Profile.uniform(num_stages, 12, 1.0, 0.5, 0.5, message_bytes=1 << 16)
    config = IterationConfig(
        counter[0], schedule, profile, comm="delegated", faults=_EveryRouteDown()
    )
    timeline = pool.run_iteration(config)
    counter[0] += 1
    return statistics.median(f.resumed_ms - f.noticed_ms for f in timeline.failovers)
