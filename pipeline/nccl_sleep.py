"""The paper's GPU path as its artifact ran it: NCCL point-to-point messages, one dispatch
queue per GPU, and each injected delay a sleep kernel before a send (`CommMode.NCCL_SLEEP`).

What the authors' artifact (github wutianyuan1/PipeMorph) does, and what this times:
- A slow link's delay is a one-thread sleep kernel launched on the sending GPU's NCCL stream
  right before each `ncclSend` across it (its `failslow_injection`, preloaded into every
  trainer). The injector reads the peer's rank in the send's communicator as 0: the previous
  stage, 1: the next stage, any other rank: that stage.
- Its launcher sets `CUDA_DEVICE_MAX_CONNECTIONS=1`: one hardware queue per GPU, so a kernel
  that must wait for an earlier one on its stream holds back every kernel queued after it.
  A send waiting for its sleep holds back the sender's next compute kernel; a receive queued
  behind a send that has not met its peer holds back what follows it.
- Schedules with a fused backward (1F1B) run Megatron's schedule: after each op one batched
  call (`batch_isend_irecv` over the PP group's communicator, whose ranks are the stages)
  sends the op's output and, if the next op's input comes from the same neighbour, receives
  it in the same call; otherwise that receive is a call of its own. Every call ends in
  `torch.cuda.synchronize()`. On that communicator the injector's reading of ranks 0 and 1
  is wrong for one sender: stage 2's sends to stage 1 sleep for link 2-3 (and, at three
  stages, for no link: its rank 3 is no stage).
- The misreading is the injector's: it picks the sleep, not the wire. A send goes over its
  own link (stage 2 to 1 over 1-2), fails where that link's route is down, and takes that
  link's cap (a fault's `bandwidth_gbps`: the wire's rate, no sleep) as more wire time, where
  a send counted right takes it too (`SleepFor`).
- Split schedules (B and W) run ZeroBubble's runtime: every send and receive is its own
  `isend` / `irecv` on a two-rank communicator (one stream per neighbour, first in first
  out), placed in the stage's order at the fault-free time its message is sent (a receive
  that overlaps the op before it is posted before that op); the sends and receives next to
  each other in that order are posted together, an op waits for all of those posted with its
  input, and sends are waited for at the end of the iteration.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Mapping, Sequence

from pipeline.errors import ScheduleError
from pipeline.ops import Op, OpKind
from pipeline.topology import Direction

__all__ = [
    "FaultFreeTimes",
    "LinkDirection",
    "Message",
    "NcclMessage",
    "SleepFor",
    "time_replica",
]

Message = tuple[str, int]
"""A message's name: ("F", m) an activation, ("B", m) a gradient of microbatch m."""

LinkDirection = tuple[int, Direction]
"""A PP link direction: (link index, its direction)."""

SleepFor = Callable[[LinkDirection, LinkDirection | None, Message, float], tuple[float, float]]
"""(the send's own link direction, the one the injector counts it on (None: none), message,
ms since the iteration began at the send) -> (the sleep the injector puts before the send:
the counted link direction's injected delay; what a cap on the send's own link direction
adds to its wire time); it raises where the send's own route is down."""


@dataclasses.dataclass(eq=False, slots=True)
class _Comm:
    """One send or receive of one message, as its stage's GPU sees it."""

    stage: int
    peer: int
    is_send: bool
    message: Message
    group: int
    """Sends and receives of one batched call share it: posted and sleeping together."""
    dispatch_ms: float | None = None
    sleep_ms: float = 0.0
    cap_ms: float = 0.0
    """A send's: what a cap on its own link adds to its wire time."""
    ready_ms: float | None = None
    """Dispatched and past its sleep: it may meet its peer's matching send or receive."""
    done_ms: float | None = None


@dataclasses.dataclass(eq=False, slots=True)
class _Compute:
    op: Op
    waits: list[_Comm]
    end_ms: float | None = None
    start_ms: float = 0.0
    asked_ms: float = 0.0
    """When its GPU's queue reached it: it then waits for what was posted with its input."""


