"""A delegate: the light process that carries messages of one link direction for a trainer
(the paper's CPU delegates, docs/paper.md). It imports nothing but the standard library (no
torch: about 10 MB each) and is imported from its folder (`python -I -S -B -c` with that
folder first on the path: no package is imported, and the bytecode cache is read, where a
script is compiled afresh at every start). It blocks on its pipe and its sockets (select, recv,
sendall: never a spin), and dies with the trainer that started it (PR_SET_PDEATHSIG).

- A sender delegate starts idle, and reads jobs from the trainer's pipe: "point" (its
  receiver's addresses and port: it connects, and notes READY), "map" (the trainer's slot
  file), "message" (a slot's offset and size, the delay the fault model puts on its wire,
  and the NIC the fault model routes it over, if it has a say), "move" (which NICs another
  sender of its link direction left), or "leave" (a rank swap, below). For a message
  it waits the delay (the slow link delays the delegate, not the trainer), sends a header
  and the slot's bytes to its receiver delegate over TCP, and acks the message on its
  notify pipe with when it picked it up and when the wire took its last byte.
- A receiver delegate listens on each of its host's data-plane addresses (one port on all),
  reports the port on its notify pipe, accepts its sender delegate (and its notice
  connection, where it has one; both then report that they are ready, each once set up and
  about to wait: idle until a job or a message comes), and receives each message straight
  into the receiving trainer's slot file (the slot of its sequence number), then reports it
  with when its last byte came in. "map" jobs on its pipe say which slot file and slot size
  the coming messages use; a message that comes before the map of its file (the sizes in
  its header tell) is received into memory of its own and reported once the map is in.

Re-pointing (a rank swap, between iterations: every message of the last is in): the trainer
hands a delegate a new peer rather than start a new one. A sender pointed again says goodbye
to its receiver (GOODBYE on the wire, then a close), connects to its new receiver as at its
start (its hello carries the pair's epoch: the trainer's count of rewires, the same on every
trainer, so a newer pair's is higher) and notes READY again. A receiver pointed (a "point"
job with an epoch and no address: its sender calls it) says farewell to its sender
(FAREWELL, then a close) and notes READY once a sender of that epoch is in. A receiver whose
sender said goodbye, and a sender whose receiver said farewell, wait for their new peer
(meanwhile a sender's own NIC going down, or a notice, is no failover: its next point reads
its NICs afresh; a message ends it, saying so; one whose move meets a receiver that left
without its farewell read ends as any refused sender: its trainer, pointing it, starts
another in its place); a hello of a newer epoch also retires the
connection it replaces, and one of a pair the receiver left is answered with farewell (its
sender, moving before it heard it, waits too). "Leave": the same goodbye or farewell, then the
delegate ends (a side a rank swap closes). Only a connection closed without either is a
failure. The old and the new peer need not speak in any order: each ignores what it hears
from a retired connection (it reads that connection until it closes).

NIC failover (the paper's section 4): a host has several data-plane NICs, and a connection
runs over one pair of them (the first, until one fails). The sender notices a failure by
netlink (its own NIC's link going down: at once; its NICs' state read afresh where the kernel
dropped events), by its receiver's notice over the
management plane (the receiver's netlink: the peer's NIC), by TCP's user timeout (data
unacked for `timeout_ms`: the peer's NIC, with no notices), by the fault hook's word (a
message the fault model routes over another NIC: hook injection, no namespaces; it connects
over that one), or by its trainer's "move" (a sibling left the NIC). It then drops the
connection and connects over the next NIC it has not seen fail (never the management
plane, never waiting for the failed one; a NIC comes back when netlink or the receiver's
notice says it is up); the receiver answers the new connection's hello with the number of
the last message it got whole (its resume point) and drops the old connection with whatever
part-message it held; the sender sends again, in order, each of the iteration's messages
past that point. Messages are numbered per delegate
pair: nothing is sent twice in normal operation, and a receiver drops anything at or before
its resume point, so every message arrives once. The sender notes the failover
(when noticed, why, which NICs, the first seq sent again, when that went).

A delegate that cannot go on says why on its notify pipe before it ends: a receiver whose
sender's connection closed without a word notes FAILED (with the sender's pid, from its
hello), a sender that found no NIC left mid-run notes FAILED and waits for its trainer to end
it, and one that ends on a connection error (no NIC reaches its receiver when pointed, every
NIC refused it) notes ENDED with the reason and each NIC's error, then exits (status 0). A
NIC whose connection closed before the receiver's answer is tried once more before a sender
tells a link failure from a receiver gone (an ending receiver's listeners close a moment
after its data connection).

Records on the pipes are fixed-size structs (below), each written whole (under PIPE_BUF; a
point job's addresses follow it in the same write).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import mmap
import os
import select
import selectors
import signal
import socket
import struct
import sys
import time

PATH_BYTES = 96
"""The longest slot file path a job carries (UTF-8 bytes)."""
JOB = struct.Struct(f"<iqiiqqdi{PATH_BYTES}s")
"""kind, iteration, microbatch, seq, offset (map: slot bytes), nbytes (map: file bytes),
fault_ms, NICs (a message: the NIC the fault model routes it over, -1: the delegate's own; a
move: bit k set for NIC k, left by a sibling, whose NIC taken is in the microbatch's place),
slot file path (map)."""
HEADER = struct.Struct("<qiiqqqq")
"""On the wire, before a message's bytes: iteration, microbatch, seq, nbytes, its number on
this delegate pair (counted from 0 over the pair's life: runs on one pool restart their
iterations, not this), and the slot and file bytes of the slot file it came from (both
trainers size theirs alike per iteration: the receiver waits for its map of that size). A
hello (a sender's first words on a connection) is (-1, NIC index, -1, HELLO, the
connection's number on the pair: each newer than the last, the sender's pid, the pair's epoch),
or (-1, 0, -1, NOTICE_HELLO, 0, 0, 0) on its notice connection; a goodbye (the sender leaves
the pair, between iterations) is (-1, 0, -1, GOODBYE, 0, the sender's pid, 0)."""
NOTICE = struct.Struct("<ii")
"""On a notice connection, receiver to sender: one of the receiver's NICs, and whether it
came up (1: usable again) or went down (0: the one in use: move)."""
RESUME = struct.Struct("<q")
"""A receiver's answer to a hello: the number of the last message it got whole (-1: none);
later, and only between iterations, FAREWELL (the receiver leaves the pair)."""
FAREWELL = -2
NOTE = struct.Struct("<iqiiqqddi")
"""kind, iteration (ENDED: each NIC's error, `nic_errors`), microbatch (FAILOVER: its cause;
ENDED: its reason), seq (FAILOVER: the first seq sent again, -1 if none; ENDED: the error's
errno, `error_code`), offset or port (FAILOVER: the NIC left; a receiver's FAILED: its
sender's pid, 0 if unknown), nbytes (FAILOVER: the NIC taken; a sender's READY: the NIC it
connected over), time 1 (FAILOVER: noticed), time 2 (FAILOVER: the connection taken over,
after what it sent again), pid."""

MAP, MESSAGE, MOVE, POINT, LEAVE = 1, 2, 3, 4, 5
"""Jobs. A point's iteration is the pair's epoch; a sender's also carries its receiver's port
(in the seq's place) and, after the job, "<its addresses, comma-separated>;<its
management-plane address>;<its host's NICs down, comma-separated>" (as many bytes as the
nbytes' place says: `point_job`)."""
PORT, READY, SENT, ARRIVED, FAILED, FAILOVER, ENDED = 1, 2, 3, 4, 5, 6, 7
UNREACHED, REFUSED, BROKEN = 1, 2, 3
"""Why a delegate ended (an ENDED note): no data-plane NIC reaches its receiver; every NIC
refused it (its receiver delegate is gone); another connection error (its errno noted)."""
NO_ERRNO = 255
"""An error code for an error without an errno: a connection closed before its answer."""
MAX_NICS_NOTED = 7
"""How many NICs' errors an ENDED note holds (a byte each in one signed 64-bit field)."""
HELLO, NOTICE_HELLO, GOODBYE = -1, -2, -3
BY_LINK_STATE, BY_TIMEOUT, BY_FAULT_HOOK, BY_SIBLING, BY_NOTICE = 1, 2, 3, 4, 5
"""Why a sender failed over: netlink said its NIC went down; the connection broke or timed
out (TCP's user timeout: the peer's NIC); the fault hook has the route down; another sender
of its link direction failed over from its NIC (its trainer says so with a "move" job); its
receiver's netlink said the receiver's NIC went down (a notice over the management plane)."""

CONNECT_TIMEOUT_S = 5.0
"""How long a connect and its hello may take on a NIC before that NIC counts as failed too."""
START_REPLY_TIMEOUT_S = 60.0
"""How long a sender's first connection waits for its receiver's answer once TCP has
connected (the NIC works): at a pool's start, hundreds of delegates start at once, and a
receiver may not run for seconds on a loaded host; that is no NIC failure."""
HELLO_TIMEOUT_S = START_REPLY_TIMEOUT_S
"""How long a receiver keeps a connection whose hello has not come whole (it reads a hello as
its bytes come, never waiting on one: meanwhile it serves its other connections and its
pipe); a sender waits no longer for its answer, and a loaded host may not run it for
seconds between its connect and its hello."""
HUNG_UP_RETRY_S = 0.1
"""How long a sender waits to try again a NIC whose connection its receiver's host took and
then closed before answering (a receiver ending closes its listeners a moment after)."""

_PR_SET_PDEATHSIG = 1
TCP_USER_TIMEOUT = 18  # linux/tcp.h
_RTMGRP_LINK, _RTM_NEWLINK = 1, 16
_IFF_UP, _IFF_RUNNING = 0x1, 0x40
_NLMSG = struct.Struct("=IHHII")  # length, type, flags, seq, pid
_IFINFO = struct.Struct("=BxHiII")  # family, type, index, flags, change
_SIOCGIFFLAGS = 0x8913
_IFREQ = struct.Struct("=16sH22x")  # struct ifreq: name, flags


def error_code(err: BaseException) -> int:
    """`err`'s errno for a note: ETIMEDOUT for a timeout without one, `NO_ERRNO` for
    another error without one."""
    if isinstance(err, OSError) and err.errno and 0 < err.errno < NO_ERRNO:
        return err.errno
    return errno.ETIMEDOUT if isinstance(err, TimeoutError) else NO_ERRNO


def nic_errors(codes: dict[int, int]) -> int:
    """NIC k's error code (0: none, not tried) in byte k, for the first `MAX_NICS_NOTED`."""
    return sum(code << 8 * nic for nic, code in codes.items() if nic < MAX_NICS_NOTED)


def move_limit_s(num_nics: int) -> float:
    """The longest a sender's move to another NIC takes where its receiver lacks nothing
    (between iterations: nothing to send again): a connect, then its hello's answer, over
    each NIC in turn (`_Sender.connect`), CONNECT_TIMEOUT_S each."""
    return 2 * CONNECT_TIMEOUT_S * num_nics


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

    def offset(self, seq: int) -> int:
        """Where message `seq`'s slot starts (the trainer's `_SlotFile.offset`)."""
        return (seq * self.slot_bytes) % max(len(self.view), 1)

    def map(self, path: str, size: int, slot_bytes: int) -> None:
        """Map `path` (`size` bytes), unless it is gone: a delegate that carried nothing
        since may read its map after the trainer has replaced the file (it waits only for the
        delegates that had messages), and the map of the new file follows in its queue."""
        if path != self.path or size != len(self.view):
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                return  # superseded
            self.view.release()
            if self._map is not None:
                self._map.close()
            try:
                self._map = mmap.mmap(fd, size)
            finally:
                os.close(fd)
            self.path, self.view = path, memoryview(self._map)
        self.slot_bytes = slot_bytes

    def map_job(self, job: tuple) -> None:  # type: ignore[type-arg]
        _, _, _, _, slot_bytes, size, _, _, path = job
        self.map(path.rstrip(b"\0").decode(), size, slot_bytes)

    def unmap(self) -> None:
        """Drop the map (a new pair: its trainer's file starts over, and a message must
        wait for the map of the new one, not land in the old by its sizes)."""
        self.view.release()
        if self._map is not None:
            self._map.close()
        self.path, self.view, self.slot_bytes, self._map = "", memoryview(b""), 0, None


def point_job(
    epoch: int,
    port: int = 0,
    peers: tuple[str, ...] = (),
    notice_peer: str = "",
    peer_nics_down: tuple[int, ...] = (),
) -> bytes:
    """A point job, for pair `epoch`: a sender's names its receiver, at `peers` (one address
    per NIC) on `port`, its notices from `notice_peer` ("": none), and the NICs down at the
    receiver's host when it offered its port (by index: the sender starts on the first NIC
    up at both ends); a receiver's, nothing more. Written whole (one write, under PIPE_BUF:
    a job is never split by another)."""
    down = ",".join(str(nic) for nic in peer_nics_down)
    target = f"{','.join(peers)};{notice_peer};{down}".encode() if peers else b""
    if JOB.size + len(target) > select.PIPE_BUF:
        raise ValueError(f"a point job holds {select.PIPE_BUF - JOB.size} bytes of addresses")
    return JOB.pack(POINT, epoch, 0, port, 0, len(target), 0.0, 0, b"") + target


def _target(job: tuple, control: int) -> tuple[int, list[str], str, set[int]]:  # type: ignore[type-arg]
    """(port, addresses per NIC, management-plane address, NICs down at the receiver's host)
    of a sender's point job, its addresses read from the job pipe `control`."""
    peers, notice_peer, down = _read_exactly(control, job[5]).decode().split(";")
    return job[3], peers.split(","), notice_peer, {int(nic) for nic in down.split(",") if nic}


def _note(fd: int, *fields: object) -> None:
    os.write(fd, NOTE.pack(*fields))


class TcpWire:
    """What carries messages between a sender delegate and its receiver delegate: a TCP
    connection (no Nagle: a header must not wait for its payload). The one implementation:
    no RDMA device exists where this runs (`adaptra-bench doctor`)."""

    def __init__(self, sock: socket.socket, timeout_ms: int = 0) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if timeout_ms:  # data unacked this long breaks the connection (ETIMEDOUT)
            sock.setsockopt(socket.IPPROTO_TCP, TCP_USER_TIMEOUT, timeout_ms)
        self._sock = sock

    @classmethod
    def connect(cls, source: str, host: str, port: int, timeout_ms: int) -> TcpWire:
        """From the NIC with address `source` to `host`:`port`."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.settimeout(CONNECT_TIMEOUT_S)
            sock.bind((source, 0))
            sock.connect((host, port))
        except BaseException:
            sock.close()
            raise
        return cls(sock, timeout_ms)

    def fileno(self) -> int:
        return self._sock.fileno()

    def send(self, header: bytes, payload: memoryview) -> None:
        self._sock.sendall(header)
        self._sock.sendall(payload)

    def receive_exactly(self, size: int) -> bytes:
        """`size` bytes (the socket's timeout applies to each read); ConnectionError if it
        closes first."""
        data = b""
        while len(data) < size:
            chunk = self._sock.recv(size - len(data))
            if not chunk:
                raise ConnectionError("the connection closed")
            data += chunk
        return data

    def receive_into(self, target: memoryview) -> int:
        """Some of `target`'s bytes (at least one); 0 if the other side closed; OSError if
        the connection broke."""
        return self._sock.recv_into(target)

    def peek(self) -> bytes:
        """A byte that is in, left there; b"" if closed; BlockingIOError if none is."""
        return self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)

    def blocking(self, timeout_s: float | None) -> None:
        self._sock.settimeout(timeout_s)

    def finish(self) -> None:
        """Send nothing more (what is queued goes, then the end): the other side reads on
        to the end, and closes."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """Close it (what is queued goes, then the end)."""
        self._sock.close()

    def abandon(self) -> None:
        """Drop the connection at once (a reset: nothing queued is sent)."""
        with contextlib.suppress(OSError):
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self._sock.close()


def nic_running(index: int) -> bool:
    """Whether interface `index` is up and running now (one gone is not)."""
    try:
        name = socket.if_indextoname(index)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            answer = fcntl.ioctl(sock, _SIOCGIFFLAGS, _IFREQ.pack(name.encode(), 0))
    except OSError:
        return False
    flags = _IFREQ.unpack(answer)[1]
    return bool(flags & _IFF_UP and flags & _IFF_RUNNING)


def nics_down(ifnames: tuple[str, ...]) -> tuple[int, ...]:
    """This host's NICs (by index; those named: a loopback run names none) that are down now
    (one that is gone is down too)."""
    down = []
    for nic, name in enumerate(ifnames):
        if not name:
            continue
        try:
            running = nic_running(socket.if_nametoindex(name))
        except OSError:
            running = False
        if not running:
            down.append(nic)
    return tuple(down)


class _LinkWatch:
    """Netlink's link events for this host (its namespace): which interfaces went down."""

    def __init__(self, indices: list[int]) -> None:
        """`indices`: the interfaces watched (0: none), whose state it reads afresh when the
        kernel dropped events."""
        self.indices = [index for index in indices if index]
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self._sock.bind((0, _RTMGRP_LINK))

    def fileno(self) -> int:
        return self._sock.fileno()

    def read(self) -> tuple[set[int], set[int]]:
        """(interface indices now down, now up) from the events waiting. If the kernel
        dropped some (the socket's buffer was full: many links changing at once, and the
        read is ENOBUFS), the watched interfaces' state is read afresh instead, each then
        down or up: a NIC's going down may be among those lost."""
        try:
            data = self._sock.recv(65536)
        except OSError as err:
            if err.errno != errno.ENOBUFS:
                raise
            self._drop_waiting()
            return self._state()
        return _link_changes(data)

    def _drop_waiting(self) -> None:
        """Drop the events waiting: the state read next is newer."""
        while True:
            try:
                self._sock.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError as err:  # more dropped meanwhile: read on
                if err.errno != errno.ENOBUFS:
                    raise

    def _state(self) -> tuple[set[int], set[int]]:
        """(the watched interfaces down, those up), as they are now."""
        down: set[int] = set()
        up: set[int] = set()
        for index in self.indices:
            (up if nic_running(index) else down).add(index)
        return down, up


def _link_changes(data: bytes) -> tuple[set[int], set[int]]:
    """(interface indices now down, now up) from netlink's link events in `data`."""
    down: set[int] = set()
    up: set[int] = set()
    while len(data) >= _NLMSG.size:
        length, kind, _, _, _ = _NLMSG.unpack_from(data)
        if length < _NLMSG.size:
            break
        if kind == _RTM_NEWLINK and length >= _NLMSG.size + _IFINFO.size:
            _, _, index, flags, _ = _IFINFO.unpack_from(data, _NLMSG.size)
            running = flags & _IFF_UP and flags & _IFF_RUNNING
            (up if running else down).add(index)
        data = data[(length + 3) & ~3 :]
    return down, up


class Unreachable(ConnectionError):
    """No NIC connected a sender to its receiver; `refused`: every one was refused (the
    receiver delegate is gone); `codes`: each NIC tried's error (`error_code`)."""

    def __init__(self, refused: bool, codes: dict[int, int]) -> None:
        super().__init__(
            "the receiver delegate is gone (every NIC refused)"
            if refused
            else "no data-plane NIC reaches the receiver"
        )
        self.refused, self.codes = refused, codes


class _Parted(ConnectionError):
    """The receiver answered a hello with its farewell: it has left the pair."""


class _HungUp(ConnectionError):
    """The receiver's host took the connection (TCP's handshake done) and reset or closed it
    before the receiver's resume point."""


class _Over(Exception):
    """The trainer closed the job pipe of a delegate that noted why it could not go on."""


class _Message:
    """A message handed over (a class of its own, not a NamedTuple: `typing` is a sixth of
    a delegate's start)."""

    __slots__ = ("iteration", "microbatch", "nbytes", "number", "offset", "seq")

    def __init__(
        self, iteration: int, microbatch: int, seq: int, offset: int, nbytes: int, number: int
    ) -> None:
        self.iteration, self.microbatch, self.seq = iteration, microbatch, seq
        self.offset, self.nbytes = offset, nbytes
        self.number = number
        """Its number on the delegate pair (HEADER)."""


class _Sender:
    """A sender delegate's connection to its receiver, over one NIC at a time."""

    def __init__(self, sources: list[str], ifnames: list[str], timeout_ms: int) -> None:
        """NIC k: from this host's address `sources[k]` (interface `ifnames[k]`, watched by
        netlink if named) to the receiver's `peers[k]` (none until `point`)."""
        self.sources, self.timeout_ms = sources, timeout_ms
        self.port, self.peers = 0, list[str]()
        self.indices = [socket.if_nametoindex(name) if name else 0 for name in ifnames]
        self.active = 0
        self.failed: set[int] = set()
        """NICs seen to fail and not seen back."""
        self.wire: TcpWire | None = None
        self.num_connections = 0
        self.epoch = 0
        """The pair's (the receiver's hello check: a newer pair's is higher)."""

    def connect(self, reply_timeout_s: float = CONNECT_TIMEOUT_S, first: int | None = None) -> int:
        """A connection over the first NIC that has not failed (each that cannot connect
        fails too), or if all have, over each again (a repair on the far side, with its
        notices off, goes unseen); `first`: that NIC before the others. The receiver's resume
        point, which it must send within `reply_timeout_s` of the TCP connection.
        `Unreachable` if none connects (saying whether every NIC refused: the receiver is
        gone, and why each failed); `_Parted` if the receiver has left the pair.

        A NIC whose connection closes before the resume point (its receiver's host took it,
        then hung up: a receiver ending as its listeners close, or one that turned the
        hello away) is tried once more, after `HUNG_UP_RETRY_S`, where every other NIC was
        refused: a receiver that has ended now refuses it too (it is gone, not the link)."""
        nics = range(len(self.peers))
        order = [k for k in nics if k not in self.failed] or list(nics)
        if first is not None:
            order = [first, *(k for k in order if k != first)]
        codes: dict[int, int] = {}
        refused: set[int] = set()
        for attempt in range(2):
            hung_up: list[int] = []
            for nic in order:
                try:
                    return self._connect_over(nic, reply_timeout_s)
                except _Parted:
                    raise
                except _HungUp as err:
                    hung_up.append(nic)
                    codes[nic] = error_code(err.__cause__ or err)
                except OSError as err:
                    codes[nic] = error_code(err)
                    if isinstance(err, ConnectionRefusedError):
                        refused.add(nic)
                self.failed.add(nic)
            if attempt or not hung_up or len(refused) + len(hung_up) < len(order):
                break
            time.sleep(HUNG_UP_RETRY_S)
            order = hung_up
        raise Unreachable(refused.issuperset(codes), codes)

    def _connect_over(self, nic: int, reply_timeout_s: float) -> int:
        """The receiver's resume point over `nic` (then its connection is the active one);
        `_HungUp` if the receiver's host took the connection and closed it before then."""
        self.num_connections += 1
        hello = HEADER.pack(-1, nic, -1, HELLO, self.num_connections, os.getpid(), self.epoch)
        wire = None
        try:
            wire = TcpWire.connect(self.sources[nic], self.peers[nic], self.port, self.timeout_ms)
            wire.blocking(reply_timeout_s)
            wire.send(hello, memoryview(b""))
            (resume,) = RESUME.unpack(wire.receive_exactly(RESUME.size))
        except BaseException as err:
            if wire is not None:
                wire.abandon()
            # Reset (in the connect too, its handshake done), closed, or a broken pipe; not
            # refused (nothing took it), nor a timeout (a slow path or host).
            if isinstance(err, ConnectionError) and not isinstance(err, ConnectionRefusedError):
                raise _HungUp from err
            raise
        if resume == FAREWELL:
            wire.close()
            raise _Parted
        wire.blocking(None)
        self.wire, self.active = wire, nic
        return resume

    def drop(self) -> None:
        """The active NIC has failed: its connection dropped."""
        self.failed.add(self.active)
        if self.wire is not None:
            self.wire.abandon()
            self.wire = None

    def leave(self) -> None:
        """Say goodbye to the receiver and close (between iterations: nothing is owed)."""
        if self.wire is not None:
            goodbye = HEADER.pack(-1, 0, -1, GOODBYE, 0, os.getpid(), 0)
            with contextlib.suppress(OSError):  # a receiver that left first reset it
                self.wire.send(goodbye, memoryview(b""))
            self.wire.close()
            self.wire = None

    def park(self) -> None:
        """The receiver said farewell: no connection until a re-point names the next."""
        if self.wire is not None:
            self.wire.close()
            self.wire = None

    def point(self, port: int, peers: list[str], epoch: int, down_there: set[int]) -> None:
        """A receiver, a new pair (the old one left): connect next, over the first NIC up
        here and at the receiver's host (`down_there`: those down there when it offered its
        port; the old receiver's failures were another host's). Without that, a NIC down
        there was tried first and its connect waited `CONNECT_TIMEOUT_S`: a rank swap next
        to a host whose rnic0 had failed took 5 s."""
        self.leave()
        self.port, self.peers, self.epoch = port, peers, epoch
        self.active, self.num_connections = 0, 0
        self.failed = self.down_here() | down_there

    def down_here(self) -> set[int]:
        """This host's NICs (those watched) that are down now."""
        return {k for k, index in enumerate(self.indices) if index and not nic_running(index)}


def run_sender(
    control: int, notify: int, timeout_ms: int, sources: list[str], ifnames: list[str]
) -> None:
    """Idle until a point job names its receiver."""
    slots = _SlotFile()
    link = _Sender(sources, ifnames, timeout_ms)
    # Watching before it connects: a NIC that goes down meanwhile is seen (its READY says
    # that it watches).
    watch = _LinkWatch(link.indices) if any(link.indices) else None
    notices: socket.socket | None = None
    pid = os.getpid()
    retained: list[_Message] = []
    """This iteration's messages so far, to send again after a failover (an iteration's
    messages all have their slots, and the next begins only once all arrived)."""
    num_sent = 0

    def send(message: _Message) -> None:
        assert link.wire is not None  # (a message to a parked sender ends it before)
        m = message
        with slots.view[m.offset : m.offset + m.nbytes] as payload:
            header = HEADER.pack(
                m.iteration, m.microbatch, m.seq, m.nbytes, m.number, slots.slot_bytes,
                len(slots.view),
            )  # fmt: skip
            link.wire.send(header, payload)  # released after: remappable

    def fail_over(cause: int, nic: int | None = None) -> None:
        """Move to the next NIC that works (`nic`: that one first)."""
        noticed_s, left = time.monotonic(), link.active
        link.drop()
        for _ in range(2 * len(link.peers)):  # each NIC twice at most (one may break again)
            try:
                resume = link.connect(first=nic)
            except _Parted:  # its receiver has left the pair (a rank swap): it waits
                return
            except Unreachable as err:
                if err.refused:  # the receiver is gone: the delegate ends, saying so
                    raise
                break
            again = [m for m in retained if m.number > resume]
            try:
                for message in again:
                    send(message)
            except OSError:
                link.drop()
                continue
            break
        if link.wire is None:  # every NIC has failed: the trainer is told, and ends the run
            _note(notify, FAILED, 0, 0, 0, 0, 0, noticed_s, time.monotonic(), pid)
            _wait_for_the_end(control)
            raise _Over
        first_seq = again[0].seq if again else -1
        # (no iteration: the trainer notes a move as the iteration it learns of it in)
        _note(notify, FAILOVER, 0, cause, first_seq, left, link.active, noticed_s,
              time.monotonic(), pid)  # fmt: skip

    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    if watch is not None:
        selector.register(watch.fileno(), selectors.EVENT_READ)
    watched: TcpWire | None = None
    watched_fd = -1
    while True:
        if link.wire is not watched:  # a failover, a park, a re-point: watch the new one
            if watched is not None:
                selector.unregister(watched_fd)  # by number: the old socket is closed
            watched, watched_fd = link.wire, -1
            if watched is not None:
                watched_fd = watched.fileno()
                selector.register(watched_fd, selectors.EVENT_READ)
        for key, _ in selector.select():
            if link.wire is not watched:
                break  # the rest of these events may be of the old connection
            if key.fd == control:
                try:
                    job = JOB.unpack(_read_exactly(control, JOB.size))
                except EOFError:  # the trainer closed its end: the run is over
                    return
                kind, iteration, microbatch, seq, offset, nbytes, fault_ms, nics, _ = job
                if kind == MAP:
                    slots.map_job(job)
                    continue
                if kind == MOVE and link.wire is None:  # parked: it takes that NIC next
                    if nics >> link.active & 1:
                        left, link.active = link.active, microbatch
                        now = time.monotonic()
                        _note(notify, FAILOVER, 0, BY_SIBLING, -1, left, link.active, now, now,
                              pid)  # fmt: skip
                    continue
                if kind == MOVE:
                    if nics >> link.active & 1:
                        fail_over(BY_SIBLING, microbatch)
                    continue
                if kind == LEAVE:
                    link.leave()
                    return
                if kind == POINT:
                    if notices is not None:
                        selector.unregister(notices)
                        notices.close()
                    port, peers, notice_peer, down_there = _target(job, control)
                    link.point(port, peers, iteration, down_there)
                    slots.unmap()
                    retained.clear()
                    num_sent = 0
                    link.connect(START_REPLY_TIMEOUT_S)
                    notices = _notice_connection(notice_peer, port) if notice_peer else None
                    if notices is not None:
                        selector.register(notices, selectors.EVENT_READ)
                    # Ready once set up, just before its wait: its trainer may take it as
                    # idle from now on (it does nothing more until a job, an event of its
                    # NICs or a notice comes).
                    _note(notify, READY, 0, 0, 0, port, link.active, 0.0, 0.0, pid)
                    continue
                if link.wire is None:
                    raise ConnectionError("its receiver left the pair, and no other was named")
                picked_s = time.monotonic()
                if retained and retained[-1].iteration != iteration:
                    retained.clear()
                message = _Message(iteration, microbatch, seq, offset, nbytes, num_sent)
                num_sent += 1
                retained.append(message)
                if fault_ms > 0:
                    time.sleep(fault_ms / 1000.0)
                if nics >= 0 and nics != link.active:
                    fail_over(BY_FAULT_HOOK, nics)  # sends it too
                else:
                    try:
                        send(message)
                    except OSError:
                        fail_over(BY_TIMEOUT)
                if link.wire is None:
                    raise ConnectionError("its receiver left the pair with a message under way")
                _note(notify, SENT, iteration, microbatch, seq, offset, nbytes, picked_s,
                      time.monotonic(), pid)  # fmt: skip
            elif notices is not None and key.fileobj is notices:
                try:
                    notice = _read_whole(notices, NOTICE.size)
                except OSError:
                    notice = b""
                if not notice:  # the receiver has ended: no more notices
                    selector.unregister(notices)
                    notices.close()
                    notices = None
                    continue
                nic, up = NOTICE.unpack(notice)
                if up:
                    link.failed.discard(nic)
                elif nic == link.active and link.wire is not None:  # (none: a point reads
                    fail_over(BY_NOTICE)  # the NICs' state afresh)
            elif watch is not None and key.fd == watch.fileno():
                went_down, came_up = watch.read()
                link.failed -= {k for k, i in enumerate(link.indices) if i in came_up}
                if link.indices[link.active] in went_down and link.wire is not None:
                    fail_over(BY_LINK_STATE)
            elif watched is not None and key.fd == watched_fd:
                # After its resume point a receiver says nothing but farewell: else this is
                # a reset, a timeout or its end (then no NIC connects: refused, it ends).
                try:
                    said = watched.peek()
                except BlockingIOError:
                    continue
                except OSError:
                    said = b""
                if said and _farewell(watched):
                    link.park()
                    continue
                fail_over(BY_TIMEOUT)


def _farewell(wire: TcpWire) -> bool:
    """Whether what its receiver said is its farewell (read)."""
    wire.blocking(CONNECT_TIMEOUT_S)
    try:
        return RESUME.unpack(wire.receive_exactly(RESUME.size)) == (FAREWELL,)
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            wire.blocking(None)


def _notice_connection(host: str, port: int) -> socket.socket:
    """A sender's connection for its receiver's notices (the receiver listens there too)."""
    sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
    sock.sendall(HEADER.pack(-1, 0, -1, NOTICE_HELLO, 0, 0, 0))
    sock.settimeout(None)
    return sock


def _read_whole(sock: socket.socket, size: int) -> bytes:
    """`size` bytes, or b"" if the other side closed first."""
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return b""
        data += chunk
    return data


def _wait_for_the_end(control: int) -> None:
    """Until the trainer closes the job pipe (it reads the note written before, at its next
    wait on this delegate), the jobs meanwhile dropped: this delegate is dead to it then."""
    with contextlib.suppress(OSError):
        while os.read(control, JOB.size):
            pass


_Header = tuple[int, int, int, int, int, int, int]
"""A message's HEADER fields."""


class _Inbox:
    """A receiver's connection and the message it is reading from it."""

    def __init__(self, wire: TcpWire, nic: int, sender_pid: int) -> None:
        self.wire, self.nic, self.sender_pid = wire, nic, sender_pid
        self.header = bytearray(HEADER.size)
        self.got = 0
        """Bytes in of the header, then of the payload."""
        self.message: _Header | None = None
        """Its header's fields once they are in."""
        self.early: bytearray | None = None
        """Its payload, if it came before the map of its slot file (else it goes straight
        into its slot)."""


class _Caller:
    """A connection a receiver accepted, and its hello as far as it came in (the receiver
    reads a hello as its bytes come: a sender slow to say it holds up no other connection)."""

    def __init__(self, sock: socket.socket, deadline_s: float) -> None:
        self.sock, self.wire, self.deadline_s = sock, TcpWire(sock), deadline_s
        self.hello = bytearray(HEADER.size)
        self.got = 0
        """Bytes in of the hello."""


def _time_left(callers: dict[TcpWire, _Caller]) -> float | None:
    """Seconds until the first of `callers` has had its time for its hello (None: no caller)."""
    if not callers:
        return None
    return max(0.0, min(c.deadline_s for c in callers.values()) - time.monotonic())


def listen(addresses: list[str]) -> list[socket.socket]:
    """A listener on each address, all on one port (a few tries for a port free on all)."""
    for _ in range(20):
        first = socket.create_server((addresses[0], 0))
        port = first.getsockname()[1]
        listeners = [first]
        try:
            listeners += [socket.create_server((address, port)) for address in addresses[1:]]
        except OSError as err:
            for listener in listeners:
                listener.close()
            if err.errno != errno.EADDRINUSE:
                raise
            continue
        return listeners
    raise OSError(errno.EADDRINUSE, "no port free on every data-plane address")


def run_receiver(
    control: int, notify: int, addresses: list[str], notice_address: str, ifnames: list[str]
) -> None:
    """`addresses`: this host's per NIC (interface `ifnames[k]`, watched by netlink if
    named); `notice_address`: its management-plane address, where its sender's notice
    connection comes ("": none)."""
    slots = _SlotFile()
    listeners = listen([*addresses, notice_address] if notice_address else addresses)
    pid = os.getpid()
    _note(notify, PORT, 0, 0, 0, listeners[0].getsockname()[1], 0, 0.0, 0.0, pid)
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    for listener in listeners:
        selector.register(listener, selectors.EVENT_READ)
    indices = [socket.if_nametoindex(name) if name else 0 for name in ifnames]
    watch = _LinkWatch(indices) if any(indices) and notice_address else None
    if watch is not None:
        selector.register(watch.fileno(), selectors.EVENT_READ)
    noticed: list[socket.socket] = []
    """Its sender's notice connection (its latest, if it made another)."""
    last = -1
    """The number of the last message in whole (the resume point)."""
    newest = 0
    """The number of the newest connection taken (an older one's hello may come late)."""
    epoch = 0
    """The pair's: its sender's (a re-pointed sender's hello has a newer one)."""
    wanted = 0
    """The epoch its trainer waits for (a re-point's), READY once a sender of it is in."""
    left = -1
    """The newest epoch whose pair it has left (goodbye, farewell): none of those again."""
    inbox: _Inbox | None = None
    callers: dict[TcpWire, _Caller] = {}
    """Connections accepted, their hellos not yet in whole (by the wire each is watched as)."""
    retired: set[TcpWire] = set()
    """Connections of pairs left, read (and what comes dropped) until their sender closes."""
    ready = False
    waiting: list[tuple[_Header, bytearray, float]] = []
    """Messages in whole before the map of their slot file (header, payload, when in)."""

    def mapped(message: _Header) -> bool:
        """Whether the slot file mapped is the one `message` goes into (its sizes)."""
        *_, slot_bytes, file_bytes = message
        return (slots.slot_bytes, len(slots.view)) == (slot_bytes, file_bytes)

    def arrived(
        message: _Header,
        early: bytearray | None,
        arrived_s: float,
    ) -> None:
        """Into its slot (unless it was received there), and reported."""
        iteration, microbatch, seq, nbytes, _, _, _ = message
        offset = slots.offset(seq)
        if early is not None:
            slots.view[offset : offset + nbytes] = early
        _note(notify, ARRIVED, iteration, microbatch, seq, offset, nbytes, arrived_s, 0.0, pid)

    def hang_up(caller: _Caller) -> None:
        """Drop a connection whose hello did not come (in time, or whole)."""
        del callers[caller.wire]
        selector.unregister(caller.wire)
        caller.wire.abandon()

    def retire(wire: TcpWire, farewell: bool) -> None:
        """Leave the pair of `wire` (say farewell first: its sender may not have left)."""
        if farewell:
            with contextlib.suppress(OSError):
                wire.send(RESUME.pack(FAREWELL), memoryview(b""))
        wire.finish()
        retired.add(wire)  # (watched since its accept)

    # It never blocks on one source: a message whose map is late is read on (into memory of
    # its own), or its sender's wire would fill and break by TCP's user timeout (a failover
    # with no fault), and a wait for the map in the middle of a batch of events would leave
    # the job pipe's event stale (a read of the empty pipe: a hang). A hello is read as it
    # comes too (a wait on one held up the message coming in meanwhile, for seconds).
    while True:
        if not ready and inbox is not None and epoch >= wanted and (noticed or not notice_address):
            # Its sender's connection taken, and its notice connection where it has one:
            # ready, and idle from here (its trainer may take it so) until something comes.
            _note(notify, READY, 0, 0, 0, 0, 0, 0.0, 0.0, pid)
            ready = True
        for key, _ in selector.select(_time_left(callers)):
            if key.fileobj == control:
                try:
                    job = JOB.unpack(_read_exactly(control, JOB.size))
                except EOFError:
                    return
                if job[0] == LEAVE:
                    if inbox is not None:
                        retire(inbox.wire, farewell=True)
                    return
                if job[0] == POINT:
                    wanted, ready = job[1], False
                    slots.unmap()
                    if inbox is not None and epoch < wanted:  # its new sender is not in yet
                        retire(inbox.wire, farewell=True)
                        inbox, left = None, epoch
                    continue
                slots.map_job(job)
                for header, payload, arrived_s in [w for w in waiting if mapped(w[0])]:
                    arrived(header, payload, arrived_s)
                waiting[:] = [w for w in waiting if not mapped(w[0])]
            elif key.fileobj in listeners:
                sock, _ = key.fileobj.accept()  # type: ignore[union-attr]
                caller = _Caller(sock, time.monotonic() + HELLO_TIMEOUT_S)
                callers[caller.wire] = caller
                selector.register(caller.wire, selectors.EVENT_READ)
            elif key.fileobj in callers:  # (not one dropped earlier in this batch)
                caller = callers[key.fileobj]
                with memoryview(caller.hello)[caller.got :] as rest:
                    count = _receive(caller.wire, rest)
                if not count:  # closed or broken before its hello was whole
                    hang_up(caller)
                    continue
                caller.got += count
                if caller.got < HEADER.size:
                    continue
                _, nic, _, hello, number, sender_pid, pair = HEADER.unpack(caller.hello)
                if hello == NOTICE_HELLO:
                    del callers[caller.wire]
                    selector.unregister(caller.wire)
                    caller.wire.blocking(CONNECT_TIMEOUT_S)  # a notice never holds it long
                    noticed[:] = [caller.sock]
                    continue
                if hello == HELLO and pair <= left:  # of a pair it left: its sender waits
                    del callers[caller.wire]
                    retire(caller.wire, farewell=True)
                    continue
                try:
                    if hello != HELLO or (pair, number) <= (epoch, newest):
                        raise ConnectionError("not a hello, or an older one than taken")
                    # (a new connection's room: at once)
                    caller.sock.sendall(RESUME.pack(last if pair == epoch else -1))
                except OSError:
                    hang_up(caller)
                    continue
                del callers[caller.wire]
                if pair > epoch:  # a new pair: the old one's connection is retired
                    if inbox is not None:
                        retire(inbox.wire, farewell=True)
                        inbox = None
                    epoch, last, noticed[:] = pair, -1, []
                if inbox is not None:  # the sender moved: the old connection is dead
                    selector.unregister(inbox.wire)
                    inbox.wire.abandon()
                # (its wire is watched since its accept)
                inbox, newest = _Inbox(caller.wire, nic, sender_pid), number
            elif watch is not None and key.fd == watch.fileno():
                went_down, came_up = watch.read()
                told = [NOTICE.pack(k, 1) for k, i in enumerate(indices) if i in came_up]
                if inbox is not None and indices[inbox.nic] in went_down:
                    told.append(NOTICE.pack(inbox.nic, 0))  # its sender moves at once
                for sock in noticed:
                    with contextlib.suppress(OSError):
                        sock.sendall(b"".join(told))
            elif key.fileobj in retired:
                if not _receive(key.fileobj, memoryview(bytearray(HEADER.size))):  # type: ignore[arg-type]
                    selector.unregister(key.fileobj)
                    retired.discard(key.fileobj)  # type: ignore[arg-type]
                    key.fileobj.close()  # type: ignore[union-attr]
            elif inbox is not None and key.fileobj is inbox.wire:  # not an older one's event
                if inbox.message is None:
                    with memoryview(inbox.header)[inbox.got :] as rest:
                        count = _receive(inbox.wire, rest)
                elif inbox.early is not None:
                    with memoryview(inbox.early)[inbox.got :] as rest:
                        count = _receive(inbox.wire, rest)
                else:
                    _, _, seq, nbytes, _, _, _ = inbox.message
                    offset = slots.offset(seq)
                    start = offset + inbox.got
                    with slots.view[start : offset + nbytes] as rest:  # released: remappable
                        count = _receive(inbox.wire, rest)
                if count is None:  # broken (reset, timeout): its sender fails over to us
                    selector.unregister(inbox.wire)
                    inbox.wire.abandon()
                    inbox = None
                    continue
                if count == 0:  # closed: the sender delegate is gone
                    if inbox.got or inbox.message or not _control_closed(control):
                        _note(notify, FAILED, 0, 0, 0, inbox.sender_pid, 0, 0.0, 0.0, pid)
                    return
                inbox.got += count
                if inbox.message is None:
                    if inbox.got < HEADER.size:
                        continue
                    header = HEADER.unpack(inbox.header)
                    if header[3] == GOODBYE:  # its sender left the pair
                        retire(inbox.wire, farewell=False)
                        inbox, left = None, epoch
                        continue
                    inbox.message, inbox.got = header, 0
                    nbytes = header[3]
                    inbox.early = None if mapped(inbox.message) else bytearray(nbytes)
                    if nbytes > 0:
                        continue
                message, early = inbox.message, inbox.early
                number = message[4]
                if inbox.got < message[3]:
                    continue
                inbox.message, inbox.early, inbox.got = None, None, 0
                if number <= last:  # sent again after a failover, and in already
                    continue
                last = number
                if early is None or mapped(message):
                    arrived(message, early, time.monotonic())
                else:  # its slot file is on the way
                    waiting.append((message, early, time.monotonic()))
        now = time.monotonic()
        for caller in [c for c in callers.values() if c.deadline_s <= now]:
            hang_up(caller)


def _receive(wire: TcpWire, target: memoryview) -> int | None:
    """What `wire.receive_into` got; None if the connection broke."""
    try:
        return wire.receive_into(target)
    except OSError:
        return None


def _control_closed(control: int) -> bool:
    """Whether the trainer closed this delegate's pipe too (the run ended: not a failure)."""
    readable, _, _ = select.select([control], [], [], 0.2)
    return bool(readable) and not os.read(control, 1)


def main(argv: list[str]) -> None:
    """argv: role, the trainer's pid, the job pipe, the notify pipe, then for "send": the
    user timeout (ms), per NIC (comma-separated) this host's addresses and interface names
    (empty: not watched; its receiver comes in a point job); for "recv": this host's
    data-plane addresses, its management-plane address (empty: no notices) and its
    interface names (the same forms)."""
    role, parent, control, notify = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer's Ctrl-C is the trainer's
    try:
        if role == "send":
            run_sender(control, notify, int(argv[4]), argv[5].split(","), argv[6].split(","))
        else:
            run_receiver(control, notify, argv[4].split(","), argv[5], argv[6].split(","))
    except _Over:
        pass  # it said why (FAILED), and its trainer is done with it
    except ConnectionError as err:  # its trainer is told why (if its notify pipe is open)
        if isinstance(err, Unreachable):
            reason = REFUSED if err.refused else UNREACHED
            nics = nic_errors(err.codes)
        else:
            reason, nics = BROKEN, 0
        with contextlib.suppress(OSError):
            _note(notify, ENDED, nics, reason, error_code(err), 0, 0, 0.0, 0.0, os.getpid())
    finally:
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
