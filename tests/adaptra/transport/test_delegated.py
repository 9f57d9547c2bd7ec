"""The delegate transport in real runs: worker processes hand their messages to delegate
processes (emulated compute), which carry them over TCP between shared-memory slots."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import queue
import select
import shutil
import signal
import statistics
import struct
import subprocess
import tempfile
import termios
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from adaptra.transport import Delegates, delegated
from adaptra.transport.delegate import HEADER, NOTE, RESUME
from adaptra.transport.delegated import DelegateTransport
from baselines import zb_h2
from pipeline.errors import LinkFailure
from pipeline.link_rates import NO_RATES
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerError, WorkerPool
from pipeline.runtime.calibrate import busy_both_ways
from pipeline.runtime.transport import (
    ACTIVATION,
    DelegateOffer,
    DelegateSetup,
    LinkDirection,
    Message,
)
from pipeline.timeline import Timeline
from tests.adaptra.transport.one_host import (
    A_TO_B,
    B_TO_A,
    D0,
    Trainers,
    Wiring,
    carry,
    entered,
    ip_batch,
    one_host_namespace,
)

pytestmark = pytest.mark.multiprocess

S, N, D = 4, 8, 2
DELAY_MS = 40.0
PROFILE = Profile.uniform(S, N, 5, 5, 5, message_bytes=1 << 20).with_delays([DELAY_MS, 0, 0])
SCHEDULE = zb_h2(PROFILE)
ON_LINK_0_1 = (("0-1", "forward", "delegated"), ("0-1", "backward", "delegated"))


def _state(pid: int) -> str:
    """/proc's state of a process ("S": asleep in a wait)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _activity(pid: int) -> tuple[int, int, int]:
    """Counts that only a delegate's work changes, exactly: its read and write calls (it
    reads its jobs and writes its notes with them; a socket's are other calls) and its
    voluntary context switches (one each time it goes back to a wait it woke from)."""
    io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    (switches,) = [line.split()[1] for line in status if line.startswith("voluntary_ctxt")]
    return int(io["syscr"]), int(io["syscw"]), int(switches)


def _idle(pids: list[int]) -> dict[int, tuple[int, int, int]]:
    """Each process's `_activity`, once all are asleep (a delegate notes READY just before
    its first wait, and may not have reached it yet on a loaded host)."""
    deadline = time.monotonic() + 30
    while not all(_state(pid) == "S" for pid in pids):
        assert time.monotonic() < deadline, {pid: _state(pid) for pid in pids}
        time.sleep(0.01)
    return {pid: _activity(pid) for pid in pids}


def _children() -> list[int]:
    """This process's child processes (every thread's)."""
    tasks = Path(f"/proc/{os.getpid()}/task").iterdir()
    return [int(pid) for task in tasks for pid in (task / "children").read_text().split()]


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # a zombie: ended, not yet reaped by its parent's parent


def _count(timeline: Timeline) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for m in timeline.messages:
        counts[m.link, m.direction] = counts.get((m.link, m.direction), 0) + 1
    return counts


def test_one_pool_switches_direct_delegated_direct_and_its_delegates_end_with_it() -> None:
    with WorkerPool(S, delegates=Delegates(), num_delegates=D, timeout_s=20) as pool:
        workers, delegates = set(pool.pids), [p for ps in pool.delegate_pids for p in ps]
        folder = Path(str(pool._slot_dir))  # the pool's own: the slot files go there
        # per link, D per direction and side: (S - 1) links x 2 directions x 2 sides x D
        assert len(delegates) == len(set(delegates)) == (S - 1) * 2 * 2 * D
        assert not workers & set(delegates)
        idle = _idle(delegates)
        first = pool.run_iteration(IterationConfig(0, SCHEDULE, PROFILE))
        # Direct: the delegates slept through it (no job read, no note, no wake).
        assert {pid: _activity(pid) for pid in delegates} == idle
        second = pool.run_iteration(IterationConfig(1, SCHEDULE, PROFILE, link_comms=ON_LINK_0_1))
        third = pool.run_iteration(IterationConfig(2, SCHEDULE, PROFILE))
        bigger = dataclasses.replace(PROFILE, message_bytes=3 << 20)  # new slot files
        fourth = pool.run_iteration(IterationConfig(3, SCHEDULE, bigger, comm="delegated"))
        assert {m.num_bytes for m in fourth.messages} == {3 << 20}
        assert {m.carrier_pid for m in fourth.messages} <= set(delegates)
        assert len(list(folder.glob("slots-*"))) == 2 * 2 * (S - 1)  # both sides, each way
        # Smaller again: new slot files, and a receiver must not take a message into its old,
        # larger one (its map job may come after the message: it waits for the right one).
        fifth = pool.run_iteration(IterationConfig(4, SCHEDULE, PROFILE, comm="delegated"))
        assert {m.num_bytes for m in fifth.messages} == {PROFILE.message_bytes}
        for timeline in (first, second, third, fourth, fifth):  # every message once
            assert _count(timeline) == {(f"{i}-{i + 1}", d): N for i in range(S - 1)
                                        for d in ("forward", "backward")}  # fmt: skip
            keys = [(m.link, m.direction, m.microbatch) for m in timeline.messages]
            assert len(set(keys)) == len(keys)
        for m in second.messages:
            if m.link == "0-1":  # carried by a delegate: not a worker, not a thread of one
                assert m.carrier_pid in delegates
                assert m.arrival_ms - m.wire_start_ms >= DELAY_MS  # the delay is on the wire
                assert m.copy_in_ms > 0
            else:
                assert m.carrier_pid in workers and m.copy_in_ms == 0
        # Not on the trainer: holding each message the delay would hold all of them at least
        # that long; load may stretch a few hand-offs, not the median of the 16.
        handed_ms = [m.send_end_ms - m.send_start_ms for m in second.messages if m.link == "0-1"]
        assert len(handed_ms) == 2 * N and statistics.median(handed_ms) < DELAY_MS, handed_ms
        for m in (*first.messages, *third.messages):
            assert m.carrier_pid in workers
            assert m.send_end_ms - m.send_start_ms >= (DELAY_MS if m.link == "0-1" else 0)
    assert not folder.exists()
    _eventually(lambda: all(_gone(pid) for pid in delegates), "the delegates' ends")


