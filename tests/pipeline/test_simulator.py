import dataclasses
import itertools
from collections import defaultdict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from baselines import one_f_one_b, zb_h1, zb_h2
from pipeline.errors import ConfigError, ScheduleError
from pipeline.faults import MessageFault
from pipeline.host_costs import FREE, CostCurve, HostCosts, RingLag
from pipeline.link_rates import NO_RATES
from pipeline.metrics import compute_metrics
from pipeline.ops import OpKind
from pipeline.profile import Profile
from pipeline.schedule import Schedule
from pipeline.simulator import CommMode, LinkComm, simulate
from pipeline.timeline import MessageRecord, OpRecord, Timeline
from pipeline.topology import Link, Topology
from tests.strategies import profiles

BUILDERS = [one_f_one_b, zb_h1, zb_h2]


@pytest.mark.parametrize("c0", [0, 10, 20, 30, 40])
def test_fig5_replay_of_the_fig4_order(fig4_fixture: dict, c0: int) -> None:
    schedule = Schedule.from_dict(fig4_fixture)
    profile = Profile.from_dict({**fig4_fixture["profile"], "delay_ms": [c0, 0, 0]})
    timeline = simulate(schedule, profile, CommMode.IDEAL)
    expected = fig4_fixture["replay_ms_by_c0"][str(c0)]
    assert compute_metrics(timeline).iteration_time_ms == expected


def test_direct_mode_blocks_the_sender() -> None:
    # F = 10, BW = 20, 5 ms per message. Ideal: stage 1 runs F0 15-25, BW0 25-45, F1 45-55,
    # BW1 55-75; stage 0 gets BW1's gradient at 80 and ends at 100. Direct: every send also
    # holds its stage for 5 ms, so stage 1 ends BW1 at 80, sends until 85, stage 0 ends at 105.
    profile = Profile.uniform(2, 2, 10, 10, 10, delay_ms=(5.0,))
    schedule = Schedule.from_text([["F0", "F1", "BW0", "BW1"], ["F0", "BW0", "F1", "BW1"]])
    ideal = simulate(schedule, profile, CommMode.IDEAL)
    direct = simulate(schedule, profile, CommMode.DIRECT)
    # Ideal: stage 0 runs F1 right after F0 at 10; direct: only after its send ends at 15.
    starts = {(r.stage, str(r.kind), r.microbatch): r.start_ms for r in direct.ops}
    assert starts[(0, "F", 1)] == 15.0
    assert {(r.stage, r.microbatch): r.start_ms for r in ideal.ops if r.kind == "F"}[(0, 1)] == 10
    send = next(m for m in direct.messages if m.direction == "forward" and m.microbatch == 0)
    assert (send.send_start_ms, send.send_end_ms, send.arrival_ms) == (10.0, 15.0, 15.0)
    assert compute_metrics(direct).iteration_time_ms == 105.0
    assert compute_metrics(ideal).iteration_time_ms == 100.0


def test_a_message_records_when_it_arrived_and_when_its_consumer_asked() -> None:
    # As above, ideal: F0's activation arrives at 15, stage 1 idle since 0 (it waits 15 ms);
    # F1's arrives at 25, but stage 1 asks only after BW0, at 45 (the message waits 20 ms).
    profile = Profile.uniform(2, 2, 10, 10, 10, delay_ms=(5.0,))
    schedule = Schedule.from_text([["F0", "F1", "BW0", "BW1"], ["F0", "BW0", "F1", "BW1"]])
    timeline = simulate(schedule, profile, CommMode.IDEAL)
    forward = {m.microbatch: m for m in timeline.messages if m.direction == "forward"}
    assert (forward[0].arrival_ms, forward[0].needed_ms) == (15.0, 0.0)
    assert (forward[1].arrival_ms, forward[1].needed_ms) == (25.0, 45.0)


def _consumer(timeline: Timeline, message: MessageRecord) -> OpRecord:
    """The op that takes the message in: the next stage's F, or the previous stage's B/BW."""
    first, second = (int(s) for s in message.link.split("-"))
    stage = second if message.direction == "forward" else first
    kinds = {OpKind.F} if message.direction == "forward" else {OpKind.B, OpKind.BW}
    (op,) = [
        r
        for r in timeline.ops
        if r.stage == stage and r.microbatch == message.microbatch and r.kind in kinds
    ]
    return op


