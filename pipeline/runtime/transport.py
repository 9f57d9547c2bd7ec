"""Transports move messages between neighbouring stages, and the DP all-reduce's chunks
between a stage's replicas; every send passes the fault hook.

A message is tagged with its iteration, kind (activation or gradient), microbatch and a
sequence number; a DP chunk with its index on its link direction (`dp_tag`). `direct` is the
GPU-direct path: the send runs on the compute thread (so it blocks the next op: head-of-line
blocking), and the iteration's receives are posted up front, since blocking sends with late
receives deadlock under gloo (measured here); a DP bucket's receives are posted before its
ring's first send (pipeline.runtime.dp_ring). Who waits on a posted receive, and when, is
the receiver's business (receiver.py): gloo only marks a receive complete inside a `wait()` on
it. A send or a wait that gloo gives up on raises TimeoutError or ConnectionError naming what
it sent or waited for (`gloo_failure`), chained from gloo's RuntimeError.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Callable, Mapping
from typing import NamedTuple, Protocol

import torch
import torch.distributed as dist

from pipeline.allreduce import KIND
from pipeline.runtime.hooks import FaultHook
from pipeline.topology import Direction, is_dp_link, is_tied_link

__all__ = [
    "DELEGATE_START_S",
    "Arrival",
    "DelegateFactory",
    "DelegateOffer",
    "DelegateSetup",
    "DelegatedLinks",
    "DirectTransport",
    "Failover",
    "LinkDirection",
    "Message",
    "PendingReceive",
    "RingTransport",
    "StateOffer",
    "StateRoute",
    "WireRecord",
    "describe",
    "describe_chunk",
    "dp_tag",
    "gloo_failure",
    "route_kind",
]

ACTIVATION, GRADIENT = 0, 1

DELEGATE_START_S = 60.0
"""How long delegates may take to start, however short the workers' timeout for one message
(a `DelegateFactory`'s transport waits that long for its own; a worker as long for a
neighbour's ports, written once the neighbour's delegates have started): many start at
once, and a loaded host may not run one for seconds. With the workers' timeout, a host whose
delegates started 3 s after its neighbour's failed a pool of a 2 s timeout at its start, or
its swap."""

DP_TAG_BASE = 1 << 20
"""DP chunks' tags start here, above every PP message's (2 x microbatch + kind)."""


TIED_TAG = 1 << 22
"""The tag of the tied weight's gradient, swapped once per iteration (`DirectTransport`)."""


STATE_TAG = 1 << 23
"""The tag of a rank swap's model state (`DirectTransport.send_state`)."""


def dp_tag(index: int) -> int:
    """The tag of the DP chunk `index` of its link direction (pipeline.allreduce)."""
    return DP_TAG_BASE + index


def route_kind(link: str) -> str:
    """What a link direction's link names: "tied" (the tied route, pipeline.topology's
    `tied_link`), "dp" (a DP ring link, "dp1:0-1") or "pp"."""
    return "tied" if is_tied_link(link) else "dp" if is_dp_link(link) else "pp"


@dataclasses.dataclass(frozen=True, slots=True)
class Message:
    iteration: int
    kind: int  # ACTIVATION (sent downstream) or GRADIENT (sent upstream)
    microbatch: int
    seq: int
    """Position among this iteration's messages on this link direction."""

    @property
    def hook_kind(self) -> str:
        """Its kind as the fault hook names it: "F" (an activation) or "B" (a gradient)."""
        return "F" if self.kind == ACTIVATION else "B"

    @property
    def tag(self) -> int:
        # Receives of one iteration are all posted before it starts: (kind, microbatch) is
        # unique within an iteration and iterations never overlap.
        return 2 * self.microbatch + self.kind


def describe(peer: int, kind: int, microbatch: int, *, sending: bool = False) -> str:
    """A message in words, for errors: "the gradient of microbatch 3 from rank 2" (`sending`:
    "... to rank 2")."""
    what = "activation" if kind == ACTIVATION else "gradient"
    return f"the {what} of microbatch {microbatch} {'to' if sending else 'from'} rank {peer}"


def describe_chunk(peer: int, index: int, *, sending: bool = False) -> str:
    """A DP chunk in words, for errors: "all-reduce chunk 4 from rank 5" (`sending`: "to")."""
    return f"all-reduce chunk {index} {'to' if sending else 'from'} rank {peer}"