@pytest.mark.parametrize(
    ("rank", "direction"),
    [(0, "forward"), (1, "backward")],  # a rank's first delegate: a sender on link 0-1
)
def test_a_killed_delegate_fails_the_run_naming_it_and_leaves_nothing(
    rank: int, direction: str
) -> None:
    """A sender delegate killed between iterations; its receiver delegate on the peer rank
    lost it, and has ended. Whichever trainer finds out first, its own (the delegate is dead)
    or its peer's (its receiver delegate is gone), the run's error names the killed pid (the
    peer's named its receiver delegate "gone (its pipe is closed)", blaming it). The
    timeouts are hang guards alone."""
    pool = WorkerPool(S, delegates=Delegates(), num_delegates=D, timeout_s=30)
    with pool:
        delegates = [p for ps in pool.delegate_pids for p in ps]
        folder = Path(str(pool._slot_dir))
        victim = pool.delegate_pids[rank][0]
        os.kill(victim, signal.SIGKILL)
        peers = pool.delegate_pids[1 - rank]
        _eventually(lambda: any(_gone(pid) for pid in peers), "the receiver delegate's end")
        with pytest.raises(WorkerError) as failed:
            pool.run_iteration(IterationConfig(0, SCHEDULE, PROFILE, link_comms=ON_LINK_0_1))
    text = str(failed.value)
    assert f"sender delegate 0 (pid {victim}" in text or (
        f"lost its sender delegate (pid {victim}, rank {rank}'s side)" in text
    ), text
    assert f"link 0-1 ({direction})" in text and "ConnectionError" in text, text
    assert not folder.exists()
    # A delegate dies by its worker's end (PR_SET_PDEATHSIG: SIGKILL), which a loaded host
    # may carry out a moment after the pool has reaped the worker.
    _eventually(lambda: all(_gone(pid) for pid in [*pool.pids, *delegates]), "every end")


def test_more_messages_than_a_notify_pipe_holds_notes_of_go_through_one_delegate() -> None:
    """1,500 activations through one sender delegate, handed over before the trainer waits
    for them: its notes (56 bytes each) would fill the 64 KiB pipe, and it would stop."""
    num_microbatches = 1500
    profile = Profile.uniform(2, num_microbatches, 0.01, 0.005, 0.005, message_bytes=64)
    config = IterationConfig(0, busy_both_ways(2, num_microbatches), profile, comm="delegated")
    with WorkerPool(2, delegates=Delegates(), num_delegates=1, timeout_s=20) as pool:
        timeline = pool.run_iteration(config)
    assert _count(timeline) == {("0-1", "forward"): 1500, ("0-1", "backward"): 1500}
    assert {m.carrier_pid for m in timeline.messages} <= set(
        pool.delegate_pids[0] + pool.delegate_pids[1]
    )


def test_a_pool_without_delegates_refuses_a_delegated_iteration() -> None:
    with WorkerPool(2, timeout_s=5) as pool, pytest.raises(WorkerError, match="no delegates"):
        profile = Profile.uniform(2, 2, 1, 1, 1)
        pool.run_iteration(IterationConfig(0, zb_h2(profile), profile, comm="delegated"))


def test_every_engine_runs_the_delegate_count_of_the_papers_rule() -> None:
    """No `num_delegates`: a fault timeline putting 30 ms on link 0-1 (ops of 10 ms) settles
    D = 3 for the run (harness.policies.with_delegate_count); the simulator uses it, and the
    emulated engine starts that many per link direction and side."""
    from harness.policies import system_controller
    from injectors.fault_files import parse_yaml
    from pipeline.engines.runtime import emulated_engine

    profile = Profile.uniform(2, 6, 10, 10, 10)
    faults = parse_yaml('[{start_iteration: 0, links: ["0-1"], delay_ms: 30}]')
    plan = system_controller("adaptra-cpu", profile, faults).plan(0)
    assert profile.num_delegates is None and plan.profile.num_delegates == 3
    with emulated_engine(2, delegates=Delegates(), timeout_s=20) as engine:
        engine.run(plan, 0, faults.at(0, profile.topology, rates=NO_RATES))
        assert [len(pids) for pids in engine.delegate_pids] == [2 * 3, 2 * 3]


