"""`assemble_timeline`: every rank's records into one timeline (no processes)."""

import pytest

from pipeline.errors import ScheduleError
from pipeline.runtime.config import RankResult
from pipeline.runtime.pool import assemble_timeline
from pipeline.runtime.transport import Failover, LinkDirection
from pipeline.topology import Direction


def _results(receives: list[tuple[str, str, int, float, float, float]]) -> list[RankResult]:
    """Stage 0 runs F0 (10.0-10.1 s) and sends its activation (10.1-10.2 s); stage 1 runs F0
    from 10.5 s, having taken in what `receives` says."""
    sender = RankResult(
        0,
        0,
        0,
        100,
        [("F", 0, 10.0, 10.1)],
        [("0-1", "forward", 0, 64, 10.1, 10.2, 20.0, 10.15, 100)],
        [],
        11,
        11,
        64,
    )
    receiver = RankResult(1, 1, 0, 101, [("F", 0, 10.5, 10.6)], [], receives, 11, 11, 0)
    return [sender, receiver]


def test_arrival_and_need_come_from_the_receiving_rank() -> None:
    # The activation arrived at 10.15 s (before the sender was free again), needed at 10.4 s.
    results = _results([("0-1", "forward", 0, 10.15, 10.4, 0.001)])
    timeline = assemble_timeline(2, 3, 10.0, 10.0, results)
    (message,) = timeline.messages
    assert message.iteration == 3 and message.num_bytes == 64
    assert (message.send_start_ms, message.send_end_ms) == pytest.approx((100.0, 200.0))
    assert (message.arrival_ms, message.needed_ms) == pytest.approx((150.0, 400.0))
    assert message.fault_ms == 20.0  # what the sender's fault hook injected
    assert message.wire_start_ms == pytest.approx(150.0)  # when its carrier picked it up
    assert (message.copy_in_ms, message.carrier_pid) == (pytest.approx(1.0), 100)


def test_a_message_no_op_took_in_is_refused() -> None:
    with pytest.raises(ScheduleError, match="no op took in the forward message of microbatch 0"):
        assemble_timeline(2, 3, 10.0, 10.0, _results([]))


def test_a_move_made_before_a_rank_swap_is_named_by_the_replica_played_then() -> None:
    """A move of a sender side a swap closed or re-pointed names the replica its trainer
    played when it carried the direction (`Failover.replica`); the others the rank's own. By
    the rank's replica alone, a PP link's move (named for every replica: "0-1") landed on
    another replica's concrete link (found on the testbed by a review)."""
    forward = LinkDirection("0-1", Direction.FORWARD)
    moves = [
        Failover(forward, 4, "link state", 0, 1, 1.0, 1.001, 0, 99, replica=1),
        Failover(forward, 4, "link state", 0, 1, 1.0, 1.001, 0, 98),
    ]
    results = [
        RankResult(2, 1, 0, 1234, [], [], [], 1.002, 1.003, 0, failovers=moves),
        RankResult(0, 0, 0, 1235, [], [], [], 1.002, 1.003, 0),
        RankResult(1, 0, 1, 1236, [], [], [], 1.002, 1.003, 0),
        RankResult(3, 1, 1, 1237, [], [], [], 1.002, 1.003, 0),
    ]
    timeline = assemble_timeline(2, 4, 1.0, 1.0, results)
    assert [(f.link, f.replica, f.carrier_pid) for f in timeline.failovers] == [
        ("0-1", 1, 99),
        ("0-1", 0, 98),
    ]
