"""A userspace wire between two hosts of a testbed, for what kernel netem cannot do.

The testbed uses it for a state netem cannot express (injectors.netem: a redrawn normal
delay, a stall), for changes scheduled at a later time, and for everything where the kernel
has no sch_netem. A TAP device in each of the two hosts' namespaces and one process between
them that forwards every frame, per direction, as that direction's `WireState` says: after a
delay (fixed, with uniform jitter drawn per burst of frames, or a normal value redrawn every
U[lo, hi] ms of the wire's clock), at a capped rate, held once for a stall (by a message's
first frame: `carries_message`), lost at random (`loss_pct`), or not at all (down). Frames
of one direction keep their order. Host routes (/32) send the pair's traffic for that plane
through the wire instead of the bridge; every other pair is untouched.

The testbed sends ("state", at, forward, backward): the directions' states from monotonic
time `at` on, answered "ok"; `at` 0 is an iteration boundary: at once, and every change
still pending from an earlier iteration is dropped. A state change keeps the frames already
queued.

A wire process ignores SIGINT: a Ctrl-C reaches every process of the terminal's group, and
the CLI answers it in one line and stops its wires (a wire ends on "stop" or when its pipe
closes); it is started with SIGINT blocked, so that one during its start waits until it is
ignored (multiprocessing's resource tracker starts the same way).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import heapq
import math
import multiprocessing
import os
import random
import select
import signal
import struct
import time
from collections.abc import Iterator
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from typing import Any

from pipeline.errors import AdaptraBenchError

__all__ = [
    "GLOO_CONTROL_BYTES",
    "HEALTHY",
    "WireError",
    "WireProcess",
    "WireState",
    "carries_message",
    "run_wire",
]

_TUNSETIFF = 0x400454CA
_IFF_TAP, _IFF_NO_PI = 0x0002, 0x1000
_MAX_FRAME = 65536
BURST_GAP_S = 0.001
"""Frames read closer than this after the one before are one burst (one jitter draw)."""


@dataclasses.dataclass(frozen=True, slots=True)
class WireState:
    """What one direction of a wire does to the frames it reads."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    """Uniform in [-jitter, +jitter] around `delay_ms` (clipped at 0), drawn per burst: a
    frame read within `BURST_GAP_S` of the one before shares its draw, so a message's frames
    (sent back to back) meet one draw, as the fault model gives a message one (drawn per
    frame, in-order frames would make a message wait the largest of its frames' draws)."""
    normal_ms: tuple[float, float] | None = None
    """(mean, std) of a delay added on top, redrawn every U[`redraw_every_ms`] ms."""
    redraw_every_ms: tuple[float, float] = (0.0, 0.0)
    rate_bit_s: float | None = None
    """A cap: frames leave no faster than this (one rate for every sender on the direction)."""
    stall_ms: float = 0.0
    """The first frame of a message (`carries_message`) read under this state holds the
    direction this long (once)."""
    down: bool = False
    seed: str = ""
    """Seeds the jitter, the losses and the redraws."""
    loss_pct: float = 0.0
    """The chance, in %, that a frame is lost (drawn per frame; 100: as down)."""

    def __post_init__(self) -> None:
        rate_ok = self.rate_bit_s is None or (
            math.isfinite(self.rate_bit_s) and self.rate_bit_s > 0
        )
        times_ok = self.delay_ms >= 0 and self.jitter_ms >= 0 and self.stall_ms >= 0
        if not (times_ok and rate_ok and 0.0 <= self.loss_pct <= 100.0):
            raise ValueError(
                "a wire takes delays, jitter and stalls >= 0, a loss of 0 to 100 % and a "
                f"rate > 0: {self}"
            )


HEALTHY = WireState()


@dataclasses.dataclass(slots=True)
class _Direction:
    """One direction's state and what it has done under it."""

    state: WireState = HEALTHY
    rng: random.Random = dataclasses.field(default_factory=random.Random)
    stalled: bool = False
    free_at: float = 0.0
    """When the capped direction has sent its last frame."""
    last_due: float = 0.0
    redraw_at: float = math.inf
    redrawn_ms: float = 0.0
    last_read: float = -math.inf
    """When it read its last frame (a burst's frames share a jitter draw)."""
    jitter_draw: float = 0.0

    def take(self, state: WireState, now: float, *, new_iteration: bool = True) -> None:
        """From `now` on, `state`; inside an iteration (not `new_iteration`) a stall already
        paid stays paid while the stall stays the same."""
        paid = self.stalled and not new_iteration and state.stall_ms == self.state.stall_ms
        self.state, self.rng, self.stalled = state, random.Random(state.seed), paid
        self.redraw_at, self.redrawn_ms = (now, 0.0) if state.normal_ms else (math.inf, 0.0)
        self.last_read = -math.inf

    def due(self, now: float, num_bytes: int, message: bool = True) -> float | None:
        """When a frame read `now` leaves; None: it is lost. A frame that is no message's
        (`message` False, `carries_message`: ARP, a bare ACK, a gloo "receive ready") pays no
        stall: the first message's first frame does."""
        state = self.state
        if state.down:
            return None
        burst, self.last_read = now - self.last_read <= BURST_GAP_S, now
        if state.loss_pct and self.rng.random() * 100.0 < state.loss_pct:
            return None  # lost before anything else: it pays no stall and takes no rate
        start = now
        if state.stall_ms and not self.stalled and message:
            self.stalled = True
            start = now + state.stall_ms / 1000.0
        delay_ms = state.delay_ms
        if state.jitter_ms:
            if not burst:
                self.jitter_draw = self.rng.uniform(-1.0, 1.0)
            delay_ms = max(0.0, delay_ms + state.jitter_ms * self.jitter_draw)
        if state.normal_ms is not None:
            while self.redraw_at <= now:
                lo, hi = state.redraw_every_ms
                self.redraw_at += max(self.rng.uniform(lo, hi), 1e-3) / 1000.0
                self.redrawn_ms = max(0.0, self.rng.gauss(*state.normal_ms))
            delay_ms += self.redrawn_ms
        if state.rate_bit_s is not None:
            self.free_at = max(self.free_at, start) + num_bytes * 8 / state.rate_bit_s
            start = self.free_at
        self.last_due = max(start + delay_ms / 1000.0, self.last_due)
        return self.last_due


GLOO_CONTROL_BYTES = 48
"""The size of one of gloo's control messages on its TCP pairs: an op's preamble alone (six
8-byte fields: the op's bytes, opcode, slot, offset, length, remote offset). A posted receive
sends the sender a "receive ready" (opcode 3), a send with none yet a "send ready" (opcode
2); a message is a preamble plus at least one byte of data (opcode 1, "unbound buffer"), so
more than this. Captured on this testbed's wire (torch 2.13's gloo, 4 KiB messages): every
notice a 48-byte segment, every message's first segment 48 + 4096 bytes."""
_GLOO_NOTICES = (2, 3)  # the opcodes of the control messages above


def carries_message(frame: bytes) -> bool:
    """Whether an Ethernet frame carries (part of) a message: a UDP packet, or a TCP segment
    with more than `GLOO_CONTROL_BYTES` of data that is not a run of gloo's control messages
    (TCP may put several in one segment, e.g. when it retransmits). Not ARP, a bare TCP ACK
    or SYN, a gloo "receive ready" or "send ready", or anything else. These are what a stall
    holds: the fault model's per-message effect, while a receive posted at an iteration's
    start sends its notice to the sender before any message. (A delegate's 48-byte header,
    adaptra.transport.delegate.HEADER, goes alone too: its payload is the message's.)"""
    if len(frame) < 34 or frame[12:14] != b"\x08\x00":
        return False
    header_bytes = (frame[14] & 0x0F) * 4
    total_bytes = int.from_bytes(frame[16:18], "big")
    protocol, transport = frame[23], 14 + header_bytes
    if protocol == 17:  # UDP
        return True
    if protocol != 6 or len(frame) < transport + 13:
        return False
    payload = frame[transport + (frame[transport + 12] >> 4) * 4 : 14 + total_bytes]
    return len(payload) > GLOO_CONTROL_BYTES and not _gloo_notices(payload)


def _gloo_notices(payload: bytes) -> bool:
    """Whether `payload` is whole gloo control messages only (`GLOO_CONTROL_BYTES` each: a
    preamble that counts its own 48 bytes, with a notice's opcode)."""
    if len(payload) % GLOO_CONTROL_BYTES:
        return False
    for start in range(0, len(payload), GLOO_CONTROL_BYTES):
        nbytes, opcode = struct.unpack_from("<QQ", payload, start)
        if nbytes != GLOO_CONTROL_BYTES or opcode not in _GLOO_NOTICES:
            return False
    return True


def _open_tap(namespace: str, ifname: str) -> int:
    from pyroute2 import netns

    netns.setns(namespace, flags=0)  # never made anew: it may be gone (a teardown)
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", ifname.encode(), _IFF_TAP | _IFF_NO_PI))
    return fd


def run_wire(ns_a: str, ns_b: str, ifname: str, conn: Connection) -> None:
    """Process entry: open both taps, report ready, then forward frames until told to stop
    (any word but a state, or EOF). SIGINT: ignored (see the module)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # one pending since the start is dropped
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    fds = (_open_tap(ns_a, ifname), _open_tap(ns_b, ifname))
    conn.send("ready")
    directions = {fds[0]: _Direction(), fds[1]: _Direction()}  # by the fd frames come from
    changes: list[tuple[float, int, WireState, WireState]] = []  # (at, seq, a->b, b->a)
    queue: list[tuple[float, int, int, bytes]] = []  # (due, seq, destination fd, frame)
    seq = 0
    while True:
        next_at = min(queue[0][0] if queue else math.inf, changes[0][0] if changes else math.inf)
        timeout = 0.5 if next_at == math.inf else max(0.0, next_at - time.monotonic())
        watched: list[Any] = [*fds, conn]
        readable, _, _ = select.select(watched, [], [], timeout)
        if conn in readable:
            try:
                word = conn.recv()
            except EOFError:
                return
            if not (isinstance(word, tuple) and word[0] == "state"):
                return
            _, at, forward, backward = word
            if not at:  # an iteration boundary: what an earlier iteration timed is void
                changes.clear()
                directions[fds[0]].take(forward, time.monotonic())
                directions[fds[1]].take(backward, time.monotonic())
            else:
                seq += 1
                heapq.heappush(changes, (at, seq, forward, backward))
            conn.send("ok")
        now = time.monotonic()
        while changes and changes[0][0] <= now:
            _, _, forward, backward = heapq.heappop(changes)
            directions[fds[0]].take(forward, now, new_iteration=False)
            directions[fds[1]].take(backward, now, new_iteration=False)
        for fd in (f for f in fds if f in readable):
            frame = os.read(fd, _MAX_FRAME)
            due = directions[fd].due(now, len(frame), carries_message(frame))
            if due is not None:
                seq += 1
                heapq.heappush(queue, (due, seq, fds[1] if fd == fds[0] else fds[0], frame))
        while queue and queue[0][0] <= time.monotonic():
            _, _, destination, frame = heapq.heappop(queue)
            with contextlib.suppress(OSError):  # the other side is down: lost, as on a wire
                os.write(destination, frame)


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread within (one that arrives is handled after, not lost);
    a process started within inherits the block through its exec."""
    # A spawn starts multiprocessing's resource tracker first if it is not running, and
    # that start unblocks SIGINT as it ends: started here, before the block, it keeps it.
    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class WireError(AdaptraBenchError, RuntimeError):
    """A wire process that is gone, silent, or answers what it should not."""


class WireProcess:
    """The testbed's handle on one wire process (`run_wire`) between two namespaces: what it
    is told and answers, named in every error as `what`."""

    def __init__(self, ns_a: str, ns_b: str, ifname: str, what: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=run_wire, args=(ns_a, ns_b, ifname, child), daemon=True
        )
        self._child: Connection | None = child
        self.what = what

    def start(self) -> None:
        with _sigint_blocked():  # the wire is born with it blocked, until it ignores it
            self.process.start()
        assert self._child is not None
        self._child.close()  # the wire's end: held by the wire alone, so its exit is an EOF
        self._child = None

    def tell(self, word: object, answer: str, wait_s: float) -> None:
        """Send `word` (None: nothing) and await `answer`; WireError if the wire is gone,
        silent or answers otherwise."""
        try:
            if word is not None:
                self.conn.send(word)
            if not self.conn.poll(wait_s):
                raise WireError(f"{self.what} did not answer in {wait_s:g} s")
            got = self.conn.recv()
        except (EOFError, OSError) as err:  # it has ended (or never started)
            raise WireError(f"{self.what} is gone: {type(err).__name__}: {err}") from err
        if got != answer:
            raise WireError(f"{self.what} answered {got!r}, not {answer!r}")

    def kill(self) -> None:
        """End it now (a wire that failed)."""
        self.conn.close()
        if self.process.pid is not None:
            self.process.kill()
            self.process.join(2.0)

    def stop(self) -> None:
        """Ask it to end; kill it if it does not within 2 s."""
        with contextlib.suppress(OSError):
            self.conn.send("stop")
        if self.process.pid is None:  # never started
            return
        self.process.join(2.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(2.0)
