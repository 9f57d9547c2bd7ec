"""A wire direction's timing of the frames it reads (pure: no namespaces, no clock)."""

import dataclasses
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adaptra.transport.delegate import HEADER
from injectors.wire import (
    _DELEGATE_HEADER,
    GLOO_CONTROL_BYTES,
    FrameKind,
    FrameReader,
    WireState,
    _Direction,
    frame_kind,
)


def _dues(state: WireState, frames: list[tuple[float, int]]) -> list[float | None]:
    direction = _Direction()
    direction.take(state, now=0.0)
    return [direction.due(at, size) for at, size in frames]


def test_a_delay_holds_every_frame_that_long() -> None:
    assert _dues(WireState(delay_ms=20.0), [(0.0, 100), (0.5, 100)]) == [0.02, 0.52]


def test_a_cap_sends_frames_one_after_another_at_its_rate() -> None:
    # 1 Mbit/s: a 1250-byte frame takes 10 ms; a second one read at once waits its turn.
    dues = _dues(WireState(rate_bit_s=1e6), [(0.0, 1250), (0.0, 1250), (1.0, 1250)])
    assert dues == pytest.approx([0.01, 0.02, 1.01])


def test_a_cap_on_the_direction_holds_under_every_state_with_the_lower_rate() -> None:
    """The testbed's cap (`Testbed.cap_bandwidth` on a wired pair) stays through a change
    of state; the lower of it and a state's own rate holds."""
    direction = _Direction(cap_bit_s=1e6)
    direction.take(WireState(delay_ms=5.0), now=0.0)
    assert direction.due(0.0, 1250) == pytest.approx(0.015)  # 10 ms at 1 Mbit/s, then 5 ms
    direction.take(WireState(rate_bit_s=1e7), now=1.0)
    assert direction.due(1.0, 1250) == pytest.approx(1.01)  # the cap: the lower
    direction.take(WireState(rate_bit_s=0.5e6), now=2.0)
    assert direction.due(2.0, 1250) == pytest.approx(2.02)  # the state's: the lower


def test_a_stall_holds_the_direction_once() -> None:
    # The first frame waits 300 ms; one read meanwhile stays behind it; later ones pass.
    dues = _dues(WireState(stall_ms=300.0), [(1.0, 100), (1.1, 100), (2.0, 100)])
    assert dues == pytest.approx([1.3, 1.3, 2.0])


def test_a_down_direction_loses_every_frame() -> None:
    assert _dues(WireState(down=True), [(0.0, 100), (1.0, 100)]) == [None, None]


def test_jitter_is_seeded_and_within_its_band() -> None:
    frames = [(i * 1.0, 100) for i in range(50)]
    state = WireState(delay_ms=10.0, jitter_ms=5.0, seed="s")
    dues = _dues(state, frames)
    assert dues == _dues(state, frames)  # the same seed, the same draws
    assert dues != _dues(WireState(delay_ms=10.0, jitter_ms=5.0, seed="t"), frames)
    held_ms = [(due - at) * 1000 for due, (at, _) in zip(dues, frames, strict=True)]  # type: ignore[operator]
    assert all(5.0 <= ms <= 15.0 for ms in held_ms) and len(set(held_ms)) > 40


def test_the_frames_of_a_burst_share_one_jitter_draw() -> None:
    """A message's frames come back to back: they meet one draw (the fault model's one per
    message), not the largest of theirs; a frame after a pause draws anew."""
    state = WireState(delay_ms=10.0, jitter_ms=10.0, seed="s")
    bursts = [(k * 0.5 + i * 0.0001, 1500) for k in range(40) for i in range(45)]
    dues = _dues(state, bursts)
    held_ms = [round((due - at) * 1000, 6) for due, (at, _) in zip(dues, bursts, strict=True)]  # type: ignore[operator]
    per_burst = [set(held_ms[k * 45 : (k + 1) * 45]) for k in range(40)]
    assert all(len(held) == 1 for held in per_burst)
    firsts = [held.pop() for held in per_burst]
    assert len(set(firsts)) == 40 and 7.0 < sum(firsts) / 40 < 13.0  # mean 10, not ~19.6


