"""The DP all-reduce's ring in the emulated runtime: PP 4 x DP 2, eight worker processes,
against the simulator's message-by-message step (pipeline.allreduce)."""

import statistics

import pytest

from baselines import one_f_one_b
from pipeline.allreduce import messages_per_link_direction
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerPool
from pipeline.simulator import CommMode, simulate
from pipeline.timeline import MessageRecord
from pipeline.topology import Link
from tests.fidelity import check_fidelity

pytestmark = pytest.mark.multiprocess

GRAD_BYTES, BUCKET_BYTES, DELAY_MS = 750_000, 250_000, 15.0


def test_a_slow_dp_link_slows_the_emulated_step_as_the_simulator_predicts() -> None:
    healthy = Profile.uniform(
        4,
        4,
        10,
        10,
        10,
        message_bytes=1024,
        num_replicas=2,
        allreduce_bytes=GRAD_BYTES,
        dp_bucket_bytes=BUCKET_BYTES,
    )
    slow = healthy.with_delays((), {Link.dp(1, 0): DELAY_MS})
    schedule = one_f_one_b(healthy)
    # 3 buckets of 250 kB, 2 steps each: 6 messages of 125 kB each way on every dp<s>:0-1.
    messages = messages_per_link_direction(GRAD_BYTES, BUCKET_BYTES, 2)
    assert messages == 6
    iteration = 0
    with WorkerPool(4, 2, timeout_s=30) as pool:
        assert len(set(pool.pids)) == 8
        pool.run_iteration(IterationConfig(iteration, schedule, healthy))  # gloo connects pairs
        for profile in (healthy, slow):
            predicted = simulate(schedule, profile, CommMode.DIRECT).iterations[0]
            measured = []
            for _ in range(3):
                iteration += 1
                timeline = pool.run_iteration(IterationConfig(iteration, schedule, profile))
                record = timeline.iterations[0]
                measured.append(record.end_ms - record.start_ms)
                assert {r.replica for r in timeline.ops} == {0, 1}
                assert len(timeline.ops) == 2 * 4 * 4 * 2  # replicas x stages x (F, BW) x N
                assert len(timeline.messages) == 2 * 2 * 3 * 4  # PP messages only
                _check_ring_records(timeline.dp_messages, messages, profile is slow)
                if profile is slow:  # each of stage 1's sends on dp1:0-1 sleeps 15 ms first
                    stage1_end = max(r.end_ms for r in timeline.ops if r.stage == 1)
                    assert record.end_ms >= stage1_end + messages * DELAY_MS
            # The step and the pipeline together, in the tests' fidelity band.
            predicted_ms = predicted.end_ms - predicted.start_ms
            check_fidelity(statistics.median(measured), predicted_ms, profile.dp_delay_ms)


def _check_ring_records(
    dp_messages: tuple[MessageRecord, ...], per_direction: int, slow: bool
) -> None:
    """Every chunk of every stage's ring is a record: sent by its link's lower replica
    forward, its upper one backward, with the hook's delay on dp1:0-1 only, on the wire from
    its send's start (direct) and stamped arriving after that delay."""
    assert sorted((m.link, m.direction, m.replica, m.microbatch) for m in dp_messages) == sorted(
        (f"dp{stage}:0-1", direction, replica, index)
        for stage in range(4)
        for direction, replica in (("forward", 0), ("backward", 1))
        for index in range(per_direction)
    )
    assert {m.num_bytes for m in dp_messages} == {BUCKET_BYTES // 2}
    for m in dp_messages:
        delay_ms = DELAY_MS if slow and m.link == "dp1:0-1" else 0.0
        assert m.fault_ms == delay_ms
        assert m.wire_start_ms == m.send_start_ms <= m.send_end_ms
        assert m.arrival_ms - m.wire_start_ms >= delay_ms  # the hook sleeps before it sends
