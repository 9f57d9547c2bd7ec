"""The trainer's side of the delegate transport (the paper's CPU delegates): for each link
direction a trainer sends on, D sender delegates; for each it receives on, D receiver
delegates (delegate.py), started with the worker pool and kept for its life.

A send copies the tensor into a slot of the direction's slot file (a file in /dev/shm, mapped
by the trainer and its delegates: the paper's copy to host memory, the only cost the trainer
pays) and hands the slot to delegate seq mod the iteration's count (`begin_iteration`: the
first so many of the D, the plan's `num_delegates`; the others idle, and move with their
siblings when a NIC fails), which waits the link's delay and carries it.
A receive is the receiver delegate's report that the message is in the receiving trainer's
slot (with when its last byte came), then the copy from the slot into the op's input buffer
(the paper's copy to the device). Slots are those of the message's sequence number: an
iteration's messages all have one, and iterations never overlap.

Each host has data-plane NICs (`Delegates.addresses`, one address per NIC), and each delegate
pair talks over one of them at a time: when it fails, the sender delegate moves to the next
(delegate.py, "NIC failover"), and its trainer learns it as a `Failover`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import torch

from adaptra.transport.delegate import (
    ARRIVED,
    BY_FAULT_HOOK,
    BY_LINK_STATE,
    BY_NOTICE,
    BY_SIBLING,
    BY_TIMEOUT,
    ENDED,
    FAILED,
    FAILOVER,
    JOB,
    LEAVE,
    MAP,
    MAX_NICS_NOTED,
    MESSAGE,
    MOVE,
    NO_ERRNO,
    NOTE,
    PATH_BYTES,
    PORT,
    READY,
    REFUSED,
    SENT,
    UNREACHED,
    move_limit_s,
    nics_down,
    point_job,
)
from adaptra.transport.state_wire import move_state
from pipeline.errors import ConfigError, LinkFailure
from pipeline.runtime.transport import (
    DELEGATE_START_S,
    Arrival,
    DelegateOffer,
    DelegateSetup,
    Failover,
    LinkDirection,
    Message,
    PendingReceive,
    StateRoute,
    WireRecord,
    describe,
)

__all__ = ["USER_TIMEOUT_MS", "DelegateTransport", "Delegates"]

DELEGATE_FILE = Path(__file__).with_name("delegate.py")
_START_DELEGATE = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); import delegate; delegate.main(sys.argv[1:])"
)
"""A delegate's start (`python -I -S -B -c` this, delegate.py's folder, `main`'s arguments):
delegate.py imported, not run as a script, which Python compiles afresh at every start (a
third of the start's CPU time: BENCHMARKS.md); imported, it is read from the bytecode cache
that the trainer's own import of it wrote (where the cache is written at all: a delegate
writes none, `-B`). Isolated (`-I`): neither the working directory nor PYTHONPATH on its
path, whose modules would come before the standard library's."""
_POLL_S = 0.2
"""How often a wait on delegates looks whether they are still alive."""
_READ_BYTES = 1 << 16
"""The most a read of a notify pipe takes at once (a full pipe)."""
_END_S = 1.0
"""How long a delegate whose job pipe is closed has to end (idle, it ends at once)."""
_LEAVE_S = 10.0
"""How long a delegate told to leave has to end (it says goodbye or farewell first: killed
before it, its peer would take the close for a failure; a loaded host may not run it for
seconds)."""

LOOPBACK_NICS = ("127.0.0.1", "127.0.0.2")
"""Two "NICs" on loopback, for runs without a testbed: the fault hook fails the first."""

USER_TIMEOUT_MS = 2000
"""The delegates' TCP user timeout by default (`Delegates.timeout_ms`)."""

