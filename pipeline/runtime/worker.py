"""The worker process: joins the process group once, then runs iterations on command.

Each iteration comes in two commands. On the first (the iteration's config) a worker sets it
up: it posts a receive for every message its neighbours will send it, starts a receiver
thread per neighbour to see each one arrive (receiver.py), builds the DP ring's buffers and
lets its compute backend prepare, then says it is ready. On the second (the start time, which
the pool picks once every worker is ready) it runs its stage's ops in order on this, the
compute thread: take the op's message, compute, send the result. The
step follows: the DP all-reduce's ring with the stage's other replicas (dp_ring.py: megatron's
real gradient, the emulated backend's zeros), then the first and last stage sum their tied
weight's gradient (megatron's tied embedding; in megatron's order, after the DP sum, so that
both copies get the same bits whatever the ring's summation order), then the compute
backend's own end of the iteration (emulated: the optimizer's time; megatron: SGD). Each of
these routes goes over gloo or, where the plan delegates its link direction, over the
worker's delegates (which fail over between NICs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as dist

from pipeline.allreduce import (
    KIND,
    largest_chunk_bytes,
    messages_per_link_direction,
    ring_peer,
)
from pipeline.errors import ConfigError
from pipeline.files import write_atomic
from pipeline.ops import Op, OpKind
from pipeline.runtime.compute import ComputeBackend
from pipeline.runtime.config import IterationConfig, RankResult, StateMove
from pipeline.runtime.devices import RankDevices, choose_devices, num_visible_gpus
from pipeline.runtime.dp_ring import Ring
from pipeline.runtime.hooks import FaultHook, FaultViewHook
from pipeline.runtime.receiver import THREAD_WAIT_S, Receiver
from pipeline.runtime.remote_error import RemoteError
from pipeline.runtime.transport import (
    ACTIVATION,
    DELEGATE_START_S,
    GRADIENT,
    DelegatedLinks,
    DelegateFactory,
    DelegateOffer,
    DelegateSetup,
    DirectTransport,
    Failover,
    LinkDirection,
    Message,
    PendingReceive,
    RingTransport,
    StateOffer,
    StateRoute,
    WireRecord,
    describe,
    route_kind,
)
from pipeline.topology import Direction, Position, Topology, link_name, tied_link

__all__ = [
    "DOING",
    "PROGRESS",
    "PROGRESS_INTERVAL_S",
    "SWITCH_INTERVAL_S",
    "Progress",
    "configure_threads",
    "join",
    "worker_devices",
    "worker_main",
]

PLACING = "the move back to the default placement"
"""What a worker's error between iterations names (`_Worker.place`)."""

PROGRESS = "progress"
"""The status of a worker's word to the pool that is no answer: its iteration moves on. The
word's payload: what the worker does now, in words (`Progress`)."""

DOING = "doing"
"""The status of a worker's word to the pool that is neither an answer nor progress: what it
does now, in words (`Progress`); the pool's wait for progress goes on."""

START_UP_S = 120.0
START_UP_PER_RANK_S = 15.0
"""How long workers may take to start (join the group; megatron imports megatron-core and
builds its stage): START_UP_S, or START_UP_PER_RANK_S per rank for larger pools (their start
shares the machine's cores); load stretches it, and it does not depend on the pool's per-wait
timeout: the pool waits that long for their ready messages, and each worker that long for the
others to join its process group (`join`)."""


def start_up_limit_s(num_ranks: int) -> float:
    """How long `num_ranks` workers may take to start (START_UP_S)."""
    return max(START_UP_S, START_UP_PER_RANK_S * num_ranks)


SWITCH_INTERVAL_S = 0.0005
"""A worker's GIL switch interval (Python's default: 5 ms). A receiver thread that must stamp
an arrival while the compute thread runs Python waits about this long for the GIL; it costs
the compute thread nothing while no other thread asks for the GIL (BENCHMARKS.md)."""


_MESSAGE_KIND = {OpKind.F: ACTIVATION, OpKind.B: GRADIENT, OpKind.BW: GRADIENT}
"""What an op takes in and sends on: F an activation (from upstream, on downstream), B and BW a
gradient (from downstream, on upstream); W neither."""

_DIRECTION = {ACTIVATION: Direction.FORWARD, GRADIENT: Direction.BACKWARD}

_WAITING, _COMPUTING, _SENDING = "waiting", "computing", "sending"
"""An op's phases (`_Worker.doing`)."""

_STARTING = "starting its iteration"
"""What a worker does before its iteration's first part (`_Worker.doing`)."""


def _sent_microbatches(ops: Sequence[Op], msg_kind: int) -> list[int]:
    """The microbatches whose `msg_kind` messages a stage running `ops` sends, in order."""
    return [op.microbatch for op in ops if _MESSAGE_KIND.get(op.kind) == msg_kind]


class _Route(NamedTuple):
    """A route of the step's gradient sums (the tied weight's, the DP ring's): the peer's
    rank, the link direction this worker sends on to it and the one it receives on from it
    (None: not this route's)."""

    peer: int
    sends: LinkDirection | None
    receives: LinkDirection | None


@dataclasses.dataclass(frozen=True, slots=True)
class _Inbound:
    """One neighbour's messages of one iteration: their link and direction, the thread
    receiving them, and their buffers by microbatch."""

    link: str
    direction: Direction
    receiver: Receiver
    buffers: dict[int, torch.Tensor]


@dataclasses.dataclass(frozen=True, slots=True)
class _Records:
    """A rank's records of its ops, in `RankResult`'s forms."""

    ops: list[tuple[str, int, float, float]] = dataclasses.field(default_factory=list)
    sends: list[tuple[str, Direction, int, int, float, float, float, float, int]] = (
        dataclasses.field(default_factory=list)
    )
    receives: list[tuple[str, Direction, int, float, float, float]] = dataclasses.field(
        default_factory=list
    )
    failovers: list[Failover] = dataclasses.field(default_factory=list)

    def add_wire(self, wire: list[WireRecord]) -> None:
        """The delegates' side of the delegated sends: when each went on the wire, and who
        carried it."""
        carried = {(w.direction.link, w.direction.direction, w.microbatch): w for w in wire}
        for i, send in enumerate(self.sends):
            w = carried.get((send[0], send[1], send[2]))
            if w is not None:
                self.sends[i] = (*send[:7], w.wire_start_s, w.carrier_pid)


