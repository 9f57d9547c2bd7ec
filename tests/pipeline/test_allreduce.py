"""The DP all-reduce (pipeline.allreduce): buckets, the ring's messages, and the simulator's
step, message by message."""

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from baselines import one_f_one_b
from pipeline.allreduce import (
    DEFAULT_BUCKET_BYTES,
    MAX_RING_MESSAGES,
    buckets,
    check_ring_messages,
    chunk_bytes,
    largest_chunk_bytes,
    message_index,
    messages_per_link_direction,
    num_buckets,
    ring_peer,
    rings_done_ms,
)
from pipeline.errors import ConfigError, LinkFailure
from pipeline.faults import MessageFault
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.simulator import CommMode, simulate
from pipeline.topology import Link

MB = 1_000_000


def test_a_gradient_splits_into_buckets_the_last_smaller() -> None:
    assert DEFAULT_BUCKET_BYTES == 40_000_000 * 2  # megatron's 40M parameters, 2 bytes each
    assert buckets(10 * MB, 4 * MB) == (4 * MB, 4 * MB, 2 * MB)
    assert buckets(8 * MB, 4 * MB) == (4 * MB, 4 * MB)
    assert buckets(0, 4 * MB) == ()
    assert chunk_bytes(10, 3) == 4  # a bucket padded to a multiple of D
    assert chunk_bytes(20, 3, element_bytes=4) == 8  # 5 fp32 elements: 2 each, padded
    assert chunk_bytes(24, 3, element_bytes=4) == 8 and chunk_bytes(4, 2, element_bytes=4) == 4
    assert messages_per_link_direction(10 * MB, 4 * MB, 2) == 3 * 2
    assert messages_per_link_direction(10 * MB, 4 * MB, 4) == 3 * 6
    assert messages_per_link_direction(10 * MB, 4 * MB, 1) == 0
    with pytest.raises(ConfigError, match="buckets >= 1 byte"):
        buckets(1, 0)