def test_a_worker_that_now_sends_where_it_received_gets_sender_delegates() -> None:
    """Two trainers' delegate transports (each wired in a thread, as two workers at once):
    A receives link direction d from B; then, as when a worker and its partner's swaps are
    undone in one step, A sends d to B: each must drop its old side of d (same peer, other
    role) and carry the message over new delegates."""
    d = LinkDirection("0-1", "forward")
    ports: queue.Queue[dict[LinkDirection, DelegateOffer]] = queue.Queue()

    def exchange(
        mine: dict[LinkDirection, DelegateOffer], wanted: tuple[LinkDirection, ...]
    ) -> dict[LinkDirection, DelegateOffer]:
        if mine:  # the receiving side's ports, to the sending side's wiring
            ports.put(mine)
        return ports.get(timeout=30.0) if wanted else {}

    def carry(sender: DelegateTransport, receiver: DelegateTransport, value: float) -> None:
        for transport in (sender, receiver):
            transport.begin_iteration({d: (1, 64)})
        message = Message(0, ACTIVATION, 0, 0)
        buffer = torch.zeros(16)
        pending = receiver.post_receive(d, message, buffer)
        sender.send(d, message, torch.full((16,), value), fault_ms=0.0)
        pending.wait(30.0)
        assert [r.direction for r in sender.finish_iteration(0)] == [d]
        assert torch.equal(buffer, torch.full((16,), value))

    with contextlib.ExitStack() as stack:
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        folder = stack.enter_context(tempfile.TemporaryDirectory(dir=shm))
        other = stack.enter_context(ThreadPoolExecutor(1))

        def setup(rank: int, inbound: tuple, outbound: tuple) -> DelegateSetup:
            return DelegateSetup(rank, folder, inbound, outbound, 1, 30.0, exchange)

        wiring = other.submit(Delegates().connect, setup(0, ((d, 1),), ()))
        b = Delegates().connect(setup(1, (), ((d, 0),)))
        stack.callback(b.close)
        a = wiring.result()
        stack.callback(a.close)
        carry(b, a, 1.0)
        rewired = other.submit(b.rewire, setup(1, ((d, 0),), ()))
        a.rewire(setup(0, (), ((d, 1),)))
        rewired.result()
        carry(a, b, 2.0)
        assert len(a.pids) == len(b.pids) == 1  # the old sides' delegates are gone


D01, D12 = LinkDirection("0-1", "forward"), LinkDirection("1-2", "forward")
IN_LINE: list[Wiring] = [((), ((D01, 1),)), (((D01, 0),), ((D12, 2),)), (((D12, 1),), ())]
"""Ranks 0, 1, 2 playing pipeline positions 0, 1, 2: 0 sends D01 to 1, 1 sends D12 to 2."""
SWAPPED: list[Wiring] = [((), ((D01, 2),)), (((D12, 2),), ()), (((D01, 0),), ((D12, 1),))]
"""Ranks 1 and 2 swapped: 0 sends D01 to 2, 2 sends D12 to 1."""


