"""The calibration's cost curves from its measured samples (the measurements themselves run
in tests/harness/test_cli.py: `calibrate`)."""

import itertools
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.host_costs import NO_COST, CostCurve
from pipeline.ops import OpKind
from pipeline.runtime import calibrate
from pipeline.runtime.calibrate import (
    MESSAGE_WAIT_S,
    _at_least_fewer_rings,
    _curve,
    busy_both_ways,
    busy_microbatches,
    busy_profile,
    lone_stage,
    measure_host_costs,
    message_wait_s,
    op_overhead_ms_of,
    receive_lags_ms,
    ring_profile,
)
from pipeline.runtime.pool import WorkerPool
from pipeline.simulator import simulate
from pipeline.timeline import MessageRecord, OpRecord, Timeline


def test_a_tail_at_one_size_is_pooled_with_the_next() -> None:
    """64 KiB caught a 5 ms stall in one of its 4 samples, so its mean is above 256 KiB's:
    the two are pooled by their counts, and the curve does not fall."""
    samples = {0: [0.1, 0.1], 1 << 16: [0.2, 0.2, 0.2, 5.2], 1 << 18: [0.3] * 4, 1 << 20: [1.0]}
    curve = _curve(samples)
    pooled = (4 * 1.45 + 4 * 0.3) / 8
    assert curve.points == ((0, 0.1), (1 << 16, pooled), (1 << 18, pooled), (1 << 20, 1.0))
    assert _curve({0: [], 1: []}) == NO_COST
    assert _curve({0: [-0.5], 8: [-0.1]}).points == ((0, 0.0), (8, 0.0))  # costs, never < 0


def test_a_pooled_top_size_still_grows_past_it() -> None:
    """4 MiB's mean above 8 MiB's (noise) pools the two; the curve past 8 MiB still grows by
    the slope measured across the pool (1 MiB to 8 MiB), not the pooled segment's 0."""
    means = {0: 0.14, 1 << 16: 0.2, 1 << 18: 0.3, 1 << 20: 0.55, 1 << 22: 2.6, 1 << 23: 2.5}
    curve = _curve({size: [ms] * 20 for size, ms in means.items()})
    assert curve.points[-2:] == ((1 << 22, pytest.approx(2.55)), (1 << 23, pytest.approx(2.55)))
    assert curve.ms(1 << 24) == pytest.approx(2.55 + 2.0 / 7 * 8)  # 4.84 ms, was 2.55


@given(
    st.dictionaries(
        st.integers(0, 1 << 24),
        st.lists(st.floats(0, 50), min_size=1, max_size=5),
        min_size=1,
        max_size=6,
    )
)
def test_the_curve_never_falls_and_keeps_the_overall_mean(samples: dict) -> None:
    curve = _curve(samples)
    costs = [ms for _, ms in curve.points]
    assert [size for size, _ in curve.points] == sorted(samples)
    assert all(a <= b + 1e-9 for a, b in itertools.pairwise(costs))
    # pooling moves cost between sizes, weighted by their counts: the total stays
    weighted = sum(curve.ms(size) * len(values) for size, values in samples.items())
    total = sum(len(values) for values in samples.values())
    mean = statistics.fmean(v for values in samples.values() for v in values)
    assert abs(weighted / total - mean) <= 1e-6 * max(1.0, mean)