@given(profiles(), st.sampled_from(BUILDERS), st.sampled_from(list(CommMode)))
def test_the_consumer_starts_once_it_asked_and_the_message_is_there(
    profile: Profile, build, comm: CommMode
) -> None:
    delegates = min(2, profile.num_microbatches)  # (at most one per microbatch)
    profile = Profile.from_dict(
        {**profile.to_dict(), "num_delegates": delegates, "copy_gbps": 100.0}
    )
    timeline = simulate(build(profile), profile, comm)
    copy_ms = profile.copy_ms() if comm is CommMode.DELEGATED else 0.0
    by_stage = defaultdict(list)
    for r in timeline.ops:
        by_stage[r.stage].append(r)  # each stage's ops in its order
    for message in timeline.messages:
        op = _consumer(timeline, message)
        if comm is CommMode.NCCL_SLEEP:  # it also waits for what was posted with its input
            assert op.start_ms >= max(message.arrival_ms, message.needed_ms)
        else:
            assert op.start_ms == max(message.arrival_ms, message.needed_ms) + copy_ms
        # It asked once the op before it was done (and its sends), not before.
        position = by_stage[op.stage].index(op)
        previous_end_ms = by_stage[op.stage][position - 1].end_ms if position else 0.0
        assert previous_end_ms <= message.needed_ms <= op.start_ms


def test_an_unvalidated_schedule_with_a_message_no_op_takes_is_refused() -> None:
    profile = Profile.uniform(2, 2, 1, 1, 1)
    broken = Schedule.from_text([["F0", "F1", "BW0", "BW1"], ["F0", "BW0"]])
    with pytest.raises(
        ScheduleError, match="no op takes in the forward message of microbatch 1 on link 0-1"
    ):
        simulate(broken, profile, validate=False)


@given(profiles(), st.sampled_from(BUILDERS))
def test_direct_is_never_faster_than_ideal(profile: Profile, build) -> None:
    schedule = build(profile)
    ideal = compute_metrics(simulate(schedule, profile, CommMode.IDEAL))
    direct = compute_metrics(simulate(schedule, profile, CommMode.DIRECT))
    assert direct.iteration_time_ms >= ideal.iteration_time_ms


@given(profiles(), st.sampled_from(BUILDERS))
def test_delegated_with_enough_delegates_and_free_copies_equals_ideal(
    profile: Profile, build
) -> None:
    """One delegate per microbatch (the most a profile has): no message waits for one."""
    schedule = build(profile)
    enough = Profile.from_dict({**profile.to_dict(), "num_delegates": profile.num_microbatches})
    ideal = simulate(schedule, profile, CommMode.IDEAL)
    delegated = simulate(schedule, enough, CommMode.DELEGATED)
    assert sorted(delegated.ops) == sorted(ideal.ops)
    assert sorted(m.arrival_ms for m in delegated.messages) == sorted(
        m.arrival_ms for m in ideal.messages
    )


@given(profiles(), st.sampled_from(BUILDERS))
def test_one_delegate_spaces_arrivals_by_the_link_delay(profile: Profile, build) -> None:
    one = Profile.from_dict({**profile.to_dict(), "num_delegates": 1})
    timeline = simulate(build(profile), one, CommMode.DELEGATED)
    arrivals = defaultdict(list)
    for message in timeline.messages:
        arrivals[(message.link, message.direction)].append(message.arrival_ms)
    for (link, _), times in arrivals.items():
        delay = profile.delay_ms[int(link.split("-")[0])]
        times.sort()
        assert all(b - a >= delay - 1e-9 for a, b in itertools.pairwise(times))