def test_a_redrawn_delay_holds_its_value_between_redraws() -> None:
    state = WireState(normal_ms=(50.0, 10.0), redraw_every_ms=(100.0, 100.0), seed="s")
    frames = [(i * 0.05, 100) for i in range(20)]  # 1 s, a frame every 50 ms
    held = [round(due - at, 9) for due, (at, _) in zip(_dues(state, frames), frames, strict=True)]  # type: ignore[operator]
    assert 9 <= len(set(held)) <= 11  # a value per 100 ms
    assert 0.02 < sum(held) / len(held) < 0.08


@given(
    st.lists(st.tuples(st.floats(0, 10), st.integers(1, 9000)), min_size=1, max_size=40).map(
        sorted
    ),
    st.floats(0, 50),
    st.floats(0, 20),
    st.one_of(st.none(), st.floats(1e5, 1e10)),
    st.floats(0, 500),
)
def test_frames_keep_their_order_and_never_leave_early(
    frames: list[tuple[float, int]],
    delay_ms: float,
    jitter_ms: float,
    rate_bit_s: float | None,
    stall_ms: float,
) -> None:
    state = WireState(delay_ms, jitter_ms, rate_bit_s=rate_bit_s, stall_ms=stall_ms, seed="p")
    dues = _dues(state, frames)
    assert all(due is not None and due >= at for due, (at, _) in zip(dues, frames, strict=True))
    assert dues == sorted(dues)  # type: ignore[type-var]


def test_loss_is_seeded_and_loses_about_its_share() -> None:
    frames = [(i * 0.001, 100) for i in range(2000)]
    state = WireState(delay_ms=1.0, loss_pct=30.0, seed="s")
    dues = _dues(state, frames)
    assert dues == _dues(state, frames)  # the same seed, the same frames lost
    assert dues != _dues(WireState(delay_ms=1.0, loss_pct=30.0, seed="t"), frames)
    lost = dues.count(None)
    assert 500 <= lost <= 700, lost  # 600 expected; a binomial's sd is 20
    kept = [(due, at) for due, (at, _) in zip(dues, frames, strict=True) if due is not None]
    assert all(due == pytest.approx(at + 0.001) for due, at in kept)  # the rest: delayed


def test_a_loss_of_100_percent_is_down_and_0_loses_nothing() -> None:
    frames = [(i * 0.01, 100) for i in range(100)]
    assert _dues(WireState(loss_pct=100.0), frames) == [None] * 100
    assert None not in _dues(WireState(loss_pct=0.0, jitter_ms=1.0, seed="s"), frames)


def test_a_lost_frame_pays_no_stall() -> None:
    direction = _Direction()
    direction.take(WireState(stall_ms=300.0, loss_pct=50.0, seed="s"), now=0.0)
    dues = [direction.due(i * 1.0, 100) for i in range(20)]
    first = next(i for i, due in enumerate(dues) if due is not None)
    assert first > 0  # seed "s" loses the first frame read
    assert dues[first] == pytest.approx(first + 0.3)  # the first frame through pays it
    assert all(due == pytest.approx(i) for i, due in enumerate(dues) if due and i > first)


def test_a_bad_state_is_refused() -> None:
    for bad in (
        {"delay_ms": -1.0},
        {"rate_bit_s": 0.0},
        {"rate_bit_s": float("inf")},
        {"loss_pct": -1.0},
        {"loss_pct": 100.5},
        {"loss_pct": float("nan")},
    ):
        with pytest.raises(ValueError, match="a wire takes"):
            WireState(**bad)  # type: ignore[arg-type]


def test_a_paid_stall_stays_paid_through_a_change_inside_the_iteration() -> None:
    direction = _Direction()
    direction.take(WireState(stall_ms=300.0), now=0.0)
    assert direction.due(1.0, 100) == pytest.approx(1.3)
    direction.take(WireState(stall_ms=300.0, delay_ms=10.0), now=2.0, new_iteration=False)
    assert direction.due(3.0, 100) == pytest.approx(3.01)  # not stalled again
    direction.take(WireState(stall_ms=300.0), now=4.0)  # the next iteration's: a new stall
    assert direction.due(5.0, 100) == pytest.approx(5.3)