def test_a_rank_swap_re_points_the_delegates_of_the_sides_it_keeps_and_back() -> None:
    """Three trainers on loopback, two delegates a side. A swap of ranks 1 and 2 re-points
    running delegates, rather than start new ones, wherever a trainer keeps a side of that
    role: rank 0's senders at rank 2's receivers, rank 1's receivers at rank 2's new senders,
    rank 2's receivers at rank 0's senders; rank 1's senders leave (and end). Then the
    swap is undone, a second re-point (rank 1's receivers again, taking rank 0's). Each
    time every message is carried, none twice, and no delegate takes a leaving peer for a
    failure: no failover, no error."""
    with contextlib.ExitStack() as stack:
        trainers = Trainers(stack, Delegates(), 2, IN_LINE)
        t0, t1, t2 = trainers.transports
        carry(t0, t1, 0, [1.0, 2.0], D01)
        carry(t1, t2, 0, [3.0, 4.0], D12)
        pids = [set(t.pids) for t in trainers.transports]
        senders_of_1 = {d.process.pid for d in t1._outbound[D12].delegates}
        trainers.rewire(SWAPPED)
        assert set(t0.pids) == pids[0]
        assert set(t1.pids) == pids[1] - senders_of_1
        assert all(_gone(pid) for pid in senders_of_1)
        assert set(t2.pids) > pids[2] and len(t2.pids) == 4  # and new senders to rank 1
        carry(t0, t2, 1, [5.0, 6.0], D01)
        carry(t2, t1, 1, [7.0, 8.0, 9.0], D12)
        receivers_of_1 = set(t1.pids)
        trainers.rewire(IN_LINE)
        assert set(t0.pids) == pids[0]
        assert set(t1.pids) > receivers_of_1 and len(t1.pids) == 4
        assert set(t2.pids) == pids[2]
        carry(t0, t1, 2, [10.0, 11.0], D01)
        carry(t1, t2, 2, [12.0], D12)
        assert [t.take_failovers() for t in trainers.transports] == [[], [], []]


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_a_message_in_before_its_receiver_s_map_after_a_re_point_lands_in_the_new_slot_file() -> (
    None
):
    """In a swap's iteration a worker that did not move may send before its new peer, which
    moved (it builds and takes state first), has set its slot file up. Rank 2's receiver,
    re-pointed at rank 0's sender, reads the message in before its trainer's map: it waits
    for the new file (its old one, of the same sizes, is its trainer's no more), and the
    trainer takes the values sent (it took zeros from its new file: the message had gone
    into the old)."""
    with contextlib.ExitStack() as stack:
        trainers = Trainers(stack, Delegates(), 1, IN_LINE)
        t0, t1, t2 = trainers.transports
        carry(t0, t1, 0, [1.0, 2.0], D01)
        carry(t1, t2, 0, [3.0, 4.0], D12)  # rank 2's receiver maps a file of 2 x 64 bytes
        trainers.rewire(SWAPPED)
        t0.begin_iteration({D01: (2, 64)})
        for k, value in enumerate([5.0, 6.0]):
            t0.send(D01, Message(1, ACTIVATION, k, k), torch.full((16,), value), fault_ms=0.0)
        t0.finish_iteration(1)  # on the wire: in rank 2's receiver's socket
        (receiver,) = t2._inbound[D01].delegates
        (connection,) = _connections(receiver.process.pid)
        _eventually(lambda: _queued(*connection) == [0], "the receiver's read")
        t2.begin_iteration({D01: (2, 64)})
        buffers = [torch.zeros(16) for _ in range(2)]
        for k, buffer in enumerate(buffers):
            t2.post_receive(D01, Message(1, ACTIVATION, k, k), buffer).wait(30.0)
        assert [b.tolist() for b in buffers] == [[5.0] * 16, [6.0] * 16]


def test_a_rewire_that_fails_to_re_point_a_side_leaves_nothing_behind() -> None:
    """One of rank 2's receiver delegates has died before a swap that re-points their side:
    the rewire fails naming it, and closes the side's other delegate and its slot file as it
    closes the rest (the side was in no list of the transport's while it was re-pointed)."""
    with contextlib.ExitStack() as stack:
        trainers = Trainers(stack, Delegates(), 2, IN_LINE)
        _, t1, t2 = trainers.transports
        carry(t1, t2, 0, [1.0, 2.0], D12)
        dead, other = t2._inbound[D12].delegates
        slot_file = t2._inbound[D12].slots.path
        os.kill(dead.process.pid, signal.SIGKILL)
        dead.process.wait()
        with pytest.raises(
            ConnectionError, match=f"pid {dead.process.pid}\\).*has died \\(killed by SIGKILL"
        ):
            t2.rewire(trainers._setup(2, SWAPPED[2]))  # its receivers are pointed first
        assert t2.pids == [] and _gone(other.process.pid) and not Path(slot_file).exists()


NEEDS_NAMESPACES = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("ss") is None,
    reason="network namespaces need root (and ip, ss)",
)
TWO_NICS = (("10.77.0.1", "10.77.1.1"),) * 2
"""Both trainers' NICs: one host's (`one_host_namespace`)."""


def _a_to_b_on_one_host(stack: contextlib.ExitStack) -> tuple[str, Trainers]:
    """A sends D0 to B over delegates on one host with two NICs, both watched (a namespace
    of the test's, entered; closed with `stack`), iteration 0 carried: the namespace and
    the trainers."""
    namespace = stack.enter_context(one_host_namespace())
    stack.enter_context(entered(namespace))
    delegates = Delegates(addresses=TWO_NICS, ifnames=("nic0", "nic1"))
    trainers = Trainers(stack, delegates, 1, A_TO_B, namespace)
    carry(*trainers.transports, 0, [1.0])
    return namespace, trainers


@NEEDS_NAMESPACES
def test_a_move_between_iterations_by_a_side_closed_at_a_rank_swap_is_recorded() -> None:
    """Two trainers' delegate transports on one host (a namespace of the test's) with two
    NICs: A sends d to B. After iteration 0, nic0 goes down, and A's sender delegate moves
    to nic1 (netlink) between iterations, its trainer not looking. Then a rank swap has A
    receive d from B, and A's sender side is closed: the move is A's failover of
    iteration 1, the one it learns of it in (it was dropped with the side's pipe)."""
    with contextlib.ExitStack() as stack:
        namespace, trainers = _a_to_b_on_one_host(stack)
        a, b = trainers.transports
        assert a.take_failovers() == []
        mover = a._outbound[D0].delegates[0]
        ip_batch(namespace, ["link set nic0 down"])
        readable, _, _ = select.select([mover.notify], [], [], 30.0)
        assert readable, "the sender delegate did not note its move"  # then noted, unread
        trainers.rewire(B_TO_A)
        assert mover.process.poll() is not None  # closed with its side
        carry(b, a, 1, [2.0])
        moves = [(f.direction, f.iteration, f.cause, f.nic_from, f.nic_to, f.resume_seq,
                  f.carrier_pid) for f in a.take_failovers()]  # fmt: skip
        assert moves == [(D0, 1, "link state", 0, 1, -1, mover.process.pid)]
        assert b.take_failovers() == []