def test_delegated_copies_cost_the_stage() -> None:
    profile = Profile.uniform(
        2, 2, 10, 10, 10, message_bytes=1_000_000, copy_gbps=8.0, num_delegates=1
    )
    schedule = Schedule.from_text([["F0", "F1", "BW0", "BW1"], ["F0", "BW0", "F1", "BW1"]])
    timeline = simulate(schedule, profile, CommMode.DELEGATED)
    starts = {(r.stage, str(r.kind), r.microbatch): r.start_ms for r in timeline.ops}
    # 1 MB at 8 Gbit/s = 1 ms: stage 0 copies out after F0, stage 1 copies in before F0.
    assert starts[(0, "F", 1)] == 11.0
    assert starts[(1, "F", 0)] == 12.0


def test_host_costs_in_direct_mode() -> None:
    """The two-stage case above with a host's costs: 0.5 ms after each op, before its send
    (the runtime's op overruns, then sends), a send of 1 MiB holds its sender 1 + 2 ms, and
    the message is usable 0.25 + 0.25 ms after the send returns."""
    profile = Profile.uniform(2, 2, 10, 10, 10, delay_ms=(5.0,), message_bytes=1 << 20)
    schedule = Schedule.from_text([["F0", "F1", "BW0", "BW1"], ["F0", "BW0", "F1", "BW1"]])
    host = HostCosts(
        send_ms_by_bytes=CostCurve.line(1.0, 2.0),
        receive_lag_ms_by_bytes=CostCurve.line(0.25, 0.25),
        op_overhead_ms=0.5,
    )
    direct = simulate(schedule, profile, CommMode.DIRECT, host=host)
    send = next(m for m in direct.messages if m.direction == "forward" and m.microbatch == 0)
    # F0 ends at 10 ms, its overhead to 10.5, then the 5 ms delay and the 3 ms send
    assert (send.send_start_ms, send.send_end_ms, send.arrival_ms) == (10.5, 18.5, 19.0)
    starts = {(r.stage, str(r.kind), r.microbatch): r.start_ms for r in direct.ops}
    assert starts[(0, "F", 1)] == 18.5  # a sending op pays its overhead too
    assert starts[(1, "F", 0)] == 19.0
    assert starts[(1, "BW", 0)] == 19.0 + 10 + 0.5  # F0's end, then the overhead
    # ideal is the paper's model: a host changes nothing there
    assert simulate(schedule, profile, CommMode.IDEAL, host=host) == simulate(
        schedule, profile, CommMode.IDEAL
    )


def test_the_op_overhead_comes_before_a_delegated_send() -> None:
    """Delegated alike: 0.5 ms after F0 (10 ms), its sender copies the message out (1 ms),
    so the stage's next op starts at 11.5 ms, not at the copy's end, 11 (the overhead was
    hidden by the send), and the message's pick-up, wire and arrival move with it."""
    profile = Profile.uniform(2, 2, 10, 10, 10, delay_ms=(5.0,), message_bytes=1 << 20)
    schedule = Schedule.from_text([["F0", "F1", "BW0", "BW1"], ["F0", "BW0", "F1", "BW1"]])
    host = HostCosts(
        copy_out_ms_by_bytes=CostCurve.line(1.0), delegate_pickup_ms=0.25, op_overhead_ms=0.5
    )
    timeline = simulate(schedule, profile, CommMode.DELEGATED, host=host)
    send = next(m for m in timeline.messages if m.direction == "forward" and m.microbatch == 0)
    assert (send.send_start_ms, send.send_end_ms, send.wire_start_ms) == (10.5, 11.5, 11.75)
    assert send.arrival_ms == pytest.approx(11.75 + profile.delegated_wire_ms() + 5.0)
    starts = {(r.stage, str(r.kind), r.microbatch): r.start_ms for r in timeline.ops}
    assert starts[(0, "F", 1)] == 11.5


