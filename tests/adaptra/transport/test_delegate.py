"""A receiver delegate process (adaptra/transport/delegate.py) driven by hand: the test plays
its trainer (the job pipe, the slot file) and its sender delegate (the TCP side)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from adaptra.transport.delegate import (
    ARRIVED,
    BY_LINK_STATE,
    FAILOVER,
    FAREWELL,
    GOODBYE,
    HEADER,
    HELLO,
    NOTE,
    NOTICE_HELLO,
    PATH_BYTES,
    PORT,
    READY,
    RESUME,
    point_job,
)
from adaptra.transport.delegated import (
    DELEGATE_FILE,
    _Inbound,
    _Outbound,
    _Process,
    _read_note,
    _SlotFile,
)
from pipeline.errors import ConfigError
from pipeline.runtime.transport import ACTIVATION, LinkDirection, Message
from tests.adaptra.transport.one_host import entered, ip_batch, one_host_namespace

SLOT_BYTES, NUM_SLOTS = 8, 2


def _start_receiver() -> tuple[_Process, int]:
    """A receiver delegate listening on 127.0.0.1, and its port."""
    process = _Process("recv", 0, LinkDirection("0-1", "forward"), 1, ["127.0.0.1", "", ""])
    try:
        kind, *_, port, _, _, _, _ = _read_note(process, time.monotonic() + 30)
        assert kind == PORT
    except BaseException:
        process.close()
        raise
    return process, port


@pytest.fixture
def receiver() -> Iterator[tuple[_Process, socket.socket, _SlotFile]]:
    """A receiver delegate on loopback, connected to the test as its sender, and a slot file
    of the test's, its trainer's (not yet handed to it: `_SlotFile.ensure` it first)."""
    folder = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    slots = _SlotFile("test", folder)
    process, port = _start_receiver()
    sender = None
    try:
        sender = socket.create_connection(("127.0.0.1", port), timeout=30)
        sender.sendall(HEADER.pack(-1, 0, -1, HELLO, 1, 0, 0))
        assert RESUME.unpack(sender.recv(RESUME.size, socket.MSG_WAITALL)) == (-1,)
        assert _read_note(process, time.monotonic() + 30)[0] == READY
        yield process, sender, slots
    finally:
        os.kill(process.process.pid, signal.SIGCONT)
        if sender is not None:
            sender.close()
        process.close()
        slots.close()
        os.rmdir(folder)


def _arrival(process: _Process) -> tuple[int, int, int, int, int, int]:
    """(kind, iteration, microbatch, seq, offset, bytes) of its next note."""
    kind, iteration, microbatch, seq, offset, nbytes, *_ = _read_note(
        process, time.monotonic() + 30
    )
    return kind, iteration, microbatch, seq, offset, nbytes


def _slot(slots: _SlotFile, offset: int, nbytes: int) -> bytes:
    return bytes(slots.tensor(offset, torch.empty(nbytes, dtype=torch.uint8)).tolist())


def _wait_state(pid: int, state: str) -> None:
    """Until process `pid` is in `state` (/proc's: "T" stopped, "S" asleep in a wait)."""
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != state:
        assert time.monotonic() < deadline, f"process {pid} never reached state {state}"
        time.sleep(0.01)


def _wait_stopped(pid: int) -> None:
    """Until the process is stopped (a signal's delivery is not immediate)."""
    _wait_state(pid, "T")


def _wait_delivered(sender: socket.socket) -> None:
    """Until every byte `sender` sent is acknowledged by its peer (nothing left in its send
    queue, SIOCOUTQ): on loopback the peer's kernel then holds them, and has woken whatever
    waits to read them (a selector then has the socket's event ready)."""
    deadline = time.monotonic() + 30
    outq = termios.TIOCOUTQ  # SIOCOUTQ for a socket: bytes not yet acknowledged
    while struct.unpack("i", fcntl.ioctl(sender.fileno(), outq, b"\0" * 4))[0] > 0:
        assert time.monotonic() < deadline, "the receiver's kernel never took the message"
        time.sleep(0.01)


def _noted(fd: int) -> bool:
    """Whether anything waits in the notify pipe `fd` (read end)."""
    return bool(select.select([fd], [], [], 0)[0])


def test_a_message_whose_map_comes_in_the_same_batch_of_events_is_received(
    receiver: tuple[_Process, socket.socket, _SlotFile],
) -> None:
    """The message's header comes first (the receiver then reads its map from the job pipe,
    which it needs to place the bytes), and the map job with it, so one wait of the receiver
    returns both: the pipe's event, stale by then, must not make it read the empty pipe (it
    blocked there for good, and the message was never reported: a CI hang of Fig. 18)."""
    process, sender, slots = receiver
    slots.ensure(NUM_SLOTS, SLOT_BYTES)
    payload = bytes(range(10, 10 + SLOT_BYTES))
    seq = 1
    os.kill(process.process.pid, signal.SIGSTOP)  # both events come while it is stopped
    try:
        _wait_stopped(process.process.pid)
        header = HEADER.pack(0, 3, seq, SLOT_BYTES, 0, SLOT_BYTES, NUM_SLOTS * SLOT_BYTES)
        sender.sendall(header + payload)
        _wait_delivered(sender)  # the message first in the receiver's ready events,
        process.write(slots.map_job())  # then the map job
    finally:
        os.kill(process.process.pid, signal.SIGCONT)
    assert _arrival(process) == (ARRIVED, 0, 3, seq, seq * SLOT_BYTES, SLOT_BYTES)
    assert _slot(slots, seq * SLOT_BYTES, SLOT_BYTES) == payload


def test_a_message_long_before_its_map_is_read_on_and_lands_in_its_slot(
    receiver: tuple[_Process, socket.socket, _SlotFile],
) -> None:
    """A message larger than the socket buffers of both ends, whose map comes only after
    all of it was sent: the receiver reads it on (had it waited for the map, the sender's
    `sendall` could not end, and a delegate's would break by TCP's user timeout: a
    failover with no fault), then puts it into its slot once the map is in."""
    process, sender, slots = receiver
    num_bytes = 32 << 20
    slots.ensure(1, num_bytes)
    payload = torch.randint(
        0, 256, (num_bytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )
    sender.sendall(HEADER.pack(4, 0, 0, num_bytes, 0, num_bytes, num_bytes))
    sender.sendall(payload.numpy().tobytes())  # the socket's 30 s timeout: no reader, no end
    process.write(slots.map_job())
    assert _arrival(process) == (ARRIVED, 4, 0, 0, 0, num_bytes)
    assert torch.equal(slots.tensor(0, payload), payload)


def _repoint(process: _Process, epoch: int) -> None:
    """Point receiver `process` at pair `epoch` (as its trainer does at a swap)."""
    process.write(point_job(epoch))


def _hello(port: int, number: int, epoch: int) -> tuple[socket.socket, bytes]:
    """A sender's connection to the receiver on `port`, its hello of `number` in pair
    `epoch` said, and what came back (its resume point; b"" where it was turned away)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(HEADER.pack(-1, 0, -1, HELLO, number, 0, epoch))
    try:
        return sock, sock.recv(RESUME.size, socket.MSG_WAITALL)
    except ConnectionResetError:
        return sock, b""


def test_a_receiver_whose_sender_said_goodbye_takes_the_next_pair_s_not_an_older_one(
    receiver: tuple[_Process, socket.socket, _SlotFile],
) -> None:
    """A rank swap: the sender leaves the pair (goodbye, then its close). The receiver notes
    no failure: it closes its side and waits for its next sender. A hello of the old pair
    (its next connection number too: a sender that moved before it heard of the swap) is
    answered with farewell (that sender then waits too); the trainer's re-point to pair 1, then
    that pair's hello: answered with a fresh resume point (-1: the numbers start over), READY
    noted (nothing before it), and a message of the new pair is in."""
    process, sender, slots = receiver
    port = sender.getpeername()[1]
    sender.sendall(HEADER.pack(-1, 0, -1, GOODBYE, 0, 0, 0))
    assert sender.recv(1) == b""  # it closed its side: the goodbye was read
    sender.close()
    old, answer = _hello(port, 2, 0)
    old.close()
    assert RESUME.unpack(answer) == (FAREWELL,)
    _repoint(process, 1)
    new, answer = _hello(port, 1, 1)
    try:
        assert RESUME.unpack(answer) == (-1,)
        assert _read_note(process, time.monotonic() + 30)[0] == READY
        slots.ensure(NUM_SLOTS, SLOT_BYTES)
        process.write(slots.map_job())
        payload = bytes(range(SLOT_BYTES))
        new.sendall(HEADER.pack(5, 0, 1, SLOT_BYTES, 0, SLOT_BYTES, NUM_SLOTS * SLOT_BYTES))
        new.sendall(payload)
        assert _arrival(process) == (ARRIVED, 5, 0, 1, SLOT_BYTES, SLOT_BYTES)
        assert _slot(slots, SLOT_BYTES, SLOT_BYTES) == payload
    finally:
        new.close()


def test_a_newer_pair_s_hello_retires_the_old_connection_with_a_farewell(
    receiver: tuple[_Process, socket.socket, _SlotFile],
) -> None:
    """At a rank swap the receiver's new sender may call before its old one has left, and
    before its own trainer's re-point: the receiver takes the newer pair and says farewell
    on the old connection (its sender parks there, rather than take the change for a failed
    NIC); the old sender's goodbye, then its close, come to nothing. The re-point then finds
    its pair in: READY at once."""
    process, old, _ = receiver
    port = old.getpeername()[1]
    new, answer = _hello(port, 1, 1)
    try:
        assert RESUME.unpack(answer) == (-1,)
        assert RESUME.unpack(old.recv(RESUME.size, socket.MSG_WAITALL)) == (FAREWELL,)
        assert old.recv(1) == b""
        old.sendall(HEADER.pack(-1, 0, -1, GOODBYE, 0, 0, 0))
        old.close()
        assert not _noted(process.notify)
        _repoint(process, 1)
        assert _read_note(process, time.monotonic() + 30)[0] == READY
    finally:
        new.close()


def _sockets(pid: int) -> int:
    """How many sockets process `pid` has open (an fd closed while they are counted, such
    as its slot file's while it maps it, is none)."""
    fds, count = Path(f"/proc/{pid}/fd"), 0
    for fd in os.listdir(fds):
        with contextlib.suppress(FileNotFoundError):
            count += os.readlink(fds / fd).startswith("socket:")
    return count


def test_a_connection_slow_to_say_hello_holds_up_none_of_the_others(
    receiver: tuple[_Process, socket.socket, _SlotFile],
) -> None:
    """A second connection (its sender delegate's next, after a failover) says the first
    part of its hello and stops. The receiver has accepted it (one more socket), and reads
    on its first connection meanwhile: a message there is reported, and the newcomer, its
    hello ended, is answered with that message's number (the receiver waited up to 5 s for
    the rest of the hello, serving nothing, then dropped the newcomer)."""
    process, sender, slots = receiver
    slots.ensure(NUM_SLOTS, SLOT_BYTES)
    process.write(slots.map_job())
    pid = process.process.pid
    before = _sockets(pid)
    hello = HEADER.pack(-1, 0, -1, HELLO, 2, 0, 0)
    with socket.create_connection(sender.getpeername(), timeout=30) as newcomer:
        newcomer.sendall(hello[:10])
        deadline = time.monotonic() + 30
        while _sockets(pid) == before:  # accepted: its hello's first part is being read
            assert time.monotonic() < deadline, "the receiver did not accept the connection"
            time.sleep(0.01)
        payload = bytes(range(40, 40 + SLOT_BYTES))
        header = HEADER.pack(2, 5, 0, SLOT_BYTES, 0, SLOT_BYTES, NUM_SLOTS * SLOT_BYTES)
        sender.sendall(header + payload)
        assert _arrival(process) == (ARRIVED, 2, 5, 0, 0, SLOT_BYTES)
        assert _slot(slots, 0, SLOT_BYTES) == payload
        newcomer.sendall(hello[10:])
        assert RESUME.unpack(newcomer.recv(RESUME.size, socket.MSG_WAITALL)) == (0,)
        payload = bytes(range(80, 80 + SLOT_BYTES))
        header = HEADER.pack(2, 6, 1, SLOT_BYTES, 1, SLOT_BYTES, NUM_SLOTS * SLOT_BYTES)
        newcomer.sendall(header + payload)  # the newcomer carries on where the first left
        assert _arrival(process) == (ARRIVED, 2, 6, 1, SLOT_BYTES, SLOT_BYTES)
        assert _slot(slots, SLOT_BYTES, SLOT_BYTES) == payload


def _sender(port: int, peers: tuple[str, ...], sources: str) -> _Process:
    """A sender delegate from `sources` (this host's address per NIC, comma-separated),
    pointed at the receiver on `port` at `peers` (its address per NIC), as pair 0."""
    direction = LinkDirection("0-1", "forward")
    process = _Process("send", 0, direction, 1, ["2000", sources, ","])
    try:
        process.point(point_job(0, port, peers), direction, 1, peers)
    except BaseException:
        process.close()
        raise
    return process


def test_a_sender_reports_the_nic_it_connected_over() -> None:
    """A sender delegate whose receiver does not listen on NIC 0's address (refused) starts
    over NIC 1 and says so in its READY note: its trainer must not believe it on NIC 0 (a
    later fault of NIC 0 would then be no failover of it)."""
    receiver, port = _start_receiver()
    sender = None
    try:
        deadline = time.monotonic() + 30
        # NIC 0's address has no listener
        sender = _sender(port, ("127.0.0.2", "127.0.0.1"), "127.0.0.1,127.0.0.1")
        kind, *_, nic, _, _, _ = _read_note(sender, deadline)
        assert (kind, nic) == (READY, 1)
        assert _read_note(receiver, deadline)[0] == READY
    finally:
        for process in (sender, receiver):
            if process is not None:
                process.close()


@pytest.mark.parametrize(
    ("peers", "sources", "error", "reason", "cause"),
    [
        # this host's NIC addresses given as addresses it does not have (a misconfiguration)
        (
            "127.0.0.1,127.0.0.2",
            "10.9.9.9,10.9.9.8",
            ConnectionError,
            "no data-plane NIC reaches its receiver delegate (NIC 0, from 10.9.9.9 to "
            "127.0.0.1: [Errno 99] Cannot assign requested address; NIC 1, from 10.9.9.8 to "
            "127.0.0.2: [Errno 99] Cannot assign requested address)",
            errno.EADDRNOTAVAIL,
        ),
        # nothing listens on the receiver's port: its delegate is gone
        (
            "127.0.0.1,127.0.0.2",
            "127.0.0.1,127.0.0.2",
            ConnectionRefusedError,
            "every NIC refused it: its receiver delegate is gone (NIC 0, from 127.0.0.1 to "
            "127.0.0.1: [Errno 111] Connection refused; NIC 1, from 127.0.0.2 to 127.0.0.2: "
            "[Errno 111] Connection refused)",
            errno.ECONNREFUSED,
        ),
    ],
)
def test_a_sender_that_cannot_connect_tells_its_trainer_why(
    peers: str, sources: str, error: type[OSError], reason: str, cause: int
) -> None:
    """A sender delegate that no NIC connects to its receiver ends (exit status 0) having
    noted why, and its trainer raises the delegate's error type with that reason, from the
    first NIC's error (it ended silently, and its trainer said it "has died (exit status
    0)", with no cause)."""
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]  # free once closed: refused there
    sender = _sender(port, tuple(peers.split(",")), sources)
    try:
        with pytest.raises(error) as failed:
            _read_note(sender, time.monotonic() + 30)
        assert str(failed.value) == (
            f"the sender delegate 0 (pid {sender.process.pid}) of link 0-1 (forward) has "
            f"ended: {reason}"
        )
        assert isinstance(failed.value.__cause__, OSError)
        assert failed.value.__cause__.errno == cause
        assert sender.process.wait(30) == 0
    finally:
        sender.close()


@pytest.mark.parametrize("receiver_then", ["ended", "answered"])
def test_a_nic_whose_connection_closes_before_its_answer_is_tried_once_more(
    receiver_then: str,
) -> None:
    """NIC 1 is refused; over NIC 0 the receiver's host takes the connection and closes it
    before answering: a receiver ending, whose listeners close a moment after its data
    connection. The sender tries NIC 0 again: refused now, it ends as its receiver gone
    (it said "no data-plane NIC reaches its receiver delegate", blaming the links); a
    receiver still there that answers this time is connected to."""
    with socket.create_server(("127.0.0.1", 0), backlog=1) as listener:
        port = listener.getsockname()[1]  # only on 127.0.0.1: NIC 1's peer refuses
        sender = _sender(port, ("127.0.0.1", "127.0.0.2"), "127.0.0.1,127.0.0.1")
        try:
            listener.settimeout(30)
            if receiver_then == "ended":
                assert select.select([listener], [], [], 30)[0]  # NIC 0's, taken
                listener.close()  # resets it: not answered
                with pytest.raises(ConnectionRefusedError) as failed:
                    _read_note(sender, time.monotonic() + 30)
                assert "every NIC refused it: its receiver delegate is gone (NIC 0" in str(
                    failed.value
                ), failed.value
                assert sender.process.wait(30) == 0
            else:
                listener.accept()[0].close()  # turned away before its answer
                again, _ = listener.accept()
                with again:
                    again.settimeout(30)
                    hello = HEADER.unpack(again.recv(HEADER.size, socket.MSG_WAITALL))
                    assert hello[1] == 0 and hello[3] == HELLO  # over NIC 0
                    again.sendall(RESUME.pack(-1))
                    kind, *_, nic, _, _, _ = _read_note(sender, time.monotonic() + 30)
                    assert (kind, nic) == (READY, 0)
        finally:
            sender.close()


def test_a_delegate_that_ends_without_a_note_has_ended_and_a_killed_one_died() -> None:
    """A delegate gone without saying why is named with how it ended: "ended" for exit
    status 0 (its job pipe closed), "died" with the signal that killed it (both read "has
    died (exit status N)")."""
    ended, _ = _start_receiver()
    killed, _ = _start_receiver()
    try:
        ended.end_jobs()
        with pytest.raises(ConnectionError) as failed:
            _read_note(ended, time.monotonic() + 30)
        name = f"receiver delegate 0 (pid {ended.process.pid}) of link 0-1 (forward)"
        assert str(failed.value) == f"the {name} has ended (exit status 0) without saying why"
        os.kill(killed.process.pid, signal.SIGKILL)
        killed.process.wait(30)
        with pytest.raises(ConnectionError) as failed:
            killed.check_alive()
        name = f"receiver delegate 0 (pid {killed.process.pid}) of link 0-1 (forward)"
        assert str(failed.value) == f"the {name} has died (killed by SIGKILL)"
    finally:
        ended.close()
        killed.close()


_STOPS_AT_ITS_SELECTOR = """import os, runpy, selectors, signal, sys
real = selectors.DefaultSelector
def stopped():
    os.kill(os.getpid(), signal.SIGSTOP)
    return real()
selectors.DefaultSelector = stopped
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
"""Runs the delegate file named first, with the arguments after it, stopped as it makes its
selector (its waits' set-up)."""


def test_a_sender_notes_ready_only_once_set_up_to_wait() -> None:
    """READY tells the trainer that a delegate is done starting: idle until a job comes (a
    worker reports the pool ready then). A sender that stops as it makes its selector (it
    once noted READY first and set up after, while the pool's first iteration ran), its
    point job waiting in its pipe, has connected to nothing and noted nothing; once it goes
    on, it connects, then notes READY."""
    receiver, port = _start_receiver()
    control_r, control = os.pipe()
    notify, notify_w = os.pipe()
    command = [sys.executable, "-S", "-c", _STOPS_AT_ITS_SELECTOR, str(DELEGATE_FILE), "send"]
    command += [str(os.getpid()), str(control_r), str(notify_w), "2000", "127.0.0.1", ""]
    sender = subprocess.Popen(command, pass_fds=(control_r, notify_w), close_fds=True)
    os.close(control_r)
    os.close(notify_w)
    try:
        deadline = time.monotonic() + 30
        os.write(control, point_job(0, port, ("127.0.0.1",)))
        _wait_stopped(sender.pid)
        assert not _noted(notify) and not _noted(receiver.notify)
        os.kill(sender.pid, signal.SIGCONT)
        assert _read_note(receiver, deadline)[0] == READY  # connected: the sender's hello in
        assert select.select([notify], [], [], 30)[0]
        kind, *_, nic, _, _, pid = NOTE.unpack(os.read(notify, NOTE.size))
        assert (kind, nic, pid) == (READY, 0, sender.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(sender.pid, signal.SIGCONT)
        os.close(control)  # its end of the run: it ends
        sender.wait(30)
        os.close(notify)
        receiver.close()


def test_a_receiver_with_notices_notes_ready_once_its_notice_connection_is_in_too() -> None:
    """A receiver whose sender also connects for its notices (the testbed's management
    plane) is not done starting with the data connection alone: the notice connection's
    accept and hello come next. It notes READY only once both are in (it noted READY
    before the notice connection came)."""
    process = _Process(
        "recv", 0, LinkDirection("0-1", "forward"), 1, ["127.0.0.1", "127.0.0.2", ""]
    )
    try:
        deadline = time.monotonic() + 30
        kind, *_, port, _, _, _, _ = _read_note(process, deadline)
        assert kind == PORT
        with socket.create_connection(("127.0.0.1", port), timeout=30) as data:
            data.sendall(HEADER.pack(-1, 0, -1, HELLO, 1, 0, 0))
            assert RESUME.unpack(data.recv(RESUME.size, socket.MSG_WAITALL)) == (-1,)
            # Its answer sent, it waits again (asleep) with nothing noted: not ready yet.
            _wait_state(process.process.pid, "S")
            assert not _noted(process.notify)
            with socket.create_connection(("127.0.0.2", port), timeout=30) as notices:
                notices.sendall(HEADER.pack(-1, 0, -1, NOTICE_HELLO, 0, 0, 0))
                assert _read_note(process, deadline)[0] == READY
    finally:
        process.close()


def test_a_slot_file_path_longer_than_a_job_holds_is_refused_and_removed() -> None:
    """A job carries the slot file's path in PATH_BYTES: a longer one would reach the
    delegate cut short (TMPDIR deep in a tree, and no /dev/shm)."""
    short = Path(tempfile.mkdtemp(prefix="s"))  # /tmp/sXXXXXXXX: room for a slot file
    try:
        deep = short / ("d" * PATH_BYTES)
        deep.mkdir()
        slots = _SlotFile("0-1-forward-out", str(deep))
        with pytest.raises(ConfigError, match=f"at most {PATH_BYTES} bytes\\): set TMPDIR"):
            slots.ensure(4, 1024)
        assert list(deep.iterdir()) == [] and slots.path == ""
        fits = _SlotFile("0-1-forward-out", str(short))
        assert fits.ensure(4, 1024) and len(fits.path.encode()) <= PATH_BYTES
        fits.close()
    finally:
        shutil.rmtree(short)


@contextlib.contextmanager
def _two_nic_direction(
    num_delegates: int,
    nics: str = "127.0.0.1,127.0.0.2",
    ifnames: str = ",",
    far_nics_down: tuple[int, ...] = (),
) -> Iterator[tuple[_Inbound, _Outbound]]:
    """One link direction's receiver and sender delegates, `num_delegates` a side, each
    sender on NIC 0 of two (`nics`: their addresses, both sides on one host; by default
    loopback's 127.0.0.1 and .2; `ifnames`: their interfaces, watched by the senders),
    ready; `far_nics_down`: NICs the receivers' offer says are down at their host (both
    sides are on one here: only the offer says so), the senders then on NIC 1."""
    direction = LinkDirection("0-1", "forward")
    folder = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    sides: list[_Inbound | _Outbound] = []
    try:
        inbound = _Inbound(direction, 0, num_delegates, [nics, "", ifnames], folder)
        sides.append(inbound)
        outbound = _Outbound(direction, 1, num_delegates, ["2000", nics, ifnames], folder)
        sides.append(outbound)
        offer = inbound.offer(30, tuple(ifnames.split(",")))
        if far_nics_down:
            offer = offer._replace(nics_down=far_nics_down)
        outbound.point(direction, 1, offer, tuple(nics.split(",")), "", 0)
        deadline = time.monotonic() + 30
        for process in inbound.delegates:
            assert _read_note(process, deadline)[0] == READY
        first_up = 1 if far_nics_down == (0,) else 0
        for process in outbound.delegates:
            kind, *_, nic, _, _, _ = _read_note(process, deadline)
            assert (kind, nic) == (READY, first_up)  # connected over that NIC
        outbound.nic_of = [first_up] * num_delegates  # (as `_wait_ready` takes the notes)
        yield inbound, outbound
    finally:
        for side in sides:
            side.close()
        shutil.rmtree(folder)


def test_a_receiver_whose_sender_died_is_found_gone_naming_the_sender() -> None:
    """A sender delegate killed between iterations: its receiver notes that it lost its
    sender and ends. Its trainer's next job to it (the next iteration's map) meets a closed
    pipe: the error names the killed sender's pid, from the receiver's note (it said "the
    receiver delegate ... is gone (its pipe is closed)", blaming the receiver)."""
    with _two_nic_direction(2) as (inbound, outbound):
        victim = outbound.delegates[0].process.pid
        os.kill(victim, signal.SIGKILL)
        receiver = inbound.delegates[0]
        assert receiver.process.wait(30) == 0  # it ended, having noted why
        with pytest.raises(ConnectionError) as failed:
            inbound.begin(2, 8)
        assert str(failed.value) == (
            f"the receiver delegate 0 (pid {receiver.process.pid}) of link 0-1 (forward) lost "
            f"its sender delegate (pid {victim}, rank 0's side): its connection closed"
        )
        assert isinstance(failed.value.__cause__, BrokenPipeError)


def test_siblings_moved_by_their_trainer_are_failovers_of_the_same_iteration() -> None:
    """Two sender delegates. The fault hook has the route down for seq 1 only: its delegate
    moves to NIC 1 by the hook; at the iteration's end the trainer moves the other (a
    sibling) and waits for it, so both moves are the iteration's failovers (the sibling's
    came only with the next iteration's, and never after a run's last)."""
    with _two_nic_direction(2) as (inbound, outbound):
        for side in (inbound, outbound):
            side.begin(2, 8)
        for seq in (0, 1):
            payload = torch.full((8,), seq, dtype=torch.uint8)
            message = Message(0, ACTIVATION, seq, seq)
            outbound.send(message, payload, fault_ms=0.0, nic=1 if seq == 1 else 0)
        records = outbound.finish(0, 30)
        assert sorted(r.microbatch for r in records) == [0, 1]
        moves = {(f.cause, f.nic_from, f.nic_to, f.iteration) for f in outbound.failovers}
        assert moves == {("fault hook", 0, 1, 0), ("sibling", 0, 1, 0)}
        assert outbound.nic_of == [1, 1]


def test_a_move_is_the_iteration_s_its_trainer_learns_of_it_in() -> None:
    """Three sender delegates; iteration 0 carries seqs 0-2, iteration 1 seqs 0-1 with the
    route down for seq 1. Delegate 2 carried nothing in iteration 1, and its trainer moves
    it then: every move is iteration 1's, the records that hold it (it was iteration 0's,
    the last its delegate had carried)."""
    with _two_nic_direction(3) as (inbound, outbound):
        for iteration, num_messages in ((0, 3), (1, 2)):
            for side in (inbound, outbound):
                side.begin(num_messages, 8)
            for seq in range(num_messages):
                payload = torch.full((8,), seq, dtype=torch.uint8)
                message = Message(iteration, ACTIVATION, seq, seq)
                down = (iteration, seq) == (1, 1)
                outbound.send(message, payload, fault_ms=0.0, nic=1 if down else None)
            records = outbound.finish(iteration, 30)
            assert sorted(r.microbatch for r in records) == list(range(num_messages))
            for seq in range(num_messages):  # the receiver's side takes them in
                buffer = torch.empty(8, dtype=torch.uint8)
                inbound.take(Message(iteration, ACTIVATION, seq, seq), buffer, 30)
                assert buffer.tolist() == [seq] * 8
        moves = sorted((f.cause, f.nic_from, f.nic_to, f.iteration) for f in outbound.failovers)
        assert moves == [("fault hook", 0, 1, 1), ("sibling", 0, 1, 1), ("sibling", 0, 1, 1)]
        assert outbound.nic_of == [1, 1, 1]


def test_a_sender_starts_on_the_first_nic_up_at_its_receiver_s_host_too() -> None:
    """Its receiver's offer says NIC 0 is down at the receiver's host, its own host's is up:
    the senders connect over NIC 1 at once (`_two_nic_direction` reads their READY notes),
    and messages go over it with no failover. They started on NIC 0, the first up at their
    own host only: on the testbed its connect to a host whose rnic0 had failed waited the
    connect timeout, and a rank swap next to that host took 5 s."""
    with _two_nic_direction(2, far_nics_down=(0,)) as (inbound, outbound):
        for side in (inbound, outbound):
            side.begin(2, 8)
        for seq in (0, 1):
            payload = torch.full((8,), seq, dtype=torch.uint8)
            outbound.send(Message(0, ACTIVATION, seq, seq), payload, fault_ms=0.0, nic=None)
        assert sorted(r.microbatch for r in outbound.finish(0, 30)) == [0, 1]
        for seq in (0, 1):
            buffer = torch.empty(8, dtype=torch.uint8)
            inbound.take(Message(0, ACTIVATION, seq, seq), buffer, 30)
            assert buffer.tolist() == [seq] * 8
        assert outbound.failovers == [] and outbound.nic_of == [1, 1]


def test_a_delegate_goes_over_the_nic_the_fault_hook_names_back_to_the_first_too() -> None:
    """One sender delegate, told by the fault hook: NIC 1 (rnic0's route down), NIC 1 again,
    then NIC 0 (rnic1's route down, rnic0's repaired): it moves there and back, every
    message arrives whole, and None leaves it where it is."""
    with _two_nic_direction(1) as (inbound, outbound):
        for iteration, nic in enumerate((1, 1, 0, None)):
            for side in (inbound, outbound):
                side.begin(1, 8)
            payload = torch.full((8,), iteration, dtype=torch.uint8)
            outbound.send(Message(iteration, ACTIVATION, 0, 0), payload, fault_ms=0.0, nic=nic)
            assert [r.microbatch for r in outbound.finish(iteration, 30)] == [0]
            buffer = torch.empty(8, dtype=torch.uint8)
            inbound.take(Message(iteration, ACTIVATION, 0, 0), buffer, 30)
            assert buffer.tolist() == [iteration] * 8
        moves = [(f.cause, f.nic_from, f.nic_to, f.iteration) for f in outbound.failovers]
        assert moves == [("fault hook", 0, 1, 0), ("fault hook", 1, 0, 2)]
        assert outbound.nic_of == [0]


def test_a_sibling_moved_by_its_trainer_takes_the_nic_the_last_move_took() -> None:
    """Two sender delegates, told by the fault hook per message: both to NIC 1, both back to
    NIC 0, then only the second to NIC 1 (the route failed after the first message). The
    first, a sibling then, is moved by its trainer to NIC 1 as well: it had left both NICs
    once, and took NIC 0 again, off the route."""
    with _two_nic_direction(2) as (inbound, outbound):
        for iteration, nics in enumerate(((1, 1), (0, 0), (0, 1))):
            for side in (inbound, outbound):
                side.begin(2, 8)
            for seq, nic in enumerate(nics):
                payload = torch.full((8,), seq, dtype=torch.uint8)
                outbound.send(Message(iteration, ACTIVATION, seq, seq), payload, 0.0, nic)
            assert sorted(r.microbatch for r in outbound.finish(iteration, 30)) == [0, 1]
            for seq in (0, 1):
                buffer = torch.empty(8, dtype=torch.uint8)
                inbound.take(Message(iteration, ACTIVATION, seq, seq), buffer, 30)
                assert buffer.tolist() == [seq] * 8
        moves = {(f.cause, f.nic_from, f.nic_to) for f in outbound.failovers if f.iteration == 2}
        assert moves == {("fault hook", 0, 1), ("sibling", 0, 1)}
        assert outbound.nic_of == [1, 1]


def _netlink_drops(pid: int) -> int:
    """How many events the kernel dropped for process `pid`'s netlink socket (its only one,
    bound to the port of its pid)."""
    header, *rows = Path(f"/proc/{pid}/net/netlink").read_text().splitlines()
    for row in rows:
        fields = dict(zip(header.split(), row.split(), strict=True))
        if int(fields["Pid"]) == pid:
            return int(fields["Drops"])
    raise AssertionError(f"process {pid} has no netlink socket")


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root"
)
def test_a_sender_whose_link_events_overflowed_reads_its_nics_state_afresh() -> None:
    """While a sender delegate is stopped, 600 changes of a link that is not its NIC
    overflow its netlink socket, and then its NIC goes down: the kernel drops events (that
    one too), and the socket's read, once those kept are read, is ENOBUFS. The delegate
    reads its NICs' state afresh, moves to NIC 1 by link state, and carries on (it died of
    the OSError, and its link direction with it)."""
    with (
        one_host_namespace() as namespace,
        entered(namespace),
        _two_nic_direction(1, "10.77.0.1,10.77.1.1", "nic0,nic1") as (inbound, outbound),
    ):
        sender = outbound.delegates[0]
        os.kill(sender.process.pid, signal.SIGSTOP)
        try:
            _wait_stopped(sender.process.pid)
            flaps = [f"link set flap {state}" for _ in range(300) for state in ("down", "up")]
            ip_batch(namespace, [*flaps, "link set nic0 down"])
            assert _netlink_drops(sender.process.pid) > 0  # its next read: ENOBUFS
        finally:
            os.kill(sender.process.pid, signal.SIGCONT)
        kind, _, cause, first_seq, left, took, *_ = _read_note(sender, time.monotonic() + 30)
        assert (kind, cause, first_seq, left, took) == (FAILOVER, BY_LINK_STATE, -1, 0, 1)
        for side in (inbound, outbound):
            side.begin(1, 8)
        payload = torch.full((8,), 7, dtype=torch.uint8)
        outbound.send(Message(0, ACTIVATION, 0, 0), payload, fault_ms=0.0, nic=None)
        assert [r.microbatch for r in outbound.finish(0, 30)] == [0]
        buffer = torch.empty(8, dtype=torch.uint8)
        inbound.take(Message(0, ACTIVATION, 0, 0), buffer, 30)
        assert buffer.tolist() == [7] * 8


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root"
)
def test_a_receiver_side_offers_its_ports_with_its_host_s_nics_down() -> None:
    """What goes to the senders of a link direction: its receiver delegates' ports, and the
    NICs of their host down now by link state (nic0 here), which the senders start on the
    first NIC up at both hosts by."""
    folder = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        with one_host_namespace() as namespace, entered(namespace):
            ip_batch(namespace, ["link set nic0 down"])
            direction = LinkDirection("0-1", "forward")
            listen = ["10.77.0.1,10.77.1.1", "", "nic0,nic1"]
            inbound = _Inbound(direction, 0, 2, listen, folder)
            try:
                offer = inbound.offer(30, ("nic0", "nic1"))
            finally:
                inbound.close()
    finally:
        shutil.rmtree(folder)
    assert offer.nics_down == (0,) and len(offer.ports) == 2 and all(offer.ports)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_slot_file_a_full_tmpfs_cannot_hold_is_refused_not_a_bus_error_later() -> None:
    """A slot file was sized, not allocated: writing a slot a full tmpfs could not back was
    a SIGBUS that killed its trainer. Its pages are taken when it is made, or it is refused."""
    folder = Path(tempfile.mkdtemp(prefix="s"))  # /tmp/sXXXXXXXX: room for a slot file
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", folder], check=True)
    except BaseException:
        folder.rmdir()
        raise
    slots = _SlotFile("0-1-forward-out", str(folder))
    try:
        with pytest.raises(ConfigError, match="no room for the delegates' 4194304-byte slot"):
            slots.ensure(4, 1 << 20)
        assert list(folder.iterdir()) == [] and slots.path == ""
        assert slots.ensure(2, 256 << 10)  # 512 KiB fits, whole
        assert os.stat(slots.path).st_blocks * 512 >= 512 << 10
    finally:
        slots.close()
        subprocess.run(["umount", folder], check=True)
        folder.rmdir()


def test_a_delegate_s_late_map_of_a_replaced_slot_file_is_skipped(tmp_path: Path) -> None:
    """A delegate that carried nothing reads a map after its trainer replaced the file (the
    trainer waits only for the delegates that had messages): skipped, the file it has stays
    mapped, and the next map, of the new file, is taken (the delegate died with a
    FileNotFoundError)."""
    from adaptra.transport.delegate import _SlotFile as DelegateSlotFile

    first, second = tmp_path / "a", tmp_path / "b"
    first.write_bytes(b"x" * 4096)
    second.write_bytes(b"y" * 8192)
    slots = DelegateSlotFile()
    slots.map(str(first), 4096, 1024)
    slots.map(str(tmp_path / "replaced"), 2048, 512)  # gone: superseded
    assert (slots.path, len(slots.view), bytes(slots.view[:1])) == (str(first), 4096, b"x")
    slots.map(str(second), 8192, 2048)
    assert (slots.path, len(slots.view), slots.slot_bytes) == (str(second), 8192, 2048)
    assert bytes(slots.view[:1]) == b"y"
    slots.view.release()


def test_a_delegate_imports_nothing_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `selectors.py` where the trainer runs, and PYTHONPATH with an empty entry (the
    working directory): a delegate still starts (`python -S -c` puts the working directory
    first on the path, before the standard library: it took that file's module, and every
    delegate died at its start)."""
    (tmp_path / "selectors.py").write_text("raise ImportError('the working directory')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", ":" + os.environ.get("PYTHONPATH", ""))
    process, port = _start_receiver()  # its PORT note
    process.close()
    assert port > 0