@dataclasses.dataclass(slots=True)
class _Prepared:
    """An iteration set up before its start (`_Worker.prepare`)."""

    config: IterationConfig
    hook: FaultHook
    """What every message passes: the iteration's own (`IterationConfig.fault_hook`) or
    `own_hook`."""
    own_hook: FaultViewHook | None
    """The runtime's own hook, whose clock starts with the iteration (`start`)."""
    transport: DirectTransport
    swaps: bool = False
    """Whether it starts with a rank swap (then it is set up after the swap)."""
    inbound: dict[int, _Inbound] | None = None
    """The neighbours' messages, posted; None until set up."""
    ring: Ring | None = None
    """The DP ring, its first bucket posted (a no-op without replicas); None until set up."""
    tied: _Inbound | None = None
    """The other tied stage's gradient of the tied weight, posted as the neighbours' messages
    are (None: no tied weight here, or not set up yet)."""


PROGRESS_INTERVAL_S = 1.0
"""How often a worker's word on its iteration goes to the pool, at most (`Progress`)."""


class Progress:
    """A worker's word to the pool during an iteration, from a thread of its own, every
    PROGRESS_INTERVAL_S while the iteration runs (`beating`): what the worker does now, in
    `describe`'s words, which the pool's timeout names for a rank without progress; as
    `PROGRESS` where its iteration moved on since the last beat (an op or a ring chunk done:
    `tick`), which restarts the pool's wait for an answer, so that it bounds a time without
    progress, not the iteration, which may be long and healthy; else as `DOING`, which does
    not. The thread speaks on while the compute thread waits, so the pool's last word on a
    rank is a beat old at most, unless the process itself stands still. The compute thread
    only counts (`tick`) and sets what `describe` reads: it sends nothing, reads no clock
    and builds no string."""

    def __init__(
        self,
        send: Callable[[str, str], None] | None = None,
        describe: Callable[[], str] = lambda: "",
    ) -> None:
        """`send`: a word (its status, what the worker does) to the pool; None: no pool to
        tell (the torchrun path), no thread."""
        self._send, self._describe = send, describe
        self._ticks = 0
        self._kept = 0
        """How many `kept_up` bodies run: while any does, every beat is progress."""
        self._beating = False

    def tick(self) -> None:
        """An op or a ring chunk done (the next beat says so)."""
        self._ticks += 1

    @contextlib.contextmanager
    def beating(self) -> Iterator[None]:
        """Beat from a thread of its own while the body runs (none without a pool, or where
        one already beats); the body must send nothing to the pool meanwhile."""
        if self._send is None or self._beating:
            yield
            return
        send, done = self._send, threading.Event()

        def beat() -> None:
            ticks = self._ticks
            while not done.wait(PROGRESS_INTERVAL_S):
                now_ticks = self._ticks
                try:
                    doing = self._describe()
                except Exception as err:  # no bug in the words may end the beat
                    doing = f"not known ({type(err).__name__} describing it)"
                try:
                    send(PROGRESS if now_ticks != ticks or self._kept > 0 else DOING, doing)
                except OSError:  # the pool is gone: the body's end will say so
                    return
                ticks = now_ticks

        beating = threading.Thread(target=beat, name="progress", daemon=True)
        self._beating = True
        beating.start()
        try:
            yield
        finally:
            done.set()
            beating.join()
            self._beating = False

    @contextlib.contextmanager
    def kept_up(self) -> Iterator[None]:
        """Every beat progress while the body runs (beating, if nothing beats yet): a wait
        whose own limits name what it waited on and may be longer than the pool's for word
        (a rank swap's rewiring of the delegates waits for their start as long as their
        start at the pool's, however short `timeout_s`: adaptra.transport), so that those
        limits end a wait too long, not the pool's."""
        self._kept += 1
        try:
            with self.beating():
                yield
        finally:
            self._kept -= 1


