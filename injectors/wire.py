"""A userspace wire between two hosts of a testbed, for what kernel netem cannot do.

The testbed uses it for a state netem cannot express (injectors.netem: a redrawn normal
delay, a stall), for changes scheduled at a later time, and for everything where the kernel
has no sch_netem. A TAP device in each of the two hosts' namespaces and one process between
them that forwards every frame, per direction, as that direction's `WireState` says: after a
delay (fixed, with uniform jitter drawn per message, or a normal value redrawn every
U[lo, hi] ms of the wire's clock), at a capped rate, held once for a stall (by a message's
first frame: `frame_kind`), lost at random (`loss_pct`), or not at all (down). Frames
of one direction keep their order. Host routes (/32) send the pair's traffic for that plane
through the wire instead of the bridge; every other pair is untouched.

The testbed sends ("state", at, forward, backward): the directions' states from monotonic
time `at` on, answered "ok"; `at` 0 is an iteration boundary: at once, and every change
still pending from an earlier iteration is dropped. A state change keeps the frames already
queued. It sends ("cap", forward, backward) for its bandwidth caps on the pair
(`Testbed.cap_bandwidth`: the pair's traffic takes the wire, not the NIC's htb classes), in
bit/s or None, answered "ok": a direction's frames leave no faster than the lower of its cap
and its state's rate, whatever states follow.

A wire process ignores SIGINT: a Ctrl-C reaches every process of the terminal's group, and
the CLI answers it in one line and stops its wires (a wire ends on "stop" or when its pipe
closes); it is started with SIGINT blocked, so that one during its start waits until it is
ignored (multiprocessing's resource tracker starts the same way).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
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
from multiprocessing.connection import Connection
from typing import Any

from pipeline.errors import AdaptraBenchError
from pipeline.signals import sigint_blocked

__all__ = [
    "GLOO_CONTROL_BYTES",
    "HEALTHY",
    "FrameKind",
    "FrameReader",
    "WireError",
    "WireProcess",
    "WireState",
    "frame_kind",
    "run_wire",
]

_TUNSETIFF = 0x400454CA
_IFF_TAP, _IFF_NO_PI = 0x0002, 0x1000
_MAX_FRAME = 65536
BURST_GAP_S = 0.001
"""A message's frames read closer than this after the one before are one burst (one jitter
draw)."""


GLOO_CONTROL_BYTES = 48
"""The size of one of gloo's control messages on its TCP pairs: an op's preamble alone (six
8-byte fields: the op's bytes, opcode, slot, offset, length, remote offset). A posted receive
sends the sender a "receive ready" (opcode 3), a send a "send ready" (opcode 2) just before
its data; a message is a preamble plus at least one byte of data (opcode 1, "unbound
buffer"), so more than this. Captured on this testbed's wire (torch 2.13's gloo, 4 KiB
messages): every notice a 48-byte segment (a few coalesced into one now and then), each
message's "send ready" 0.2-0.4 ms before its segment of 48 + 4096 bytes."""
_UNBOUND_BUFFER, _SEND_READY, _RECEIVE_READY = 1, 2, 3  # gloo's opcodes (a message, notices)


class FrameKind(enum.Enum):
    """What a frame is to the fault model's per-message effects (`frame_kind`)."""

    OTHER = "other"
    """No message's: ARP, a bare TCP ACK or SYN, gloo's "receive ready" notices (sent as a
    receive is posted: a worker posts an iteration's receives at its start, before any
    message). It pays no stall and draws no jitter: it takes the direction's current draw."""
    ANNOUNCE = "announce"
    """A short segment (`GLOO_CONTROL_BYTES` of data or fewer, outside a message) that a
    message follows: gloo's "send ready", a delegate's 48-byte header
    (adaptra.transport.delegate.HEADER, sent alone before its payload). It draws the jitter
    that its message's frames then share (else the message would wait behind its
    announcement's older draw); it pays no stall."""
    MESSAGE = "message"
    """A message's data: a TCP segment inside the bytes its header owes (whatever its size:
    `FrameReader`), where no header is known more than `GLOO_CONTROL_BYTES` of TCP data that
    is not a run of gloo notices (TCP may coalesce a few), or a UDP packet. The first one
    under a stall pays it;
    one that starts a burst and was not announced draws jitter."""


@dataclasses.dataclass(frozen=True, slots=True)
class WireState:
    """What one direction of a wire does to the frames it reads."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    """Uniform in [-jitter, +jitter] around `delay_ms` (clipped at 0), drawn per message: by
    its announcement (gloo's "send ready"), else by its first frame, and shared by its
    frames read within `BURST_GAP_S` of one another (sent back to back), as the fault model
    gives a message one draw (drawn per frame, in-order frames would make a message wait the
    largest of its frames' draws). Frames of no message (ACKs, gloo's "receive ready") take
    the current draw (`FrameKind`). A message still waits for any frame ahead of it: where
    messages follow closer than the jitter's range (2 x `jitter_ms`), each waits the largest
    draw of those ahead, and the wire's delays lie above the fault model's."""
    normal_ms: tuple[float, float] | None = None
    """(mean, std) of a delay added on top, redrawn every U[`redraw_every_ms`] ms."""
    redraw_every_ms: tuple[float, float] = (0.0, 0.0)
    rate_bit_s: float | None = None
    """A cap: frames leave no faster than this (one rate for every sender on the direction)."""
    stall_ms: float = 0.0
    """The first frame of a message (`FrameKind.MESSAGE`) read under this state holds the
    direction this long (once)."""
    stall_since_ms: float = 0.0
    """When in the iteration the stall began (ms): a later state of the iteration with the
    same stall keeps it paid, one whose stall began later (another stall row, of any value)
    is a new stall (`_Direction.take`)."""
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
    cap_bit_s: float | None = None
    """The testbed's bandwidth cap on the direction, under every state (see the module)."""
    rng: random.Random = dataclasses.field(default_factory=random.Random)
    stalled: bool = False
    free_at: float = 0.0
    """When the capped direction has sent its last frame."""
    last_due: float = 0.0
    redraw_at: float = math.inf
    redrawn_ms: float = 0.0
    last_read: float = -math.inf
    """When it read its last frame of a message (a burst's frames share a jitter draw)."""
    jitter_draw: float = 0.0
    """The current draw, in [-1, 1] (0 until a frame draws one under the state)."""
    announced: bool = False
    """An announcement drew the next message's draw (`FrameKind.ANNOUNCE`)."""

    def take(self, state: WireState, now: float, *, new_iteration: bool = True) -> None:
        """From `now` on, `state`; inside an iteration (not `new_iteration`) a stall already
        paid stays paid while the stall stays the same (its value and its start)."""
        same = (state.stall_ms, state.stall_since_ms) == (
            self.state.stall_ms,
            self.state.stall_since_ms,
        )
        paid = self.stalled and not new_iteration and same
        self.state, self.rng, self.stalled = state, random.Random(state.seed), paid
        self.redraw_at, self.redrawn_ms = (now, 0.0) if state.normal_ms else (math.inf, 0.0)
        self.last_read, self.jitter_draw, self.announced = -math.inf, 0.0, False

    def due(self, now: float, num_bytes: int, kind: FrameKind = FrameKind.MESSAGE) -> float | None:
        """When a frame of `kind` read `now` leaves; None: it is lost. Only a message's first
        frame pays a stall; jitter is drawn by an announcement, or by a message's frame that
        starts a burst unannounced, and every other frame takes the current draw (see
        `FrameKind`)."""
        state = self.state
        if state.down:
            return None
        message = kind is FrameKind.MESSAGE
        burst = message and now - self.last_read <= BURST_GAP_S
        if message:
            self.last_read = now
        if state.loss_pct and self.rng.random() * 100.0 < state.loss_pct:
            return None  # lost before anything else: it pays no stall and takes no rate
        start = now
        if state.stall_ms and not self.stalled and message:
            self.stalled = True
            start = now + state.stall_ms / 1000.0
        delay_ms = state.delay_ms
        draws = kind is FrameKind.ANNOUNCE or (message and not burst and not self.announced)
        self.announced = kind is FrameKind.ANNOUNCE or (self.announced and not message)
        if state.jitter_ms:
            if draws:
                self.jitter_draw = self.rng.uniform(-1.0, 1.0)
            delay_ms = max(0.0, delay_ms + state.jitter_ms * self.jitter_draw)
        if state.normal_ms is not None:
            while self.redraw_at <= now:
                lo, hi = state.redraw_every_ms
                self.redraw_at += max(self.rng.uniform(lo, hi), 1e-3) / 1000.0
                self.redrawn_ms = max(0.0, self.rng.gauss(*state.normal_ms))
            delay_ms += self.redrawn_ms
        rate_bit_s = state.rate_bit_s
        if self.cap_bit_s is not None:
            rate_bit_s = min(self.cap_bit_s, rate_bit_s or math.inf)
        if rate_bit_s is not None:
            self.free_at = max(self.free_at, start) + num_bytes * 8 / rate_bit_s
            start = self.free_at
        self.last_due = max(start + delay_ms / 1000.0, self.last_due)
        return self.last_due


def frame_kind(frame: bytes) -> FrameKind:
    """What an Ethernet frame is (`FrameKind`), read alone: a segment is classified by what
    it starts with (`FrameReader` also knows where it lies in its stream)."""
    return FrameReader().kind(frame)


_DELEGATE_HEADER = struct.Struct("<qiiqqqq")
"""adaptra.transport.delegate.HEADER (iteration, microbatch, seq, nbytes, ...), written out
here: a delegate is started by path and imports no package, and injectors sit beside adaptra,
not above it (tests/injectors/test_wire.py holds the two equal)."""


class FrameReader:
    """Classifies one direction's frames (`FrameKind`) by their place in their TCP stream:
    per flow (addresses and ports) the data bytes still owed by the last header read (a gloo
    op's preamble, which counts its own 48 bytes; a delegate's `_DELEGATE_HEADER`, which
    counts its payload's). A segment inside a message is `FrameKind.MESSAGE` whatever its
    size (a message's last segment may be 1 byte); where no header is known (a stream
    joined mid-message, a segment that is not one of gloo's or a delegate's) it is classified
    by size: more than `GLOO_CONTROL_BYTES` of data a message's, else an announcement.
    Limits: a retransmitted segment is counted again, so a message's count may end early
    (its last segments are then classified by size) until the next header that starts a
    segment; a header is tried as gloo's first, so a delegate header whose first 16 bytes
    read as a gloo notice (iteration 48, microbatch 2 or 3, seq 0) is taken for one."""

    def __init__(self) -> None:
        self.owed: dict[bytes, int] = {}

    def kind(self, frame: bytes) -> FrameKind:
        if len(frame) < 34 or frame[12:14] != b"\x08\x00":
            return FrameKind.OTHER
        header_bytes = (frame[14] & 0x0F) * 4
        total_bytes = int.from_bytes(frame[16:18], "big")
        protocol, transport = frame[23], 14 + header_bytes
        if protocol == 17:  # UDP
            return FrameKind.MESSAGE
        if protocol != 6 or len(frame) < transport + 13:
            return FrameKind.OTHER
        payload = frame[transport + (frame[transport + 12] >> 4) * 4 : 14 + total_bytes]
        if not payload:
            return FrameKind.OTHER  # a bare ACK, SYN or FIN: no stream bytes
        flow = frame[26:34] + frame[transport : transport + 4]
        owed = self.owed.pop(flow, 0)
        if owed >= len(payload):
            if owed > len(payload):
                self.owed[flow] = owed - len(payload)
            return FrameKind.MESSAGE
        kind = self._headers(flow, payload[owed:])
        return FrameKind.MESSAGE if owed else kind

    def _headers(self, flow: bytes, data: bytes) -> FrameKind:
        """The kind of a segment's `data` that starts with a header (where known), the bytes
        its last message still owes counted for `flow`."""
        announces = message = False
        while data:
            if len(data) < GLOO_CONTROL_BYTES:
                return _by_size(data, announces, message)
            nbytes, opcode, _, _, length, _ = struct.unpack_from("<6Q", data)
            if nbytes == GLOO_CONTROL_BYTES and opcode in (_SEND_READY, _RECEIVE_READY):
                announces |= opcode == _SEND_READY  # a notice
                data = data[GLOO_CONTROL_BYTES:]
                continue
            if opcode == _UNBOUND_BUFFER and length > 0 and nbytes == GLOO_CONTROL_BYTES + length:
                whole = nbytes  # gloo's message: its preamble and its data
            else:
                iteration, microbatch, seq, payload_bytes, *_ = _DELEGATE_HEADER.unpack_from(data)
                if min(iteration, microbatch, seq) < 0 or payload_bytes <= 0:
                    return _by_size(data, announces, message)  # a hello, or no header known
                whole = _DELEGATE_HEADER.size + payload_bytes
            announces |= len(data) == GLOO_CONTROL_BYTES  # a header alone, before its data
            message |= len(data) > GLOO_CONTROL_BYTES
            if whole > len(data):
                self.owed[flow] = whole - len(data)
                break
            data = data[whole:]
        if message:
            return FrameKind.MESSAGE
        return FrameKind.ANNOUNCE if announces else FrameKind.OTHER


def _by_size(data: bytes, announces: bool, message: bool) -> FrameKind:
    """A segment's kind where its `data` starts with no header known (after the `announces`
    and `message` of what came before it in the segment)."""
    if message or len(data) > GLOO_CONTROL_BYTES:
        return FrameKind.MESSAGE
    return FrameKind.ANNOUNCE


TUN = "/dev/net/tun"
"""The TUN/TAP device every wire opens its TAPs through."""


def _open_tap(namespace: str, ifname: str) -> int:
    from pyroute2 import netns

    netns.setns(namespace, flags=0)  # never made anew: it may be gone (a teardown)
    fd = os.open(TUN, os.O_RDWR)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", ifname.encode(), _IFF_TAP | _IFF_NO_PI))
    return fd


def _start_failure(err: Exception) -> str:
    """Why a wire could not open its TAPs, in words."""
    if isinstance(err, FileNotFoundError) and err.filename == TUN:
        return (
            f"no {TUN} on this machine (the TUN/TAP device): no userspace wire can start, so "
            "no per-link fault that kernel netem does not take (see `adaptra-bench doctor`)"
        )
    return f"opening its TAPs: {type(err).__name__}: {err}"


def run_wire(ns_a: str, ns_b: str, ifname: str, conn: Connection) -> None:
    """Process entry: open both taps, report ready (or ("error", why) and end), then forward
    frames until told to stop (any word but a state or a cap, or EOF). SIGINT: ignored (see
    the module)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # one pending since the start is dropped
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        fds = (_open_tap(ns_a, ifname), _open_tap(ns_b, ifname))
    except Exception as err:  # told: not a traceback on stderr and a pipe closed on EOF
        conn.send(("error", _start_failure(err)))
        return
    conn.send("ready")
    directions = {fds[0]: _Direction(), fds[1]: _Direction()}  # by the fd frames come from
    readers = {fds[0]: FrameReader(), fds[1]: FrameReader()}  # kept through state changes
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
            if isinstance(word, tuple) and word[0] == "cap":
                _, directions[fds[0]].cap_bit_s, directions[fds[1]].cap_bit_s = word
            elif isinstance(word, tuple) and word[0] == "state":
                _, at, forward, backward = word
                if not at:  # an iteration boundary: what an earlier iteration timed is void
                    changes.clear()
                    directions[fds[0]].take(forward, time.monotonic())
                    directions[fds[1]].take(backward, time.monotonic())
                else:
                    seq += 1
                    heapq.heappush(changes, (at, seq, forward, backward))
            else:
                return
            conn.send("ok")
        now = time.monotonic()
        while changes and changes[0][0] <= now:
            _, _, forward, backward = heapq.heappop(changes)
            directions[fds[0]].take(forward, now, new_iteration=False)
            directions[fds[1]].take(backward, now, new_iteration=False)
        for fd in (f for f in fds if f in readable):
            frame = os.read(fd, _MAX_FRAME)
            due = directions[fd].due(now, len(frame), readers[fd].kind(frame))
            if due is not None:
                seq += 1
                heapq.heappush(queue, (due, seq, fds[1] if fd == fds[0] else fds[0], frame))
        while queue and queue[0][0] <= time.monotonic():
            _, _, destination, frame = heapq.heappop(queue)
            with contextlib.suppress(OSError):  # the other side is down: lost, as on a wire
                os.write(destination, frame)


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
        with sigint_blocked():  # the wire is born with it blocked, until it ignores it
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
        if isinstance(got, tuple) and len(got) == 2 and got[0] == "error":
            raise WireError(f"{self.what} could not start: {got[1]}")
        if got != answer:
            raise WireError(f"{self.what} answered {got!r}, not {answer!r}")

    def kill(self) -> None:
        """End it now (a wire that failed)."""
        self.conn.close()
        if self.process.pid is not None:
            self.process.kill()
            self.process.join(2.0)

    def stop(self, grace_s: float = 2.0) -> None:
        """Ask it to end; kill it if it does not within `grace_s` (a testbed's close: 2 s)."""
        with contextlib.suppress(OSError):
            self.conn.send("stop")
        if self.process.pid is None:  # never started
            return
        self.process.join(grace_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(2.0)
