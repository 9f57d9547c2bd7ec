"""A rank swap's model state between two trainers, over a TCP connection of their own on the
first data-plane NIC up at both ends (the delegates' rule), not over the process group: gloo
is bound to one NIC (on the testbed rnic0), and a megatron swap on a host whose rnic0 was down
waited there for the whole timeout and restarted, although its delegates had failed over.

Each mover sends one state and takes one: it listens on each of its NICs (one port) and offers
that port with its NICs down (`StateRoute.offer`), connects to its taker over the first NIC up
at both ends, sends the length and the bytes and waits until the taker's host has
acknowledged every byte (TCP's acks: a word of the taker's own could be lost with a NIC going
down once the state was in, and its giver waited for the whole timeout), and then for the
taker's close, up to TCP's user timeout: a taker that read every byte closes at once, one
that closes with bytes unread resets the connection (a failure of its own: the giver raises
`NotRead`, not "given"), and a close that does not come is taken as lost with a NIC. Meanwhile
a thread of its own takes its giver's state. A connection that breaks (a NIC going down
mid-way: a reset, or TCP's user timeout) is given up and the next NIC tried from the first
byte; the taker drops a connection a newer one replaces. No delegate process carries it: a
one-off transfer, the iteration's first work, has no compute to overlap."""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Sequence

import torch

from adaptra.transport.delegate import CONNECT_TIMEOUT_S, TCP_USER_TIMEOUT, listen, nics_down
from pipeline.errors import LinkFailure
from pipeline.runtime.transport import StateOffer, StateRoute

__all__ = ["NotRead", "move_state"]

_LENGTH = struct.Struct("<q")
"""On the wire before the state's bytes: how many there are."""
_SIOCOUTQ = 0x5411
"""linux/sockios.h: a TCP socket's bytes not yet acknowledged (sent or not)."""
_ACKED_POLL_S = 0.001
"""How often a giver looks whether its last bytes are acknowledged."""
_LOOK_S = 0.1
"""How long the taker waits on a read (or, with no connection, for one) before it looks for
a newer connection and at its deadline."""


class NotRead(ConnectionResetError):
    """The taker closed the connection with the state's bytes unread (its host had them all):
    a failure on the taker's side, not of a NIC, so no other NIC is tried; a ConnectionError
    (not a `LinkFailure`), so the pool names the taker's own error as the cause where it
    reports one."""


def move_state(
    outgoing: torch.Tensor,
    incoming: torch.Tensor,
    route: StateRoute,
    *,
    here: Sequence[str],
    taker_nics: Sequence[str],
    ifnames: tuple[str, ...],
    timeout_s: float,
    user_timeout_ms: int,
) -> int:
    """`outgoing` (host bytes) to `route.taker`, whose NICs' addresses are `taker_nics`, and
    `incoming` filled from `route.giver`, within `timeout_s`; `here`: this host's NICs'
    addresses (`ifnames`: their interfaces, whose link state says which are down). The NIC
    that carried `outgoing`. `LinkFailure` (naming each NIC's error) if none did, `NotRead`
    if the taker closed with it unread, `TimeoutError` if the giver's state did not come."""
    deadline = time.monotonic() + timeout_s
    listeners = listen(list(here))
    taking = _Taking(listeners, _bytes_of(incoming), route.giver, deadline)
    try:
        route.offer(StateOffer(listeners[0].getsockname()[1], nics_down(ifnames)))
        taking.start()
        offer = route.offer_of(deadline)
        down = set(nics_down(ifnames)) | set(offer.nics_down)
        order = [k for k in range(len(here)) if k not in down] + sorted(down)
        try:
            nic = _give(_bytes_of(outgoing), route.taker, here, taker_nics, offer.port,
                        order, deadline, user_timeout_ms)  # fmt: skip
        except NotRead as unread:
            # Its own state may still come, and a failure of its own (a state of another
            # size) is the news, not this echo of the taker's: the taker of this one stops
            # only then (stopping at once failed the other mover's send in turn).
            with contextlib.suppress(TimeoutError):  # it did not come: `unread` says why
                taking.join(deadline)
            raise unread from None
        taking.join(deadline)
        return nic
    finally:
        taking.stop()
        for listener in listeners:
            listener.close()


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """A host tensor's bytes, in place."""
    return memoryview(tensor.numpy()).cast("B")  # type: ignore[arg-type]