class _Worker:
    def __init__(
        self,
        rank: int,
        topology: Topology,
        compute: ComputeBackend,
        timeout_s: float,
        delegates: DelegatedLinks | None = None,
    ) -> None:
        self.rank, self.num_stages = rank, topology.num_stages
        self.delegates = delegates
        """This worker's delegate processes, if the pool has them (adaptra.transport)."""
        self.delegate_files = (0, "")
        """Its delegates per link direction and side, and their slot files' folder."""
        self.num_wirings = 0
        """The delegates' wirings so far (at start-up, then at every rank swap, on every
        worker at once): their port exchanges' files are told apart by it."""
        self.topology = self._grid = topology
        """The placement played now; `_grid`: the default one (an iteration's None)."""
        self.position = topology.position_of_worker(rank)
        self.stage, self.replica = self.position.stage, self.position.replica
        self.compute = compute
        self.timeout_s = timeout_s
        self.devices = RankDevices("gloo", "cpu", "cpu")
        """Set by `join` (pipeline.runtime.devices)."""
        self.up: tuple[int, str] | None = None
        self.down: tuple[int, str] | None = None
        self.tied: _Route | None = None
        """The route to the other stage of a tied weight (`ComputeBackend.tied_weight`)."""
        self.ring: tuple[_Route, _Route] | None = None
        """The DP ring's routes: from the previous replica, to the next (D > 1)."""
        self._place(topology)
        self.current_op: str | None = None
        """The op running ("F3"), None outside ops: where a failure happened."""
        self._doing: str | tuple[str, Op] | Ring = _STARTING
        """What the worker does now, for `doing`: in words; an op's phase (`_WAITING`,
        `_COMPUTING`, `_SENDING`) and the op; or the DP ring it runs. One attribute, set
        as the work goes on (no string built), read whole by another thread."""
        self.progress = Progress()
        """Set by the pool's worker (`worker_main`); the torchrun path has no pool to tell."""

    def doing(self) -> str:
        """What this worker does now, in words, for the pool's word on a silent rank: "op
        F3, waiting for the activation of microbatch 3 from rank 0 on link 0-1", "in the DP
        ring of stage 0, waiting for chunk 5 (of chunks 0-7) from rank 3 over dp0:0-1",
        "the tied-weight sum with rank 3"."""
        doing = self._doing
        if isinstance(doing, str):
            return doing
        if isinstance(doing, Ring):
            return doing.doing()
        phase, op = doing
        msg_kind = _MESSAGE_KIND.get(op.kind)
        if phase == _COMPUTING or msg_kind is None:
            return f"op {op}, computing"
        waiting = phase == _WAITING
        neighbour = self.up if (msg_kind == ACTIVATION) == waiting else self.down
        if neighbour is None:  # not this stage's: the phase moved on meanwhile
            return f"op {op}"
        peer, link = neighbour
        what = describe(peer, msg_kind, op.microbatch, sending=not waiting)
        return f"op {op}, {'waiting for' if waiting else 'sending'} {what} on link {link}"

    def _place(self, topology: Topology) -> None:
        """Play this worker's position under `topology`; neighbours are the workers playing
        the next positions up and down (activations come from up, gradients from down)."""
        self.topology, self.position = topology, topology.position_of_worker(self.rank)
        self.stage, self.replica = self.position.stage, self.position.replica
        up, down = Position(self.stage - 1, self.replica), Position(self.stage + 1, self.replica)
        self.up = (topology.worker(up), link_name(up.stage)) if self.stage > 0 else None
        last = self.stage == self.num_stages - 1
        self.down = None if last else (topology.worker(down), link_name(self.stage))
        self.tied = None
        if self.compute.ties(self.stage, self.num_stages):
            other = Position(self.num_stages - 1 if self.stage == 0 else 0, self.replica)
            link = tied_link(self.num_stages)
            forward, backward = Direction.FORWARD, Direction.BACKWARD
            mine, theirs = (forward, backward) if self.stage == 0 else (backward, forward)
            route = (LinkDirection(link, mine), LinkDirection(link, theirs))
            self.tied = _Route(topology.worker(other), *route)
        self.ring = None
        num_replicas = topology.num_replicas
        if num_replicas > 1:
            receiver, out_link, direction = ring_peer(self.stage, self.replica, num_replicas)
            sender = (self.replica - 1) % num_replicas
            _, in_link, in_direction = ring_peer(self.stage, sender, num_replicas)
            self.ring = (
                _Route(
                    topology.worker(Position(self.stage, sender)),
                    None,
                    LinkDirection(str(in_link), in_direction),
                ),
                _Route(
                    topology.worker(Position(self.stage, receiver)),
                    LinkDirection(str(out_link), direction),
                    None,
                ),
            )

    def prepare(self, config: IterationConfig) -> _Prepared:
        """Set up `config`'s iteration before its start, which is not known yet: its
        delegates' slots, a posted receive (and a receiver thread) for every message a
        neighbour sends it, the DP ring's buffers and first bucket's receives, and the compute
        backend's own set-up (megatron: a checkpoint's or the initial weights' load). None of
        it is the iteration's time: the pool picks the start once every worker has done this.
        An iteration that starts with a rank swap sets up after its swap (`start`), as its
        neighbours, receives and ring follow from the position the worker plays then: inside
        the iteration, in a mover's swap record."""
        topology = config.topology or self._grid
        profile = config.profile
        hook, own = config.fault_hook, None
        if hook is None:  # the runtime's own, its clock started with the iteration (`start`)
            delays = {link_name(i): d for i, d in enumerate(profile.delay_ms)}
            delays.update((str(link), d) for link, d in profile.dp_delay_ms)
            replica = topology.position_of_worker(self.rank).replica
            hook = own = FaultViewHook(delays, config.faults, replica)
        swaps = topology.workers != self.topology.workers
        # A swap's first messages between two workers wait for the later one's swap and
        # set-up (a mover builds its new stage): no per-message limit bounds that, as none
        # bounds a pipeline; the pool's bound on a time without progress does.
        send_limit_s = THREAD_WAIT_S if swaps else self.timeout_s
        prepared = _Prepared(config, hook, own, DirectTransport(hook, send_limit_s), swaps)
        self.current_op = None
        if not swaps:
            self._set_up(prepared)
        return prepared

    def _set_up(self, prepared: _Prepared) -> None:
        """`prepare`'s set-up, under the placement played now."""
        config, transport, hook = prepared.config, prepared.transport, prepared.hook
        self._begin_delegated(config)
        prepared.inbound = self._post_receives(config, transport)
        prepared.tied = self._post_tied_receive(config, transport)
        prepared.ring = Ring(
            self._ring_transport(config, transport, hook),
            self.topology,
            self.position,
            config.profile,
            self.compute.dp_gradient_layout(config.profile),
            config.iteration,
            self.timeout_s,
            self.compute.device,
            self.progress.tick,
            self._check_sends(),
        )
        try:
            prepared.ring.post()
            for inbox in (*prepared.inbound.values(), *_optional(prepared.tied)):
                inbox.receiver.start()
            self.compute.begin_iteration(config)
        except BaseException:
            self.abandon(prepared)
            raise

    def abandon(self, prepared: _Prepared) -> None:
        """Stop a prepared iteration's receiver threads (one still inside a wait on a silent
        peer is a daemon and ends with the process: waiting for it would only hold back the
        report of what failed): an iteration that failed, or that never started."""
        for inbox in (*(prepared.inbound or {}).values(), *_optional(prepared.tied)):
            inbox.receiver.stop(0.0)
        if prepared.ring is not None:
            prepared.ring.stop()

    def start(self, prepared: _Prepared, start_at: float) -> RankResult:
        """Run the prepared iteration from `start_at` (host monotonic s): its ops, then the
        step. A failure ends the iteration (the worker reports it and ends)."""
        if prepared.own_hook is not None:
            prepared.own_hook.iteration_start = start_at
        _sleep_until(start_at)
        with self.progress.beating():  # the pool's word on the iteration, as it goes
            return self._run(prepared)

    def _run(self, prepared: _Prepared) -> RankResult:
        """`start`'s iteration, from its start on."""
        config, transport, hook = prepared.config, prepared.transport, prepared.hook
        topology = config.topology or self._grid
        moved = None
        self._doing = _STARTING
        try:
            if prepared.swaps:  # the iteration's first work, with the set-up that follows it
                self.current_op = "swap"  # a failure in it names it
                self._doing = "the rank swap"
                moves_state = config.iteration > 0 and config.load_checkpoint is None
                moved = self._swap(topology, transport if moves_state else None, prepared.own_hook)
                self.current_op = None
                self._doing = "setting up the iteration after the rank swap"
                self._set_up(prepared)
                if moved is not None:  # its record spans the set-up too: no unseen gap
                    moved = dataclasses.replace(moved, end_s=time.monotonic())
            assert prepared.inbound is not None
            records = self._run_ops(config, transport, prepared.inbound, hook, prepared.swaps)
            self._doing = "joining its receiver threads after its last op"
            self._finish_receivers(prepared.inbound)
            if self.delegates is not None:
                self._doing = "ending its delegates' part of the pipeline"
                records.add_wire(self.delegates.finish_iteration(config.iteration))
            step_start = time.monotonic()
            ring = prepared.ring
            assert ring is not None
            self.current_op = KIND  # a failure in the ring names it
            self._doing = ring
            chunks = ring.run(
                self.compute.dp_gradient() if self.topology.num_replicas > 1 else None
            )
            self._doing = "taking the DP ring's sums"
            self.compute.take_dp_sums()
            self.current_op = "tied"  # a failure in the sum names it
            if self.tied is not None:
                self._doing = f"the tied-weight sum with rank {self.tied.peer}"
            self._sum_tied(config, transport, prepared.tied)
        except BaseException:
            self.abandon(prepared)  # a failed iteration ends the worker (worker_main)
            raise
        records.sends.extend(chunks.sends)
        records.receives.extend(chunks.receives)
        if self.delegates is not None:  # the step's delegated messages, and every failover
            self._doing = "ending its delegates' part of the step"
            records.add_wire(self.delegates.finish_iteration(config.iteration))
            records.failovers.extend(self.delegates.take_failovers())
        self.current_op = None
        self._doing = "the compute backend's end of the iteration (its optimizer step)"
        step_output = self.compute.end_iteration(config)
        step_end = time.monotonic()  # a digest's copy and a checkpoint are not the step's
        self._doing = "the compute backend's work after the step (a digest, a checkpoint)"
        step_output = self.compute.after_step(config, step_output)
        return RankResult(
            self.rank,
            self.stage,
            self.replica,
            os.getpid(),
            records.ops,
            records.sends,
            records.receives,
            step_start,
            step_end,
            transport.bytes_sent,
            step_output,
            records.failovers,
            moved,
        )

    def _swap(
        self,
        topology: Topology,
        transport: DirectTransport | None,
        hook: FaultViewHook | None = None,
    ) -> StateMove | None:
        """Play `topology` from now on, on every worker at once: the
        delegates of each link direction whose peer changed are wired to the new one (a new
        pair past the NICs whose route `hook`'s faults have failed), and a
        worker that plays another position builds it and, over `transport`, sends the left
        one's state to its new player and takes the new one's from its last (a permutation:
        every mover sends one and takes one). None for `transport`: no state moves (the
        iteration starts from the initial state or a checkpoint anyway, or the workers go
        back to the default placement between runs: `place`). Its record, for a worker that
        moved; its end is the state exchange's (`start` extends it over the set-up)."""
        start = time.monotonic()
        left, before = self.position, self.topology
        self._place(topology)
        if self.delegates is not None:
            with self.progress.kept_up():  # its waits have limits of their own
                self.delegates.rewire(_delegate_setup(self, *self.delegate_files, hook))
        if self.position == left:
            return None
        outgoing = (
            None if transport is None else self.compute.export_state().to(self.compute.device)
        )
        self.compute.move(self.stage, self.replica)
        num_bytes = 0
        if transport is not None and outgoing is not None and outgoing.numel():
            incoming = torch.empty(
                self.compute.state_bytes(), dtype=torch.uint8, device=self.compute.device
            )
            giver, taker = before.worker(self.position), topology.worker(left)
            if self.delegates is None:
                pending = transport.post_state_receive(giver, incoming)
                transport.send_state(taker, outgoing)
                pending.wait(transport.timeout_s)  # spans the giver's build of its stage
            else:  # not over gloo, which is bound to one NIC: where the delegates would go
                self.delegates.move_state(outgoing, incoming, self._state_route(giver, taker))
            self.compute.import_state(incoming)
            num_bytes = outgoing.numel()
        return StateMove(left.stage, left.replica, num_bytes, start, time.monotonic())

    def _state_route(self, giver: int, taker: int) -> StateRoute:
        """A rank swap's state move (`DelegatedLinks.move_state`): the movers' offers go
        through files in the pool's slot folder, as the delegates' ports do."""
        swap = self.num_wirings  # every worker's count of rewires: the same on all

        def path(sender: int, receiver: int) -> Path:
            return Path(self.delegate_files[1]) / f"state-{swap}-{sender}-to-{receiver}.json"

        def offer(mine: StateOffer) -> None:
            write_atomic(path(giver, self.rank), mine.to_json())

        def offer_of(deadline: float) -> StateOffer:
            what = f"rank {taker}'s port for the model state"
            text = _wait_for_file(path(self.rank, taker), deadline, what, self.timeout_s)
            return StateOffer.from_json(text)

        return StateRoute(taker, giver, offer, offer_of)

    def place(self, topology: Topology) -> None:
        """Play `topology` from now on, outside any iteration and moving no state, on every
        worker at once (`WorkerPool.place_default`: a new run starts where a fresh pool's
        workers do, from the initial state)."""
        if topology.workers != self.topology.workers:
            self._doing = PLACING
            self._swap(topology, None)

    def _directions(self) -> list[tuple[LinkDirection, int, bool]]:
        """Every link direction this worker sends or receives on: (it, the peer, whether
        this worker receives on it). PP ones first, then the tied route's, then the DP
        ring's (received from the previous replica, sent to the next)."""
        out = self._pp_directions()
        for route in (self.tied, *(self.ring or ())):
            if route is not None and route.receives is not None:
                out += [(route.receives, route.peer, True)]
            if route is not None and route.sends is not None:
                out += [(route.sends, route.peer, False)]
        return out

    def _pp_directions(self) -> list[tuple[LinkDirection, int, bool]]:
        """Every PP link direction this worker sends or receives on (as `_directions`)."""
        out = []
        if self.up is not None:
            peer, link = self.up
            out += [(LinkDirection(link, Direction.FORWARD), peer, True)]
            out += [(LinkDirection(link, Direction.BACKWARD), peer, False)]
        if self.down is not None:
            peer, link = self.down
            out += [(LinkDirection(link, Direction.BACKWARD), peer, True)]
            out += [(LinkDirection(link, Direction.FORWARD), peer, False)]
        return out

    def _begin_delegated(self, config: IterationConfig) -> None:
        """Slots for the link directions this iteration sends over delegates, through the
        profile's `num_delegates` of each one's delegates (None: all started)."""
        sizes = {
            d: size
            for d, _, _ in self._directions()
            if config.comm_of(d.link, d.direction) != "direct"
            and (size := self._slots_of(d, config))[0] > 0
        }
        if not sizes:
            return
        if self.delegates is None:
            raise ConfigError("this worker pool has no delegates: the delegated comm needs them")
        self.delegates.begin_iteration(sizes, config.profile.num_delegates)

    def _slots_of(self, direction: LinkDirection, config: IterationConfig) -> tuple[int, int]:
        """The messages of one iteration on `direction`, and the bytes of the largest."""
        profile = config.profile
        kind = route_kind(direction.link)
        if kind == "tied":
            weight = self.compute.tied_weight()
            assert weight is not None
            return 1, weight.numel() * weight.element_size()
        if kind == "dp":
            layout = self.compute.dp_gradient_layout(profile)
            num_replicas = self.topology.num_replicas
            count = messages_per_link_direction(
                layout.num_bytes, profile.dp_bucket_bytes, num_replicas
            )
            largest = largest_chunk_bytes(
                layout.num_bytes, profile.dp_bucket_bytes, num_replicas, layout.element_bytes
            )
            return count, largest
        buffer = self.compute.message_buffer(profile)
        num_microbatches = config.schedule_of(self.replica).num_microbatches
        return num_microbatches, buffer.numel() * buffer.element_size()

    def _post_tied_receive(
        self, config: IterationConfig, transport: DirectTransport
    ) -> _Inbound | None:
        """The receive of the other tied stage's gradient of the tied weight (`_sum_tied`),
        posted at set-up as every other receive of the iteration, with a receiver thread (not
        started): posted only at the sum, the other stage's send waited for it, bounded by
        the timeout for one message, as long as this stage's pipeline and DP ring still ran
        (a healthy iteration whose stages ended them more than that apart failed:
        "sending the tied weight's gradient ... Timed out"). None: no tied weight here."""
        weight = self.compute.tied_weight()
        if self.tied is None or weight is None:
            return None
        peer, _, receives = self.tied
        assert receives is not None
        inbox = torch.empty(weight.shape, dtype=weight.dtype, device=self.compute.device)
        if config.comm_of(receives.link, receives.direction) == "delegated":
            assert self.delegates is not None  # _begin_delegated checked
            message = Message(config.iteration, GRADIENT, 0, 0)
            pending = self.delegates.post_receive(receives, message, inbox)
        else:
            pending = transport.post_tied_receive(peer, inbox)
        receiver = Receiver(peer, GRADIENT, [(0, pending)], check=self._check_sends())
        return _Inbound(receives.link, receives.direction, receiver, {0: inbox})

    def _sum_tied(
        self, config: IterationConfig, transport: DirectTransport, posted: _Inbound | None
    ) -> None:
        """The tied weight's gradient plus the other stage's, on both (a + b = b + a: both
        hold the same bits), over gloo or the delegates as the plan has the direction. After
        the DP ring (megatron's order: its DDP's gradient sync, then the word embedding's
        all-reduce): each copy's DP sum is the same on every replica, so every copy of the
        weight gets the same bits; summed before it, each copy's (a_r + b_r) went round the
        ring in its own order (the ring's order per element follows its chunk, and the
        embedding is at the start of stage 0's gradient but at the end of the last stage's),
        and with D >= 3 the copies drifted apart. The other stage's gradient comes once that
        stage has ended its pipeline and its DP ring: the wait for it has no limit of its own
        (as the DP ring's for its first chunks), the pool's bound on a time without progress
        bounds it; its receive was posted at set-up (`_post_tied_receive`), so the swap
        always runs, a weight without a gradient sending zeros and taking the other's (a
        receive left posted would take the next iteration's message)."""
        weight = self.compute.tied_weight()
        if self.tied is None or posted is None or weight is None:
            return
        peer, sends, _ = self.tied
        assert sends is not None
        inbox = posted.buffers[0]
        # the same tensor unless off the host
        grad = torch.zeros_like(inbox) if weight.grad is None else weight.grad.to(inbox.device)
        if config.comm_of(sends.link, sends.direction) == "delegated":
            assert self.delegates is not None
            message = Message(config.iteration, GRADIENT, 0, 0)
            self.delegates.send(sends, message, grad, 0.0)
        else:
            transport.send_tied(peer, sends.link, grad)
        posted.receiver.take(0, None)
        posted.receiver.finish(self.timeout_s)
        if weight.grad is None:
            weight.grad = inbox.to(weight.device)
        else:
            weight.grad.add_(inbox.to(weight.grad.device))

    def _ring_transport(
        self,
        config: IterationConfig,
        transport: DirectTransport,
        hook: FaultHook,
    ) -> RingTransport:
        """How this worker's DP ring chunks go: gloo, or the delegates for a direction the
        plan delegates."""
        if self.ring is None or self.delegates is None:
            return transport
        receives, sends = self.ring[0].receives, self.ring[1].sends
        assert receives is not None and sends is not None
        modes = {d: config.comm_of(d.link, d.direction) for d in (receives, sends)}
        if all(mode == "direct" for mode in modes.values()):
            return transport
        num_nics = len(config.profile.topology.nics)
        return _DelegatedRing(
            transport, self.delegates, hook, config.iteration, receives, modes, num_nics
        )

    def _post_receives(
        self, config: IterationConfig, transport: DirectTransport
    ) -> dict[int, _Inbound]:
        """Post a receive for every message a neighbour will send this iteration, in its send
        order, each with a receiver thread (not started) per neighbour; by message kind."""
        inbound = {}
        for msg_kind, neighbour, peer_stage in (
            (ACTIVATION, self.up, self.stage - 1),
            (GRADIENT, self.down, self.stage + 1),
        ):
            if neighbour is None:
                continue
            peer, link = neighbour
            peer_ops = config.schedule_of(self.replica).stages[peer_stage]
            microbatches = _sent_microbatches(peer_ops, msg_kind)
            buffers = {m: self.compute.message_buffer(config.profile) for m in microbatches}
            direction = LinkDirection.of(link, msg_kind)
            delegates = (
                self.delegates if config.comm_of(link, direction.direction) == "delegated" else None
            )
            receives = []
            for seq, m in enumerate(microbatches):
                message = Message(config.iteration, msg_kind, m, seq)
                receives.append(
                    (
                        m,
                        transport.post_receive(peer, message, buffers[m])
                        if delegates is None
                        else delegates.post_receive(direction, message, buffers[m]),
                    )
                )
            receiver = Receiver(peer, msg_kind, receives, check=self._check_sends())
            inbound[msg_kind] = _Inbound(link, _DIRECTION[msg_kind], receiver, buffers)
        return inbound

    def _check_sends(self) -> Callable[[], None] | None:
        """What a wait on a message calls: its delegates' look for a link direction with no
        NIC left (`DelegatedLinks.check`); None without delegates."""
        return None if self.delegates is None else self.delegates.check

    def _finish_receivers(self, inbound: dict[int, _Inbound]) -> None:
        """Join the receiver threads after the last op: in a valid schedule every message a
        neighbour sends has been taken in by then, so they are done or about to be."""
        for inbox in inbound.values():
            inbox.receiver.finish(self.timeout_s)

    def _run_ops(
        self,
        config: IterationConfig,
        transport: DirectTransport,
        inbound: dict[int, _Inbound],
        hook: FaultHook,
        swaps: bool = False,
    ) -> _Records:
        """Run this stage's ops in order: take each op's message, compute, send the result.
        `swaps`: the iteration began with a rank swap, so each neighbour's first message
        comes after its swap and set-up, which no per-message limit bounds (a mover's build
        of its new stage longer than the timeout failed the neighbours' first ops)."""
        records = _Records()
        num_sent = {ACTIVATION: 0, GRADIENT: 0}
        # in a swap's iteration, the message kinds whose first message is yet to be taken
        unbounded = set(inbound) if swaps else set()
        for op in config.schedule_of(self.replica).stages[self.stage]:
            self.current_op = str(op)
            msg_kind = _MESSAGE_KIND.get(op.kind)
            inbox = None if msg_kind is None else inbound.get(msg_kind)
            inputs = None
            if inbox is not None:
                self._doing = (_WAITING, op)
                needed = time.monotonic()
                limit_s = None if msg_kind in unbounded else self.timeout_s
                unbounded.discard(msg_kind)
                arrival = inbox.receiver.take(op.microbatch, limit_s)
                records.receives.append(
                    (
                        inbox.link,
                        inbox.direction,
                        op.microbatch,
                        arrival.arrived_s,
                        needed,
                        arrival.copy_in_s,
                    )
                )
                inputs = inbox.buffers[op.microbatch]
            self._doing = (_COMPUTING, op)
            start = time.monotonic()
            output = self.compute.run(op.kind, op.microbatch, inputs, config.profile)
            records.ops.append((op.kind.value, op.microbatch, start, time.monotonic()))
            self.progress.tick()
            target = self.down if msg_kind == ACTIVATION else self.up
            if output is None or msg_kind is None or target is None:
                continue
            peer, link = target
            self._doing = (_SENDING, op)
            message = Message(config.iteration, msg_kind, op.microbatch, num_sent[msg_kind])
            num_sent[msg_kind] += 1
            direction = LinkDirection.of(link, msg_kind)
            num_bytes = output.numel() * output.element_size()
            send_start = time.monotonic()
            if config.comm_of(link, direction.direction) == "delegated":
                assert self.delegates is not None  # _begin_delegated checked
                route = hook.route(
                    link, direction.direction, config.iteration, message.hook_kind,
                    op.microbatch, num_bytes, self.delegates.route_nic(direction),
                    len(config.profile.topology.nics),
                )  # fmt: skip
                self.delegates.send(direction, message, output, route.fault_ms, route.nic)
                fault_ms = route.fault_ms
            else:
                fault_ms = transport.send(peer, link, message, output)
            records.sends.append(
                (
                    link,
                    direction.direction,
                    op.microbatch,
                    num_bytes,
                    send_start,
                    time.monotonic(),
                    fault_ms,
                    send_start,  # the wire's start: a delegate's is filled in at the end
                    os.getpid(),
                )
            )
        self.current_op = None
        return records