_Item = _Comm | _Compute


@dataclasses.dataclass(frozen=True, slots=True)
class NcclMessage:
    """One message as it went: for the timeline's records."""

    sender: int
    receiver: int
    message: Message
    sent_ms: float
    """When the op producing it ended."""
    sleep_ms: float
    cap_ms: float
    """What a cap on its own link added to its wire time (after `wire_start_ms`)."""
    wire_start_ms: float
    """When send and receive met (both posted, the sleep over)."""
    arrival_ms: float
    asked_ms: float
    """When the receiver's GPU reached the op that takes it in."""


def _input_of(op: Op, stage: int, num_stages: int) -> tuple[int, Message] | None:
    """The neighbour an op takes its input from, and the message."""
    if op.kind is OpKind.F and stage > 0:
        return stage - 1, ("F", op.microbatch)
    if op.kind in (OpKind.B, OpKind.BW) and stage < num_stages - 1:
        return stage + 1, ("B", op.microbatch)
    return None


def _output_of(op: Op, stage: int, num_stages: int) -> tuple[int, Message] | None:
    """The neighbour an op sends its output to, and the message."""
    if op.kind is OpKind.F and stage < num_stages - 1:
        return stage + 1, ("F", op.microbatch)
    if op.kind in (OpKind.B, OpKind.BW) and stage > 0:
        return stage - 1, ("B", op.microbatch)
    return None


def _megatron_program(ops: Sequence[Op], stage: int, num_stages: int) -> list[_Item]:
    """Megatron's 1F1B calls around one stage's ops, one group per call."""
    items: list[_Item] = []
    received: dict[Message, _Comm] = {}
    group = 0

    def receive(op: Op) -> None:
        source = _input_of(op, stage, num_stages)
        if source is not None:
            received[source[1]] = _Comm(stage, source[0], False, source[1], group)
            items.append(received[source[1]])

    if ops:
        receive(ops[0])
    for j, op in enumerate(ops):
        source = _input_of(op, stage, num_stages)
        items.append(_Compute(op, [received.pop(source[1])] if source is not None else []))
        group += 1
        destination = _output_of(op, stage, num_stages)
        if destination is not None:
            items.append(_Comm(stage, destination[0], True, destination[1], group))
        if j + 1 < len(ops):
            following = _input_of(ops[j + 1], stage, num_stages)
            if destination is not None and (following is None or following[0] != destination[0]):
                group += 1  # not the same neighbour: the receive is a call of its own
            receive(ops[j + 1])
    return items