@NEEDS_NAMESPACES
def test_a_move_between_iterations_by_a_side_re_pointed_at_a_rank_swap_is_recorded() -> None:
    """Three trainers on one host (a namespace of the test's) with two NICs, in line. After
    iteration 0, nic0 goes down, and rank 0's sender delegate moves to nic1 (netlink)
    between iterations, its trainer not looking. A swap of ranks 1 and 2 re-points it at
    rank 2's receiver: its move, noted before it was re-pointed, is rank 0's failover of
    iteration 1, of the link direction it carried then; the new pair starts on nic1 (its
    own NIC 0 is down: no try there), and carries. Rank 1's sender, on the same NIC, moved
    too: its side is closed at the swap, and its move is rank 1's failover of iteration 1;
    rank 2's new senders start on nic1 (no move). Both moves name the replica their trainers
    played before the swap (here every rank plays replica 1 after it): the pool named a PP
    link's move after the replica played since, another concrete link."""
    delegates = Delegates(addresses=(TWO_NICS[0],) * 3, ifnames=("nic0", "nic1"))
    with contextlib.ExitStack() as stack:
        namespace = stack.enter_context(one_host_namespace())
        stack.enter_context(entered(namespace))
        trainers = Trainers(stack, delegates, 1, IN_LINE, namespace)
        t0, t1, t2 = trainers.transports
        carry(t0, t1, 0, [1.0], D01)
        carry(t1, t2, 0, [2.0], D12)
        (mover,) = t0._outbound[D01].delegates
        (closed,) = t1._outbound[D12].delegates
        ip_batch(namespace, ["link set nic0 down"])
        for delegate in (mover, closed):
            readable, _, _ = select.select([delegate.notify], [], [], 30.0)
            assert readable, "a sender delegate did not note its move"  # then noted, unread
        trainers.replicas = {0: 1, 1: 1, 2: 1}
        trainers.rewire(SWAPPED)
        assert t0._outbound[D01].delegates == [mover]
        carry(t0, t2, 1, [3.0], D01)
        carry(t2, t1, 1, [4.0], D12)
        moves = [
            [(f.direction, f.iteration, f.cause, f.nic_from, f.nic_to, f.carrier_pid, f.replica)
             for f in t.take_failovers()]
            for t in trainers.transports
        ]  # fmt: skip
        assert moves == [
            [(D01, 1, "link state", 0, 1, mover.process.pid, 0)],
            [(D12, 1, "link state", 0, 1, closed.process.pid, 0)],
            [],
        ]
        assert [t._outbound[d].nic_of for t, d in ((t0, D01), (t2, D12))] == [[1], [1]]


class _NicDownBeforeRank0Points(Trainers):
    """Trainers whose rank 0 (sending D01 only), when armed, waits at its exchange (its
    senders idle, or left by their receiver at a swap and not yet pointed again) while
    nic0 goes down."""

    armed = False
    swapping: int | None = None
    """At a swap, the pid of rank 0's sender."""

    def _exchange(
        self, mine: dict[LinkDirection, DelegateOffer], wanted: tuple[LinkDirection, ...]
    ) -> dict[LinkDirection, DelegateOffer]:
        if not mine and self.armed and self.namespace is not None:
            self.armed = False
            if (pid := self.swapping) is not None:  # rank 1 pointed its receiver: a farewell
                _eventually(lambda: _connections(pid) == [], "the farewell")
            else:  # its senders idle: set up (watching netlink), asleep in their wait
                _idle(_children())
            ip_batch(self.namespace, ["link set nic0 down"])
            time.sleep(0.5)  # the senders' netlink event in: no "failover" with no receiver
        return super()._exchange(mine, wanted)


@NEEDS_NAMESPACES
@pytest.mark.parametrize("when", ["start", "swap"])
def test_a_sender_without_a_receiver_takes_its_nic_going_down_for_no_failure(when: str) -> None:
    """Three trainers on one host with two NICs. nic0 goes down while rank 0's sender has no
    receiver: at the start (idle until its point job) or at a swap (its receiver, pointed
    again, said farewell; its own point job not yet there). That is no failover (with no
    receiver it had none to move to, or moved back to the receiver that had left, which
    turned it away: a LinkFailure though nic1 works): pointed, it connects over nic1, and
    carries."""
    delegates = Delegates(addresses=(TWO_NICS[0],) * 3, ifnames=("nic0", "nic1"))
    with contextlib.ExitStack() as stack:
        namespace = stack.enter_context(one_host_namespace())
        stack.enter_context(entered(namespace))
        _NicDownBeforeRank0Points.armed = when == "start"
        trainers = _NicDownBeforeRank0Points(stack, delegates, 1, IN_LINE, namespace)
        t0, t1, t2 = trainers.transports
        if when == "swap":
            carry(t0, t1, 0, [1.0], D01)
            trainers.swapping = t0._outbound[D01].delegates[0].process.pid
            trainers.armed = True
            trainers.rewire(SWAPPED)
            carry(t0, t2, 1, [2.0], D01)
        else:
            carry(t0, t1, 0, [2.0], D01)
        assert t0._outbound[D01].nic_of == [1] and t0.take_failovers() == []