class _DelegatedRing:
    """A worker's DP ring chunks over its delegates (`RingTransport`), for the directions
    the plan delegates; over gloo (`transport`) for the others. A chunk is message `index`
    of its direction (seq and microbatch both: pipeline.allreduce's numbering)."""

    def __init__(
        self,
        transport: DirectTransport,
        delegates: DelegatedLinks,
        hook: FaultHook,
        iteration: int,
        inbound: LinkDirection,
        modes: dict[LinkDirection, str],
        num_nics: int,
    ) -> None:
        self._transport, self._delegates, self._hook = transport, delegates, hook
        self._iteration, self._inbound, self._modes = iteration, inbound, modes
        self._num_nics = num_nics

    def post_dp_receive(self, peer: int, index: int, buffer: torch.Tensor) -> PendingReceive:
        if self._modes[self._inbound] != "delegated":
            return self._transport.post_dp_receive(peer, index, buffer)
        message = Message(self._iteration, GRADIENT, index, index)
        return self._delegates.post_receive(self._inbound, message, buffer)

    def send_dp(
        self, peer: int, link: str, direction: Direction, iteration: int, index: int,
        payload: torch.Tensor,
    ) -> float:  # fmt: skip
        outbound = LinkDirection(link, direction)
        if self._modes[outbound] != "delegated":
            return self._transport.send_dp(peer, link, direction, iteration, index, payload)
        num_bytes = payload.numel() * payload.element_size()
        nic = self._delegates.route_nic(outbound)
        route = self._hook.route(
            link, direction, iteration, KIND, index, num_bytes, nic, self._num_nics
        )
        message = Message(iteration, GRADIENT, index, index)
        self._delegates.send(outbound, message, payload, route.fault_ms, route.nic)
        return route.fault_ms