FaultFreeTimes = Mapping[tuple[int, Op], tuple[float, float]]
"""(stage, op) -> its (start, end) with nothing injected (the simulator's `ideal` mode)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Passing:
    """One message of a replica between two neighbours, at its fault-free send time."""

    sender: int
    receiver: int
    message: Message
    sent_ms: float


_Node = tuple[int, Op] | _Passing
"""A replica's op (its stage, the op) or message, in ZeroBubble's posting order."""


def _posting_order(stages: Sequence[Sequence[Op]], times: FaultFreeTimes) -> list[_Node]:
    """Every op and message of a replica in the order ZeroBubble's runtime posts them: by
    fault-free time (an op at its start, a message at its producer's end), at equal times
    messages first, in one order both neighbours share (by sender, kind, microbatch); but
    never a message before the op producing it, nor an op before its input or before the op
    ahead of it on its stage (equal times allow both: zero-length ops)."""
    num_stages = len(stages)
    rank: dict[_Node, tuple[float, int, int, int]] = {}
    followers: dict[_Node, list[_Node]] = {}
    taker: dict[tuple[int, Message], _Node] = {}  # (receiver, message) -> the op taking it
    for s, ops in enumerate(stages):
        for k, op in enumerate(ops):
            rank[s, op] = (times[s, op][0], 1, s, k)
            followers[s, op] = [(s, ops[k + 1])] if k + 1 < len(ops) else []
            source = _input_of(op, s, num_stages)
            if source is not None:
                taker[s, source[1]] = (s, op)
    for s, ops in enumerate(stages):
        for kind in (OpKind.F, OpKind.B, OpKind.BW):
            for op in sorted(o for o in ops if o.kind is kind):
                output = _output_of(op, s, num_stages)
                if output is None:
                    continue
                passing = _Passing(s, output[0], output[1], times[s, op][1])
                if (passing.receiver, passing.message) not in taker:
                    raise ScheduleError(f"stage {passing.receiver}: no op takes in {output[1]}")
                rank[passing] = (passing.sent_ms, 0, len(rank), 0)
                followers[s, op].append(passing)
                followers[passing] = [taker[passing.receiver, passing.message]]
    num_waiting = dict.fromkeys(rank, 0)
    for nodes in followers.values():
        for node in nodes:
            num_waiting[node] += 1
    ready = [(rank[node], node) for node, count in num_waiting.items() if count == 0]
    heapq.heapify(ready)  # ranks are unique: nodes are never compared
    order: list[_Node] = []
    while ready:
        _, node = heapq.heappop(ready)
        order.append(node)
        for follower in followers[node]:
            num_waiting[follower] -= 1
            if num_waiting[follower] == 0:
                heapq.heappush(ready, (rank[follower], follower))
    if len(order) < len(rank):
        raise ScheduleError("the schedule's ops wait on each other at one instant")
    return order


def _by_stage(posting: Sequence[_Node], num_stages: int) -> list[list[_Node]]:
    """Each stage's share of a replica's posting order: its ops and the messages it sends or
    takes in, in that order."""
    shares: list[list[_Node]] = [[] for _ in range(num_stages)]
    for node in posting:
        if isinstance(node, _Passing):
            shares[node.sender].append(node)
            shares[node.receiver].append(node)
        else:
            shares[node[0]].append(node)
    return shares


def _zero_bubble_program(
    posting: Sequence[_Node], stage: int, num_stages: int, times: FaultFreeTimes
) -> list[_Item]:
    """ZeroBubble's runtime order for one stage, from its share of the replica's posting order
    (`_by_stage`): its ops, sends and receives in that order, a receive overlapping the op
    before it posted before that op."""
    nodes: list[tuple[float, Op | _Comm]] = []
    for posted_node in posting:
        if isinstance(posted_node, _Passing):
            sending = posted_node.sender == stage
            peer = posted_node.receiver if sending else posted_node.sender
            nodes.append((posted_node.sent_ms, _Comm(stage, peer, sending, posted_node.message, 0)))
        else:
            nodes.append((times[posted_node][0], posted_node[1]))
    for k in range(1, len(nodes)):  # a receive overlapping the op before it is posted first
        (_, before), (when, current) = nodes[k - 1], nodes[k]
        receive = isinstance(current, _Comm) and not current.is_send
        if receive and isinstance(before, Op) and when <= times[stage, before][1]:
            nodes[k - 1], nodes[k] = nodes[k], nodes[k - 1]
    order = [node for _, node in nodes]
    next_input: list[Message | None] = [None] * len(order)  # the next op's input, from k on
    following: Message | None = None
    for k in range(len(order) - 1, -1, -1):
        item = order[k]
        if isinstance(item, Op):
            source = _input_of(item, stage, num_stages)
            following = None if source is None else source[1]
        next_input[k] = following
    items: list[_Item] = []
    posted: list[_Comm] = []  # sends and receives posted together
    waits: dict[Message, list[_Comm]] = {}
    for k, node in enumerate(order):
        if isinstance(node, Op):
            source = _input_of(node, stage, num_stages)
            items.append(_Compute(node, waits.pop(source[1], []) if source else []))
            continue
        node.group = len(items) + 1  # each its own isend / irecv
        items.append(node)
        posted.append(node)
        consumed = not node.is_send and next_input[k] == node.message
        if consumed or k + 1 == len(order) or isinstance(order[k + 1], Op):
            for comm in posted:
                if not comm.is_send:
                    waits[comm.message] = list(posted)
            posted = []
    return items


def _own_link(sender: int, receiver: int) -> LinkDirection:
    """The link direction a send between neighbours goes over."""
    return min(sender, receiver), Direction.between(sender, receiver)


def _injected_link(
    sender: int, receiver: int, num_stages: int, batched: bool
) -> LinkDirection | None:
    """The link direction the artifact's injector counts a send on: it takes peer rank 0 for
    the previous stage and 1 for the next, right on a two-rank communicator and, on the PP
    group's (Megatron's batched calls), wrong for stage 2's sends to stage 1."""
    peer = receiver
    if batched and receiver in (0, 1):
        peer = sender - 1 if receiver == 0 else sender + 1
    if abs(peer - sender) != 1 or not 0 <= peer < num_stages:
        return None
    return _own_link(sender, peer)


