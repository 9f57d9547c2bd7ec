"""A rank swap's model state between two movers over a NIC of their own choosing (two threads
on loopback addresses standing for two hosts' NICs)."""

from __future__ import annotations

import fcntl
import socket
import struct
import termios
import threading
import time

import pytest
import torch

from adaptra.transport.delegate import listen, nics_down
from adaptra.transport.state_wire import NotRead, _give, _Taking, move_state
from pipeline.errors import LinkFailure
from pipeline.runtime.transport import StateOffer, StateRoute

HOSTS = {0: ("127.0.0.11", "127.0.0.12"), 1: ("127.0.0.21", "127.0.0.22")}
"""Each mover's two NICs' addresses."""


class _Board:
    """The slot folder's offer files, in memory: one offer per (giver, taker)."""

    def __init__(self) -> None:
        self._offers: dict[tuple[int, int], StateOffer] = {}
        self._changed = threading.Condition()

    def route(self, rank: int, down: tuple[int, ...] = ()) -> StateRoute:
        peer = 1 - rank

        def offer(mine: StateOffer) -> None:
            with self._changed:
                self._offers[(peer, rank)] = mine._replace(nics_down=down)
                self._changed.notify_all()

        def offer_of(deadline: float) -> StateOffer:
            with self._changed:
                assert self._changed.wait_for(lambda: (rank, peer) in self._offers, 30)
                return self._offers.pop((rank, peer))

        return StateRoute(peer, peer, offer, offer_of)