def _optional(inbox: _Inbound | None) -> tuple[_Inbound, ...]:
    """`inbox` as a tuple of none or one."""
    return () if inbox is None else (inbox,)


def configure_threads() -> None:
    """A worker process's threads: one intra-op torch thread (many ranks share few cores) and
    a short GIL switch interval (receiver threads stamp arrivals promptly)."""
    torch.set_num_threads(1)
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def _sleep_until(deadline: float) -> None:
    remaining = deadline - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)


def join(
    rank: int,
    num_stages: int,
    num_replicas: int,
    init_method: str,
    timeout_s: float,
    compute: ComputeBackend,
    delegates: DelegateFactory | None = None,
    num_delegates: int = 0,
    slot_dir: str = "",
    on_host: tuple[int, int] | None = None,
    join_timeout_s: float | None = None,
) -> _Worker:
    """Join the process group (pipeline.runtime.devices: gloo, with messages through host
    copies where the worker computes on a GPU); the worker for this rank (under the default
    placement: pipeline.topology), with `num_delegates` delegates per link direction and
    side from `delegates` if given (their slot files in `slot_dir`). `on_host`: this
    worker's index among the workers on its host and their number (torchrun's LOCAL_RANK and
    LOCAL_WORLD_SIZE: a job over several hosts); None: every worker is on this host.
    `join_timeout_s`: how long the join waits for the other ranks where that is longer than
    `timeout_s` (the group's timeout, which gloo's rendezvous takes: a pool's worker that a
    loaded host started some 2 x `timeout_s` after another failed the pool's start-up, which
    may take START_UP_S); the worker's sends take `timeout_s` all the same
    (`DirectTransport`)."""
    grid = Topology(num_stages, num_replicas)
    position = grid.position_of_worker(rank)
    stage, replica = position.stage, position.replica
    local_rank, num_local = on_host or (rank, grid.num_workers)
    devices = worker_devices(compute, local_rank, num_local)
    if devices.compute_device != "cpu":
        torch.cuda.set_device(torch.device(devices.compute_device))
    dist.init_process_group(
        devices.process_group,
        init_method=init_method,
        rank=rank,
        world_size=grid.num_workers,
        timeout=dt.timedelta(seconds=max(timeout_s, join_timeout_s or 0.0)),
    )
    compute.setup(stage, num_stages, replica, devices)
    worker = _Worker(rank, grid, compute, timeout_s)
    worker.devices = devices
    if delegates is not None:
        worker.delegate_files = (num_delegates, slot_dir)
        worker.delegates = delegates.connect(_delegate_setup(worker, num_delegates, slot_dir))
    return worker


