"""The DP all-reduce's ring in the emulated runtime: PP 4 x DP 2, eight worker processes,
against the simulator's message-by-message step (pipeline.allreduce)."""

import dataclasses
import re
import statistics
import time

import pytest

from baselines import one_f_one_b
from injectors.fault_files import parse_yaml
from pipeline.allreduce import messages_per_link_direction
from pipeline.link_rates import NO_RATES
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerPool, WorkerTimeout
from pipeline.runtime import pool as pool_module
from pipeline.simulator import CommMode, simulate
from pipeline.timeline import MessageRecord, Timeline
from pipeline.topology import Link, Topology
from tests.fidelity import check_fidelity
from tests.pipeline.runtime.test_pool import an_op_s_wait_timed_out

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


def _skewed(delay_ms: float) -> IterationConfig:
    """PP 2 x DP 2, 2 microbatches of 10 ms ops, one bucket per stage, every message on
    replica 1's PP link (pp1:0-1) held `delay_ms`: replica 1's pipeline ends at least 3 x
    `delay_ms` after it starts (act 0, then F1's activation, then BW1's gradient, each
    after the one before, on its critical path), replica 0's some 40 ms in."""
    profile = Profile.uniform(
        2,
        2,
        10,
        10,
        0,
        message_bytes=4096,
        num_replicas=2,
        allreduce_bytes=(8_000, 8_000),
        dp_bucket_bytes=8_000,
    )
    timeline = f'- {{start_iteration: 0, links: ["pp1:0-1"], delay_ms: {delay_ms:g}}}\n'
    faults = parse_yaml(timeline).at(0, Topology(2, 2), rates=NO_RATES)
    return IterationConfig(0, one_f_one_b(profile), profile, faults=faults)


def _last_op_end_ms(timeline: Timeline, stage: int, replica: int) -> float:
    return max(r.end_ms for r in timeline.ops if (r.stage, r.replica) == (stage, replica))


_TRIES = 5
_LANDING_MS = 100.0
"""How long before its receiver's last op a chunk's send must start for the iteration to
show where its arrival is stamped (a chunk's transit, and its stamping, take a few ms)."""


def test_a_chunk_that_lands_while_its_receiver_runs_its_pipeline_is_stamped_as_it_lands() -> None:
    """Replica 0's ring sends its first chunk (forward on dp<s>:0-1) as its pipeline ends,
    some 40 ms in; replica 1, slowed by 150 ms on each message of its PP link, runs its
    pipeline for 450 ms and more. The ring's receiver thread waits from the iteration's
    start, so the chunk's arrival is stamped before replica 1's last op ended: started with
    replica 1's ring, after that op, it stamped the chunk then, and the detector took the
    skew for a slow DP link. The chunk the other way is sent after replica 1's pipeline.
    Replica 1's stage 1 ends some 300 ms before replica 0's chunk would have to wait for it:
    a loaded host that holds replica 0 that long sends the chunk after it, and the iteration
    shows nothing (the chunk landed after the op, as it should be stamped); such an iteration
    is run again, up to _TRIES in all, until one sent each forward chunk _LANDING_MS or more
    before its receiver's last op ended (with the defect, no such iteration passes)."""
    config = _skewed(150.0)
    with WorkerPool(2, 2, timeout_s=30) as pool:
        for iteration in range(_TRIES):
            timeline = pool.run_iteration(dataclasses.replace(config, iteration=iteration))
            first = {(m.link, m.direction): m for m in timeline.dp_messages if m.microbatch == 0}
            if all(
                first[f"dp{stage}:0-1", "forward"].wire_start_ms + _LANDING_MS
                < _last_op_end_ms(timeline, stage, 1)
                for stage in (0, 1)
                if (f"dp{stage}:0-1", "forward") in first
            ):
                break
        else:
            pytest.fail(f"replica 0 was held past replica 1's pipeline in all {_TRIES} tries")
    assert {m.fault_ms for m in timeline.messages if m.replica == 1} == {150.0}
    assert sorted(first) == [
        (f"dp{stage}:0-1", direction) for stage in (0, 1) for direction in ("backward", "forward")
    ]
    for stage in (0, 1):
        forward, backward = first[f"dp{stage}:0-1", "forward"], first[f"dp{stage}:0-1", "backward"]
        assert (forward.replica, backward.replica) == (0, 1)  # the senders
        # Replica 1 (stage `stage`) received the forward chunk during its pipeline.
        assert forward.wire_start_ms <= forward.arrival_ms < _last_op_end_ms(timeline, stage, 1)
        # Replica 0 received the backward chunk once replica 1's pipeline had ended.
        assert backward.arrival_ms >= _last_op_end_ms(timeline, stage, 1)


