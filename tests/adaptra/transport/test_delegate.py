"""A receiver delegate process (adaptra/transport/delegate.py) driven by hand: the test plays
its trainer (the job pipe, the slot file) and its sender delegate (the TCP side)."""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from adaptra.transport.delegate import ARRIVED, HEADER, HELLO, PORT, READY, RESUME
from adaptra.transport.delegated import _Process, _read_note, _SlotFile
from pipeline.runtime.transport import LinkDirection

SLOT_BYTES, NUM_SLOTS = 8, 2


@pytest.fixture
def receiver() -> Iterator[tuple[_Process, socket.socket, _SlotFile]]:
    """A receiver delegate on loopback, connected to the test as its sender, and its
    trainer's slot file (not yet handed to it)."""
    folder = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    slots = _SlotFile("test", folder)
    process = _Process("recv", 0, LinkDirection("0-1", "forward"), ["127.0.0.1", "", ""])
    sender = None
    try:
        deadline = time.monotonic() + 30
        kind, *_, port, _, _, _, _ = _read_note(process, deadline)
        assert kind == PORT
        sender = socket.create_connection(("127.0.0.1", port), timeout=30)
        sender.sendall(HEADER.pack(-1, 0, -1, HELLO, 1, 0, 0))
        assert RESUME.unpack(sender.recv(RESUME.size, socket.MSG_WAITALL)) == (-1,)
        assert _read_note(process, deadline)[0] == READY
        slots.ensure(NUM_SLOTS, SLOT_BYTES)
        yield process, sender, slots
    finally:
        os.kill(process.process.pid, signal.SIGCONT)
        if sender is not None:
            sender.close()
        process.close()
        slots.close()
        os.rmdir(folder)


def _wait_stopped(pid: int) -> None:
    """Until the process is stopped (a signal's delivery is not immediate)."""
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, "the receiver delegate did not stop"
        time.sleep(0.01)


def test_a_message_whose_map_comes_in_the_same_batch_of_events_is_received(
    receiver: tuple[_Process, socket.socket, _SlotFile],
) -> None:
    """The message's header comes first (the receiver then reads its map from the job pipe,
    which it needs to place the bytes), and the map job with it, so one wait of the receiver
    returns both: the pipe's event, stale by then, must not make it read the empty pipe (it
    blocked there for good, and the message was never reported: a CI hang of Fig. 18)."""
    process, sender, slots = receiver
    payload = bytes(range(10, 10 + SLOT_BYTES))
    seq = 1
    os.kill(process.process.pid, signal.SIGSTOP)  # both events come while it is stopped
    try:
        _wait_stopped(process.process.pid)
        header = HEADER.pack(0, 3, seq, SLOT_BYTES, 0, SLOT_BYTES, NUM_SLOTS * SLOT_BYTES)
        sender.sendall(header + payload)
        time.sleep(0.1)  # the message first in the receiver's ready events, then the map job
        process.write(slots.map_job())
    finally:
        os.kill(process.process.pid, signal.SIGCONT)
    kind, iteration, microbatch, got_seq, offset, nbytes, *_ = _read_note(
        process, time.monotonic() + 30
    )
    assert (kind, iteration, microbatch, got_seq) == (ARRIVED, 0, 3, seq)
    assert (offset, nbytes) == (seq * SLOT_BYTES, SLOT_BYTES)
    like = torch.empty(SLOT_BYTES, dtype=torch.uint8)
    assert bytes(slots.tensor(offset, like).tolist()) == payload