def _known(times: list[float | None]) -> list[float]:
    return [t for t in times if t is not None]


def _execute(
    programs: list[list[_Item]],
    duration_ms: Callable[[int, Op], float],
    wire_ms: float,
    sleep_for: SleepFor,
    start_ms: float,
    *,
    synchronize: bool,
) -> None:
    """Dispatch every stage's items in order on its GPU's one queue: an item goes when the
    item before it has gone and what it waits for is done (a compute: the previous compute
    and its waits; a send or receive: the one before it on its stream unless posted with it,
    and the compute before it); a send's sleep holds the queue. `synchronize`: after each
    call the next item waits for everything before it (torch.cuda.synchronize)."""
    num_stages = len(programs)
    partner: dict[tuple[int, int, Message, bool], _Comm] = {}
    for items in programs:
        for item in items:
            if isinstance(item, _Comm):
                sender = item.stage if item.is_send else item.peer
                partner[sender, item.stage if not item.is_send else item.peer, item.message,
                        item.is_send] = item  # fmt: skip
    position = [0] * num_stages
    queue_ms = [start_ms] * num_stages  # the last dispatch, or the end of a sleep holding it
    compute_ms = [start_ms] * num_stages  # the end of the last compute
    last_on_stream: dict[tuple[int, int], _Comm] = {}
    unfinished: list[list[_Comm]] = [[] for _ in range(num_stages)]  # (synchronize)
    calls: dict[tuple[int, int], list[_Comm]] = {}  # (stage, group) -> its sends and receives
    for stage, items in enumerate(programs):
        for item in items:
            if isinstance(item, _Comm):
                calls.setdefault((stage, item.group), []).append(item)

    def meet(comm: _Comm) -> None:
        sender = comm.stage if comm.is_send else comm.peer
        receiver = comm.peer if comm.is_send else comm.stage
        other = partner.get((sender, receiver, comm.message, not comm.is_send))
        if other is None:
            raise ScheduleError(f"stage {comm.stage}: no stage takes part in {comm.message}")
        if other.ready_ms is not None and comm.ready_ms is not None:
            cap_ms = comm.cap_ms if comm.is_send else other.cap_ms  # the send's own link's
            comm.done_ms = other.done_ms = max(comm.ready_ms, other.ready_ms) + wire_ms + cap_ms

    progress = True
    while progress:
        progress = False
        for stage, items in enumerate(programs):
            while position[stage] < len(items):
                item = items[position[stage]]
                waits = [c.done_ms for c in unfinished[stage]] if synchronize else []
                if isinstance(item, _Compute):
                    waits += [c.done_ms for c in item.waits]
                    if None in waits:
                        break
                    item.asked_ms = max(queue_ms[stage], compute_ms[stage])
                    start = max([item.asked_ms, *_known(waits)])
                    item.start_ms, item.end_ms = start, start + duration_ms(stage, item.op)
                    queue_ms[stage], compute_ms[stage] = start, item.end_ms
                    unfinished[stage] = [c for c in unfinished[stage] if c.done_ms is None]
                else:
                    before = last_on_stream.get((stage, item.peer))
                    same_call = before is not None and before.group == item.group
                    if before is not None and not same_call:
                        waits.append(before.done_ms)
                    if synchronize and same_call:
                        waits = []
                    if None in waits:
                        break
                    if same_call:
                        assert before is not None and before.dispatch_ms is not None
                        item.dispatch_ms = before.dispatch_ms
                    else:
                        item.dispatch_ms = max([queue_ms[stage], compute_ms[stage], *_known(waits)])
                    if item.is_send:  # its own route decides whether it goes at all
                        injected = _injected_link(stage, item.peer, num_stages, synchronize)
                        own = _own_link(stage, item.peer)
                        offset_ms = item.dispatch_ms - start_ms
                        item.sleep_ms, item.cap_ms = sleep_for(
                            own, injected, item.message, offset_ms
                        )
                    group = calls[stage, item.group]
                    sleep_ms = max(c.sleep_ms for c in group)
                    for comm in group:  # a later send of the call raises the call's sleep
                        if comm.dispatch_ms is not None:
                            comm.ready_ms = item.dispatch_ms + sleep_ms
                    queue_ms[stage] = item.dispatch_ms + sleep_ms
                    last_on_stream[stage, item.peer] = item
                    unfinished[stage].append(item)
                    for comm in group:
                        if comm.ready_ms is not None:
                            meet(comm)
                position[stage] += 1
                progress = True
    if any(position[s] < len(items) for s, items in enumerate(programs)):
        stuck = [s for s, items in enumerate(programs) if position[s] < len(items)]
        raise ScheduleError(
            f"stages {stuck} wait on each other's sends and receives (their NCCL order deadlocks)"
        )