def test_the_ring_s_first_chunk_waits_out_a_peer_replica_s_longer_pipeline() -> None:
    """Each message on replica 1's PP link is held 0.8 s, well under the 2 s timeout (the
    delay check lets it through; 1.2 s to spare for a worker held up on a loaded host):
    replica 1's pipeline runs at least 2.4 s, so replica 0's ring waits that long for its
    first chunk, which leaves replica 1 only after its last op. That wait had the timeout
    for one message and failed the iteration ("waiting for all-reduce chunk 0 from rank 3
    failed: nothing came within 1 s", with a 1 s timeout); it has none now (the pool's bound
    on a time without progress: replica 1's ranks report their ops), and the iteration runs,
    every chunk recorded as in the simulator. A worker held more than those 1.2 s fails an
    op's wait (its own timeout, not the ring's): the iteration is run again on a new pool, up
    to 3 in all."""
    config = _skewed(800.0)
    for attempt in range(3):
        try:
            with WorkerPool(2, 2, timeout_s=2.0) as pool:
                timeline = pool.run_iteration(config)
            break
        except WorkerTimeout as err:
            if attempt == 2 or not an_op_s_wait_timed_out(err):
                raise
    assert {m.fault_ms for m in timeline.messages if m.replica == 1} == {800.0}
    assert {m.fault_ms for m in timeline.messages if m.replica == 0} == {0.0}
    predicted = simulate(config.schedule, config.profile, CommMode.DIRECT)

    def chunks(messages: tuple[MessageRecord, ...]) -> list[tuple[str, str, int, int]]:
        return sorted((m.link, m.direction, m.microbatch, m.replica) for m in messages)

    assert chunks(timeline.dp_messages) == chunks(predicted.dp_messages)
    for stage in (0, 1):
        (first,) = [
            m
            for m in timeline.dp_messages
            if (m.link, m.direction, m.microbatch) == (f"dp{stage}:0-1", "backward", 0)
        ]
        # Replica 1 sent it after its pipeline, replica 0 waited for it from its ring's start.
        assert first.arrival_ms >= first.send_start_ms >= _last_op_end_ms(timeline, stage, 1)
        assert first.needed_ms >= _last_op_end_ms(timeline, stage, 0)


@dataclasses.dataclass(frozen=True)
class _Withhold:
    """A fault hook: the sender of DP chunk `index` on `link`'s `direction` never sends it
    (its hook sleeps an hour; the pool's close ends it)."""

    link: str
    direction: str
    index: int

    def __call__(
        self, link: str, direction: str, iteration: int, kind: str, index: int, *_: object
    ) -> float:
        if (link, direction, kind, index) == (self.link, self.direction, "AR", self.index):
            time.sleep(3600.0)
        return 0.0


def test_a_ring_chunk_that_never_comes_is_the_pool_s_timeout_naming_what_each_rank_waits_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DP 2 of one stage: replica 0 never sends its first chunk forward on dp0:0-1, and
    replica 1's wait for it, which spans replica 0's pipeline, has no limit of its own: the
    pool's bound on a time without progress ends the run (2 x 1 s + 1 s here), and names
    what each silent rank said it did last: its progress thread speaks while its compute
    thread waits."""
    monkeypatch.setattr(pool_module, "BACKSTOP_GRACE_S", 1.0)  # read by the pool, at its wait
    profile = Profile.uniform(
        1, 2, 1, 1, 1, num_replicas=2, allreduce_bytes=8_000, dp_bucket_bytes=4_000
    )
    config = IterationConfig(
        0, one_f_one_b(profile), profile, fault_hook=_Withhold("dp0:0-1", "forward", 0)
    )
    with WorkerPool(1, 2, timeout_s=1.0) as pool, pytest.raises(WorkerTimeout) as info:
        pool.run_iteration(config)
    message = str(info.value)
    assert message.startswith(
        "no progress from rank(s) [0, 1] for 3 s during iteration 0 (2 x the workers' 1 s "
        "wait for one message, plus 1 s): neither records, progress nor an error came from "
        "them, and they did not exit; by their last word, "
    ), message
    # 2 buckets of 2 chunks each way: chunks 0-3; the first bucket's first is withheld.
    words = re.fullmatch(r".*; by their last word, (.*)", message)
    assert words is not None
    said = [re.fullmatch(r"(.*) \(said \d+\.\d s before\)", w) for w in words[1].split("; ")]
    assert [m[1] if m else None for m in said] == [
        "rank 0 (stage 0): in the DP ring of stage 0, sending chunk 0 (of chunks 0-3) to "
        "rank 1 over dp0:0-1",
        "rank 1 (stage 0): in the DP ring of stage 0, waiting for chunk 0 (of chunks 0-3) "
        "from rank 0 over dp0:0-1",
    ]
    assert info.value.rank is None and info.value.remote is None