@NEEDS_NAMESPACES
def test_a_rewire_on_a_host_with_every_nic_down_fails_at_once_naming_them() -> None:
    """A sends D0 to B on one host with two NICs; both go down, then a rank swap has B send
    D0 to A: each trainer's rewire is a `LinkFailure` naming the host's NICs, once the
    offers are exchanged (a peer waits for none that never comes). A rewire waited for its
    delegates' whole start-up wait (60 s) whatever the workers' timeout: on the testbed a
    megatron swap onto a host with both NICs down was noticed a minute late."""
    with contextlib.ExitStack() as stack:
        namespace, trainers = _a_to_b_on_one_host(stack)
        ip_batch(namespace, ["link set nic0 down", "link set nic1 down"])
        rewires = [trainers.rewire_one(rank, wiring) for rank, wiring in enumerate(B_TO_A)]
        errors = [rewire.exception(timeout=60) for rewire in rewires]
    for rank, error in enumerate(errors):
        assert isinstance(error, LinkFailure), errors
        assert str(error) == (
            f"rank {rank}: every data-plane NIC of its host is down (nic0, nic1): its "
            "delegates reach no peer"
        )


def test_a_pair_with_no_nic_up_at_both_hosts_is_a_link_failure_of_its_sender() -> None:
    """The offers of the receivers being wired say which NICs are down at their hosts: all
    of one (here both of two) fails the wiring, naming that rank; some, or none, do not
    (this host's NICs named "": unwatched, never down), unless the others are down here:
    a pair with no NIC up at both ends waited the 60 s start-up wait too."""
    offers = {D0: DelegateOffer((5001,), (0, 1))}
    with pytest.raises(LinkFailure) as failed:
        delegated._check_reachable(0, ("", ""), offers, {D0: 1}, {})
    assert str(failed.value) == (
        "rank 1: every data-plane NIC of its host is down: rank 0's delegates cannot reach "
        "it on 0-1 (forward)"
    )
    for down in ((1,), ()):
        delegated._check_reachable(0, ("", ""), {D0: DelegateOffer((5001,), down)}, {D0: 1}, {})
    # No NIC up at both: rnic0 down here (an interface that is gone is down), rnic1 there.
    gone_and_up = ("no-such-nic", "lo")
    with pytest.raises(LinkFailure) as failed:
        delegated._check_reachable(0, gone_and_up, {D0: DelegateOffer((5001,), (1,))}, {D0: 1}, {})
    assert str(failed.value) == (
        "ranks 0 and 1: no data-plane NIC is up at both hosts (no-such-nic down at rank 0's, "
        "lo at rank 1's): 0-1 (forward) cannot connect"
    )
    delegated._check_reachable(0, gone_and_up, {D0: DelegateOffer((5001,), (0,))}, {D0: 1}, {})
    # Hook injection: the routes the fault view has failed count as NICs down.
    for routes, message in [
        ((0, 1), "the fault timeline fails NIC 0, NIC 1"),
        ((1,), "the fault timeline fails NIC 1; NIC 0 down"),
    ]:
        offer = DelegateOffer((5001,), (0,) if len(routes) == 1 else ())
        with pytest.raises(LinkFailure) as failed:
            delegated._check_reachable(0, ("", ""), {D0: offer}, {D0: 1}, {D0: routes})
        assert str(failed.value) == (
            f"ranks 0 and 1: no data-plane NIC's route is up between them ({message}): "
            "0-1 (forward) cannot connect"
        )
    delegated._check_reachable(0, ("", ""), {D0: DelegateOffer((5001,), ())}, {D0: 1}, {D0: (0,)})