def test_a_one_stage_pipeline_pays_its_rings_host_costs() -> None:
    """No PP link, but a DP ring: the host's costs hold for its messages as with stages."""
    host = HostCosts(
        send_ms_by_bytes=CostCurve.line(0.2), receive_lag_ms_by_bytes=CostCurve.line(0.3)
    )
    profiles = {
        num_stages: Profile.uniform(num_stages, 2, 1, 1, 1, num_replicas=2,
                                    allreduce_bytes=2000, dp_bucket_bytes=1000)
        for num_stages in (1, 2)
    }  # fmt: skip
    timelines = {
        num_stages: simulate(one_f_one_b(profile), profile, CommMode.DIRECT, host=host)
        for num_stages, profile in profiles.items()
    }
    # 2 buckets x 2 ring steps, each a send (0.2 ms) and the receiver's lag (0.3 ms).
    steps = [timeline.iterations[0].step_time_ms for timeline in timelines.values()]
    assert steps == [pytest.approx(2.0), pytest.approx(2.0)]
    # The ring's own lag, per step too, by the rings running at once (one, on one stage) and
    # the chunk's size (500 B: halfway between 0 and 1000 B).
    alone = profiles[1]
    by_rings = RingLag(((1, CostCurve(((0, 0.25), (1000, 1.25)))), (2, CostCurve(((0, 9.0),)))))
    ringed = dataclasses.replace(host, ring_lag_ms_by_rings=by_rings)
    with_lag = simulate(one_f_one_b(alone), alone, CommMode.DIRECT, host=ringed)
    assert with_lag.iterations[0].step_time_ms == pytest.approx(2.0 + 4 * 0.75)
    assert with_lag.ops == timelines[1].ops  # the pipeline's messages do not pay it
    delegated = RingLag.by_rings_alone(CostCurve(((1, 1.0), (2, 2.0))))
    over_delegates = dataclasses.replace(ringed, delegated_ring_lag_ms_by_rings=delegated)
    for comm, lag_ms in ((CommMode.DIRECT, 0.75), (CommMode.DELEGATED, 1.0)):
        run = simulate(one_f_one_b(alone), alone, comm, host=over_delegates)
        assert run.iterations[0].step_time_ms == pytest.approx(2.0 + 4 * lag_ms)


@given(profiles(), st.sampled_from(BUILDERS), st.sampled_from(["direct", "delegated"]))
def test_host_costs_only_ever_add_time(profile: Profile, build, comm: str) -> None:
    schedule = build(profile)
    host = HostCosts(
        send_ms_by_bytes=CostCurve(((0, 0.2), (1 << 16, 0.19), (1 << 20, 0.6))),  # not a line
        receive_lag_ms_by_bytes=CostCurve.line(0.3, 0.1),
        op_overhead_ms=0.05,
    )
    free = compute_metrics(simulate(schedule, profile, CommMode(comm)))
    costly = compute_metrics(simulate(schedule, profile, CommMode(comm), host=host))
    assert costly.iteration_time_ms >= free.iteration_time_ms
    assert simulate(schedule, profile, CommMode(comm), host=FREE) == simulate(
        schedule, profile, CommMode(comm)
    )


def test_comm_modes_mix_per_link_direction() -> None:
    """Delegates on link 0-1 only: its messages free their sender after the device-to-host
    copy, link 1-2's hold it for the transfer; all link directions delegated is delegated."""
    from pipeline.simulator import LinkComm

    profile = Profile.uniform(
        3, 6, 10, 10, 10, delay_ms=(20.0, 20.0), message_bytes=1_000_000, copy_gbps=8.0
    )
    schedule = one_f_one_b(profile)
    slow_first = tuple(LinkComm(Link.pp(0), d, CommMode.DELEGATED) for d in ("forward", "backward"))
    mixed = simulate(schedule, profile, CommMode.DIRECT, link_comms=slow_first)
    for m in mixed.messages:
        held = m.send_end_ms - m.send_start_ms
        assert held == pytest.approx(1.0 if m.link == "0-1" else 20.0), m  # copy: 1 MB at 8 Gb/s
    every = tuple(
        LinkComm(Link.pp(i), d, CommMode.DELEGATED)
        for i in range(2)
        for d in ("forward", "backward")
    )
    assert simulate(schedule, profile, CommMode.DIRECT, link_comms=every) == simulate(
        schedule, profile, CommMode.DELEGATED
    )
    direct = simulate(schedule, profile, CommMode.DIRECT)
    end = compute_metrics(mixed).iteration_time_ms
    assert compute_metrics(simulate(schedule, profile, CommMode.DELEGATED)).iteration_time_ms < end
    assert end < compute_metrics(direct).iteration_time_ms