def time_replica(
    stages: Sequence[Sequence[Op]],
    duration_ms: Callable[[int, Op], float],
    wire_ms: float,
    sleep_for: SleepFor,
    start_ms: float,
    fault_free: Callable[[], FaultFreeTimes],
) -> tuple[list[tuple[int, Op, float, float]], list[NcclMessage], list[float]]:
    """Time one replica's pipeline: its ops (stage, op, start, end), its messages, and when
    each stage is done (its last op and its last send). `fault_free`: the schedule's times
    with nothing injected, where ZeroBubble's runtime places its sends and receives."""
    num_stages = len(stages)
    fused = any(op.kind is OpKind.BW for ops in stages for op in ops)
    if fused:
        programs = [_megatron_program(ops, s, num_stages) for s, ops in enumerate(stages)]
    else:
        times = fault_free()
        shares = _by_stage(_posting_order(stages, times), num_stages)
        programs = [
            _zero_bubble_program(share, s, num_stages, times) for s, share in enumerate(shares)
        ]
    _execute(programs, duration_ms, wire_ms, sleep_for, start_ms, synchronize=fused)
    ops: list[tuple[int, Op, float, float]] = []
    sent: dict[tuple[int, Message], float] = {}
    asked: dict[tuple[int, Message], float] = {}  # (receiver, message) -> its consumer's
    done = [start_ms] * num_stages
    for stage, items in enumerate(programs):
        for item in items:
            if isinstance(item, _Compute):
                assert item.end_ms is not None
                ops.append((stage, item.op, item.start_ms, item.end_ms))
                output = _output_of(item.op, stage, num_stages)
                if output is not None:
                    sent[stage, output[1]] = item.end_ms
                source = _input_of(item.op, stage, num_stages)
                if source is not None:
                    asked[stage, source[1]] = item.asked_ms
                done[stage] = max(done[stage], item.end_ms)
            elif item.is_send:
                assert item.done_ms is not None
                done[stage] = max(done[stage], item.done_ms)
    messages = []
    for stage, items in enumerate(programs):
        for item in items:
            if isinstance(item, _Comm) and item.is_send:
                assert item.done_ms is not None
                messages.append(
                    NcclMessage(
                        stage,
                        item.peer,
                        item.message,
                        sent[stage, item.message],
                        item.sleep_ms,
                        item.cap_ms,
                        item.done_ms - wire_ms - item.cap_ms,
                        item.done_ms,
                        asked[item.peer, item.message],
                    )
                )
    return ops, messages, done
