"""A delegate: the light process that carries messages of one link direction for a trainer
(the paper's CPU delegates, docs/paper.md). It imports nothing but the standard library (no
torch: about 10 MB each) and is started by path (`python delegate.py ...`), so no package is
imported either. It blocks on its pipe and its socket (select, recv, sendall: never a spin),
and dies with the trainer that started it (PR_SET_PDEATHSIG).

- A sender delegate reads jobs from the trainer's pipe: "map" (the trainer's slot file) or
  "message" (a slot's offset and size, and the delay the fault model puts on its wire). For a
  message it waits the delay (the slow link delays the delegate, not the trainer), sends a
  header and the slot's bytes to its receiver delegate over TCP, and acks the message on its
  notify pipe with when it picked it up and when the wire took its last byte.
- A receiver delegate listens, reports its port on its notify pipe, accepts its sender
  delegate (both then report that they are ready), and receives each message straight into
  the receiving trainer's slot file (the slot of its sequence number), then reports it with
  when its last byte came in. "map" jobs on its pipe say which slot file and slot size the
  coming messages use.

Records on the pipes are fixed-size structs (below), each written whole (under PIPE_BUF).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import selectors
import signal
import socket
import struct
import sys
import time
from typing import Protocol

JOB = struct.Struct("<iqiiqqd96s")
"""kind, iteration, microbatch, seq, offset (map: slot bytes), nbytes (map: file bytes),
fault_ms, slot file path (map)."""
HEADER = struct.Struct("<qiiq")
"""On the wire, before a message's bytes: iteration, microbatch, seq, nbytes."""
NOTE = struct.Struct("<iqiiqqddi")
"""kind, iteration, microbatch, seq, offset or port, nbytes, time 1, time 2, pid."""

MAP, MESSAGE = 1, 2
PORT, READY, SENT, ARRIVED, FAILED = 1, 2, 3, 4, 5

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the prctl
        os._exit(1)