def test_a_stall_that_begins_later_in_the_iteration_is_paid_again_whatever_its_value() -> None:
    """A second stall row in the iteration is a stall of its own, as in the fault model: the
    wire paid it only where its value differed from the first's."""
    direction = _Direction()
    direction.take(WireState(stall_ms=300.0), now=0.0)
    assert direction.due(1.0, 100) == pytest.approx(1.3)
    again = WireState(stall_ms=300.0, stall_since_ms=100.0)
    direction.take(again, now=2.0, new_iteration=False)
    assert direction.due(3.0, 100) == pytest.approx(3.3)
    direction.take(dataclasses.replace(again, delay_ms=10.0), now=4.0, new_iteration=False)
    assert direction.due(5.0, 100) == pytest.approx(5.01)  # the same stall: paid


def _ipv4(protocol: int, payload: bytes | int, tcp_header_bytes: int = 20) -> bytes:
    """An Ethernet frame of an IPv4 packet (20-byte header) of `protocol` carrying `payload`
    (an int: that many zero bytes)."""
    data = bytes(payload) if isinstance(payload, int) else payload
    transport = bytearray(tcp_header_bytes if protocol == 6 else 8)
    if protocol == 6:
        transport[12] = (tcp_header_bytes // 4) << 4
    total = 20 + len(transport) + len(data)
    ip = bytes([0x45, 0]) + total.to_bytes(2, "big") + bytes(5) + bytes([protocol]) + bytes(10)
    return bytes(12) + b"\x08\x00" + ip + bytes(transport) + data


def _gloo_notice(opcode: int, slot: int, length: int = 4096) -> bytes:
    """A gloo TCP control op as captured on the wire: a preamble alone (the op's bytes,
    opcode, slot, offset, length of the message it is about, remote offset; 8 bytes each)."""
    return struct.pack("<6Q", GLOO_CONTROL_BYTES, opcode, slot, 0, length, 0)


def _gloo_message(slot: int, length: int) -> bytes:
    """A gloo TCP op that carries a message of `length` bytes: its preamble and its data."""
    preamble = struct.pack("<6Q", GLOO_CONTROL_BYTES + length, MESSAGE, slot, 0, length, 0)
    return preamble + bytes(range(256)) * (length // 256) + bytes(length % 256)


RECEIVE_READY, SEND_READY, MESSAGE = 3, 2, 1
"""gloo's opcodes (its tcp `Op::Opcode`; 1 is an "unbound buffer", a send's data)."""


def test_what_each_frame_is_to_a_message() -> None:
    """As captured on the testbed's wire (torch 2.13's gloo, 4 KiB messages): a posted
    receive's "receive ready" and a send's "send ready" are 48-byte segments, alone or (a
    retransmission) several in one; a message's first segment is 48 + its bytes, the next
    ones its bytes. The "send ready" (or a delegate's header) comes just before its message."""
    arp = bytes(12) + b"\x08\x06" + bytes(28)
    receive_ready = _gloo_notice(RECEIVE_READY, 3)
    send_ready = _gloo_notice(SEND_READY, 0)
    assert len(receive_ready) == GLOO_CONTROL_BYTES == 48
    other = [
        arp,
        _ipv4(6, 0),  # a bare ACK
        _ipv4(6, 0, 32),  # with timestamps
        b"short",
        _ipv4(6, receive_ready),
        _ipv4(6, receive_ready + _gloo_notice(RECEIVE_READY, 5) + receive_ready),  # coalesced
        _ipv4(6, 0) + bytes(20),  # a frame padded past its packet's end
    ]
    announce = [
        _ipv4(6, send_ready, 32),
        _ipv4(6, receive_ready + send_ready),
        _ipv4(6, 48),  # 48 bytes of anything (a delegate's header)
        _ipv4(6, 1),
    ]
    message = [
        _ipv4(6, _gloo_message(0, 4096)),
        _ipv4(6, _gloo_message(0, 1)),  # the smallest message: one byte of data
        _ipv4(6, bytes(1448), 32),  # a later segment of a large message
        _ipv4(6, send_ready + _gloo_message(2, 100)),  # a notice and its message together
        _ipv4(6, 49),
        _ipv4(17, 0),  # UDP
    ]
    assert [frame_kind(f) for f in other] == [FrameKind.OTHER] * len(other)
    assert [frame_kind(f) for f in announce] == [FrameKind.ANNOUNCE] * len(announce)
    assert [frame_kind(f) for f in message] == [FrameKind.MESSAGE] * len(message)


def test_a_frame_of_no_message_before_the_message_does_not_take_its_stall() -> None:
    """An ARP request, a bare ACK, a gloo "receive ready" or a "send ready" read just after a
    stall is set passes; the message's first frame takes the stall, and what comes after it
    waits behind it."""
    direction = _Direction()
    direction.take(WireState(stall_ms=300.0), now=0.0)
    assert direction.due(1.0, 60, FrameKind.OTHER) == pytest.approx(1.0)
    assert direction.due(1.05, 60, FrameKind.ANNOUNCE) == pytest.approx(1.05)
    assert direction.due(1.1, 1500, FrameKind.MESSAGE) == pytest.approx(1.4)
    assert direction.due(1.2, 60, FrameKind.OTHER) == pytest.approx(1.4)
    assert direction.due(2.0, 1500, FrameKind.MESSAGE) == pytest.approx(2.0)


def _held_ms(state: WireState, frames: list[tuple[float, FrameKind]]) -> list[float]:
    """How long each frame (read at, kind) is held, ms (none lost)."""
    direction = _Direction()
    direction.take(state, now=0.0)
    dues = [direction.due(at, 1500, kind) for at, kind in frames]
    return [round((due - at) * 1000, 6) for due, (at, _) in zip(dues, frames, strict=True)]  # type: ignore[operator]


JITTERY = WireState(delay_ms=20.0, jitter_ms=15.0, seed="s")


def test_only_a_message_or_its_announcement_draws_jitter_the_rest_takes_the_current_draw() -> None:
    """Messages 0.5 s apart, each with gloo's "send ready" 0.3 ms before its two frames, and
    between them ACKs and "receive ready" notices (which once drew each their own value,
    and held the next message with it): a message's frames and its announcement share one
    draw, the frames between take the message's before them, and they change no draw."""
    messages = [
        frames
        for k in range(40)
        for frames in ((k * 0.5, FrameKind.ANNOUNCE), (k * 0.5 + 3e-4, FrameKind.MESSAGE),
                       (k * 0.5 + 4e-4, FrameKind.MESSAGE))
    ]  # fmt: skip
    between = [(k * 0.5 + 0.1 + i * 0.02, FrameKind.OTHER) for k in range(40) for i in range(10)]
    alone = _held_ms(JITTERY, messages)
    mixed = sorted(messages + between)
    held = dict(zip(mixed, _held_ms(JITTERY, mixed), strict=True))
    assert [held[frame] for frame in messages] == alone  # the same draws
    per_message = [set(alone[k * 3 : k * 3 + 3]) for k in range(40)]
    assert all(len(draw) == 1 for draw in per_message)  # one per message
    for at, kind in between:  # the draw of the message before
        assert held[at, kind] == alone[int(at / 0.5) * 3]
    draws = [draw.pop() for draw in per_message]
    assert len(set(draws)) == 40 and all(5.0 <= ms <= 35.0 for ms in draws)


def test_acks_ahead_of_a_message_hold_it_with_one_draw_not_one_each() -> None:
    """A message announced 1.2 ms after a stream of 25 ACKs 1.2 ms apart (the other
    direction's large message) waits for the ACKs ahead of it (frames keep their order).
    When each ACK drew its own value, it waited for the largest of them (a mean of 28 ms
    over 400 such messages, seeded); now they all hold the draw of the message before it
    (24 ms; the message's own draws alone: 20)."""
    frames = []
    for k in range(400):
        frames += [(k + i * 0.0012, FrameKind.OTHER) for i in range(25)]
        frames += [(k + 0.0300, FrameKind.ANNOUNCE), (k + 0.0303, FrameKind.MESSAGE)]
    messages = _held_ms(JITTERY, frames)[26::27]
    assert len(messages) == 400
    assert 20.0 < sum(messages) / 400 < 26.0


MSS = 9000 - 52
"""The testbed's TCP segments' most data bytes (MTU 9000, with timestamps)."""
DELEGATE_HEADER = struct.Struct("<qiiqqqq")
"""adaptra.transport.delegate.HEADER."""


def _segments(stream: bytes) -> list[bytes]:
    return [_ipv4(6, stream[i : i + MSS], 32) for i in range(0, len(stream), MSS)]


def _delegated(nbytes: int) -> list[bytes]:
    """A delegate's message of `nbytes`: its header alone, then its payload's segments."""
    header = DELEGATE_HEADER.pack(5, 1, 1, nbytes, 0, nbytes, 8 * nbytes)
    return [_ipv4(6, header, 32), *_segments(bytes([7]) * nbytes)]


def _gloo_sent(length: int) -> list[bytes]:
    """A gloo send of `length` bytes: its "send ready", then its op's segments."""
    return [_ipv4(6, _gloo_notice(SEND_READY, 0), 32), *_segments(_gloo_message(0, length))]


A, M = FrameKind.ANNOUNCE, FrameKind.MESSAGE


def test_a_message_s_segments_are_its_data_whatever_their_size() -> None:
    """A message's last segment of 1 to 48 bytes (its bytes mod the MSS) is its data, as is
    a 16-byte delegated message's one segment; the next header is an announcement again
    (read alone, by their size, such tails were announcements)."""
    reader = FrameReader()
    kinds = [
        reader.kind(frame)
        for frame in _delegated(2 * MSS + 20) + _delegated(16) + _gloo_sent(2 * MSS - 48 + 30)
    ]
    assert kinds == [A, M, M, M, A, M, A, M, M, M]
    reader = FrameReader()
    coalesced = _ipv4(6, bytes(MSS - 10) + _gloo_notice(SEND_READY, 1), 32)  # tail + notice
    kinds = [reader.kind(frame) for frame in _gloo_sent(MSS - 48 + MSS - 10)[:2]]
    assert [*kinds, reader.kind(coalesced)] == [A, M, M]
    assert [reader.kind(frame) for frame in _segments(_gloo_message(1, 40))] == [M]


def test_a_message_s_short_last_segment_draws_no_jitter_and_a_short_message_pays_the_stall() -> (
    None
):
    """Through a direction: every frame of a message with a 20-byte tail waits its one draw
    (200 seeds; drawn again by the tail, 109 of them waited longer); a 16-byte delegated
    message, the first under a stall, pays it (not the one after it)."""

    def held_ms(state: WireState, frames: list[bytes], gap_s: float) -> list[float]:
        direction, reader = _Direction(), FrameReader()
        direction.take(state, now=0.0)
        ats = [1.0 + k * gap_s for k in range(len(frames))]
        dues = [
            direction.due(at, len(f), reader.kind(f)) for at, f in zip(ats, frames, strict=True)
        ]
        return [round((due - at) * 1000, 6) for due, at in zip(dues, ats, strict=True)]  # type: ignore[operator]

    for seed in range(200):
        jittery = WireState(delay_ms=20.0, jitter_ms=15.0, seed=f"s{seed}")
        assert len(set(held_ms(jittery, _delegated(2 * MSS + 20), 1e-4))) == 1
    stalled = held_ms(WireState(stall_ms=300.0), _delegated(16) + _delegated(4096), 0.01)
    assert stalled == [0.0, 300.0, 290.0, 280.0]


def test_the_wire_reads_the_delegates_header_as_they_write_it() -> None:
    assert _DELEGATE_HEADER.format == HEADER.format
