"""The simulator's timing of delays and caps put in a network (`delays_in_network`: a run with
`--inject network`): a message's bytes queue at its link's rate, its delay propagates, and
neither holds its sender, as on the testbed's wires and htb caps (and any real network)."""

import pytest

from baselines import one_f_one_b
from pipeline.host_costs import FREE, CostCurve, HostCosts
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.schedule import Schedule
from pipeline.simulator import CommMode, simulate
from pipeline.timeline import Timeline

KIB = 1024
BYTES_MS = 64 * KIB * 8 / (0.1 * 1e6)
"""64 KiB at 0.1 Gbit/s: 5.24288 ms."""


def _lead(**options: object) -> Profile:
    """S=2, N=4, 10 ms ops, 64 KiB messages at 0.1 Gbit/s with 20 ms on link 0-1."""
    return Profile.uniform(
        2, 4, 10, 10, 10, message_bytes=64 * KIB, link_bandwidth_gbps=0.1, delay_ms=[20.0],
        **options,
    )  # fmt: skip


FORWARDS_FIRST = Schedule.from_text(
    [
        ["F0", "F1", "F2", "F3", "BW0", "BW1", "BW2", "BW3"],
        ["F0", "BW0", "F1", "BW1", "F2", "BW2", "F3", "BW3"],
    ]
)
"""Stage 0 sends its four activations back to back, one per 1 ms op."""


def _ms(timeline: Timeline) -> float:
    return compute_metrics(timeline).iteration_time_ms


def test_the_delay_and_the_bytes_hold_no_sender_in_the_network() -> None:
    """1F1B at S=2, N=4 over 20 ms and 0.1 Gbit/s: the hook's sleep before each send holds
    the sender for 20 + 5.24 ms per message (276.2 ms, the simulator's only timing before);
    on the testbed nothing holds it, and messages arrive 25.24 ms after they went: 251.0 ms.
    Measured on the testbed: 257.2 ms (254.2 ms predicted with this host's calibration,
    against 281.0 ms timed as the hook); through the fault hook, which holds the sender for
    the delay but imposes no bandwidth, 258.4 ms (the two agreed by chance)."""
    profile = _lead()
    schedule = one_f_one_b(profile)
    hooked = simulate(schedule, profile, CommMode.DIRECT)
    network = simulate(schedule, profile, CommMode.DIRECT, delays_in_network=True)
    assert _ms(hooked) == pytest.approx(250.0 + 5 * BYTES_MS)
    assert _ms(network) == pytest.approx(250.97152)
    for message in network.messages:
        assert message.send_end_ms == message.send_start_ms  # held by nothing (no host costs)
        assert message.arrival_ms >= message.send_start_ms + 20.0 + BYTES_MS - 1e-9


def test_back_to_back_messages_queue_at_the_cap_and_their_delays_overlap() -> None:
    """Forward messages sent 1 ms apart over a link that takes 5.24 ms per message: each
    waits for the bytes before it (one queue per link direction), while their 20 ms delays
    overlap: the k-th arrives 1 + 20 + (k + 1) x 5.24 ms in (not 20 + 5.24 after its own
    send, which would let the link carry five times its rate)."""
    profile = Profile.uniform(
        2, 4, 1, 1, 1, message_bytes=64 * KIB, link_bandwidth_gbps=0.1, delay_ms=[20.0]
    )
    timeline = simulate(FORWARDS_FIRST, profile, CommMode.DIRECT, delays_in_network=True)
    forward = sorted(
        (m for m in timeline.messages if m.direction == "forward"), key=lambda m: m.microbatch
    )
    assert [m.send_start_ms for m in forward] == pytest.approx([1.0, 2.0, 3.0, 4.0])
    expected = [1.0 + 20.0 + (k + 1) * BYTES_MS for k in range(4)]
    assert [m.arrival_ms for m in forward] == pytest.approx(expected)


def test_a_send_s_host_cost_holds_its_sender_and_its_lag_follows_the_arrival() -> None:
    """With a calibration the sender is held for its send call only; the message can be used
    the receive lag after the later of that call's return and its last byte's propagation."""
    host = HostCosts(
        send_ms_by_bytes=CostCurve.line(0.5), receive_lag_ms_by_bytes=CostCurve.line(0.25)
    )
    profile = _lead()
    timeline = simulate(
        one_f_one_b(profile), profile, CommMode.DIRECT, host=host, delays_in_network=True
    )
    first = min(timeline.messages, key=lambda m: m.send_start_ms)
    assert first.send_end_ms == pytest.approx(first.send_start_ms + 0.5)
    assert first.arrival_ms == pytest.approx(first.send_start_ms + BYTES_MS + 20.0 + 0.25)


def test_delegates_share_the_link_s_queue_in_the_network() -> None:
    """Three delegates on a direction: their messages' delays overlap (a delegate is held by
    nothing but its send), but the link's bytes still go one message after another, as the
    pair's htb cap sends them; without it each delegate's message took 5.24 ms of the link
    at once, three times its rate."""
    profile = Profile.uniform(
        2, 4, 1, 1, 1, message_bytes=64 * KIB, link_bandwidth_gbps=0.1, delay_ms=[20.0],
        num_delegates=3,
    )  # fmt: skip
    timeline = simulate(FORWARDS_FIRST, profile, CommMode.DELEGATED, delays_in_network=True)
    forward = sorted(
        (m for m in timeline.messages if m.direction == "forward"), key=lambda m: m.microbatch
    )
    expected = [1.0 + 20.0 + (k + 1) * BYTES_MS for k in range(4)]
    assert [m.arrival_ms for m in forward] == pytest.approx(expected)


def test_without_the_network_nothing_changes() -> None:
    """The default timing is the fault hook's (the delay and the bytes held by the sender)."""
    profile = _lead()
    schedule = one_f_one_b(profile)
    assert _ms(simulate(schedule, profile, CommMode.DIRECT, host=FREE)) == pytest.approx(
        250.0 + 5 * BYTES_MS
    )


def test_a_lower_jitter_draw_waits_for_the_message_before_it_on_its_connection() -> None:
    """Direct messages of one link direction share one connection, which delivers in order:
    a message whose delay drew 1 ms waits for the one before it, which drew 30 ms (the
    testbed's wire keeps a direction's frames in order too); timed apart, it came 19 ms
    before it."""
    from pipeline.faults import MessageFault

    class Drawn:
        """30 ms on the first forward message, 1 ms on every other."""

        def message_fault(self, link, direction, kind, microbatch, *args, **kwargs):  # type: ignore[no-untyped-def]
            first = direction == "forward" and microbatch == 0
            return MessageFault(30.0 if first else 1.0)

        def route_failed(self, *args: object) -> bool:
            return False

        def affects(self, link: object) -> bool:
            return True

        def cache_key(self) -> None:
            return None

    profile = Profile.uniform(2, 4, 1, 1, 1)
    timeline = simulate(
        FORWARDS_FIRST, profile, CommMode.DIRECT, faults=Drawn(), delays_in_network=True
    )
    forward = sorted(
        (m for m in timeline.messages if m.direction == "forward"), key=lambda m: m.microbatch
    )
    assert [m.arrival_ms for m in forward] == pytest.approx([31.0, 31.0, 31.0, 31.0])