def _give(
    payload: memoryview,
    taker: int,
    here: Sequence[str],
    taker_nics: Sequence[str],
    port: int,
    order: list[int],
    deadline: float,
    user_timeout_ms: int,
) -> int:
    """`payload` to the taker over the first NIC in `order` that carries it whole."""
    errors: dict[int, OSError] = {}
    for nic in order:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, TCP_USER_TIMEOUT, user_timeout_ms)
            sock.settimeout(max(min(CONNECT_TIMEOUT_S, deadline - time.monotonic()), 0.001))
            sock.bind((here[nic], 0))
            sock.connect((taker_nics[nic], port))
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.sendall(_LENGTH.pack(len(payload)))
            sock.sendall(payload)
            _wait_acked(sock, deadline)
            closed_by = min(deadline, time.monotonic() + user_timeout_ms / 1000.0)
            _wait_closed(sock, taker, nic, closed_by)
            return nic
        except NotRead:
            raise
        except OSError as err:
            errors[nic] = err
        finally:
            sock.close()
    said = "; ".join(f"NIC {nic}: {err or type(err).__name__}" for nic, err in errors.items())
    raise LinkFailure(f"no NIC carried the model state to rank {taker} ({said})")


def _wait_acked(sock: socket.socket, deadline: float) -> None:
    """Until the far host has acknowledged every byte sent on `sock` (its taker then reads
    them, whatever its NICs do next); the connection's error if it broke (a reset, or TCP's
    user timeout: bytes unacknowledged that long), `TimeoutError` at `deadline`."""
    while True:
        (unacked,) = struct.unpack("i", fcntl.ioctl(sock.fileno(), _SIOCOUTQ, bytes(4)))
        if not unacked:
            return
        error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if error:
            raise OSError(error, os.strerror(error))
        if time.monotonic() > deadline:
            raise TimeoutError(f"{unacked} bytes of the state unacknowledged at the deadline")
        time.sleep(_ACKED_POLL_S)


def _wait_closed(sock: socket.socket, taker: int, nic: int, until: float) -> None:
    """Until the taker closes `sock`, every byte acknowledged: an orderly close (it read them
    all) returns, a reset (it closed with bytes unread: it failed or dropped the connection)
    is `NotRead`; none by `until` returns too (its close may be lost with a NIC going down
    once the state was in)."""
    sock.settimeout(max(until - time.monotonic(), 0.001))
    try:
        sock.recv(1)  # the taker sends nothing: b"" at its close
    except TimeoutError:
        return
    except ConnectionResetError:
        raise NotRead(
            f"rank {taker} closed the connection over NIC {nic} without reading the whole "
            "model state"
        ) from None


class _Taking:
    """The thread that takes the giver's state into `target`: it accepts on every listener and
    reads the newest connection (an older one's sender has given it up)."""

    def __init__(
        self, listeners: list[socket.socket], target: memoryview, giver: int, deadline: float
    ) -> None:
        self._listeners, self._target, self._giver = listeners, target, giver
        self._deadline = deadline
        self._stopped = threading.Event()
        self._error: BaseException | None = None
        self._taken = False
        self._thread = threading.Thread(target=self._run, name="state-taker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, deadline: float) -> None:
        """Wait for the whole state; its error if it failed."""
        self._thread.join(max(deadline - time.monotonic(), 0.0))
        if self._error is not None:
            raise self._error
        if not self._taken:
            raise TimeoutError(f"the model state from rank {self._giver} did not come in time")

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(1.0)

    def _run(self) -> None:
        try:
            self._take()
        except BaseException as err:  # the trainer's thread raises it (`join`)
            self._error = err

    def _take(self) -> None:
        conn: socket.socket | None = None
        header, got = b"", 0
        try:
            while not self._stopped.is_set():
                left_s = self._deadline - time.monotonic()
                if left_s <= 0:
                    return  # `join` says it timed out
                # A newer connection replaces the one read (its sender gave that one up).
                wait_s = 0.0 if conn is not None else min(left_s, _LOOK_S)
                ready, _, _ = select.select(self._listeners, [], [], wait_s)
                if ready:
                    if conn is not None:
                        conn.close()
                    conn, _ = ready[0].accept()
                    conn.settimeout(_LOOK_S)
                    header, got = b"", 0
                if conn is None:
                    continue
                try:
                    if len(header) < _LENGTH.size:
                        data = conn.recv(_LENGTH.size - len(header))
                        num_read = len(data)
                        header += data
                        if len(header) == _LENGTH.size:
                            self._check_size(_LENGTH.unpack(header)[0])
                    else:
                        num_read = conn.recv_into(self._target[got:])
                        got += num_read
                except TimeoutError:
                    continue  # nothing for a while: look for a newer connection
                except OSError:
                    num_read = 0  # broken: its sender tries another NIC
                if num_read == 0:  # closed before the end
                    conn.close()
                    conn = None
                elif len(header) == _LENGTH.size and got == len(self._target):
                    self._taken = True
                    return
        finally:
            if conn is not None:
                conn.close()

    def _check_size(self, size: int) -> None:
        if size != len(self._target):
            raise ValueError(
                f"rank {self._giver} sent {size} bytes of model state, where this "
                f"position's are {len(self._target)}"
            )