CAUSES = {
    BY_LINK_STATE: "link state",
    BY_TIMEOUT: "timeout",
    BY_FAULT_HOOK: "fault hook",
    BY_SIBLING: "sibling",
    BY_NOTICE: "notice",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Delegates:
    """The factory the worker pool calls in every worker (picklable)."""

    addresses: tuple[tuple[str, ...], ...] = ()
    """Each rank's data-plane addresses, one per NIC (a testbed host's NICs: pipeline.topology's
    host of the rank): its receiver delegates listen on all, its neighbours' sender delegates
    connect to the first that works, so delegate traffic crosses that NIC and its wires.
    Empty: `LOOPBACK_NICS` for all."""
    ifnames: tuple[str, ...] = ()
    """The NICs' interface names, the same on every host, whose link state the delegates
    watch (netlink); empty: none watched (loopback)."""
    notice_addresses: tuple[str, ...] = ()
    """Each rank's management-plane address, where its receiver delegates tell their senders
    that their NIC went down (else the senders notice it by TCP's timeout); empty: none."""
    timeout_ms: int = USER_TIMEOUT_MS
    """TCP's user timeout on the delegates' connections: data unacked this long means the
    far NIC failed. Above any delay the links put on a message's acks."""

    def __post_init__(self) -> None:
        if any(len(nics) != len(self.nics(0)) for nics in self.addresses) or (
            self.ifnames and len(self.ifnames) != len(self.nics(0))
        ):
            raise ValueError("every rank needs one address per NIC, and one name per NIC")
        if self.notice_addresses and len(self.notice_addresses) != len(self.addresses):
            raise ValueError("every rank needs a management-plane address, or none does")
        every_nic = tuple(range(len(self.nics(0))))
        for rank in range(len(self.addresses)):  # a sender's point job carries them
            point_job(0, 0, self.nics(rank), self.notice_address(rank), every_nic)

    def nics(self, rank: int) -> tuple[str, ...]:
        return self.addresses[rank] if self.addresses else LOOPBACK_NICS

    def notice_address(self, rank: int) -> str:
        return self.notice_addresses[rank] if self.notice_addresses else ""

    def nic_ifnames(self) -> tuple[str, ...]:
        """The NICs' interface names, one per NIC ("" for each where none is watched)."""
        return self.ifnames or tuple("" for _ in self.nics(0))

    def ifname_list(self) -> str:
        """The NICs' interface names as the delegates take them (comma-separated)."""
        return ",".join(self.nic_ifnames())

    def connect(self, setup: DelegateSetup) -> DelegateTransport:
        return DelegateTransport(setup, self)


class _SlotFile:
    """A file of `num_slots` slots of `slot_bytes`, mapped: where a direction's messages wait
    for their delegate (sending side) or for their op (receiving side)."""

    def __init__(self, what: str, folder: str) -> None:
        self.what, self.folder, self.path, self.size, self.slot_bytes = what, folder, "", 0, 0
        self._map: object = None

    def ensure(self, num_slots: int, slot_bytes: int) -> bool:
        """Room for `num_slots` of `slot_bytes`; True if that needed a new file."""
        size = num_slots * slot_bytes
        if self._map is not None and size <= self.size and slot_bytes == self.slot_bytes:
            return False
        import mmap

        self.close()
        fd, self.path = tempfile.mkstemp(dir=self.folder, prefix=f"slots-{self.what}-")
        if len(self.path.encode()) > PATH_BYTES:  # a job would carry it cut short
            os.close(fd)
            self.close()
            raise ConfigError(
                f"the delegates' slot files go in {self.folder}, whose path is too long for "
                f"them (a slot file's path has at most {PATH_BYTES} bytes): set TMPDIR to a "
                "shorter folder"
            )
        try:
            # Its pages taken now: a mapped page a full tmpfs cannot back is a SIGBUS later.
            os.posix_fallocate(fd, 0, max(size, 1))
            self._map = mmap.mmap(fd, max(size, 1))
        except OSError as err:
            self.close()
            raise ConfigError(
                f"no room for the delegates' {size}-byte slot file in {self.folder} "
                f"({err.strerror}): free some there, or set TMPDIR to a folder with room"
            ) from err
        finally:
            os.close(fd)
        self.size, self.slot_bytes = size, slot_bytes
        return True

    def offset(self, seq: int) -> int:
        return (seq * self.slot_bytes) % max(self.size, 1)

    def tensor(self, offset: int, like: torch.Tensor) -> torch.Tensor:
        """The slot at `offset` as a tensor shaped like `like`, flat."""
        if like.numel() == 0:  # an empty message (a profile without message bytes)
            return torch.empty(0, dtype=like.dtype)
        return torch.frombuffer(
            self._map,  # type: ignore[arg-type]
            dtype=like.dtype,
            count=like.numel(),
            offset=offset,
        )

    def map_job(self) -> bytes:
        return JOB.pack(MAP, 0, 0, 0, self.slot_bytes, self.size, 0.0, 0, self.path.encode())

    def close(self) -> None:
        if self._map is not None:
            self._map.close()  # type: ignore[attr-defined]
            self._map = None
        if self.path:
            Path(self.path).unlink(missing_ok=True)
            self.path = ""


class _Process:
    """One delegate process, its job pipe's write end and its notify pipe's read end."""

    def __init__(
        self, role: str, index: int, direction: LinkDirection, peer: int, args: list[str]
    ) -> None:
        """`peer`: the rank its counterpart delegate is on; `args`: delegate.py's `main`'s
        after the pipes."""
        self.role, self.index, self.direction, self.peer = role, index, direction, peer
        self.args = args
        self.peer_addresses: tuple[str, ...] = ()
        """A sender's receiver's, per NIC (its point job's)."""
        self.job = b""
        """Its last point job."""
        control_r, self.control = os.pipe()
        self.notify, notify_w = os.pipe()
        command = [sys.executable, "-I", "-S", "-B", "-c", _START_DELEGATE]
        command.append(str(DELEGATE_FILE.parent))
        command += [role, str(os.getpid()), str(control_r), str(notify_w), *args]
        try:
            self.process = subprocess.Popen(command, pass_fds=(control_r, notify_w), close_fds=True)
        except BaseException:
            for fd in (self.control, self.notify):
                os.close(fd)
            raise
        finally:
            os.close(control_r)
            os.close(notify_w)
        self.unread = bytearray()
        """What it has written to its notify pipe and `_read_note` has not taken yet."""

    @property
    def name(self) -> str:
        return (
            f"{'sender' if self.role == 'send' else 'receiver'} delegate {self.index} (pid "
            f"{self.process.pid}) of link "
            f"{self.direction.link} ({self.direction.direction})"
        )

    def __str__(self) -> str:
        return self.name

    def point(
        self, job: bytes, direction: LinkDirection, peer: int, addresses: tuple[str, ...] = ()
    ) -> None:
        """Hand it a point job (`point_job`) for a pair with `peer` on `direction` (a
        sender's: to `addresses`), and name it so."""
        self.direction, self.peer, self.peer_addresses, self.job = direction, peer, addresses, job
        self.write(job)

    def leave(self) -> None:
        """Hand it "leave" (it says goodbye or farewell to its peer, then ends), unless it
        has ended already: a side a rewire closes."""
        with contextlib.suppress(OSError):
            os.write(self.control, JOB.pack(LEAVE, 0, 0, 0, 0, 0, 0.0, 0, b""))

    def write(self, job: bytes) -> None:
        """Hand it a job; if it is gone, the error of `gone` (raised from the broken pipe,
        unless it has a cause of its own)."""
        try:
            os.write(self.control, job)
        except BrokenPipeError as err:
            failure = self.gone()
            raise failure from failure.__cause__ or err

    def read_written(self) -> None:
        """Read what it has noted so far, without waiting. A delegate whose notify pipe is
        full stops (its write blocks): a trainer that hands over more messages than the pipe
        holds notes of (about 1,170) before it waits for them reads their notes as it goes."""
        while select.select([self.notify], [], [], 0)[0]:
            chunk = os.read(self.notify, _READ_BYTES)
            if not chunk:
                return  # closed: `_read_note` says so once the notes before are taken
            self.unread += chunk

    def check_alive(self) -> None:
        """The error of `gone` if it has ended."""
        if self.process.poll() is not None:
            raise self.gone()

    def gone(self) -> Exception:
        """The error for it found gone (its job pipe broken, its notify pipe closed, its
        process ended): what it noted before it ended says why, if it did (`error`; a
        receiver delegate that lost its sender notes so, and its trainer may find it gone
        before the sender's trainer finds the sender), else its end (given `_END_S` to come,
        a pipe closing just before its process ends)."""
        self.read_written()
        starts = range(0, len(self.unread) - NOTE.size + 1, NOTE.size)
        for note in (NOTE.unpack_from(self.unread, at) for at in starts):
            if note[0] in (FAILED, ENDED):
                return self.error(note)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(_END_S)
        code = self.process.returncode
        if code is None:
            return ConnectionError(f"the {self.name} is gone (its pipes are closed)")
        if code == 0:
            return ConnectionError(f"the {self.name} has ended (exit status 0) without saying why")
        if code < 0:
            with contextlib.suppress(ValueError):
                return ConnectionError(
                    f"the {self.name} has died (killed by {signal.Signals(-code).name})"
                )
        return ConnectionError(f"the {self.name} has died (exit status {code})")

    def error(self, note: tuple) -> Exception:  # type: ignore[type-arg]
        """The error its FAILED or ENDED note says. FAILED: a sender found no NIC left (a
        failed link: `LinkFailure`), or a receiver's sender closed its connection (a
        `ConnectionError` naming the sender's pid). ENDED: the delegate ended on a
        connection error, raised as the type it raised (`ConnectionRefusedError` where every
        NIC refused it) with the reason and each NIC's error, from an `OSError` of the
        errno it noted (where no NIC connected: the first NIC's; `OSError` picks the
        subclass of the errno)."""
        kind, nics, reason, code, sender_pid, *_ = note
        if kind == FAILED and self.role == "send":
            return LinkFailure(
                f"the {self.name} could not reach its receiver over any NIC: link "
                f"{self.direction.link} ({self.direction.direction}) has failed"
            )
        if kind == FAILED:
            sender = f"pid {sender_pid}, " if sender_pid else ""
            return ConnectionError(
                f"the {self.name} lost its sender delegate ({sender}rank {self.peer}'s side): "
                "its connection closed"
            )
        if reason in (UNREACHED, REFUSED):
            codes = [(nics >> 8 * k) & 0xFF for k in range(MAX_NICS_NOTED)]
            failures = "; ".join(
                f"NIC {k}, {self._route(k)}: {_strerror(c)}" for k, c in enumerate(codes) if c
            )
            what = (
                "every NIC refused it: its receiver delegate is gone"
                if reason == REFUSED
                else "no data-plane NIC reaches its receiver delegate"
            )
            error_type = ConnectionRefusedError if reason == REFUSED else ConnectionError
            failure: Exception = error_type(f"the {self.name} has ended: {what} ({failures})")
            code = next((c for c in codes if c and c != NO_ERRNO), code)
        else:
            failure = ConnectionError(
                f"the {self.name} has ended on a connection error: {_strerror(code)}"
            )
        if code != NO_ERRNO:
            failure.__cause__ = OSError(code, os.strerror(code))
        return failure

    def _route(self, nic: int) -> str:
        """A sender's NIC `nic` as "from <its address> to <the receiver's>"."""
        peers, sources = self.peer_addresses, self.args[1].split(",")
        if nic >= min(len(peers), len(sources)):
            return "?"
        return f"from {sources[nic]} to {peers[nic]}"

    def end_jobs(self) -> None:
        """Close its job pipe: it ends once done with what it is doing (a move in progress
        is finished, and noted)."""
        if self.control >= 0:
            with contextlib.suppress(OSError):
                os.close(self.control)
            self.control = -1  # the number may be another file's from now on

    def read_to_end(self, deadline: float) -> None:
        """Read what it writes, into `unread`, until it has ended (its notify pipe closed)
        or `deadline` (monotonic s) has passed."""
        while (left_s := deadline - time.monotonic()) > 0:
            if select.select([self.notify], [], [], left_s)[0]:
                chunk = os.read(self.notify, _READ_BYTES)
                if not chunk:
                    return
                self.unread += chunk

    def close(self, grace_s: float = _END_S) -> None:
        """End it: its job pipe closed, `grace_s` to end, then killed."""
        self.end_jobs()
        if self.notify >= 0:
            with contextlib.suppress(OSError):
                os.close(self.notify)
            self.notify = -1
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _strerror(code: int) -> str:
    """An error code of a note (delegate.py's `error_code`), in words."""
    if code == NO_ERRNO:
        return "the connection closed before the receiver answered"
    return f"[Errno {code}] {os.strerror(code)}"


def _start(
    role: str, direction: LinkDirection, peer: int, arg_lists: list[list[str]]
) -> list[_Process]:
    """Delegate k with `arg_lists[k]`, for every k; those started are closed if a later one
    fails to start."""
    started: list[_Process] = []
    try:
        for k, args in enumerate(arg_lists):
            started.append(_Process(role, k, direction, peer, args))
    except BaseException:
        for process in started:
            process.close()
        raise
    return started


def _check_reachable(
    rank: int,
    ifnames: tuple[str, ...],
    theirs: dict[LinkDirection, DelegateOffer],
    peers: dict[LinkDirection, int],
    routes_down: Mapping[LinkDirection, tuple[int, ...]],
) -> None:
    """A `LinkFailure` where a pair being wired has no data-plane NIC up at both ends: every
    one down at this host (`ifnames`: its NICs' interfaces; unwatched ones, named "", are
    up), or each down here or at a receiver's host (`theirs`: its offer; `peers`: each
    direction's rank), or its route failed by the fault hook (`routes_down`). No delegate
    could connect, and a peer waited for it the delegates' whole start-up wait (60 s)
    whatever the workers' timeout: a rank swap onto a host with both NICs down was noticed
    a minute late."""
    every = set(range(len(ifnames)))
    here = set(nics_down(ifnames))
    if here == every:
        raise LinkFailure(
            f"rank {rank}: every data-plane NIC of its host is down ({', '.join(ifnames)}): "
            "its delegates reach no peer"
        )
    for direction, offer in theirs.items():
        there, on = set(offer.nics_down), f"{direction.link} ({direction.direction})"
        if there == every:
            raise LinkFailure(
                f"rank {peers[direction]}: every data-plane NIC of its host is down: rank "
                f"{rank}'s delegates cannot reach it on {on}"
            )
        failed = set(routes_down.get(direction, ()))
        if failed and here | there | failed == every:
            raise LinkFailure(
                f"ranks {rank} and {peers[direction]}: no data-plane NIC's route is up "
                f"between them (the fault timeline fails {_named(failed, ifnames)}"
                + (f"; {_named(here | there, ifnames)} down" if here | there else "")
                + f"): {on} cannot connect"
            )
        if here | there == every:
            raise LinkFailure(
                f"ranks {rank} and {peers[direction]}: no data-plane NIC is up at both hosts "
                f"({_named(here, ifnames)} down at rank {rank}'s, "
                f"{_named(there, ifnames)} at rank {peers[direction]}'s): {on} cannot connect"
            )


def _named(nics: set[int], ifnames: tuple[str, ...]) -> str:
    """NICs by their interfaces' names (by index where unnamed)."""
    return ", ".join(ifnames[nic] or f"NIC {nic}" for nic in sorted(nics))


def _read_note(process: _Process, deadline: float) -> tuple:  # type: ignore[type-arg]
    """The next note of `process`, waiting until `deadline` (monotonic s); a FAILED or ENDED
    note is raised (`_Process.error`), a closed pipe or an ended process as `_Process.gone`
    says."""
    while len(process.unread) < NOTE.size:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the {process.name} said nothing in time")
        readable, _, _ = select.select([process.notify], [], [], min(left, _POLL_S))
        if not readable:
            process.check_alive()
            continue
        chunk = os.read(process.notify, _READ_BYTES)
        if not chunk:
            raise process.gone()
        process.unread += chunk
    note = NOTE.unpack_from(process.unread)
    del process.unread[: NOTE.size]
    if note[0] in (FAILED, ENDED):
        raise process.error(note)
    return note


class _Side:
    """One side of a link direction: its slot file and its delegates (message seq k goes
    through delegate k mod D, D those of them the iteration uses)."""

    role = ""
    """Its delegates' ("send" or "recv")."""

    def __init__(
        self,
        direction: LinkDirection,
        peer: int,
        num_delegates: int,
        args: list[str],
        folder: str,
    ) -> None:
        """`peer`: the rank its peer delegates are on; `args`: what every delegate is told
        (delegate.py's `main`); `folder`: where its slot file goes."""
        self.direction, self.peer = direction, peer
        end = "out" if self.role == "send" else "in"
        self.slots = _SlotFile(f"{direction.link}-{direction.direction}-{end}", folder)
        self.delegates = _start(self.role, direction, peer, [args] * num_delegates)
        self.num_used = num_delegates
        """The delegates this iteration's messages go through (`begin`), the first so many."""
        self._begin_state()

    def _begin_state(self) -> None:
        """The role's own state of a side just started."""

    def delegate_of(self, seq: int) -> _Process:
        return self.delegates[seq % self.num_used]

    def begin(self, num_messages: int, slot_bytes: int, num_delegates: int | None = None) -> None:
        """Slots for an iteration's messages, which go through its first `num_delegates`
        delegates (None: all); the delegates map a new slot file."""
        started = len(self.delegates)
        if num_delegates is not None and not 1 <= num_delegates <= started:
            raise ValueError(f"{num_delegates} delegate(s) asked of the {started} started")
        self.num_used = started if num_delegates is None else num_delegates
        if self.slots.ensure(num_messages, slot_bytes):
            for delegate in self.delegates:
                delegate.write(self.slots.map_job())

    def close(self, grace_s: float = _END_S) -> None:
        for delegate in self.delegates:
            delegate.close(grace_s)
        self.slots.close()

    def new_pair(self, direction: LinkDirection, peer: int) -> None:
        """Carry `direction` with `peer` from now on (its delegates re-pointed). Its slot file
        starts over, as its new peer's does: the two must be sized alike (the receiver
        takes a message's slot file by its sizes), and their iterations' sizes make them
        so only where they start together."""
        self.direction, self.peer = direction, peer
        self.slots.close()

    def leave(self) -> None:
        """Close the side at a rewire: its delegates leave their peers first (a peer that
        is re-pointed takes no leaving for a failure)."""
        for delegate in self.delegates:
            delegate.leave()
        self.close(_LEAVE_S)


class _Outbound(_Side):
    """The sender delegates of one link direction this trainer sends on (started idle:
    `point` them)."""

    role = "send"

    def _begin_state(self) -> None:
        self.moves_of = self.direction
        """The direction the moves its delegates note before their next READY are of (the
        one it carried before it was pointed again)."""
        self.pointed = self.re_pointed = False
        """Whether it has been pointed; whether its last point was not its first."""
        self.pending: list[int] = []
        """The seqs of the messages handed over this iteration, not yet acked."""
        self.failovers: list[Failover] = []
        """Its delegates' moves to another NIC, noted and not yet taken."""
        self.nic_of = [0] * len(self.delegates)
        """The NIC each of its delegates is on."""
        self.route_nic = 0
        """The NIC the last message's fault hook routed it over (hook injection); before
        any since it was pointed, the NIC its delegates connected over."""

    def point(
        self,
        direction: LinkDirection,
        peer: int,
        offer: DelegateOffer,
        addresses: tuple[str, ...],
        notice_address: str,
        epoch: int,
    ) -> None:
        """Carry `direction` to `peer` from now on, as pair `epoch`: delegate k to the
        receiver delegate at `offer.ports[k]`, starting on the first NIC up at both ends
        (`addresses`: the peer's per NIC; `notice_address`: its management plane's, "" for
        none). A side's first pair, or its next at a rewire (its failovers not yet taken are
        then the caller's to keep)."""
        self.re_pointed, self.moves_of = self.pointed, self.direction
        self.pointed = True
        self.new_pair(direction, peer)
        for delegate, port in zip(list(self.delegates), offer.ports, strict=True):
            job = point_job(epoch, port, addresses, notice_address, offer.nics_down)
            try:
                delegate.point(job, direction, peer, addresses)
            except ConnectionError:
                if not self.re_pointed:
                    raise
                self.replace(delegate)  # (`DelegateTransport._wait_ready`)
        self.failovers, self.nic_of, self.route_nic = [], [0] * len(offer.ports), 0

    def replace(self, delegate: _Process) -> _Process:
        """A new delegate in `delegate`'s place (which is closed), pointed as it was."""
        delegate.close()
        new = _Process("send", delegate.index, self.direction, self.peer, delegate.args)
        self.delegates[delegate.index] = new
        new.point(delegate.job, self.direction, self.peer, delegate.peer_addresses)
        return new

    def send(
        self, message: Message, payload: torch.Tensor, fault_ms: float, nic: int | None
    ) -> None:
        delegate = self.delegate_of(message.seq)
        delegate.check_alive()
        delegate.read_written()
        nbytes = payload.numel() * payload.element_size()
        offset = self.slots.offset(message.seq)
        self.slots.tensor(offset, payload).copy_(payload.detach().reshape(-1))
        job = JOB.pack(
            MESSAGE, message.iteration, message.microbatch, message.seq, offset, nbytes,
            fault_ms, -1 if nic is None else nic, b"",
        )  # fmt: skip
        delegate.write(job)
        self.pending.append(message.seq)

    def finish(self, iteration: int, timeout_s: float) -> list[WireRecord]:
        """Wait for every message handed over this iteration to be on the wire."""
        records = []
        deadline = time.monotonic() + timeout_s
        for seq in sorted(self.pending):
            delegate = self.delegate_of(seq)
            kind = FAILOVER
            while kind == FAILOVER:
                note = self._take_note(delegate, iteration, deadline)
                kind, it, microbatch, got, _, _, t1, _, pid = note
            if kind != SENT or it != iteration or got != seq:
                raise ConnectionError(f"the {delegate.name} acked {got} of {it}, not {seq}")
            records.append(WireRecord(self.direction, microbatch, t1, pid))
        self.pending.clear()
        self._move_the_others(iteration, deadline)
        return records

    def _take_note(self, delegate: _Process, iteration: int, deadline: float) -> tuple:  # type: ignore[type-arg]
        """A delegate's next note, read in `iteration`; a failover is noted as that
        iteration's, a failure over every NIC raised (`_read_note`)."""
        note = _read_note(delegate, deadline)
        kind, *_ = note
        if kind == FAILOVER:
            failover = _failover(self.direction, iteration, note)
            self.failovers.append(failover)
            self.nic_of[delegate.index] = failover.nic_to
        return note

    def hang_up(self, num_nics: int) -> list[tuple]:  # type: ignore[type-arg]
        """Close the side (a rank swap no longer uses it), keeping its delegates' moves:
        the FAILOVER notes not read yet (moves since its trainer's last look, between
        iterations: by netlink, a notice, TCP's timeout), its other notes dropped. Its
        delegates are told to leave (a goodbye to their receivers) and their job pipes
        closed first, so that a delegate moving meanwhile finishes the move and notes it
        before it ends; its notes are read until each has ended, for the longest a
        move over `num_nics` NICs takes (`move_limit_s`, plus `_END_S`) at most: one not
        ended then (stopped, or kept off the CPU that long) is killed, a move of its
        unrecorded."""
        for delegate in self.delegates:
            delegate.leave()
            delegate.end_jobs()
        deadline = time.monotonic() + move_limit_s(num_nics) + _END_S
        notes = []
        for delegate in self.delegates:
            delegate.read_to_end(deadline)
            starts = range(0, len(delegate.unread) - NOTE.size + 1, NOTE.size)
            notes += [NOTE.unpack_from(delegate.unread, at) for at in starts]
        self.close()
        return [note for note in notes if note[0] == FAILOVER]

    def check(self) -> None:
        """Raise `LinkFailure` if one of its delegates has noted that it found no NIC left,
        or the error of one that noted why it ended (`_Process.error`; its other notes
        stay, to be read in turn)."""
        for delegate in self.delegates:
            delegate.read_written()
            notes = delegate.unread
            starts = range(0, len(notes) - NOTE.size + 1, NOTE.size)
            for note in (NOTE.unpack_from(notes, at) for at in starts):
                if note[0] in (FAILED, ENDED):
                    raise delegate.error(note)

    def _move_the_others(self, iteration: int, deadline: float) -> None:
        """Where one delegate left a NIC, its siblings on it leave too, before their next
        message, for the NIC the last move took first: the same route, whose failure each
        would otherwise notice on its own (by TCP's timeout, once per delegate). Their moves
        are waited for, so that they are this iteration's failovers (also in a run's last
        iteration). The moves its delegates have noted and the main loop did not read (a
        delegate with nothing to carry this iteration, no ack to read them with; one whose
        connection broke after its last message went, TCP's user timeout) are read first:
        they move the siblings too. Until a pass finds no delegate left on a NIC left."""
        while True:
            self._take_written(iteration, deadline)
            left: set[int] = set()  # the NICs left and not gone back to since, in order
            for failover in self.failovers:
                left = (left | {failover.nic_from}) - {failover.nic_to}
            moving = [d for d in self.delegates if self.nic_of[d.index] in left]
            if not moving:
                return
            for delegate in moving:  # to where the last move went first
                taken = self.failovers[-1].nic_to
                mask = 1 << self.nic_of[delegate.index]
                delegate.write(JOB.pack(MOVE, 0, taken, 0, 0, 0, 0.0, mask, b""))
            for delegate in moving:  # one that had moved on its own already noted that move
                if self._take_note(delegate, iteration, deadline)[0] != FAILOVER:
                    raise ConnectionError(f"the {delegate.name} was told to move and did not")

    def _take_written(self, iteration: int, deadline: float) -> None:
        """Every note its delegates have written so far, each a move (`_take_note`), once
        every message handed over is acked."""
        for delegate in self.delegates:
            delegate.read_written()
            while len(delegate.unread) >= NOTE.size:
                if self._take_note(delegate, iteration, deadline)[0] != FAILOVER:
                    raise ConnectionError(f"the {delegate.name} noted what it did not carry")


def _changed(
    sides: Mapping[LinkDirection, _Side], wanted: tuple[tuple[LinkDirection, int], ...]
) -> list[LinkDirection]:
    """The directions of `sides` not `wanted` with the same peer."""
    peers = dict(wanted)
    return [d for d, side in sides.items() if peers.get(d) != side.peer]


def _failover(
    direction: LinkDirection,
    iteration: int,
    note: tuple,  # type: ignore[type-arg]
    replica: int | None = None,
) -> Failover:
    """A delegate's FAILOVER note, as the failover of `iteration` (the one its trainer learns
    of it in), made while its trainer played `replica` (None: the one it plays then)."""
    _, _, cause, first_seq, left, took, noticed_s, resumed_s, pid = note
    return Failover(
        direction, iteration, CAUSES[cause], left, took, noticed_s, resumed_s, first_seq, pid,
        replica,
    )  # fmt: skip


class _DelegatedReceive:
    def __init__(self, inbound: _Inbound, message: Message, buffer: torch.Tensor) -> None:
        self._inbound, self._message, self._buffer = inbound, message, buffer

    def wait(self, timeout_s: float) -> Arrival:
        return self._inbound.take(self._message, self._buffer, timeout_s)


class _Inbound(_Side):
    """The receiver delegates of one link direction this trainer receives on."""

    role = "recv"

    def _begin_state(self) -> None:
        self.arrived: dict[tuple[int, int], tuple[int, float]] = {}
        """(iteration, seq) -> (offset, arrival s) of messages in, not yet taken."""
        self._ports: list[int] = []

    def offer(self, timeout_s: float, ifnames: tuple[str, ...]) -> DelegateOffer:
        """Where its delegates listen (their first notes), and this host's NICs down now
        (`ifnames`: their interfaces)."""
        deadline = time.monotonic() + timeout_s
        while len(self._ports) < len(self.delegates):
            delegate = self.delegates[len(self._ports)]
            kind, *_, port, _, _, _, _ = _read_note(delegate, deadline)
            if kind != PORT:
                raise ConnectionError(f"the {delegate.name} did not report its port")
            self._ports.append(port)
        return DelegateOffer(tuple(self._ports), nics_down(ifnames))

    def point(self, direction: LinkDirection, peer: int, epoch: int) -> None:
        """Take `direction` from `peer` from now on (a rewire): its delegates say farewell
        to their senders, and wait for senders of pair `epoch` on the same ports."""
        for delegate in self.delegates:
            delegate.point(point_job(epoch), direction, peer)
        self.new_pair(direction, peer)

    def take(self, message: Message, buffer: torch.Tensor, timeout_s: float) -> Arrival:
        """Wait for the message's delegate to report it in, then copy it into `buffer`."""
        key = (message.iteration, message.seq)
        delegate = self.delegate_of(message.seq)
        deadline = time.monotonic() + timeout_s
        while key not in self.arrived:
            try:
                note = _read_note(delegate, deadline)
            except TimeoutError:
                what = describe(self.peer, message.kind, message.microbatch)
                raise TimeoutError(
                    f"waiting for {what} failed: its {delegate.name} received nothing within "
                    f"{timeout_s:g} s"
                ) from None
            kind, iteration, _, seq, offset, _, arrived_s, _, _ = note
            if kind == ARRIVED:
                if (iteration, seq) in self.arrived:
                    raise ConnectionError(f"the {delegate.name} had message {seq} twice")
                self.arrived[iteration, seq] = (offset, arrived_s)
        offset, arrived_s = self.arrived.pop(key)
        copy_start = time.monotonic()
        buffer.reshape(-1).copy_(self.slots.tensor(offset, buffer))
        return Arrival(arrived_s, time.monotonic() - copy_start)


class DelegateTransport:
    """A trainer's delegated link directions (the runtime's `DelegatedLinks`)."""

    def __init__(self, setup: DelegateSetup, delegates: Delegates) -> None:
        self._outbound: dict[LinkDirection, _Outbound] = {}
        self._inbound: dict[LinkDirection, _Inbound] = {}
        self.timeout_s = setup.timeout_s
        self._rank = setup.rank
        self._delegates = delegates
        self._closed_moves: list[tuple[LinkDirection, int | None, tuple]] = []  # type: ignore[type-arg]
        """FAILOVER notes of sender sides closed or re-pointed at a rewire, read then, with
        their direction and the replica the trainer played: the next `finish_iteration`'s
        failovers."""
        self._replica = setup.replica
        """The replica the trainer plays under its last wiring."""
        self._closed_failovers: list[Failover] = []
        """Failovers of sender sides closed or re-pointed at a rewire, not yet taken."""
        self._epoch = 0
        """How many rewires it has had: its new delegate pairs' epoch (every trainer rewires
        at once, as `DelegateSetup.exchange` needs: the same count on every trainer)."""
        try:
            self._wire(setup, setup.inbound, setup.outbound, [], [])
        except BaseException:
            self.close()
            raise

    def _wire(
        self,
        setup: DelegateSetup,
        inbound: tuple[tuple[LinkDirection, int], ...],
        outbound: tuple[tuple[LinkDirection, int], ...],
        spare_in: list[_Inbound],
        spare_out: list[_Outbound],
    ) -> None:
        """Wire these link directions to their peers' delegates: each over a spare side's
        delegates, pointed again, while there are spares (sides a rewire no longer uses),
        else over new ones (new senders start before the ports are exchanged, the
        receivers' starts meanwhile); the spares left over are closed once the ports are
        exchanged (no other trainer waits for that). The delegates are waited for at least
        `DELEGATE_START_S` however short the workers' timeout for one message (the
        pool's start-up is given longer still): many start at once, and a loaded host may
        not run one for seconds."""
        start_s = max(setup.timeout_s, DELEGATE_START_S)
        delegates = self._delegates
        here = ",".join(delegates.nics(setup.rank))
        ifnames = delegates.ifname_list()
        wired: list[_Side] = []
        for direction, peer in inbound:
            if spare_in:
                inbound_side = self._inbound[direction] = spare_in.pop()  # (closed if it fails)
                inbound_side.point(direction, peer, self._epoch)
            else:
                listen = [here, delegates.notice_address(setup.rank), ifnames]
                inbound_side = self._inbound[direction] = _Inbound(
                    direction, peer, setup.num_delegates, listen, setup.slot_dir
                )
            wired.append(inbound_side)
        sender_args = [str(delegates.timeout_ms), here, ifnames]
        for direction, peer in outbound[len(spare_out) :]:
            self._outbound[direction] = _Outbound(
                direction, peer, setup.num_delegates, sender_args, setup.slot_dir
            )
        mine = {d: self._inbound[d].offer(start_s, delegates.nic_ifnames()) for d, _ in inbound}
        theirs = setup.exchange(mine, tuple(d for d, _ in outbound))
        _check_reachable(
            setup.rank, delegates.nic_ifnames(), theirs, dict(outbound), setup.routes_down
        )
        theirs = {  # a route the fault hook failed is passed over as a NIC down
            d: offer._replace(nics_down=tuple(sorted({*offer.nics_down, *setup.routes_down[d]})))
            if setup.routes_down.get(d)
            else offer
            for d, offer in theirs.items()
        }
        for direction, peer in outbound:
            if direction not in self._outbound:
                self._outbound[direction] = spare_out.pop()
                self._closed_failovers += self._played(self._outbound[direction].failovers)
            outbound_side = self._outbound[direction]
            outbound_side.point(
                direction, peer, theirs[direction], delegates.nics(peer),
                delegates.notice_address(peer), self._epoch,
            )  # fmt: skip
            wired.append(outbound_side)
        while spare_in:
            spare_in.pop().leave()
        while spare_out:
            self._close(spare_out.pop())
        self._wait_ready(wired, start_s)

    def rewire(self, setup: DelegateSetup) -> None:
        # Per side: a worker may now send where it received, to the same peer (its partner's
        # and its own swaps undone in one step), and then needs a sender side, not the old one.
        self._epoch += 1
        spare_in = [self._inbound.pop(d) for d in _changed(self._inbound, setup.inbound)]
        spare_out = [self._outbound.pop(d) for d in _changed(self._outbound, setup.outbound)]
        try:
            self._wire(
                setup,
                tuple((d, p) for d, p in setup.inbound if d not in self._inbound),
                tuple((d, p) for d, p in setup.outbound if d not in self._outbound),
                spare_in,
                spare_out,
            )
        except BaseException:
            for side in [*spare_in, *spare_out]:  # those neither re-pointed nor closed yet
                side.close()
            self.close()
            raise
        self._replica = setup.replica

    def _played(self, failovers: list[Failover]) -> list[Failover]:
        """`failovers` of a side closed or re-pointed now, made under the last wiring: each
        names the replica its trainer played then."""
        return [
            f if f.replica is not None else f._replace(replica=self._replica) for f in failovers
        ]

    def move_state(self, outgoing: torch.Tensor, incoming: torch.Tensor, route: StateRoute) -> None:
        delegates = self._delegates
        move_state(
            outgoing,
            incoming,
            route,
            here=delegates.nics(self._rank),
            taker_nics=delegates.nics(route.taker),
            ifnames=delegates.nic_ifnames(),
            timeout_s=self.timeout_s,
            user_timeout_ms=delegates.timeout_ms,
        )

    def _close(self, side: _Outbound) -> None:
        """Close a sender side a rewire no longer uses, keeping its failovers: those not yet
        taken, and the moves its delegates noted since its last look, or finish as it
        closes (`_Outbound.hang_up`), read now (a rewire is an iteration's first work: they
        are the failovers of the iteration finished next, the one its trainer learns of
        them in)."""
        self._closed_failovers += self._played(side.failovers)
        num_nics = len(self._delegates.nics(side.peer))
        moves = side.hang_up(num_nics)
        self._closed_moves += [(side.direction, self._replica, note) for note in moves]

    def _sides(self) -> dict[LinkDirection, _Side]:
        """Every link direction this trainer sends or receives on (each has one side)."""
        return {**self._outbound, **self._inbound}

    def _wait_ready(self, sides: list[_Side], timeout_s: float) -> None:
        """Until every delegate of `sides` is connected to its peer (and done starting or
        re-pointing: idle); a sender's moves noted before that are kept (`_close`)."""
        deadline = time.monotonic() + timeout_s
        for side in sides:
            for process in list(side.delegates):
                try:
                    note = self._ready_note(side, process, deadline)
                except ConnectionError:  # (a LinkFailure too)
                    if not (isinstance(side, _Outbound) and side.re_pointed):
                        raise
                    # Its old receiver, leaving, may have refused or reset a move it made
                    # before it read its point: a new delegate is pointed in its place.
                    process = side.replace(process)
                    note = self._ready_note(side, process, deadline)
                kind, *_, nic, _, _, _ = note
                if kind != READY:
                    raise ConnectionError(f"the {process.name} did not connect")
                if isinstance(side, _Outbound):  # a NIC that failed to answer is left
                    side.nic_of[process.index] = side.route_nic = nic

    def _ready_note(self, side: _Side, process: _Process, deadline: float) -> tuple:  # type: ignore[type-arg]
        """The note `process` writes once connected; a sender's moves noted before it are
        kept, as its side's before the rewire (`moves_of`)."""
        note = _read_note(process, deadline)
        while note[0] == FAILOVER and isinstance(side, _Outbound):
            played = self._replica if side.re_pointed else None  # a new side's: its own
            self._closed_moves.append((side.moves_of, played, note))
            note = _read_note(process, deadline)
        return note

    @property
    def pids(self) -> list[int]:
        """Every delegate process of this trainer."""
        return [d.process.pid for side in self._sides().values() for d in side.delegates]

    def begin_iteration(
        self, sizes: dict[LinkDirection, tuple[int, int]], num_delegates: int | None = None
    ) -> None:
        """Slots for this iteration's delegated directions: (messages, bytes each); its
        messages go through the first `num_delegates` delegates of each (None: all)."""
        sides = self._sides()
        for direction, (num_messages, slot_bytes) in sizes.items():
            if direction not in sides:
                raise ValueError(f"no delegates for {direction}")
            sides[direction].begin(num_messages, slot_bytes, num_delegates)

    def post_receive(
        self, direction: LinkDirection, message: Message, buffer: torch.Tensor
    ) -> PendingReceive:
        return _DelegatedReceive(self._inbound[direction], message, buffer)

    def send(
        self,
        direction: LinkDirection,
        message: Message,
        payload: torch.Tensor,
        fault_ms: float,
        nic: int | None = None,
    ) -> None:
        side = self._outbound[direction]
        side.send(message, payload, fault_ms, nic)
        if nic is not None:
            side.route_nic = nic

    def route_nic(self, direction: LinkDirection) -> int:
        return self._outbound[direction].route_nic

    def finish_iteration(self, iteration: int) -> list[WireRecord]:
        self._closed_failovers += [_failover(d, iteration, n, r) for d, r, n in self._closed_moves]
        self._closed_moves.clear()
        records: list[WireRecord] = []
        for outbound in self._outbound.values():
            records += outbound.finish(iteration, self.timeout_s)
        return records

    def check(self) -> None:
        for outbound in self._outbound.values():
            outbound.check()

    def take_failovers(self) -> list[Failover]:
        taken = [f for outbound in self._outbound.values() for f in outbound.failovers]
        taken += self._closed_failovers
        for outbound in self._outbound.values():
            outbound.failovers = []
        self._closed_failovers = []
        return sorted(taken, key=lambda f: f.noticed_s)

    def close(self) -> None:
        for side in self._sides().values():
            side.close()
        self._outbound.clear()
        self._inbound.clear()