def test_buckets_are_counted_without_listing_them() -> None:
    """2**40 one-byte buckets: listing them was a MemoryError before any count was checked."""
    assert [num_buckets(g, 4 * MB) for g in (0, 1, 4 * MB, 10 * MB)] == [0, 1, 1, 3]
    assert num_buckets(2**40, 1) == 2**40
    assert largest_chunk_bytes(10 * MB, 4 * MB, 3) == chunk_bytes(4 * MB, 3)
    assert largest_chunk_bytes(3 * MB, 4 * MB, 2) == 3 * MB // 2  # one smaller bucket
    assert largest_chunk_bytes(0, 4 * MB, 2) == 0
    assert largest_chunk_bytes(2**40, 1, 2) == 1
    assert messages_per_link_direction(2**40, 1, 2) == 2**41
    with pytest.raises(ConfigError, match=r"is 8,796,093,022,208 messages an iteration \(2 "):
        check_ring_messages([2**40, 2**40], 1, 2)
    check_ring_messages([MAX_RING_MESSAGES // 4], 1, 2)  # 2 replicas x 2 steps: at the limit
    with pytest.raises(ConfigError, match="more than the simulator times"):
        check_ring_messages([MAX_RING_MESSAGES // 4 + 1], 1, 2)
    with pytest.raises(ConfigError, match="buckets >= 1 byte"):
        largest_chunk_bytes(1, 0, 2)


def test_the_ring_sends_to_the_next_replica_forward_from_the_lower() -> None:
    assert ring_peer(1, 0, 2) == (1, Link.dp(1, 0), "forward")
    assert ring_peer(1, 1, 2) == (0, Link.dp(1, 0), "backward")  # D = 2: both ways on 0-1
    assert ring_peer(2, 1, 3) == (2, Link.dp(2, 1), "forward")
    assert ring_peer(2, 2, 3) == (0, Link.dp(2, 0, 2), "backward")  # the ring closes
    assert str(Link.dp(2, 0, 2)) == "dp2:0-2"
    assert [message_index(b, k, 3) for b in range(2) for k in range(4)] == list(range(8))


def _profile(num_replicas: int, **options: object) -> Profile:
    """Two stages; stage 1 reduces 25 MB in 4 MB buckets (7 of them), stage 0 10 MB (3)."""
    return Profile.uniform(
        2,
        4,
        1,
        2,
        1,
        num_replicas=num_replicas,
        allreduce_bytes=(10 * MB, 25 * MB),
        dp_bucket_bytes=4 * MB,
        **options,
    )


@pytest.mark.parametrize("num_replicas", [2, 3, 4])
def test_a_dp_link_delay_costs_its_messages_times_the_delay(num_replicas: int) -> None:
    healthy = _profile(num_replicas)
    slow = healthy.with_delays((), {Link.dp(1, 0): 10.0})
    schedule = one_f_one_b(healthy)
    base = simulate(schedule, healthy, CommMode.DIRECT)
    delayed = simulate(schedule, slow, CommMode.DIRECT)
    # No bandwidth, no latency: the ring is free without the delay, and each of stage 1's
    # sends on dp1:0-1 (forward; also backward with D = 2) waits 10 ms, one after another.
    stage1_end = max(r.end_ms for r in base.ops if r.stage == 1)
    assert base.iterations[0].end_ms == max(r.end_ms for r in base.ops)
    messages = messages_per_link_direction(25 * MB, 4 * MB, num_replicas)
    assert messages == 7 * 2 * (num_replicas - 1)
    assert delayed.iterations[0].end_ms == stage1_end + messages * 10.0
    assert compute_metrics(delayed).iteration_time_ms == compute_metrics(base).iteration_time_ms
    assert {r.replica for r in delayed.ops} == set(range(num_replicas))


def test_wire_time_host_costs_and_the_optimizer_add_per_message() -> None:
    from pipeline.host_costs import CostCurve, HostCosts

    profile = _profile(2, link_latency_ms=0.5, dp_bandwidth_gbps=8.0, optimizer_ms=(0.0, 3.0))
    host = HostCosts(
        send_ms_by_bytes=CostCurve.line(0.25), receive_lag_ms_by_bytes=CostCurve.line(0.125)
    )
    timeline = simulate(one_f_one_b(profile), profile, CommMode.DIRECT, host=host)
    # Stage 1: 25 MB = 6 x 4 MB + 1 MB, 2 steps each. A step: 0.5 ms latency + its chunk at
    # 1 GB/s (2 MB, or 0.5 MB in the last bucket) + the send's 0.25 ms, then 0.125 ms until
    # the receiver may forward it. Then the optimizer's 3 ms. The ring starts once stage 1's
    # last gradient has gone to stage 0 (0.5 ms latency + 0.25 ms send after its last op).
    stage1_end = max(r.end_ms for r in timeline.ops if r.stage == 1) + 0.75
    fixed_ms = 0.5 + 0.25 + 0.125
    expected = stage1_end + 12 * (fixed_ms + 2.0) + 2 * (fixed_ms + 0.5) + 3.0
    assert timeline.iterations[0].end_ms == pytest.approx(expected)
    large = dataclasses.replace(profile, dp_bucket_bytes=24 * MB)  # 24 MB + 1 MB
    end = simulate(one_f_one_b(large), large, CommMode.DIRECT, host=host).iterations[0].end_ms
    assert end == pytest.approx(stage1_end + 2 * (fixed_ms + 12.0) + 2 * (fixed_ms + 0.5) + 3.0)


def test_rings_at_once_pay_the_lag_of_as_many_rings() -> None:
    """Two stages' rings (2 replicas, one bucket: 2 steps each), a step's lag 1 ms per ring
    running when it starts: started together, each step pays 2 ms; apart, 1 ms; a ring runs
    from its last replica's start to its last replica's end."""

    def lag_by_rings(num_bytes: int, num_rings: int) -> tuple[float, float]:
        return 0.0, float(num_rings)

    def done(starts: list[list[float]], grads: tuple[int, int] = (100, 100)) -> list[float]:
        return [max(ends) for ends in rings_done_ms(starts, grads, 100, lag_by_rings)]

    assert done([[0.0, 0.0], [0.0, 0.0]]) == [4.0, 4.0]
    assert done([[0.0, 0.0], [10.0, 10.0]]) == [2.0, 12.0]
    # Stage 1's ring runs from 0.5: stage 0's second step (at 1) and both of its own pay 2.
    assert done([[0.0, 0.0], [0.0, 0.5]]) == [3.0, 4.5]
    only_one = done([[0.0, 0.0], [0.0, 0.0]], (100, 0))
    assert only_one == [2.0, 0.0]  # no gradient: no ring
    assert rings_done_ms([[3.0], [1.0]], [100, 100], 100, lag_by_rings) == ((3.0,), (1.0,))


@given(
    st.lists(st.tuples(st.floats(0, 50), st.floats(0, 50), st.integers(0, 400)), min_size=1,
             max_size=5),
    st.floats(0, 3),
)  # fmt: skip
def test_with_one_lag_for_any_number_of_rings_each_ring_runs_as_if_alone(
    rings: list[tuple[float, float, int]], lag_ms: float
) -> None:
    def cost(num_bytes: int, num_rings: int) -> tuple[float, float]:
        return 0.001 * num_bytes, lag_ms

    starts = [[a, b] for a, b, _ in rings]
    grads = [g for _, _, g in rings]
    together = rings_done_ms(starts, grads, 64, cost)
    for stage in range(len(rings)):
        alone = [g if s == stage else 0 for s, g in enumerate(grads)]
        assert together[stage] == rings_done_ms(starts, alone, 64, cost)[stage]


@dataclasses.dataclass(frozen=True)
class _Recording:
    """A fault view that slows forward DP messages by 1 ms and notes every message asked."""

    asked: list[tuple[Link, str, str, int]] = dataclasses.field(default_factory=list)
    sizes: set[int] = dataclasses.field(default_factory=set)

    def message_fault(
        self,
        link: Link,
        direction: str,
        kind: str,
        microbatch: int,
        num_bytes: int = 0,
        offset_ms: float = 0.0,
        nic: int = 0,
    ) -> MessageFault:
        self.asked.append((link, direction, kind, microbatch))
        if not link.is_pp:
            self.sizes.add(num_bytes)
        return MessageFault(1.0 if not link.is_pp and direction == "forward" else 0.0)

    def affects(self, link: Link) -> bool:
        return not link.is_pp


def test_every_dp_message_asks_the_fault_view_with_its_link_direction_and_index() -> None:
    profile = _profile(3)
    faults = _Recording()
    timeline = simulate(one_f_one_b(profile), profile, CommMode.IDEAL, faults=faults)
    dp = [a for a in faults.asked if not a[0].is_pp]
    assert {kind for _, _, kind, _ in dp} == {"AR"}
    assert faults.sizes == {chunk_bytes(4 * MB, 3), chunk_bytes(2 * MB, 3), chunk_bytes(MB, 3)}
    by_direction: dict[tuple[Link, str], list[int]] = {}
    for link, direction, _, index in dp:
        by_direction.setdefault((link, direction), []).append(index)
    # Each link direction the ring uses, 3 replicas: r -> r+1 forward, 2 -> 0 backward.
    assert set(by_direction) == {
        (link, direction)
        for s in (0, 1)
        for link, direction in (
            (Link.dp(s, 0), "forward"),
            (Link.dp(s, 1), "forward"),
            (Link.dp(s, 0, 2), "backward"),
        )
    }
    for (link, _), indices in by_direction.items():
        count = messages_per_link_direction(profile.allreduce_bytes[link.dp_stage], 4 * MB, 3)
        assert sorted(indices) == list(range(count))
    # Forward messages cost 1 ms each, so replicas 0 and 1 send one after another 1 ms apart
    # and replica 2's sends wait for theirs: stage 0's ring (3 buckets x 4 steps) takes 12 ms,
    # stage 1's (7 x 4) 28 ms.
    stage_end = [max(r.end_ms for r in timeline.ops if r.stage == s) for s in (0, 1)]
    assert timeline.iterations[0].end_ms == max(stage_end[0] + 12.0, stage_end[1] + 28.0)


def test_a_failed_dp_link_is_a_link_failure_in_the_simulator() -> None:
    @dataclasses.dataclass(frozen=True)
    class Failed:
        def message_fault(
            self,
            link: Link,
            direction: str,
            kind: str,
            microbatch: int,
            num_bytes: int = 0,
            offset_ms: float = 0.0,
            nic: int = 0,
        ) -> MessageFault:
            return MessageFault(failed=not link.is_pp)

        def affects(self, link: Link) -> bool:
            return not link.is_pp

    profile = _profile(2)
    # The first DP message in time fails: stage 1's, as its last op ends before stage 0's.
    with pytest.raises(LinkFailure, match="all-reduce message 0 .forward. on link dp1:0-1") as info:
        simulate(one_f_one_b(profile), profile, faults=Failed())
    ops = simulate(one_f_one_b(profile), profile).ops
    stage_end = [max(r.end_ms for r in ops if r.stage == stage) for stage in (0, 1)]
    assert info.value.at_ms == stage_end[1] < stage_end[0]


def test_one_replica_without_an_optimizer_has_no_step() -> None:
    profile = dataclasses.replace(_profile(2), num_replicas=1)
    timeline = simulate(one_f_one_b(profile), profile)
    assert not profile.has_dp_step
    assert timeline.iterations[0].step_time_ms == 0.0
    assert {r.replica for r in timeline.ops} == {0}