def _read_exactly(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


class _SlotFile:
    """The trainer's slot file, mapped; remapped when the trainer names another."""

    def __init__(self) -> None:
        self.path, self.view, self.slot_bytes = "", memoryview(b""), 0
        self._map: mmap.mmap | None = None

    def map(self, path: str, size: int, slot_bytes: int) -> None:
        if path != self.path or size != len(self.view):
            self.view.release()
            if self._map is not None:
                self._map.close()
            fd = os.open(path, os.O_RDWR)
            try:
                self._map = mmap.mmap(fd, size)
            finally:
                os.close(fd)
            self.path, self.view = path, memoryview(self._map)
        self.slot_bytes = slot_bytes


def _note(fd: int, *fields: object) -> None:
    os.write(fd, NOTE.pack(*fields))


class Wire(Protocol):
    """What carries messages from a sender delegate to its receiver delegate: the
    implementation here is TCP (`TcpWire`); an RDMA one (pyverbs) would fit the same four
    calls, and none is written: no RDMA device exists where this runs (`adaptra-bench
    doctor`)."""

    def fileno(self) -> int:
        """What a select waits on for the next message."""
        ...

    def send(self, header: bytes, payload: memoryview) -> None: ...

    def receive(self, size: int) -> bytes:
        """The next `size` bytes; fewer only if the other side has gone."""
        ...

    def receive_into(self, target: memoryview) -> bool:
        """Fill `target`; False if the other side went first."""
        ...


class TcpWire:
    """A TCP connection (no Nagle: a header must not wait for its payload)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock

    @classmethod
    def connect(cls, host: str, port: int) -> TcpWire:
        return cls(socket.create_connection((host, port)))

    @classmethod
    def accept(cls, listener: socket.socket) -> TcpWire:
        sock, _ = listener.accept()
        listener.close()
        return cls(sock)

    def fileno(self) -> int:
        return self._sock.fileno()

    def send(self, header: bytes, payload: memoryview) -> None:
        self._sock.sendall(header)
        self._sock.sendall(payload)

    def receive(self, size: int) -> bytes:
        return self._sock.recv(size, socket.MSG_WAITALL)

    def receive_into(self, target: memoryview) -> bool:
        got = 0
        while got < len(target):
            with target[got:] as rest:
                count = self._sock.recv_into(rest)
            if count == 0:
                return False
            got += count
        return True


def run_sender(control: int, notify: int, host: str, port: int) -> None:
    slots = _SlotFile()
    wire: Wire = TcpWire.connect(host, port)
    pid = os.getpid()
    _note(notify, READY, 0, 0, 0, port, 0, 0.0, 0.0, pid)
    while True:
        try:
            kind, iteration, microbatch, seq, offset, nbytes, fault_ms, path = JOB.unpack(
                _read_exactly(control, JOB.size)
            )
        except EOFError:  # the trainer closed its end: the run is over
            return
        if kind == MAP:
            slots.map(path.rstrip(b"\0").decode(), nbytes, offset)
            continue
        picked_s = time.monotonic()
        if fault_ms > 0:
            time.sleep(fault_ms / 1000.0)
        with slots.view[offset : offset + nbytes] as payload:  # released: remappable
            wire.send(HEADER.pack(iteration, microbatch, seq, nbytes), payload)
        _note(
            notify,
            SENT,
            iteration,
            microbatch,
            seq,
            offset,
            nbytes,
            picked_s,
            time.monotonic(),
            pid,
        )


def run_receiver(control: int, notify: int, host: str) -> None:
    slots = _SlotFile()
    listener = socket.create_server((host, 0))
    pid = os.getpid()
    _note(notify, PORT, 0, 0, 0, listener.getsockname()[1], 0, 0.0, 0.0, pid)
    wire: Wire = TcpWire.accept(listener)
    _note(notify, READY, 0, 0, 0, 0, 0, 0.0, 0.0, pid)
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    selector.register(wire.fileno(), selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj == control:
                try:
                    _, _, _, _, slot_bytes, size, _, path = JOB.unpack(
                        _read_exactly(control, JOB.size)
                    )
                except EOFError:
                    return
                slots.map(path.rstrip(b"\0").decode(), size, slot_bytes)
                continue
            header = wire.receive(HEADER.size)
            if len(header) < HEADER.size:  # the sender delegate is gone
                if header or not _control_closed(control):
                    _note(notify, FAILED, 0, 0, 0, 0, 0, 0.0, 0.0, pid)
                return
            iteration, microbatch, seq, nbytes = HEADER.unpack(header)
            while slots.slot_bytes < nbytes:  # its slot file is on the way: wait for it
                _, _, _, _, slot_bytes, size, _, path = JOB.unpack(_read_exactly(control, JOB.size))
                slots.map(path.rstrip(b"\0").decode(), size, slot_bytes)
            offset = (seq * slots.slot_bytes) % max(len(slots.view), 1)
            with slots.view[offset : offset + nbytes] as target:  # released: remappable
                whole = wire.receive_into(target)
            if not whole:
                _note(notify, FAILED, iteration, microbatch, seq, 0, 0, 0.0, 0.0, pid)
                return
            arrived_s = time.monotonic()
            _note(notify, ARRIVED, iteration, microbatch, seq, offset, nbytes, arrived_s, 0.0, pid)


def _control_closed(control: int) -> bool:
    """Whether the trainer closed this delegate's pipe too (the run ended: not a failure)."""
    import select

    readable, _, _ = select.select([control], [], [], 0.2)
    return bool(readable) and not os.read(control, 1)


def main(argv: list[str]) -> None:
    role, parent, control, notify = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer's Ctrl-C is the trainer's
    try:
        if role == "send":
            run_sender(control, notify, argv[4], int(argv[5]))
        else:
            run_receiver(control, notify, argv[4])
    except (BrokenPipeError, ConnectionError):
        pass  # the other side is gone; whoever waits on this delegate hears it from its peer
    finally:
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