def worker_devices(compute: ComputeBackend, local_rank: int, num_local: int) -> RankDevices:
    """The devices of the worker `local_rank` of `num_local` on this host: a GPU of the host's
    only for a backend that computes on one (`ComputeBackend.uses_gpu`); the emulated one,
    which sleeps, takes none (a CUDA context in each worker would be memory and start-up
    for nothing)."""
    num_gpus = num_visible_gpus() if compute.uses_gpu else 0
    return choose_devices(local_rank, num_local, num_gpus)


_PORTS_POLL_S = 0.001
"""How often a sending side looks for its receiver's ports file."""


def _wait_for_file(path: Path, deadline: float, what: str, timeout_s: float) -> str:
    """The text of `path`, another worker's word in the pool's slot folder (written
    atomically, read once: removed), once it is there; `TimeoutError` naming `what` if it is
    not by `deadline` (monotonic s: `timeout_s` after the wait's start)."""
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not come within {timeout_s:g} s")
        time.sleep(_PORTS_POLL_S)
    text = path.read_text()
    path.unlink()
    return text


def _delegate_setup(
    worker: _Worker, num_delegates: int, slot_dir: str, hook: FaultViewHook | None = None
) -> DelegateSetup:
    """What this worker's delegates are wired to: its neighbours under its placement. Their
    `exchange` swaps ports with the neighbours through files in the pool's slot folder: each
    receiving side writes its delegates' ports, each sending side reads the far end's. Not
    over the process group: gloo is bound to one NIC (on the testbed rnic0), and a rank swap
    that rewired a worker whose NIC had failed waited there for the whole timeout, although
    its delegates had failed over."""
    directions = worker._directions()
    inbound = tuple((d, peer) for d, peer, receives in directions if receives)
    outbound = tuple((d, peer) for d, peer, receives in directions if not receives)
    peer_in, peer_out = dict(inbound), dict(outbound)
    wiring = worker.num_wirings
    worker.num_wirings += 1

    def ports_file(direction: LinkDirection, sender: int, receiver: int) -> Path:
        way = f"{direction.link}.{direction.direction}".replace(":", "_")
        return Path(slot_dir) / f"ports-{wiring}-{way}-{sender}-to-{receiver}.json"

    def exchange(
        mine: dict[LinkDirection, DelegateOffer], wanted: tuple[LinkDirection, ...]
    ) -> dict[LinkDirection, DelegateOffer]:
        for direction, offer in mine.items():
            write_atomic(ports_file(direction, peer_in[direction], worker.rank), offer.to_json())
        limit_s = max(worker.timeout_s, DELEGATE_START_S)
        deadline = time.monotonic() + limit_s
        theirs = {}
        for direction in wanted:
            path = ports_file(direction, worker.rank, peer_out[direction])
            what = (
                f"rank {peer_out[direction]}'s delegate ports for {direction.link} "
                f"({direction.direction})"
            )
            text = _wait_for_file(path, deadline, what, limit_s)
            theirs[direction] = DelegateOffer.from_json(text)
        return theirs

    num_nics = len(worker.topology.nics)
    routes_down = {} if hook is None else {d: hook.routes_down(d.link, num_nics) for d in peer_out}
    return DelegateSetup(
        worker.rank, slot_dir, inbound, outbound, num_delegates, worker.timeout_s, exchange,
        routes_down, worker.replica,
    )  # fmt: skip