def test_a_receive_lag_is_counted_only_where_the_consumer_sat_waiting() -> None:
    """Stage 0 ends F1 at 25 and sends its activation until 40 (a blocking send). BW0's
    gradient is sent 35-36, before stage 0 asks for it at 40: the 4 ms until BW0 starts are
    stage 0's own send, not a lag, and are left out (they were counted before). F1's
    activation returns at 40 while stage 1 has waited since 30: F1 starts at 40.5, a lag of
    0.5 ms (its stage's first op, skipped before). B1's gradient (taken in by a B, as in ZB)
    returns at 60 with stage 0 waiting since 50: B1 starts at 61, a lag of 1 ms."""
    ops = (
        OpRecord(0, 0, OpKind.F, 1, 15.0, 25.0),
        OpRecord(0, 0, OpKind.BW, 0, 40.0, 45.0),
        OpRecord(0, 0, OpKind.B, 1, 61.0, 66.0),
        OpRecord(0, 1, OpKind.F, 1, 40.5, 50.0),
    )
    messages = (
        MessageRecord(0, "0-1", "backward", 0, 8, 35.0, 36.0, 36.0, needed_ms=40.0),
        MessageRecord(0, "0-1", "forward", 1, 8, 25.0, 40.0, 40.2, needed_ms=30.0),
        MessageRecord(0, "0-1", "backward", 1, 8, 55.0, 60.0, 60.5, needed_ms=50.0),
    )
    timeline = Timeline(num_stages=2, ops=ops, messages=messages, iterations=())
    assert receive_lags_ms(timeline) == [pytest.approx(0.5), pytest.approx(1.0)]
    # from the arrival (a delegated message's: the receiver copies it in as it arrives):
    # F1's 40.2 to 40.5, B1's 60.5 to 61; BW0's gradient came before stage 0 asked for it
    from_arrival = receive_lags_ms(timeline, from_arrival=True)
    assert from_arrival == [pytest.approx(0.3), pytest.approx(0.5)]


@pytest.mark.parametrize("num_stages", [2, 4, 5, 12, 13, 16])
def test_the_calibrations_pipelines_run_at_any_stage_count(num_stages: int) -> None:
    """`calibrate --stages S` for any S: each of its pipelines has a microbatch per stage at
    least (it had 4 for the ring lag and 12 elsewhere, refused past those)."""
    for at_least in (4, 12):
        num_microbatches = busy_microbatches(num_stages, at_least)
        assert num_microbatches == max(at_least, num_stages)
    profile = busy_profile(num_stages, 1 << 16, 10.0)
    assert profile.num_microbatches == busy_microbatches(num_stages)
    schedule = busy_both_ways(num_stages, profile.num_microbatches)
    timeline = simulate(schedule, profile)  # validated against the profile
    assert len(timeline.ops) == num_stages * 2 * profile.num_microbatches


@pytest.mark.parametrize("op_ms", [2.0, 10.0, 25.0])
def test_the_per_op_overhead_is_measured_with_ops_of_op_ms(op_ms: float) -> None:
    """Its ops lasted 2 ms whatever `--op-ms` said; they last `op_ms` (F and BW alike), and
    the overhead is the gaps between starts beyond that."""
    schedule, profile = lone_stage(op_ms)
    timeline = simulate(schedule, profile)
    assert len(timeline.ops) == 32
    assert {r.end_ms - r.start_ms for r in timeline.ops} == {op_ms}
    starts = [0.0, op_ms + 0.25, 2 * op_ms + 0.75]  # gaps of 0.25 and 0.5 ms beyond op_ms
    ops = tuple(OpRecord(0, 0, OpKind.F, m, t, t + op_ms) for m, t in enumerate(starts))
    measured = Timeline(num_stages=1, ops=ops, messages=(), iterations=())
    assert op_overhead_ms_of([measured], op_ms) == pytest.approx(0.375)
    assert op_overhead_ms_of([measured], op_ms + 1.0) == 0.0  # never below 0