def test_a_failed_route_fails_over_delegates_and_fails_the_direct_path() -> None:
    """rnic0 of stage 1's host down from 3 ms: over the direct path its first message there
    is a LinkFailure; over delegates each of the four link directions through the host
    moves once, its delegates busy `failover_ms` from the message that found it failed, and
    the next iteration (those directions moved already) runs as a healthy one."""
    from injectors.fault_files import parse_yaml
    from pipeline.errors import LinkFailure

    profile = Profile.uniform(4, 4, 1, 1, 1, message_bytes=4096, num_delegates=2)
    view = parse_yaml('[{start_iteration: 0, at_ms: 3, nic: "host1:rnic0", down: true}]')
    faults = view.at(0, Topology(4), rates=NO_RATES)
    schedule = one_f_one_b(profile)
    with pytest.raises(LinkFailure, match="microbatch 2 on link pp0:0-1 cannot go"):
        simulate(schedule, profile, CommMode.DIRECT, faults=faults)
    healthy = simulate(schedule, profile, CommMode.DELEGATED)
    host = HostCosts(failover_ms=2.5)
    failed = simulate(schedule, profile, CommMode.DELEGATED, faults=faults, host=host)
    assert {(f.link, f.direction) for f in failed.failovers} == {
        (link, way) for link in ("0-1", "1-2") for way in ("forward", "backward")
    }
    assert all(f.resumed_ms - f.noticed_ms == 2.5 and f.noticed_ms >= 3 for f in failed.failovers)
    assert failed.iterations[0].end_ms > healthy.iterations[0].end_ms
    assert {(f.nic_from, f.nic_to) for f in failed.failovers} == {("rnic0", "rnic1")}
    moved = {(0, f.link, f.direction): 1 for f in failed.failovers}
    again = simulate(
        schedule, profile, CommMode.DELEGATED, faults=faults, host=host, nics_in_use=moved
    )
    assert not again.failovers and again.iterations == healthy.iterations


def test_a_dp_failover_holds_its_sender_but_is_no_injected_delay() -> None:
    """Stage 1 replica 0's rnic0 down, a 2 ms static delay on its DP link, free wires: each
    direction of dp1:0-1 fails over on its first message, which holds its sender the delay
    and the 7 ms move (as a PP message's delegates are held), but records only the 2 ms
    injected as its `fault_ms` (the profile's delay plus the fault model's, in every
    engine)."""
    from injectors.fault_files import parse_yaml

    profile = Profile.uniform(
        2, 2, 1, 1, 1, message_bytes=64, num_delegates=1, num_replicas=2,
        allreduce_bytes=(64, 64), dp_bucket_bytes=64, dp_delay_ms=((Link.dp(1, 0, 1), 2.0),),
    )  # fmt: skip
    view = parse_yaml('[{start_iteration: 0, nic: "host1:rnic0", down: true}]')
    timeline = simulate(
        one_f_one_b(profile), profile, CommMode.DELEGATED,
        faults=view.at(0, Topology(2, 2), rates=NO_RATES), host=HostCosts(failover_ms=7.0),
    )  # fmt: skip
    assert {(f.link, f.direction, f.replica) for f in timeline.failovers if f.link[:2] == "dp"} == {
        ("dp1:0-1", "forward", 0),
        ("dp1:0-1", "backward", 1),
    }
    ring = [
        (m.direction, m.microbatch, m.fault_ms, m.send_end_ms - m.send_start_ms)
        for m in timeline.dp_messages
        if m.link == "dp1:0-1"
    ]
    assert sorted(ring) == [
        ("backward", 0, 2.0, 9.0),
        ("backward", 1, 2.0, 2.0),
        ("forward", 0, 2.0, 9.0),
        ("forward", 1, 2.0, 2.0),
    ]
    assert timeline.iterations[0].end_ms == 25.0


