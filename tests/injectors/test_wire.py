"""A wire direction's timing of the frames it reads (pure: no namespaces, no clock)."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from injectors.wire import GLOO_CONTROL_BYTES, WireState, _Direction, carries_message


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


def test_only_frames_of_a_message_are_a_message_s() -> None:
    """As captured on the testbed's wire (torch 2.13's gloo, 4 KiB messages): a posted
    receive's "receive ready" and a send's "send ready" are 48-byte segments, alone or (a
    retransmission) several in one; a message's first segment is 48 + its bytes, the next
    ones its bytes. Only the message's pay a stall and draw jitter."""
    arp = bytes(12) + b"\x08\x06" + bytes(28)
    notice = _gloo_notice(RECEIVE_READY, 3)
    assert len(notice) == GLOO_CONTROL_BYTES == 48
    not_messages = [
        arp,
        _ipv4(6, 0),  # a bare ACK
        _ipv4(6, 0, 32),  # with timestamps
        b"short",
        _ipv4(6, notice),
        _ipv4(6, _gloo_notice(SEND_READY, 0), 32),
        _ipv4(6, notice + _gloo_notice(SEND_READY, 1) + notice),  # coalesced
        _ipv4(6, 48),  # 48 bytes of anything: no bigger than a notice
        _ipv4(6, 1) + bytes(20),  # a frame padded past its packet's end
    ]
    messages = [
        _ipv4(6, _gloo_message(0, 4096)),
        _ipv4(6, _gloo_message(0, 1)),  # the smallest message: one byte of data
        _ipv4(6, bytes(1448), 32),  # a later segment of a large message
        _ipv4(6, notice + _gloo_message(2, 100)),  # a notice and a message together
        _ipv4(6, 49),
        _ipv4(17, 0),  # UDP
    ]
    assert [carries_message(f) for f in not_messages] == [False] * len(not_messages)
    assert [carries_message(f) for f in messages] == [True] * len(messages)


def test_a_frame_of_no_message_before_the_message_does_not_take_its_stall() -> None:
    """An ARP request, a bare ACK or a gloo "receive ready" read just after a stall is set
    passes; the message's first frame takes the stall, and what comes after it waits behind
    it."""
    direction = _Direction()
    direction.take(WireState(stall_ms=300.0), now=0.0)
    assert direction.due(1.0, 60, message=False) == pytest.approx(1.0)
    assert direction.due(1.1, 1500, message=True) == pytest.approx(1.4)
    assert direction.due(1.2, 60, message=False) == pytest.approx(1.4)
    assert direction.due(2.0, 1500, message=True) == pytest.approx(2.0)