@pytest.mark.parametrize("runs_again", ["before the rewire", "during it"])
def test_a_sender_ended_before_its_re_point_is_replaced_by_a_new_one(runs_again: str) -> None:
    """Rank 0 sends D01 to rank 1; a swap then has it send D01 to rank 2 (rank 1's side is
    closed). Rank 1's receiver ended between iterations, gone before its farewell was read
    (as a leaving receiver is for a sender off the CPU, or whose farewell was lost with its
    NIC; here killed while the sender is stopped): the sender moves, every NIC refuses it,
    and it ends. Pointing it fails (the point job's write, if it ran again before the
    rewire; else, mostly, the wait for its READY), so the rewire starts a new delegate in
    its place, pointed as it would have been, and the swap goes through (it failed: "every
    NIC refused it"). Resumed during the rewire, it may read its point first: pointed, it
    carries."""
    one_to_one: list[Wiring] = [((), ((D01, 1),)), (((D01, 0),), ()), ((), ())]
    one_to_two: list[Wiring] = [((), ((D01, 2),)), ((), ()), (((D01, 0),), ())]
    with contextlib.ExitStack() as stack:
        trainers = Trainers(stack, Delegates(), 1, one_to_one)
        t0, t1, t2 = trainers.transports
        carry(t0, t1, 0, [1.0], D01)
        (sender,) = t0._outbound[D01].delegates
        (receiver,) = t1._inbound[D01].delegates
        os.kill(sender.process.pid, signal.SIGSTOP)
        stack.callback(_resume, sender.process.pid)
        receiver.process.kill()
        receiver.process.wait()  # gone whole: its listeners too (a refusal, not a reset)
        if runs_again == "before the rewire":
            _resume(sender.process.pid)
            assert sender.process.wait(30) == 0  # it noted why, and ended
        else:  # (whether before or after its point is read: either way it is replaced)
            threading.Timer(0.5, _resume, [sender.process.pid]).start()
        trainers.rewire(one_to_two)
        (new,) = t0._outbound[D01].delegates
        assert new.process.poll() is None
        if runs_again == "before the rewire":
            assert new.process.pid != sender.process.pid
        # During it, a sender that reads its point before it notices its receiver gone (a
        # loaded host: the timer's resume late) is pointed and carries, no new one needed
        # (a test here asserting a new one failed under load); either way the swap goes
        # through.
        carry(t0, t2, 1, [2.0], D01)
        assert t0.take_failovers() == []


@NEEDS_NAMESPACES
def test_a_move_noted_after_its_last_ack_moves_its_siblings_in_that_iteration() -> None:
    """A sends d to B over two delegates on one host with two NICs (no netlink, no notices:
    TCP's timeout is how a sender learns its route failed). Both messages of iteration 0 are
    in; then delegate 0's connection is aborted (`ss -K`, as TCP's user timeout does after
    a message's last byte went), and it moves to nic1, its note after its last ack. Its
    trainer reads that note only once the acks are in: its sibling, on the same route, is
    moved then too, a failover of iteration 0 (it stayed on nic0 for good)."""
    with contextlib.ExitStack() as stack:
        namespace = stack.enter_context(one_host_namespace())
        stack.enter_context(entered(namespace))
        trainers = Trainers(stack, Delegates(addresses=TWO_NICS), 2, A_TO_B, namespace)
        a, b = trainers.transports
        for transport in (a, b):
            transport.begin_iteration({D0: (2, 64)})
        buffers = [torch.zeros(16) for _ in range(2)]
        messages = [Message(0, ACTIVATION, k, k) for k in range(2)]
        pending = [b.post_receive(D0, m, buffers[m.seq]) for m in messages]
        for k, message in enumerate(messages):
            a.send(D0, message, torch.full((16,), float(k)), fault_ms=0.0)
        for receive in pending:
            receive.wait(30.0)
        mover, sibling = a._outbound[D0].delegates
        assert _sources(mover.process.pid) == _sources(sibling.process.pid) == ["10.77.0.1"]
        _abort(mover.process.pid)
        _eventually(lambda: _notes_written(mover) == 2, "its ack, then its move")
        a.finish_iteration(0)
        assert b.finish_iteration(0) == []
        moves = [(f.iteration, f.cause, f.nic_from, f.nic_to, f.resume_seq, f.carrier_pid)
                 for f in a.take_failovers()]  # fmt: skip
        assert moves == [
            (0, "timeout", 0, 1, -1, mover.process.pid),
            (0, "sibling", 0, 1, -1, sibling.process.pid),
        ]
        assert _sources(mover.process.pid) == _sources(sibling.process.pid) == ["10.77.1.1"]
        carry(a, b, 1, [3.0, 4.0])
        assert a.take_failovers() == []


@NEEDS_NAMESPACES
def test_a_move_in_progress_when_a_rank_swap_closes_its_side_is_recorded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sends d to B on one host with two NICs. After iteration 0, B's receiver delegate is
    stopped (a loaded host's), and nic0 goes down: A's sender delegate moves (netlink), its
    connection over nic1 up and its hello unanswered. A rank swap has A receive d from B,
    and A closes its sender side meanwhile; the receiver runs again once A has closed the
    delegate's job pipe (B's side of the swap, which closes the receiver, waits for A's
    close). The move finishes after its trainer closed the side, and is A's failover of
    iteration 1 all the same. (The mover waits CONNECT_TIMEOUT_S, 5 s, for the answer, and
    a loaded host may take longer to run the test to A's close: the mover is stopped too,
    from its hello until the receiver's answer is in its socket, which it then finds at
    once whenever it runs again.)"""
    with contextlib.ExitStack() as stack:
        namespace, trainers = _a_to_b_on_one_host(stack)
        a, b = trainers.transports
        mover = a._outbound[D0].delegates[0]
        receiver = b._inbound[D0].delegates[0].process.pid
        os.kill(receiver, signal.SIGSTOP)
        stack.callback(_resume, receiver)  # also if the test fails first
        ip_batch(namespace, ["link set nic0 down"])
        over_nic1 = ["10.77.1.1"]
        _eventually(lambda: _sources(mover.process.pid) == over_nic1, "its move's connection")
        (mine,) = _connections(mover.process.pid)
        hello_in = [HEADER.size]  # in the receiver's socket, not yet accepted
        _eventually(lambda: _queued(mine[1], mine[0]) == hello_in, "its move's hello")
        os.kill(mover.process.pid, signal.SIGSTOP)
        stack.callback(_resume, mover.process.pid)
        assert _notes_written(mover) == 0  # its move waits for the receiver's answer
        job_pipe, real_close, real_close_side = mover.control, os.close, a._close
        closed_side, hung_up = threading.Event(), threading.Event()

        def close(fd: int) -> None:
            real_close(fd)
            # A hangs up on the mover (once: ss's pipes may reuse the number): its receiver
            # runs again, answers, and then the mover, which finds the answer in.
            if fd == job_pipe and not hung_up.is_set():
                hung_up.set()
                _resume(receiver)
                answer_in = [RESUME.size]
                _eventually(lambda: _queued(*mine) == answer_in, "the receiver's answer")
                _resume(mover.process.pid)

        def close_side(side: delegated._Side) -> None:
            real_close_side(side)
            closed_side.set()

        monkeypatch.setattr(os, "close", close)
        monkeypatch.setattr(a, "_close", close_side)
        rewired = trainers.rewire_one(1, B_TO_A[1], after=closed_side)
        trainers.rewire_one(0, B_TO_A[0]).result()
        monkeypatch.undo()
        rewired.result()
        assert mover.process.poll() == 0  # it ended by itself, once it had noted its move
        carry(b, a, 1, [2.0])
        moves = [(f.direction, f.iteration, f.cause, f.nic_from, f.nic_to, f.resume_seq,
                  f.carrier_pid) for f in a.take_failovers()]  # fmt: skip
        assert moves == [(D0, 1, "link state", 0, 1, -1, mover.process.pid)]
        assert b.take_failovers() == []


def _resume(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


def _sources(pid: int) -> list[str]:
    """The local addresses of the established TCP connections of process `pid` (in this
    thread's namespace)."""
    out = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    return sorted(line.split()[2].rsplit(":", 1)[0] for line in out.splitlines()
                  if f"pid={pid}," in line)  # fmt: skip


def _ss_established() -> list[list[str]]:
    """`ss`'s established TCP connections (in this thread's namespace): Recv-Q, Send-Q,
    local address:port, peer address:port, and the process, if one has it yet."""
    out = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    return [line.split() for line in out.splitlines()]


def _connections(pid: int) -> list[tuple[str, str]]:
    """(local, peer) address:port of each established TCP connection of process `pid`."""
    return [(c[2], c[3]) for c in _ss_established() if f"pid={pid}," in " ".join(c[4:])]


def _queued(local: str, peer: str) -> list[int]:
    """The bytes received and not yet read on the connection from `local` to `peer` (none
    if there is no such connection)."""
    return [int(c[0]) for c in _ss_established() if (c[2], c[3]) == (local, peer)]


def _abort(pid: int) -> None:
    """Abort process `pid`'s one established TCP connection (a reset, as a failed route's
    timeout breaks it)."""
    out = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    (local,) = [line.split()[2] for line in out.splitlines() if f"pid={pid}," in line]
    address, port = local.rsplit(":", 1)
    subprocess.run(["ss", "-K", "src", address, "sport", "=", port], capture_output=True,
                   check=True)  # fmt: skip


def _notes_written(delegate: delegated._Process) -> int:
    """How many notes `delegate` has written that its trainer has not taken."""
    (waiting,) = struct.unpack("i", fcntl.ioctl(delegate.notify, termios.FIONREAD, b"\0" * 4))
    return (len(delegate.unread) + waiting) // NOTE.size


def _eventually(check: Callable[[], bool], what: str) -> None:
    """Until `check()` holds (30 s at most: a hang guard)."""
    deadline = time.monotonic() + 30.0
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within 30 s"
        time.sleep(0.01)


def test_delegates_started_before_one_that_fails_to_start_are_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second of three receiver delegates cannot start (e.g. no process left): the
    first has ended by the time the error is raised and no pipe of theirs stays open."""
    started: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def popen(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        if len(started) == 1:
            raise OSError(11, "Resource temporarily unavailable")
        started.append(real_popen(*args, **kwargs))  # type: ignore[call-overload]
        return started[-1]

    fds_before = sorted(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(delegated.subprocess, "Popen", popen)
    with tempfile.TemporaryDirectory() as folder, pytest.raises(OSError, match="unavailable"):
        direction = LinkDirection("0-1", "forward")
        delegated._Inbound(direction, 0, 3, [",".join(delegated.LOOPBACK_NICS), "", ""], folder)
    assert len(started) == 1 and started[0].poll() is not None
    assert sorted(os.listdir("/proc/self/fd")) == fds_before