@dataclasses.dataclass(frozen=True)
class _EveryMessageLonger:
    extra_ms: float

    def message_fault(
        self,
        link: Link,
        direction: str,
        kind: str,
        m: int,
        num_bytes: int = 0,
        at: float = 0,
        nic: int = 0,
    ) -> MessageFault:
        return MessageFault(self.extra_ms)

    def affects(self, link: Link) -> bool:
        return True

    def cache_key(self) -> None:
        return None


def _times(timeline: Timeline) -> list[float]:
    """Every op's start and end, then every message's send end and arrival, in order."""
    messages = [t for m in timeline.messages for t in (m.send_end_ms, m.arrival_ms)]
    return [t for r in timeline.ops for t in (r.start_ms, r.end_ms)] + messages


@pytest.mark.parametrize("build", [one_f_one_b, zb_h2])
def test_a_fault_delay_on_a_direct_link_is_a_longer_send(build) -> None:
    """A fault's delay holds a direct sender and moves its message's arrival exactly as a
    send that costs that much more (benchmarks/bench_send_replay.py replays measured send
    times this way), also when it shortens the send (a negative delay)."""
    profile = Profile.uniform(4, 8, 5, 5, 5, message_bytes=1 << 20)
    schedule = build(profile)
    for extra_ms in (0.7, -0.3):
        base = HostCosts(
            send_ms_by_bytes=CostCurve(((0, 0.5), (1 << 21, 1.5))),
            receive_lag_ms_by_bytes=CostCurve(((0, 0.4),)),
            op_overhead_ms=0.1,
        )
        longer = dataclasses.replace(
            base, send_ms_by_bytes=CostCurve(((0, 0.5 + extra_ms), (1 << 21, 1.5 + extra_ms)))
        )
        faulted = simulate(
            schedule, profile, CommMode.DIRECT, host=base, faults=_EveryMessageLonger(extra_ms)
        )
        slower = simulate(schedule, profile, CommMode.DIRECT, host=longer)
        assert _times(faulted) == pytest.approx(_times(slower))
        plain = simulate(schedule, profile, CommMode.DIRECT, host=base)
        assert (
            compute_metrics(faulted).iteration_time_ms != compute_metrics(plain).iteration_time_ms
        )


def test_a_link_comm_is_a_pp_link_direction() -> None:
    """The simulator took a DP link's override as the PP link of its index (dp2:0-1 re-moded
    PP link 0-1), where the runtime delegated the DP ring: one plan, two meanings."""
    assert LinkComm(Link.pp(1), "backward", CommMode.DELEGATED).link == Link.pp(1)
    with pytest.raises(ConfigError, match="not dp2:0-1 forward"):
        LinkComm(Link.parse("dp2:0-1"), "forward", CommMode.DELEGATED)
    with pytest.raises(ConfigError, match="not 0-1 sideways"):
        LinkComm(Link.pp(0), "sideways", CommMode.DELEGATED)
    # One replica's link: the simulator set every replica's, the runtimes none (direct).
    with pytest.raises(ConfigError, match="every replica's link: 0-1, not pp1:0-1"):
        LinkComm(Link.pp(0, 1), "forward", CommMode.DELEGATED)


def test_a_library_simulate_charges_a_cap_over_the_profile_s_own_rate() -> None:
    """A 0.4 Gbit/s cap on link 0-1 of a 1 Gbit/s profile holds each 250 kB message
    bytes/cap - bytes/rate = 5 - 2 = 3 ms (not the cap's 5 ms in full, which a forgotten
    rates once gave: `at` has no default for them now)."""
    from injectors.fault_files import parse_yaml

    profile = Profile.uniform(2, 4, 1, 1, 1, message_bytes=250_000, link_bandwidth_gbps=1.0)
    view = parse_yaml('[{start_iteration: 0, links: ["0-1"], bandwidth_gbps: 0.4}]', seed=1)
    with pytest.raises(TypeError):
        view.at(0, profile.topology)  # type: ignore[call-arg]
    faults = view.at(0, profile.topology, rates=profile.link_rates)
    timeline = simulate(one_f_one_b(profile), profile, CommMode.DIRECT, faults=faults)
    charged = [m.fault_ms for m in timeline.messages]
    assert charged and charged == pytest.approx([3.0] * len(charged))