def gloo_failure(doing: str, err: RuntimeError) -> OSError:
    """gloo's error in a send or a wait as what it was, to raise from `err`: "{doing} failed:
    {gloo's text}". gloo raises RuntimeError for all; only its text tells a TimeoutError
    ("Timed out waiting 2000ms for recv"; "Application timeout caused pair closure": an
    earlier wait on the pair timed out) from a ConnectionError ("Connection reset by peer",
    "Connection closed by peer": a peer that died or broke off)."""
    text = str(err)
    timed_out = "timed out" in text.lower() or "timeout" in text.lower()
    kind = TimeoutError if timed_out else ConnectionError
    return kind(f"{doing} failed: {text}")


class Arrival(NamedTuple):
    """What a transport knows of a message it received."""

    arrived_s: float
    """When its last byte was in (host monotonic s), stamped where it landed."""
    copy_in_s: float = 0.0
    """How long copying it into the op's buffer took afterwards (the delegated path's copy
    to the device; 0 where it lands in the buffer)."""


class PendingReceive(Protocol):
    def wait(self, timeout_s: float) -> Arrival | None:
        """Block until the message is in its buffer; TimeoutError if it is not within
        `timeout_s`, ConnectionError if the connection to the peer broke. Its `Arrival` if
        the transport stamped one, else None (the waiter stamps it as the wait returns)."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class LinkDirection:
    """One direction of a PP link: forward carries activations, backward gradients."""

    link: str
    direction: Direction

    @classmethod
    def of(cls, link: str, kind: int) -> LinkDirection:
        return cls(link, Direction.FORWARD if kind == ACTIVATION else Direction.BACKWARD)


class WireRecord(NamedTuple):
    """A delegated message on the wire, as its sending trainer learns it."""

    direction: LinkDirection
    microbatch: int
    wire_start_s: float
    """When a delegate picked it up (its wait for the link's delay included)."""
    carrier_pid: int
    """The delegate process that carried it."""


class Failover(NamedTuple):
    """A sender delegate's move to another NIC, as its trainer learns it."""

    direction: LinkDirection
    iteration: int
    """The iteration its trainer learnt of it in, whose records hold it (a sibling's move, or
    one between iterations, also carried none of that iteration's messages)."""
    cause: str
    """What noticed the failure: "link state" (netlink: its own NIC went down), "notice"
    (its receiver's netlink, over the management plane: the far NIC), "timeout" (its
    connection broke or its data went unacked: the far NIC, with notices off), "fault hook"
    (the fault model has the route down: hook injection), "sibling" (another delegate of its
    link direction left that NIC: its trainer moved it)."""
    nic_from: int
    """The NIC it left, by index among the host's data-plane NICs (pipeline.topology)."""
    nic_to: int
    noticed_s: float
    resumed_s: float
    """When the new connection had taken over: connected, agreed the resume point, and sent
    again what the receiver lacked."""
    resume_seq: int
    """The first seq it sent again (-1: the receiver had everything)."""
    carrier_pid: int
    replica: int | None = None
    """The replica its trainer played when its delegate carried `direction`, where a rank
    swap has moved the trainer since (a side closed or re-pointed then: a PP link's name is
    every replica's); None: the one it plays now."""


class StateOffer(NamedTuple):
    """Where a rank swap's mover takes its new position's state: the port it listens on (on
    each of its data-plane NICs), and which of its NICs are down (by index)."""

    port: int
    nics_down: tuple[int, ...]

    def to_json(self) -> str:
        return json.dumps([self.port, self.nics_down])

    @classmethod
    def from_json(cls, text: str) -> StateOffer:
        port, down = json.loads(text)
        return cls(int(port), tuple(int(nic) for nic in down))


@dataclasses.dataclass(frozen=True)
class StateRoute:
    """A rank swap's model state for one mover: it sends the state of the position it left
    to rank `taker` (that position's new player) and takes its new position's from rank
    `giver` (the last player). `offer` tells the giver where this worker listens; `offer_of`
    waits for the taker's until a deadline (monotonic s) and raises `TimeoutError` after."""

    taker: int
    giver: int
    offer: Callable[[StateOffer], None]
    offer_of: Callable[[float], StateOffer]


class DelegateOffer(NamedTuple):
    """Where a link direction's receiver delegates take their senders: one port per delegate
    (each listening on every data-plane NIC of its host), and which of that host's NICs are
    down (by index) when offered: the senders start on the first NIC up at both ends."""

    ports: tuple[int, ...]
    nics_down: tuple[int, ...]

    def to_json(self) -> str:
        return json.dumps([self.ports, self.nics_down])

    @classmethod
    def from_json(cls, text: str) -> DelegateOffer:
        ports, down = json.loads(text)
        return cls(tuple(int(port) for port in ports), tuple(int(nic) for nic in down))


@dataclasses.dataclass(frozen=True)
class DelegateSetup:
    """What a worker's delegates are wired to: the link directions it sends and receives on,
    each with its peer rank, D delegates per direction and side, and `exchange`, which swaps
    the receiving delegates' offers with the neighbours (through the pool's folder): it
    takes this worker's offers by inbound direction (the ones being wired) and the outbound
    directions being wired, and returns the neighbours' offers for those. `routes_down`:
    per outbound direction, the NICs (by index) whose route the fault hook has failed as
    the rewire starts (hook injection: a new pair starts past them, as past the NICs down
    at either host; none on the testbed, where the NICs are down for real)."""

    rank: int
    slot_dir: str
    """Where its shared files go (the pool's own folder, which the pool removes)."""
    inbound: tuple[tuple[LinkDirection, int], ...]
    outbound: tuple[tuple[LinkDirection, int], ...]
    num_delegates: int
    timeout_s: float
    exchange: Callable[
        [dict[LinkDirection, DelegateOffer], tuple[LinkDirection, ...]],
        dict[LinkDirection, DelegateOffer],
    ]
    routes_down: Mapping[LinkDirection, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    replica: int = 0
    """The replica the worker plays under the placement wired (its failovers' records name
    the concrete PP link by it)."""


class DelegatedLinks(Protocol):
    """A worker's delegated link directions (adaptra.transport provides them)."""

    @property
    def pids(self) -> list[int]:
        """Its delegate processes."""
        ...

    def begin_iteration(
        self, sizes: dict[LinkDirection, tuple[int, int]], num_delegates: int | None = None
    ) -> None:
        """Slots for this iteration's delegated directions: (messages, bytes each); its
        messages go through the first `num_delegates` delegates of each (None: all)."""
        ...

    def post_receive(
        self, direction: LinkDirection, message: Message, buffer: torch.Tensor
    ) -> PendingReceive: ...

    def send(
        self,
        direction: LinkDirection,
        message: Message,
        payload: torch.Tensor,
        fault_ms: float,
        nic: int | None = None,
    ) -> None:
        """Hand the message over (copying it out) and return; its delegate waits `fault_ms`
        (the link's delay) and carries it over data-plane NIC `nic` (the fault hook's route:
        a delegate on another NIC fails over to it first; None: over the NIC its delegate
        is on)."""
        ...

    def route_nic(self, direction: LinkDirection) -> int:
        """The NIC the last `send` on outbound `direction` named (before any since its
        delegates were wired: the NIC they started on)."""
        ...

    def finish_iteration(self, iteration: int) -> list[WireRecord]:
        """Once every op ran: wait until every message handed over is on the wire."""
        ...

    def take_failovers(self) -> list[Failover]:
        """The failovers its delegates noted since the last call, in the order noticed."""
        ...

    def check(self) -> None:
        """Raise `LinkFailure` if a sender delegate has found no NIC left to carry its link
        direction: called while the worker waits on a message, so that the failure, not the
        wait's timeout, ends the iteration."""
        ...

    def move_state(self, outgoing: torch.Tensor, incoming: torch.Tensor, route: StateRoute) -> None:
        """A rank swap's model state (host tensors of bytes): `outgoing` to `route.taker`,
        `incoming` filled from `route.giver`, over the data-plane NIC the delegates would
        take (the first up at both ends), not the process group."""
        ...

    def rewire(self, setup: DelegateSetup) -> None:
        """Wire to `setup`'s neighbours (a rank swap): a link direction whose peer stays
        keeps its delegates, one whose peer changed (or that is new) gets new ones, one no
        longer used is closed; both ends of a changed route do this at once."""
        ...

    def close(self) -> None: ...


class DelegateFactory(Protocol):
    """Picklable: the pool ships it to every worker, which calls it once it has joined."""

    def connect(self, setup: DelegateSetup) -> DelegatedLinks: ...


class RingTransport(Protocol):
    """How a DP ring's chunks go (pipeline.runtime.dp_ring): `DirectTransport`'s methods."""

    def post_dp_receive(self, peer: int, index: int, buffer: torch.Tensor) -> PendingReceive: ...

    def send_dp(
        self, peer: int, link: str, direction: Direction, iteration: int, index: int,
        payload: torch.Tensor,
    ) -> float: ...  # fmt: skip


class _GlooReceive:
    def __init__(self, work: dist.Work, what: str) -> None:
        self._work = work
        self._what = what

    def wait(self, timeout_s: float) -> None:
        try:
            self._work.wait(dt.timedelta(seconds=timeout_s))
        except RuntimeError as err:
            raise gloo_failure(f"waiting for {self._what}", err) from err


class DirectTransport:
    """gloo point-to-point on the caller's thread, receives pre-posted (`irecv`)."""

    def __init__(self, fault_hook: FaultHook, timeout_s: float) -> None:
        """`timeout_s`: how long a send may wait (the process group's own timeout is longer:
        a pool's start-up bound, for its rendezvous)."""
        self.fault_hook = fault_hook
        self.timeout_s = timeout_s
        self.bytes_sent = 0

    def post_receive(self, peer: int, message: Message, buffer: torch.Tensor) -> PendingReceive:
        return self._post(
            peer, message.tag, buffer, describe(peer, message.kind, message.microbatch)
        )

    def post_dp_receive(self, peer: int, index: int, buffer: torch.Tensor) -> PendingReceive:
        """The DP chunk `index` from rank `peer` (its sender's link direction's numbering)."""
        return self._post(peer, dp_tag(index), buffer, describe_chunk(peer, index))

    def _post(self, peer: int, tag: int, buffer: torch.Tensor, what: str) -> PendingReceive:
        work = dist.irecv(buffer, src=peer, tag=tag)
        if work is None:
            raise RuntimeError(f"irecv from rank {peer} returned no handle")
        return _GlooReceive(work, what)

    def send(self, peer: int, link: str, message: Message, payload: torch.Tensor) -> float:
        """Send through the fault hook; the delay it injected, in ms. TimeoutError or
        ConnectionError (`gloo_failure`) if the send fails, naming the message."""
        direction = Direction.FORWARD if message.kind == ACTIVATION else Direction.BACKWARD
        num_bytes = payload.numel() * payload.element_size()
        fault_ms = self.fault_hook(
            link, direction, message.iteration, message.hook_kind, message.microbatch, num_bytes
        )
        what = describe(peer, message.kind, message.microbatch, sending=True)
        _send(payload, peer, message.tag, f"sending {what} on link {link}", self.timeout_s)
        self.bytes_sent += num_bytes
        return fault_ms

    def send_dp(
        self,
        peer: int,
        link: str,
        direction: Direction,
        iteration: int,
        index: int,
        payload: torch.Tensor,
    ) -> float:
        """Send DP chunk `index` on DP link `link` ("dp1:0-1") through the fault hook (kind
        "AR", the index in place of a microbatch); the delay it injected, in ms."""
        num_bytes = payload.numel() * payload.element_size()
        fault_ms = self.fault_hook(link, direction, iteration, KIND, index, num_bytes)
        what = describe_chunk(peer, index, sending=True)
        _send(payload, peer, dp_tag(index), f"sending {what} on link {link}", self.timeout_s)
        self.bytes_sent += num_bytes
        return fault_ms

    def post_tied_receive(self, peer: int, buffer: torch.Tensor) -> PendingReceive:
        """The tied weight's gradient from rank `peer` (pipeline.topology's `tied_link`)."""
        return self._post(peer, TIED_TAG, buffer, f"the tied weight's gradient from rank {peer}")

    def send_tied(self, peer: int, link: str, payload: torch.Tensor) -> None:
        """The tied weight's gradient to rank `peer`: no fault hook (pipeline.topology's
        `tied_link`)."""
        what = f"the tied weight's gradient to rank {peer}"
        _send(payload, peer, TIED_TAG, f"sending {what} on {link}", self.timeout_s)
        self.bytes_sent += payload.numel() * payload.element_size()

    def post_state_receive(self, peer: int, buffer: torch.Tensor) -> PendingReceive:
        """A rank swap's model state from rank `peer`, the last player of this worker's new
        position: no fault hook (it is not a training message; on the testbed it crosses the
        wire all the same)."""
        return self._post(peer, STATE_TAG, buffer, f"the model state from rank {peer}")

    def send_state(self, peer: int, payload: torch.Tensor) -> None:
        """The model state of the position this worker left, to its new player `peer`."""
        _send(payload, peer, STATE_TAG, f"sending the model state to rank {peer}", self.timeout_s)
        self.bytes_sent += payload.numel() * payload.element_size()


def _send(payload: torch.Tensor, peer: int, tag: int, doing: str, timeout_s: float) -> None:
    """A blocking gloo send, for up to `timeout_s`; its failure as `gloo_failure` says,
    naming what it sent."""
    try:
        work = dist.isend(payload, dst=peer, tag=tag)
        assert work is not None
        work.wait(dt.timedelta(seconds=timeout_s))
    except RuntimeError as err:
        raise gloo_failure(doing, err) from err
