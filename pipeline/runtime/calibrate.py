"""Measure this host's runtime costs (pipeline.host_costs) with microbenchmarks of the real
worker runtime: never the schedules a calibrated simulator is then judged on.

- per-op overhead: one stage running 2 ms ops back to back (no messages): the time between
  consecutive op starts beyond the ops' own durations;
- send cost: two stages passing messages of 0, 1/4, 1, 4 and 8 MiB: how long each blocking
  send holds its sender, fitted as a fixed cost plus a cost per MiB (least squares on the
  medians);
- receive lag: in the same runs, from a send's return to the start of the op that was
  waiting for it (only ops whose stage was idle when the send returned), fitted alike.
"""

from __future__ import annotations

import datetime as dt
import itertools
import platform
import statistics
from collections.abc import Callable

from pipeline.host_costs import HostCosts
from pipeline.profile import Profile
from pipeline.runtime.pool import IterationConfig, WorkerPool
from pipeline.schedule import Schedule
from pipeline.timeline import Timeline

__all__ = ["SEND_SIZES", "measure_host_costs"]

SEND_SIZES = (0, 1 << 18, 1 << 20, 1 << 22, 1 << 23)
_MIB = 1 << 20


def _one_f_one_b_two_stages(num_microbatches: int) -> Schedule:
    """1F1B on two stages (written out: the runtime layer imports no baseline)."""
    n = num_microbatches
    first = ["F0", *(op for m in range(1, n) for op in (f"F{m}", f"BW{m - 1}")), f"BW{n - 1}"]
    last = [op for m in range(n) for op in (f"F{m}", f"BW{m}")]
    return Schedule.from_dict({"stages": [first, last]})


def _runs(
    pool: WorkerPool, schedule: Schedule, profile: Profile, repeats: int, counter: list[int]
) -> list[Timeline]:
    """`repeats` measured iterations after one warm-up."""
    timelines = []
    for k in range(repeats + 1):
        timeline = pool.run_iteration(IterationConfig(counter[0], schedule, profile))
        counter[0] += 1
        if k:
            timelines.append(timeline)
    return timelines


def _op_overhead_ms(timelines: list[Timeline], op_ms: float) -> float:
    gaps = []
    for timeline in timelines:
        starts = sorted(r.start_ms for r in timeline.ops)
        gaps += [b - a - op_ms for a, b in itertools.pairwise(starts)]
    return max(statistics.median(gaps), 0.0)


def _fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares y = a + b x, both clamped at 0 (costs)."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread if spread else 0.0
    slope = max(slope, 0.0)
    return max(mean_y - slope * mean_x, 0.0), slope


def _receive_lags_ms(timeline: Timeline) -> list[float]:
    """Send return to the consuming op's start, where the consumer sat idle waiting."""
    by_stage: dict[int, list] = {}
    for record in sorted(timeline.ops, key=lambda r: r.start_ms):
        by_stage.setdefault(record.stage, []).append(record)
    lags = []
    for message in timeline.messages:
        stage = int(message.link.split("-")[1 if message.direction == "forward" else 0])
        wanted = "F" if message.direction == "forward" else "BW"
        ops = by_stage[stage]
        for before, op in itertools.pairwise(ops):
            if op.kind.value == wanted and op.microbatch == message.microbatch:
                if before.end_ms < message.send_end_ms:  # it was waiting
                    lags.append(op.start_ms - message.send_end_ms)
                break
    return lags


def measure_host_costs(
    repeats: int = 3, progress: Callable[[str], None] = lambda line: None
) -> HostCosts:
    """About 10 s: two pools (1 and 2 workers), `repeats` measured iterations per point."""
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
    with WorkerPool(2) as pool:
        schedule = _one_f_one_b_two_stages(8)
        for num_bytes in SEND_SIZES:
            profile = Profile.uniform(2, 8, 1.0, 0.5, 0.5, message_bytes=num_bytes)
            timelines = _runs(pool, schedule, profile, repeats, counter)
            durations = [m.send_end_ms - m.send_start_ms for t in timelines for m in t.messages]
            sends.append((num_bytes / _MIB, statistics.median(durations)))
            waited = [lag for t in timelines for lag in _receive_lags_ms(t)]
            lags.append((num_bytes / _MIB, statistics.median(waited)))
            progress(f"{num_bytes} B: send {sends[-1][1]:.3f} ms, receive lag {lags[-1][1]:.3f} ms")
    send_fixed_ms, send_ms_per_mib = _fit_line(sends)
    receive_lag_ms, receive_lag_ms_per_mib = _fit_line(lags)
    return HostCosts(
        send_fixed_ms=send_fixed_ms,
        send_ms_per_mib=send_ms_per_mib,
        receive_lag_ms=receive_lag_ms,
        receive_lag_ms_per_mib=receive_lag_ms_per_mib,
        op_overhead_ms=op_overhead_ms,
        host=platform.node(),
        measured_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )
