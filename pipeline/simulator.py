"""An exact, event-driven simulator of one schedule under a profile.

With a fixed op order per stage every op starts at max(stage free, inputs arrived), so ops are
evaluated in dependency order as their inputs become known: no time step, no rounding, and
O(number of ops). The three communication modes are those of docs/design.md.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any

from pipeline.allreduce import KIND, MessageDelay, RingMessage, SendDelay, rings_done_ms
from pipeline.errors import ConfigError, LinkFailure, ScheduleError
from pipeline.faults import NO_FAULTS, IterationFaults, route_over
from pipeline.host_costs import FREE, HostCosts, RingLag
from pipeline.nccl_sleep import LinkDirection, Message, time_replica
from pipeline.ops import Op, OpKind
from pipeline.profile import Profile
from pipeline.schedule import ReplicaSchedules, Schedule, validate_schedule
from pipeline.timeline import FailoverRecord, IterationRecord, MessageRecord, OpRecord, Timeline
from pipeline.topology import Direction, Link, is_dp_link

__all__ = ["HOST_COST_COMMS", "CommMode", "LinkComm", "check_takes_host_costs", "simulate"]


class CommMode(StrEnum):
    IDEAL = "ideal"
    """A message arrives transfer time after its op ends; sending costs the stage nothing."""
    DIRECT = "direct"
    """The send runs on the stage after its op: head-of-line blocking until it completes."""
    DELEGATED = "delegated"
    """Copies to and from host on the stage; delegates per link direction carry messages."""
    NCCL_SLEEP = "nccl-sleep"
    """The paper's GPU path as its artifact injects delays (pipeline.nccl_sleep): NCCL sends
    and receives on one dispatch queue per GPU, each delay a sleep kernel before a send."""


HOST_COST_COMMS = (CommMode.DIRECT, CommMode.DELEGATED)
"""The comm modes a host's runtime costs (`simulate`'s `host`, a calibration) apply to:
`ideal` (the paper's model) and `nccl-sleep` (the paper's GPU path) take none."""


def check_takes_host_costs(comm: str, calibration: str = "a calibration") -> None:
    """A ConfigError where a calibration (`calibration`: how the input names it) is given for
    messages sent `comm`, which takes no host costs (`HOST_COST_COMMS`): it would change
    nothing there, or be charged to only some of the systems compared."""
    if CommMode(comm) not in HOST_COST_COMMS:
        raise ConfigError(
            f"{calibration} adds this host's runtime costs to comm direct or delegated; "
            f"{comm} takes none"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class LinkComm:
    """One PP link direction's comm mode (every replica), where a plan mixes modes."""

    link: Link
    direction: Direction
    """Forward (activations) or backward (gradients)."""
    comm: CommMode

    def __post_init__(self) -> None:
        if not self.link.is_pp or self.direction not in _DIRECTIONS:
            raise ConfigError(
                f"a link comm is a PP link's direction (forward or backward), not "
                f"{self.link} {self.direction}"
            )
        if self.link.group is not None:  # the runtimes and the simulator set every replica's
            raise ConfigError(
                f"a link comm sets every replica's link: "
                f"{Link.pp(self.link.first)}, not {self.link}"
            )


def _durations(profile: Profile) -> dict[OpKind, tuple[float, ...]]:
    fused = tuple(b + w for b, w in zip(profile.t_b_ms, profile.t_w_ms, strict=True))
    return {
        OpKind.F: profile.t_f_ms,
        OpKind.B: profile.t_b_ms,
        OpKind.W: profile.t_w_ms,
        OpKind.BW: fused,
    }


_DIRECTIONS = tuple(Direction)
"""Indexed by a message's direction number (0 forward, 1 backward) in the hot loop."""


def _records(messages: list[list[Any]]) -> tuple[MessageRecord, ...]:
    """The messages' records, once every one sent has been taken in by an op (a schedule that
    was not validated could leave one behind)."""
    for fields in messages:
        if fields[8] is None:
            raise ScheduleError(
                f"no op takes in the {fields[2]} message of microbatch {fields[3]} on link "
                f"{fields[1]} (a schedule that was not validated)"
            )
    # What MessageRecord._make does (every field is there), without a Python call per message.
    return tuple(map(functools.partial(tuple.__new__, MessageRecord), messages))


def _pp_link_down(
    iteration: int, direction: Direction, microbatch: int, link: Link, at_ms: float
) -> LinkFailure:
    return LinkFailure(
        f"iteration {iteration}: the {direction} message of microbatch {microbatch} on link "
        f"{link} cannot go: its link or a NIC on its route is down ({at_ms:.3f} ms into the "
        "iteration)",
        at_ms=at_ms,
    )


def simulate(
    schedule: Schedule,
    profile: Profile,
    comm: CommMode = CommMode.IDEAL,
    *,
    iteration: int = 0,
    start_ms: float = 0.0,
    validate: bool = True,
    host: HostCosts = FREE,
    faults: IterationFaults = NO_FAULTS,
    link_comms: Sequence[LinkComm] = (),
    nics_in_use: Mapping[tuple[int, str, str], int] | None = None,
    replica_schedules: ReplicaSchedules | None = None,
    faults_from_ms: float | None = None,
    delays_in_network: bool = False,
) -> Timeline:
    """Time every op and message of one iteration starting at `start_ms` (`faults_from_ms`,
    default `start_ms`: where the iteration began for `faults`' offsets, before a rank swap's
    state transfer). `comm` is every
    link direction's mode but those `link_comms` give another (modes mixed per direction).
    `faults` adds each message's fault delay (pipeline.faults) to its link's transfer time.
    With DP replicas (`profile.num_replicas`), every replica runs the pipeline (the profile's
    PP delays apply to each; a replica whose links the faults leave alone, beside a replica 0
    they leave alone too, is a copy of replica 0), and with a DP step
    (`profile.has_dp_step`) the iteration ends with it: each stage's all-reduce, message by
    message (pipeline.allreduce), and optimizer; its messages are not in the timeline's
    records (PP only). `host` adds a real host's runtime costs to `direct` and `delegated`
    (not to `ideal`, the paper's model): after each op its stage is busy `op_overhead_ms`
    more, before the op's send (the runtime's op overruns, then sends); a send holds its
    sender (direct) `host.send_ms(bytes)`, and the message is there
    `host.receive_lag_for_ms(bytes)` after the send returns; delegated, the sender pays
    `host.copy_out_ms(bytes)`, a delegate picks the message up `host.delegate_pickup_ms`
    later and is busy until it is there `host.delegate_transfer_ms(bytes)` after that (and
    the wire), and the receiver copies it in as it arrives: its op may start
    `host.copy_in_ms(bytes)` after its arrival (the profile's device copy, `copy_gbps`, comes
    before the op, as the paper's model has it).

    A message whose route has failed (a NIC or link down) is a LinkFailure over the direct
    path (gloo's one NIC, the first), and over delegates where no other NIC has its route
    up; else over delegates its link direction fails over to the first NIC whose route is up
    (pipeline.faults.route_over, as adaptra.transport's sender delegates): its delegates are
    busy `host.failover_ms` from the message's send, and it and the direction's later
    messages go over that NIC and meet its route's faults (the timeline's `failovers`; a
    later failure there moves it again, back to a repaired NIC too). `nics_in_use`: the NIC
    (by index) of each (replica, link, direction) that an earlier iteration left off the
    first (the sim engine keeps them from iteration to iteration). `replica_schedules`: each
    replica's own schedule on its share of the global batch (unequal microbatch counts;
    None: every replica runs `schedule`). `nccl-sleep` (pipeline.nccl_sleep) takes no host
    costs, mixes with no other mode, and fails a message whose own link's route is down
    and times its own link's cap on its wire (stage 2's gradients too, which its injector
    counts on link 2-3: their sleep is that link's injected delay).

    `delays_in_network`: the delays and caps are a network's (`--inject network`, the
    testbed's wires and htb caps), not a sleep before each send (the fault hook's, the
    paper's artifact's): a `direct` or `delegated` PP message holds its sender (direct) or
    delegate (delegated) for the host's send cost only; its bytes go through one queue per
    link direction and replica at the link's rate (the lowest cap on its route), after the
    bytes of the direction's earlier messages, whatever carried them; then the latency and
    the delays, a propagation time that messages in flight share (pipelined); it arrives at
    the later of its send's return and its last byte's propagation, the host's receive lag
    later, and not before the link direction's earlier direct message (one connection
    delivers in order: a jitter draw lower than the one before waits for it; a delegate's
    connection is not held by another's). A delegate's own rate plays no part (its bytes
    cross the same queue); `ideal`, `nccl-sleep` and the DP ring are timed as without it."""
    num_stages, num_replicas = profile.num_stages, profile.num_replicas
    message_bytes = profile.message_bytes
    origin_ms = start_ms if faults_from_ms is None else faults_from_ms
    if replica_schedules is None:
        counts = (profile.num_microbatches,) * num_replicas
    else:
        counts = replica_schedules.counts
        if len(counts) != num_replicas:
            raise ScheduleError(f"{len(counts)} replica schedules for {num_replicas} replicas")

    def schedule_of(replica: int) -> Schedule:
        return schedule if replica_schedules is None else replica_schedules.schedules[replica]

    if validate:
        for replica in range(num_replicas):
            validate_schedule(schedule_of(replica), num_stages, counts[replica])
    comm = CommMode(comm)
    if CommMode.NCCL_SLEEP in (comm, *(o.comm for o in link_comms)) and link_comms:
        raise ScheduleError("comm nccl-sleep times every link alike: it mixes with no other mode")
    # modes[link][direction]: how that link direction's messages go.
    modes = [[comm, comm] for _ in range(num_stages - 1)]
    for override in link_comms:
        modes[override.link.first][_DIRECTIONS.index(override.direction)] = override.comm
    if comm is CommMode.NCCL_SLEEP or (
        comm is CommMode.IDEAL and all(mode is CommMode.IDEAL for pair in modes for mode in pair)
    ):
        host = FREE  # (a one-stage pipeline has no PP link, and its ring its host's costs)
    op_overhead_ms = host.op_overhead_ms
    send_ms = host.send_ms(profile.message_bytes)
    lag_ms = host.receive_lag_for_ms(profile.message_bytes)
    durations = _durations(profile)
    transfer = [profile.transfer_ms(i) for i in range(num_stages - 1)]
    # delays_in_network: a message's bytes at its link's own rate (the rest of a transfer
    # propagates: the latency and the delays).
    bytes_ms = profile.wire_ms() - profile.link_latency_ms
    copy_out_ms = profile.copy_ms() + host.copy_out_ms(message_bytes)
    pickup_ms = host.delegate_pickup_ms
    deliver_ms = host.delegate_transfer_ms(message_bytes)
    # The receiver's copy of a delegated message as it arrives (the runtime's receiver thread).
    copy_on_arrival_ms = host.copy_in_ms(message_bytes)
    # A delegate sends at its own rate (profile.delegate_gbps), not the link's.
    delegated_extra_ms = profile.delegated_wire_ms() - profile.wire_ms()
    num_delegates = profile.delegate_count()
    # The host-to-device copy before an op that takes in a delegated message.
    copy_in = [
        [profile.copy_ms() if mode is CommMode.DELEGATED else 0.0 for mode in pair]
        for pair in modes
    ]
    copy_before_f = [0.0] + [copy_in[i][0] for i in range(num_stages - 1)]
    copy_before_b = [copy_in[i][1] for i in range(num_stages - 1)] + [0.0]
    # delegate_free[link][direction][slot]: when that delegate has delivered its last message.
    links = [str(Link.pp(i)) for i in range(num_stages - 1)]  # every replica's name
    last = num_stages - 1

    failovers: list[FailoverRecord] = []
    nics = profile.topology.nics
    in_use = {} if nics_in_use is None else nics_in_use

    def run_replica(replica: int) -> tuple[list[OpRecord], list[list[Any]], list[float]]:
        """One replica's pipeline: its ops, its messages' fields, when each stage is done."""
        if comm is CommMode.NCCL_SLEEP:
            return run_nccl_replica(replica)
        stages = schedule_of(replica).stages
        count = counts[replica]
        delegate_free = [[[start_ms] * num_delegates for _ in range(2)] for _ in transfer]
        # bytes_free[link][direction]: when its last byte has left (delays_in_network).
        bytes_free = [[start_ms, start_ms] for _ in transfer]
        # in_order[link][direction]: the last direct arrival there (one stream, in order).
        in_order = [[start_ms, start_ms] for _ in transfer]
        on_nic = {(link, d): nic for (r, link, d), nic in in_use.items() if r == replica}
        num_sent = [[0, 0] for _ in transfer]
        pp_links = [Link.pp(i, replica) for i in range(num_stages - 1)]  # (faults)
        # arrival[i][m]: when stage i may consume the activation (fwd) or gradient (bwd) of m.
        fwd_arrival: list[list[float | None]] = [[None] * count for _ in range(num_stages)]
        bwd_arrival: list[list[float | None]] = [[None] * count for _ in range(num_stages)]
        for m in range(count):
            fwd_arrival[0][m] = start_ms
        # in_flight[direction][i][m]: the fields of the message of m to stage i (0 fwd, 1 bwd),
        # from its send on; the op that takes it in fills in `needed_ms`.
        in_flight: list[list[list[list[Any]]]] = [
            [[[]] * count for _ in range(num_stages)] for _ in range(2)
        ]
        free_at = [start_ms] * num_stages
        position = [0] * num_stages
        op_records: list[OpRecord] = []
        messages: list[list[Any]] = []
        pending = list(range(num_stages - 1, -1, -1))
        while pending:
            stage_idx = pending.pop()
            ops = stages[stage_idx]
            free = free_at[stage_idx]
            pos = position[stage_idx]
            notify = []
            while pos < len(ops):
                op: Op = ops[pos]
                kind, m = op
                remote = True
                if kind is OpKind.F:
                    ready = fwd_arrival[stage_idx][m]
                    remote = stage_idx > 0
                elif kind is OpKind.W:
                    ready = free
                    remote = False
                elif stage_idx == last:
                    ready = free  # its own F already ran earlier in this stage's order
                    remote = False
                else:
                    ready = bwd_arrival[stage_idx][m]
                if ready is None:
                    break
                start = max(free, ready)
                if remote:
                    # The stage asked for the message at `free` (it arrived at `ready`).
                    in_flight[0 if kind is OpKind.F else 1][stage_idx][m][8] = free
                    # the host-to-device copy of the received message (delegated)
                    start += (copy_before_f if kind is OpKind.F else copy_before_b)[stage_idx]
                end = start + durations[kind][stage_idx]
                op_records.append(OpRecord(iteration, stage_idx, kind, m, start, end, replica))
                # The runtime's own time after an op (mostly the op overrunning its asked
                # time) comes before its send: the message leaves once it is over.
                sent = free = end + op_overhead_ms
                pos += 1
                if kind is OpKind.F and stage_idx < last:
                    link_idx, direction, dest, arrivals = stage_idx, 0, stage_idx + 1, fwd_arrival
                elif (kind is OpKind.B or kind is OpKind.BW) and stage_idx > 0:
                    link_idx, direction, dest, arrivals = (
                        stage_idx - 1,
                        1,
                        stage_idx - 1,
                        bwd_arrival,
                    )
                else:
                    continue
                transfer_ms = transfer[link_idx]
                fault_ms = profile.delay_ms[link_idx]
                cap_ms = 0.0  # what a fault's cap adds to the message's bytes
                mode = modes[link_idx][direction]
                if faults is not NO_FAULTS:
                    here = (links[link_idx], _DIRECTIONS[direction])
                    nic = on_nic.get(here, 0) if mode is CommMode.DELEGATED else 0
                    route = route_over(
                        faults, nic, len(nics) if mode is CommMode.DELEGATED else 1,
                        pp_links[link_idx], here[1], "FB"[direction], m, message_bytes,
                        sent - origin_ms,
                    )  # fmt: skip
                    if route.fault.failed:
                        raise _pp_link_down(
                            iteration, here[1], m, pp_links[link_idx], sent - origin_ms
                        )
                    if route.nic != nic:  # its delegates move to that NIC
                        on_nic[here] = route.nic
                        slots = delegate_free[link_idx][direction]
                        slots[:] = [max(t, sent) + host.failover_ms for t in slots]
                        seq = num_sent[link_idx][direction]
                        record = FailoverRecord(
                            iteration, here[0], here[1], replica, "fault hook", nics[nic],
                            nics[route.nic], sent, sent + host.failover_ms, seq, carrier_pid=0,
                        )  # fmt: skip
                        failovers.append(record)
                    transfer_ms += route.fault.delay_ms
                    fault_ms += route.fault.delay_ms
                    cap_ms = route.fault.cap_ms
                wire_start, copied_in, copying_ms = sent, 0.0, 0.0
                if mode is CommMode.IDEAL:
                    send_end = sent
                    arrival = sent + transfer_ms
                elif mode is CommMode.DIRECT and delays_in_network:
                    send_end = sent + send_ms
                    landed = _landed_ms(
                        bytes_free[link_idx], direction, sent, bytes_ms, cap_ms, transfer_ms
                    )
                    arrival = max(send_end, landed) + lag_ms
                    # one connection delivers in order: a message whose delay drew less
                    # (jitter) waits for the one before it
                    arrival = in_order[link_idx][direction] = max(
                        arrival, in_order[link_idx][direction]
                    )
                elif mode is CommMode.DIRECT:
                    send_end = sent + transfer_ms + send_ms
                    arrival = send_end + lag_ms
                else:
                    send_end = sent + copy_out_ms
                    copying_ms = copy_on_arrival_ms
                    copied_in = profile.copy_ms() + copying_ms
                    seq = num_sent[link_idx][direction]
                    num_sent[link_idx][direction] = seq + 1
                    slots = delegate_free[link_idx][direction]
                    slot = seq % num_delegates
                    wire_start = max(send_end + pickup_ms, slots[slot])
                    if delays_in_network:  # the delegate is busy with its send only
                        slots[slot] = wire_start + deliver_ms
                        landed = _landed_ms(
                            bytes_free[link_idx],
                            direction,
                            wire_start,
                            bytes_ms,
                            cap_ms,
                            transfer_ms,
                        )
                        arrival = max(slots[slot], landed)
                    else:
                        carried_ms = transfer_ms + delegated_extra_ms
                        slots[slot] = arrival = wire_start + carried_ms + deliver_ms
                free = max(free, send_end)
                arrivals[dest][m] = arrival + copying_ms
                fields = [
                    iteration,
                    links[link_idx],
                    _DIRECTIONS[direction],
                    m,
                    message_bytes,
                    sent,
                    send_end,
                    arrival,
                    None,  # needed_ms, from the op that takes it in
                    replica,
                    fault_ms,
                    wire_start,
                    copied_in,
                    0,  # carrier_pid: no process
                ]
                in_flight[direction][dest][m] = fields
                messages.append(fields)
                notify.append(dest)
            free_at[stage_idx] = free
            position[stage_idx] = pos
            pending.extend(notify)
        return op_records, messages, free_at

    def run_nccl_replica(replica: int) -> tuple[list[OpRecord], list[list[Any]], list[float]]:
        pp_links = [Link.pp(i, replica) for i in range(num_stages - 1)]

        def sleep_for(
            own: LinkDirection, counted: LinkDirection | None, message: Message, at_ms: float
        ) -> tuple[float, float]:
            """The sleep before a send over `own` that the injector counts on `counted`: the
            profile's and the faults' injected delay there; and what a cap on `own` adds to
            the send's wire time (a cap is the wire's: it stays with the link the send
            crosses); a LinkFailure where `own`'s route is down. A misread send (`counted`
            not `own`) is asked about on both, in that order: a view's per-sender state (a
            stall paid) follows each ask, so a stall on `counted` goes to the first send the
            injector counts there (its one-off sleep) and one on `own`'s route to the first
            send over it (as in every mode), though not slept."""
            if faults is NO_FAULTS:
                return (0.0 if counted is None else profile.delay_ms[counted[0]]), 0.0
            kind, m = message
            at_ms += start_ms - origin_ms  # time_replica's offsets are from `start_ms`
            link, direction = pp_links[own[0]], own[1]
            fault = faults.message_fault(link, direction, kind, m, message_bytes, at_ms)
            if fault.failed:
                raise _pp_link_down(iteration, direction, m, link, at_ms)
            cap_ms = fault.cap_ms
            if counted is None:
                return 0.0, cap_ms
            if counted != own:  # (a failure there is not this send's, nor a cap there)
                link, direction = pp_links[counted[0]], counted[1]
                fault = faults.message_fault(link, direction, kind, m, message_bytes, at_ms)
            return profile.delay_ms[counted[0]] + fault.delay_ms - fault.cap_ms, cap_ms

        def fault_free() -> dict[tuple[int, Op], tuple[float, float]]:
            """This replica's pipeline alone with nothing injected (`ideal`)."""
            healthy = Profile(
                num_stages=num_stages, num_microbatches=counts[replica],
                t_f_ms=profile.t_f_ms, t_b_ms=profile.t_b_ms, t_w_ms=profile.t_w_ms,
                message_bytes=message_bytes, link_latency_ms=profile.link_latency_ms,
                link_bandwidth_gbps=profile.link_bandwidth_gbps,
            )  # fmt: skip
            ops = simulate(schedule_of(replica), healthy, validate=False).ops
            return {(r.stage, Op(r.kind, r.microbatch)): (r.start_ms, r.end_ms) for r in ops}

        ops, sent, done = time_replica(
            schedule_of(replica).stages,
            lambda stage, op: durations[op.kind][stage],
            profile.wire_ms(),
            sleep_for,
            start_ms,
            fault_free,
        )
        op_records = [
            OpRecord(iteration, s, op.kind, op.microbatch, a, b, replica) for s, op, a, b in ops
        ]
        fields = [
            [
                iteration,
                links[min(m.sender, m.receiver)],
                Direction.between(m.sender, m.receiver),
                m.message[1],
                message_bytes,
                m.sent_ms,
                m.arrival_ms,
                m.arrival_ms,
                m.asked_ms,
                replica,
                m.sleep_ms + m.cap_ms,  # the injected delay it slept, and its wire's cap
                m.wire_start_ms,
                0.0,
                0,
            ]
            for m in sent
        ]
        return op_records, fields, done

    op_records, messages, free_at = run_replica(0)
    stage_ends = [free_at]
    affected = [
        faults is not NO_FAULTS
        and any(faults.affects(Link.pp(i, k)) for i in range(num_stages - 1))
        for k in range(num_replicas)
    ]
    replica_ops, replica_messages = [], []
    for k in range(1, num_replicas):
        if affected[0] or affected[k] or schedule_of(k) != schedule_of(0):  # its own timing
            ops_k, messages_k, free_k = run_replica(k)
            replica_ops += ops_k
            replica_messages += messages_k
            stage_ends.append(free_k)
        else:  # the same as replica 0's
            replica_ops += [OpRecord(*r[:-1], k) for r in op_records]
            replica_messages += [[*r[:9], k, *r[10:]] for r in messages]
            stage_ends.append(free_at)
    op_records += replica_ops
    messages += replica_messages
    end_ms = max((r.end_ms for r in op_records), default=start_ms)
    records = _records(messages)
    step_end_ms = end_ms
    dp_messages: list[MessageRecord] = []
    if profile.has_dp_step:
        dp_nics = {key: nic for key, nic in in_use.items() if is_dp_link(key[1])}
        step_end_ms = _step_end_ms(
            profile, stage_ends, host, faults, iteration, origin_ms,
            _DpFailover(comm is CommMode.DELEGATED, dp_nics, failovers, nics),
            dp_messages,
            host.ring_lag(delegated=comm is CommMode.DELEGATED),
        )  # fmt: skip
    return Timeline(
        num_stages=num_stages,
        ops=tuple(op_records),
        messages=records,
        iterations=(IterationRecord(iteration, start_ms, step_end_ms, step_end_ms - end_ms, ()),),
        failovers=tuple(failovers),
        dp_messages=tuple(dp_messages),
    )


@dataclasses.dataclass(slots=True)
class _DpFailover:
    """The DP ring's link directions over delegates (`delegated`: the plan's comm is): one
    whose route fails moves to the first NIC whose route is up (`route_over`), holding its
    sender `host.failover_ms` (recorded in `failovers`); `on_nic`: the NIC of each (sender
    replica, link, direction) that is off the first, here or since an earlier iteration."""

    delegated: bool
    on_nic: dict[tuple[int, str, str], int]
    failovers: list[FailoverRecord]
    nics: tuple[str, ...]


def _step_end_ms(
    profile: Profile,
    stage_end_ms: list[list[float]],
    host: HostCosts,
    faults: IterationFaults,
    iteration: int,
    origin_ms: float,
    failover: _DpFailover,
    dp_messages: list[MessageRecord],
    ring_lag: RingLag,
) -> float:
    """When the last stage has reduced its gradients over its replicas and stepped, given
    when each stage was done with its pipeline on each replica (`stage_end_ms[replica]`). A
    DP message holds its sender for its injected delay, its wire time and the host's send
    cost, and can be used the host's receive lag and the ring's lag later (`ring_lag` at its
    size and the number of stages' rings running then; the `direct` path's rule, over
    delegates too, with the delegated ring's lag). A message whose route failed is a
    LinkFailure, unless its link direction is delegated (`failover`) and another
    NIC's route is up (it moves there: `route_over`, holding its sender `host.failover_ms`
    more, which is no injected delay: not in its record's `fault_ms`). Every DP
    message's record goes to `dp_messages` (its `replica`: the sender's; `microbatch`: its
    index; on the wire from its send's start)."""
    static_ms = dict(profile.dp_delay_ms)

    @functools.cache  # a few sizes and ring counts, asked for every chunk
    def chunk_cost(num_bytes: int, num_rings: int) -> tuple[float, float]:
        hold_ms = profile.dp_wire_ms(num_bytes) + host.send_ms(num_bytes)
        return hold_ms, host.receive_lag_for_ms(num_bytes) + ring_lag.ms(num_bytes, num_rings)

    ask = faults is not NO_FAULTS
    num_nics = len(failover.nics) if failover.delegated else 1  # gloo: the first NIC only

    def message_delay(
        link: Link, direction: Direction, index: int, num_bytes: int, sent_at_ms: float
    ) -> SendDelay:
        delay_ms = static_ms.get(link, 0.0) if static_ms else 0.0
        hold_ms = 0.0  # a failover's move: it holds the sender, nobody injected it
        if ask:
            offset_ms = sent_at_ms - origin_ms
            sender = link.sender(direction).replica
            here = (sender, str(link), direction)
            nic = failover.on_nic.get(here, 0) if failover.delegated else 0
            route = route_over(
                faults, nic, num_nics, link, direction, KIND, index, num_bytes, offset_ms
            )
            if route.fault.failed:
                raise LinkFailure(
                    f"iteration {iteration}: all-reduce message {index} ({direction}) on link "
                    f"{link} cannot go: its link or a NIC on its route is down "
                    f"({offset_ms:.3f} ms into the iteration)",
                    at_ms=offset_ms,
                )
            if route.nic != nic:
                failover.on_nic[here] = route.nic
                record = FailoverRecord(
                    iteration, here[1], direction, sender, "fault hook", failover.nics[nic],
                    failover.nics[route.nic], sent_at_ms, sent_at_ms + host.failover_ms, index,
                    carrier_pid=0,
                )  # fmt: skip
                failover.failovers.append(record)
                hold_ms = host.failover_ms
            delay_ms += route.fault.delay_ms
        return SendDelay(delay_ms, hold_ms)

    def record(m: RingMessage) -> None:
        dp_messages.append(
            MessageRecord(
                iteration, str(m.link), m.direction, m.number, m.num_bytes, m.send_start_ms,
                m.send_end_ms, m.arrival_ms, m.needed_ms, m.sender, m.fault_ms, m.send_start_ms,
            )
        )  # fmt: skip

    delay: MessageDelay | None = message_delay if static_ms or ask else None
    ends = rings_done_ms(
        [[ends[stage] for ends in stage_end_ms] for stage in range(profile.num_stages)],
        profile.allreduce_bytes,
        profile.dp_bucket_bytes,
        chunk_cost,
        delay,
        record,
    )
    return max(max(e) + profile.optimizer_ms[stage] for stage, e in enumerate(ends))


def _landed_ms(
    bytes_free: list[float],
    direction: int,
    sent_ms: float,
    bytes_ms: float,
    cap_ms: float,
    transfer_ms: float,
) -> float:
    """Under `delays_in_network`: when a message's last byte reaches the far end. Its bytes
    leave after the link direction's earlier ones (`bytes_free[direction]`, moved on by its
    bytes at the link's rate and a cap's extra), then propagate for the rest of its
    `transfer_ms` (the latency and the delays)."""
    bytes_free[direction] = max(sent_ms, bytes_free[direction]) + bytes_ms + cap_ms
    flight_ms = transfer_ms - bytes_ms - cap_ms
    return bytes_free[direction] + flight_ms