@contextlib.contextmanager
def _ended_if_orphaned(conn: Connection) -> Iterator[None]:
    """Within, the process ends once the controller's end of `conn` closes: its join may wait
    the start-up bound in gloo's rendezvous (a rank that never comes, a testbed's wires gone
    with the killed controller), and nothing waits for it any more. The pool says nothing
    before a worker's ready answer, so whatever `conn` has to read then is its end."""
    joined = threading.Event()

    def watch() -> None:
        try:
            while not joined.is_set():
                if conn.poll(0.2) and not joined.is_set():
                    os._exit(1)
        except OSError:  # its end closed as it looked
            os._exit(1)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()
    try:
        yield
    finally:
        joined.set()


def worker_main(
    rank: int,
    num_stages: int,
    num_replicas: int,
    init_file: str,
    conn: Connection,
    timeout_s: float,
    compute: ComputeBackend,
    delegates: DelegateFactory | None = None,
    num_delegates: int = 0,
    slot_dir: str = "",
) -> None:
    """Process entry point; reports ready (with its delegates' pids and its devices), then
    answers one command per iteration. A failure (in start-up or an iteration) is reported
    as a `RemoteError` and ends the worker. It ignores SIGINT: a terminal's Ctrl-C reaches
    every process of the job, and the controller, which gets it too, ends the workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    configure_threads()
    stage, replica = rank % num_stages, rank // num_stages
    try:
        # (a rank that never joins leaves the others waiting the start-up bound: the pool's
        # timeout then tells it, silent, from those that reached the join)
        conn.send((DOING, "joining the process group (its rendezvous waits for every rank)"))
    except (BrokenPipeError, ConnectionResetError):
        return  # the controller is gone before this worker's first word: nobody to tell
    try:
        with _ended_if_orphaned(conn):
            worker = join(
                rank,
                num_stages,
                num_replicas,
                f"file://{init_file}",
                timeout_s,
                compute,
                delegates,
                num_delegates,
                slot_dir,
                join_timeout_s=start_up_limit_s(num_stages * num_replicas),
            )
    except Exception as err:
        remote = RemoteError.from_exception(err, rank=rank, stage=stage, replica=replica)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # nobody to tell
            conn.send(("error", remote))
        return
    try:
        _serve(worker, conn, rank)
    except (BrokenPipeError, ConnectionResetError):
        return  # its pipe to the controller broke: the controller is gone, nobody to tell
    finally:
        if worker.delegates is not None:
            worker.delegates.close()


def _serve(worker: _Worker, conn: Connection, rank: int) -> None:
    """Answer the pool's commands: per iteration its config, answered with a ready message
    once set up (`_Worker.prepare`), then its start time, answered with the records; between
    iterations a placement to play (`_Worker.place`), answered once played; None (in any
    place) ends the worker."""
    worker.progress = Progress(lambda status, doing: conn.send((status, doing)), worker.doing)
    delegate_pids = [] if worker.delegates is None else worker.delegates.pids
    conn.send(("ok", (os.getpid(), delegate_pids, worker.devices)))
    while True:
        try:
            config = conn.recv()
        except EOFError:  # the controller is gone
            return
        if config is None:
            break
        if isinstance(config, Topology):  # between runs: no iteration, no records
            try:
                worker.place(config)
            except Exception as err:
                remote = RemoteError.from_exception(
                    err, rank=rank, stage=worker.stage, replica=worker.replica, op=PLACING
                )
                conn.send(("error", remote))
                return
            conn.send(("ok", None))
            continue
        try:
            prepared = worker.prepare(config)
            conn.send(("ok", None))  # ready
            try:
                start_at = conn.recv()
            except EOFError:
                start_at = None  # the controller is gone
            if start_at is None:  # the pool ends before the start (another worker failed)
                worker.abandon(prepared)
                return
            conn.send(("ok", worker.start(prepared, start_at)))
        except Exception as err:
            remote = RemoteError.from_exception(
                err,
                rank=rank,
                stage=worker.stage,  # the position it plays now (a swap moves it)
                replica=worker.replica,
                iteration=config.iteration,
                op=worker.current_op,
            )
            conn.send(("error", remote))
            return
    dist.destroy_process_group()