@pytest.mark.parametrize(
    ("chunk_bytes", "num_chunks"), [(125_000, 16), (1_000_000, 16), (4_000_000, 4), (40_000_000, 4)]
)
def test_the_ring_lags_pipeline_has_chunks_of_the_size_asked(
    chunk_bytes: int, num_chunks: int
) -> None:
    """The first `num_rings` stages reduce a gradient over 2 replicas in chunks of exactly
    `chunk_bytes`: 16 per link direction up to 1 MB, 4 above (each large one lasts long)."""
    profile = ring_profile(4, 3, chunk_bytes)
    timeline = simulate(busy_both_ways(4, profile.num_microbatches), profile)
    by_direction: dict[tuple[str, str], list[int]] = {}
    for message in timeline.dp_messages:
        by_direction.setdefault((message.link, message.direction), []).append(message.num_bytes)
    assert sorted(by_direction) == [
        (f"dp{stage}:0-1", direction) for stage in range(3) for direction in ("backward", "forward")
    ]
    assert all(sizes == [chunk_bytes] * num_chunks for sizes in by_direction.values())


def test_a_ring_lag_never_falls_with_more_rings() -> None:
    """A ring count's mean below the count before it (noise: more rings never cost less) is
    raised to it at each size, and the curve still never falls with the size."""
    one = CostCurve(((125_000, 0.6), (40_000_000, 8.0)))
    two = CostCurve(((125_000, 0.3), (40_000_000, 25.0)))
    raised = _at_least_fewer_rings(two, [(1, one)])
    assert raised.points == ((125_000, 0.6), (40_000_000, 25.0))
    assert _at_least_fewer_rings(one, []) == one


def _longest_wait_ms(timeline: Timeline) -> float:
    """The longest a stage sat idle (waiting for a message, in an ideal run) before an op."""
    longest = 0.0
    for stage in range(timeline.num_stages):
        ops = sorted((r for r in timeline.ops if r.stage == stage), key=lambda r: r.start_ms)
        longest = max(longest, ops[0].start_ms)
        for a, b in itertools.pairwise(ops):
            longest = max(longest, b.start_ms - a.end_ms)
    return longest


@pytest.mark.parametrize("num_stages", [2, 4, 16])
@pytest.mark.parametrize("op_ms", [1.0, 10_000.0, 60_000.0])
def test_the_workers_wait_longer_than_a_healthy_calibration_does(
    num_stages: int, op_ms: float
) -> None:
    """A healthy busy run's longest wait (stage 0's first backward, 2 (S - 1) ops) is
    MESSAGE_WAIT_S short of the workers' wait at any --op-ms: the pools' 60 s alone failed
    `calibrate --stages 4 --op-ms 10000` (a 60 s wait for stage 0's first gradient)."""
    profile = busy_profile(num_stages, 0, op_ms)
    timeline = simulate(busy_both_ways(num_stages, profile.num_microbatches), profile)
    longest_s = _longest_wait_ms(timeline) / 1000
    assert longest_s == pytest.approx(2 * (num_stages - 1) * op_ms / 1000)
    assert message_wait_s(num_stages, op_ms) >= longest_s + MESSAGE_WAIT_S


class _ShortWaitPool(WorkerPool):
    """A pool whose workers wait 0.25 s for a message unless told (the runtime's 60 s,
    scaled down with the ops)."""

    def __init__(self, *args: object, timeout_s: float = 0.25, **kwargs: object) -> None:
        super().__init__(*args, timeout_s=timeout_s, **kwargs)  # type: ignore[arg-type]


def test_a_calibration_of_ops_longer_than_its_pools_wait_allows_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """2 stages, ops of 0.15 s: stage 0 waits 0.3 s for its first gradient, past a pool's
    own 0.25 s wait (as 4 stages' 10 s ops are past its 60 s): the calibration gives its
    pools a wait that covers its ops. (Few points: one size, a microbatch per stage.)"""
    monkeypatch.setattr(calibrate, "WorkerPool", _ShortWaitPool)
    monkeypatch.setattr(calibrate, "SEND_SIZES", (0,))
    monkeypatch.setattr(calibrate, "lone_stage", lambda op_ms: lone_stage(op_ms, 2))
    monkeypatch.setattr(calibrate, "busy_microbatches", lambda num_stages: num_stages)
    costs = measure_host_costs(1, 2, op_ms=150.0, dp_ring=False)
    assert costs.send_ms_by_bytes.points[0][0] == 0