def _swap(
    sizes: tuple[int, int],
    *,
    seen_nics: dict[int, tuple[str, str]] | None = None,
    down: dict[int, tuple[int, ...]] | None = None,
    timeout_s: float = 30.0,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[object]]:
    """Two movers trade states of `sizes` bytes at once (`seen_nics`: the addresses each
    mover dials for the other's NICs; `down`: the NICs each offers as down). What each sent,
    what each took, and what each `move_state` returned or raised."""
    board = _Board()
    generator = torch.Generator().manual_seed(7)
    sent = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=generator) for n in sizes]
    taken = [torch.zeros(sizes[1 - rank], dtype=torch.uint8) for rank in (0, 1)]
    outcome: list[object] = [None, None]
    dialled = seen_nics or HOSTS

    def mover(rank: int) -> None:
        try:
            outcome[rank] = move_state(
                sent[rank], taken[rank], board.route(rank, (down or {}).get(rank, ())),
                here=HOSTS[rank], taker_nics=dialled[1 - rank], ifnames=("", ""),
                timeout_s=timeout_s, user_timeout_ms=2000,
            )  # fmt: skip
        except Exception as err:
            outcome[rank] = err

    threads = [threading.Thread(target=mover, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return sent, taken, outcome


def test_each_mover_takes_the_other_s_state_whole_over_the_first_nic() -> None:
    sent, taken, outcome = _swap((3 << 20, 1 << 20))  # more than a socket buffer each way
    assert outcome == [0, 0]
    assert torch.equal(taken[0], sent[1]) and torch.equal(taken[1], sent[0])


def test_a_nic_down_at_the_taker_s_end_sends_over_the_next() -> None:
    sent, taken, outcome = _swap((4096, 4096), down={1: (0,)})
    assert outcome == [1, 0]  # mover 0 sends to mover 1, whose NIC 0 is down
    assert torch.equal(taken[1], sent[0])


def test_a_nic_that_does_not_connect_is_passed_over() -> None:
    unreachable = {0: HOSTS[0], 1: ("127.0.0.29", HOSTS[1][1])}  # nothing listens there
    sent, taken, outcome = _swap((4096, 4096), seen_nics=unreachable)
    assert outcome == [1, 0]
    assert torch.equal(taken[1], sent[0]) and torch.equal(taken[0], sent[1])


def test_no_nic_left_is_a_link_failure_naming_each_nic_s_error() -> None:
    nowhere = {0: HOSTS[0], 1: ("127.0.0.29", "127.0.0.28")}
    _, _, outcome = _swap((4096, 4096), seen_nics=nowhere, timeout_s=2.0)
    assert isinstance(outcome[0], LinkFailure)
    assert str(outcome[0]).startswith("no NIC carried the model state to rank 1 (NIC 0: ")
    assert "; NIC 1: " in str(outcome[0])
    # Its state never came: the other mover, gone, closed its connection with the state
    # unread (NotRead: it was "given", and the giver waited for the whole timeout for a
    # state of its own that could not come), reset it mid-way, or took its state and ended
    # before sending its own.
    assert isinstance(outcome[1], NotRead | LinkFailure | TimeoutError)


def test_a_state_of_another_size_is_refused() -> None:
    board = _Board()
    outcome: list[object] = [None, None]

    def mover(rank: int, size: int, expected: int) -> None:
        try:
            outcome[rank] = move_state(
                torch.zeros(size, dtype=torch.uint8), torch.zeros(expected, dtype=torch.uint8),
                board.route(rank), here=HOSTS[rank], taker_nics=HOSTS[1 - rank],
                ifnames=("", ""), timeout_s=5.0, user_timeout_ms=2000,
            )  # fmt: skip
        except Exception as err:
            outcome[rank] = err

    threads = [
        threading.Thread(target=mover, args=(0, 100, 100)),
        threading.Thread(target=mover, args=(1, 100, 99)),  # expects 99, is sent 100
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert isinstance(outcome[1], ValueError)
    assert str(outcome[1]) == ("rank 0 sent 100 bytes of model state, where this position's are 99")


def test_named_nics_that_do_not_exist_are_down_and_unnamed_ones_are_not() -> None:
    assert nics_down(("", "lo", "no-such-nic0")) == (2,)


@pytest.mark.parametrize("size", [0])
def test_an_empty_state_is_acked_at_once(size: int) -> None:
    _, taken, outcome = _swap((size, size))
    assert outcome == [0, 0] and taken[0].numel() == 0


def test_a_giver_is_done_once_the_taker_s_host_has_every_byte() -> None:
    """The taker's host takes every byte and its taker says nothing (a word back could be
    lost with a NIC going down once the state is in: the giver waited for the whole timeout
    and failed the swap). TCP's acks, and no reset within TCP's user timeout (here 0.3 s),
    are the giver's word: it is done."""
    (listener,) = listen([HOSTS[1][0]])
    with listener:
        payload = bytes(range(256)) * 64
        done: list[object] = []
        port, deadline = listener.getsockname()[1], time.monotonic() + 5.0

        def give_state() -> None:
            nic = _give(memoryview(payload), 1, HOSTS[0], HOSTS[1], port, [0], deadline, 300)
            done.append(nic)

        give = threading.Thread(target=give_state)
        give.start()
        conn, _ = listener.accept()
        with conn:
            received = b""
            while len(received) < 8 + len(payload):
                received += conn.recv(1 << 16)
            give.join(30)
            assert done == [0]  # without a word from the far end
    assert received[8:] == payload


def test_a_connection_broken_mid_state_is_taken_again_whole_from_the_first_byte() -> None:
    """A giver's first connection breaks after part of the state (its NIC went down); it
    sends the whole state again over the next NIC. The taker drops what the first brought
    and takes the second's from its first byte."""
    listeners = listen(list(HOSTS[1]))
    target = torch.zeros(1 << 16, dtype=torch.uint8)
    state = torch.randint(0, 256, (1 << 16,), dtype=torch.uint8, generator=torch.Generator())
    taking = _Taking(listeners, memoryview(target.numpy()), 0, time.monotonic() + 30.0)
    taking.start()
    try:
        port = listeners[0].getsockname()[1]
        with socket.create_connection((HOSTS[1][0], port)) as first:
            first.sendall(struct.pack("<q", state.numel()) + bytes(20000))  # zeros, cut short
            first.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        assert _give(memoryview(state.numpy()), 1, HOSTS[0], HOSTS[1], port, [1],
                     time.monotonic() + 30.0, 2000) == 1  # fmt: skip
        taking.join(time.monotonic() + 30.0)
    finally:
        taking.stop()
        for listener in listeners:
            listener.close()
    assert torch.equal(target, state)


def test_a_state_the_taker_closes_unread_is_not_given() -> None:
    """The taker's host acknowledged every byte, then the taker closed without reading them
    (a failure of its own): the giver said "given" (`_give` returned its NIC) and went on,
    and the error named the taker's side only, or, where the taker had dropped that
    connection for another, its timeout for a state that "did not come". The close resets
    the connection: `NotRead`, a ConnectionError (the pool then names the taker's own error),
    and no other NIC tried (it is no NIC's failure)."""
    (listener,) = listen([HOSTS[1][0]])
    with listener:
        payload = bytes(range(256)) * 64
        outcome: list[object] = []
        port, deadline = listener.getsockname()[1], time.monotonic() + 5.0

        def give_state() -> None:
            try:
                outcome.append(
                    _give(memoryview(payload), 1, HOSTS[0], HOSTS[1], port, [0, 1], deadline, 2000)
                )
            except Exception as err:
                outcome.append(err)

        give = threading.Thread(target=give_state)
        give.start()
        conn, _ = listener.accept()
        with conn:  # every byte in its host, none read
            while _unread(conn) < 8 + len(payload) and time.monotonic() < deadline:
                time.sleep(0.001)
            assert _unread(conn) == 8 + len(payload)
        give.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], NotRead), outcome
    assert isinstance(outcome[0], ConnectionError) and not isinstance(outcome[0], LinkFailure)
    assert str(outcome[0]) == (
        "rank 1 closed the connection over NIC 0 without reading the whole model state"
    )


def _unread(conn: socket.socket) -> int:
    """The bytes in `conn`'s receive queue (FIONREAD)."""
    return int(struct.unpack("i", fcntl.ioctl(conn.fileno(), termios.FIONREAD, bytes(4)))[0])
