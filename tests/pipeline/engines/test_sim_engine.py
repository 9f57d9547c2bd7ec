import dataclasses

import pytest

from baselines import one_f_one_b
from injectors.fault_files import parse_yaml
from pipeline.engines import Action, Capabilities, Plan, check_plan
from pipeline.engines.sim import SimEngine
from pipeline.errors import ConfigError, ScheduleError
from pipeline.faults import NO_FAULTS, MessageFault
from pipeline.link_rates import NO_RATES
from pipeline.link_terms import NO_LINK_TERMS
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.schedule import ReplicaSchedules, Schedule
from pipeline.simulator import CommMode, LinkComm
from pipeline.topology import Link, Position, Topology


@dataclasses.dataclass(frozen=True)
class _SlowForward:
    """10 ms more on every activation of link 0-1 (replica 0), nothing on gradients."""

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
        slow = link == Link.pp(0, 0) and direction == "forward"
        return MessageFault(10.0 if slow else 0.0)

    def affects(self, link: Link) -> bool:
        return link == Link.pp(0, 0)

    def route_failed(self, link: Link, nic: int, offset_ms: float = 0.0) -> bool:
        return False

    def cache_key(self) -> None:
        return None  # never reuse an iteration under it


def test_iterations_run_back_to_back_and_a_fault_view_delays_its_messages() -> None:
    profile = Profile.uniform(2, 2, 10, 10, 10)
    plan = Plan(one_f_one_b(profile), profile, CommMode.IDEAL)
    with SimEngine() as engine:
        first = engine.run(plan, 0, NO_FAULTS).timeline
        second = engine.run(plan, 1, _SlowForward()).timeline
    assert compute_metrics(first, 0).iteration_time_ms == 90.0
    assert second.iterations[0].start_ms == 90.0
    # 1F1B's critical path crosses link 0-1 forward once (F0 on its way down): +10 ms.
    assert compute_metrics(second, 1).iteration_time_ms == 90.0 + 10
    forward = [m.fault_ms for m in second.messages if m.direction == "forward"]
    backward = [m.fault_ms for m in second.messages if m.direction == "backward"]
    assert forward == [10.0, 10.0] and backward == [0.0, 0.0]


def test_fault_delays_add_to_the_profile_s() -> None:
    profile = Profile.uniform(2, 2, 10, 10, 10, delay_ms=(5.0,))
    plan = Plan(one_f_one_b(profile), profile, CommMode.IDEAL)
    with SimEngine() as engine:
        timeline = engine.run(plan, 0, _SlowForward()).timeline
    assert sorted({m.fault_ms for m in timeline.messages}) == [5.0, 15.0]


def test_a_plan_the_engine_cannot_run_is_refused_by_name() -> None:
    from pipeline.engines.runtime import RuntimeEngine  # no pool starts until run()

    profile = Profile.uniform(2, 2, 1, 1, 1)
    delegated = Plan(one_f_one_b(profile), profile, CommMode.DELEGATED)
    check_plan(SimEngine(), delegated)
    with (
        RuntimeEngine("emulated", 2) as emulated,
        pytest.raises(ConfigError, match="comm 'delegated' is not available in the emulated"),
    ):
        check_plan(emulated, delegated)
    restart = dataclasses.replace(delegated, action=Action.RESTART)
    check_plan(SimEngine(), restart)

    class _NoRestarts:
        name = "frozen"
        capabilities = Capabilities(comms=frozenset(CommMode), link_terms=NO_LINK_TERMS)

    with pytest.raises(ConfigError, match="the frozen engine cannot restart"):
        check_plan(_NoRestarts(), restart)  # type: ignore[arg-type]
    swapped = dataclasses.replace(
        delegated, comm=CommMode.DIRECT, topology=Topology(2).swapped(Position(0), Position(1))
    )
    check_plan(SimEngine(), swapped)
    with RuntimeEngine("emulated", 2) as emulated:
        check_plan(emulated, swapped)
    mixed = dataclasses.replace(
        swapped, link_comms=(LinkComm(Link.pp(0), "forward", CommMode.DELEGATED),)
    )
    check_plan(SimEngine(), mixed)
    with (
        RuntimeEngine("emulated", 2) as emulated,
        pytest.raises(ConfigError, match="comm 'delegated' is not available in the emulated"),
    ):
        check_plan(emulated, mixed)
    with RuntimeEngine("megatron", 2, trains=True) as megatron:
        check_plan(megatron, swapped)


def test_after_a_restart_no_iteration_is_named_the_same_as_one_from_before_it() -> None:
    """Iterations 1 and 2 repeat iteration 0 (the same plan, no faults). After a restart
    back to iteration 1, that index runs again, maybe under other faults: an iteration
    naming it from the cache would take that run's records for its own."""
    profile = Profile.uniform(2, 2, 10, 10, 10)
    plan = Plan(one_f_one_b(profile), profile, CommMode.IDEAL)
    with SimEngine() as engine:
        same = [engine.run(plan, k, NO_FAULTS).same_as for k in range(3)]
        engine.restart()
        after = [engine.run(plan, k, NO_FAULTS).same_as for k in (1, 2)]
    assert same == [None, 0, 0]
    assert after == [None, 1]  # iteration 1 anew, then iteration 2 is it again


def test_a_swap_starts_its_iteration_with_the_state_transfer_the_cost_model_gives() -> None:
    """PP 2 x DP 2, 1 MB of gradient per stage, DP links at 8 Gbit/s: a swap of two workers
    moves 8 MB of training state each way (mixed-precision Adam), 8 ms, before the
    iteration's first op; the iteration after it is the plain one again."""
    profile = Profile.uniform(
        2, 4, 1, 1, 1, num_replicas=2, allreduce_bytes=1_000_000, dp_bandwidth_gbps=8.0
    )
    swapped = Topology(2, 2).dp_pair_onto_pp(Link.parse("dp0:0-1"))
    plain = Plan(one_f_one_b(profile), profile, CommMode.DIRECT)
    engine = SimEngine()
    times, swaps = [], []
    for k, topology in enumerate((None, None, swapped, swapped)):
        outcome = engine.run(dataclasses.replace(plain, topology=topology), k, NO_FAULTS)
        times.append(compute_metrics(outcome.timeline, k).iteration_time_ms)
        swaps.append(outcome.timeline.swaps)
        if k == 2:
            assert outcome.same_as is None  # not iteration 1 again: it has the swap
            first_op = min(r.start_ms for r in outcome.timeline.ops)
    assert swaps[:2] == [(), ()] and swaps[3] == ()
    moved = sorted((r.stage_from, r.replica_from, r.stage_to, r.replica_to) for r in swaps[2])
    assert moved == [(0, 1, 1, 0), (1, 0, 0, 1)]
    assert {r.num_bytes for r in swaps[2]} == {8_000_000}
    (start, end) = {(r.start_ms, r.end_ms) for r in swaps[2]}.pop()
    assert end - start == pytest.approx(8.0) and first_op == pytest.approx(end)
    assert times[2] == pytest.approx(times[1] + 8.0) and times[3] == pytest.approx(times[1])


def test_after_a_restart_a_swapped_plan_swaps_from_the_default_placement() -> None:
    """The processes start on the default placement, after a restart too: a plan on another
    one swaps to it in its first iteration (as the runtimes' fresh pool does), moving no
    state (it comes from a checkpoint, or the initial state at iteration 0); on the default
    placement nothing swaps. 8 Gbit/s and 1 ms of latency on the DP links: a state transfer
    of 8 MB takes 9 ms, an empty one 1 ms."""
    profile = Profile.uniform(
        2, 4, 1, 1, 1, num_replicas=2, allreduce_bytes=1_000_000, dp_bandwidth_gbps=8.0,
        link_latency_ms=1.0,
    )  # fmt: skip
    swapped = Topology(2, 2).dp_pair_onto_pp(Link.parse("dp0:0-1"))
    plain = Plan(one_f_one_b(profile), profile, CommMode.DIRECT)
    on_swapped = dataclasses.replace(plain, topology=swapped)
    engine = SimEngine()

    def swaps(plan: Plan, iteration: int) -> list[tuple[int, int, int, float]]:
        records = engine.run(plan, iteration, NO_FAULTS).timeline.swaps
        return sorted((r.iteration, r.stage_to, r.num_bytes, r.end_ms - r.start_ms)
                      for r in records)  # fmt: skip

    assert swaps(plain, 0) == swaps(plain, 1) == []
    assert swaps(on_swapped, 2) == [(2, 0, 8_000_000, 9.0), (2, 1, 8_000_000, 9.0)]
    assert swaps(on_swapped, 3) == []
    engine.restart()  # back to iteration 2, from its checkpoint
    assert swaps(on_swapped, 2) == [(2, 0, 0, 1.0), (2, 1, 0, 1.0)]
    assert swaps(on_swapped, 3) == []
    engine.restart()  # back to iteration 0
    assert swaps(on_swapped, 0) == [(0, 0, 0, 1.0), (0, 1, 0, 1.0)]
    engine.restart()
    assert swaps(plain, 0) == []
    engine = SimEngine()  # a fresh one's processes too
    assert swaps(on_swapped, 0) == [(0, 0, 0, 1.0), (0, 1, 0, 1.0)]


@dataclasses.dataclass
class _Offsets:
    """Healthy, recording how far into its iteration each PP message was asked about."""

    asked_ms: list[float] = dataclasses.field(default_factory=list)

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
        if kind != "AR":
            self.asked_ms.append(at)
        return MessageFault()

    def affects(self, link: Link) -> bool:
        return True

    def route_failed(self, link: Link, nic: int, offset_ms: float = 0.0) -> bool:
        return False

    def cache_key(self) -> None:
        return None


def test_a_fault_s_offsets_count_the_swap_s_transfer_as_the_runtimes_do() -> None:
    """The runtimes' fault hook counts from the iteration's start, swap included; the
    simulator counted from the first op, 8 ms later."""
    profile = Profile.uniform(
        2, 4, 1, 1, 1, num_replicas=2, allreduce_bytes=1_000_000, dp_bandwidth_gbps=8.0
    )
    swapped = Topology(2, 2).dp_pair_onto_pp(Link.parse("dp0:0-1"))
    plain = Plan(one_f_one_b(profile), profile, CommMode.DIRECT)
    engine = SimEngine()
    engine.run(plain, 0, NO_FAULTS)
    offsets = {}
    for k, plan in ((1, plain), (2, dataclasses.replace(plain, topology=swapped))):
        faults = _Offsets()
        engine.run(plan, k, faults)
        offsets[k] = min(faults.asked_ms)
    assert offsets[1] == pytest.approx(1.0)  # the first activation, after a 1 ms F
    assert offsets[2] == pytest.approx(8.0 + 1.0)  # after the 8 ms transfer too


def test_each_replica_runs_its_own_share_of_a_rebalanced_batch() -> None:
    """PP 2 x DP 2, 4 microbatches each, split 3 + 5: each replica runs its own schedule for
    its own count (1F1B over 10 ms ops: (m + 1) x 20 ms), the iteration lasts as long as the
    longer one, and the plan refuses a split that is not the global batch's."""
    profile = Profile.uniform(2, 4, 10, 5, 5, num_replicas=2)
    split = ReplicaSchedules(
        tuple(one_f_one_b(dataclasses.replace(profile, num_microbatches=m)) for m in (3, 5))
    )
    assert (split.counts, split.num_microbatches, split.offset(1), str(split)) == (
        (3, 5), 8, 3, "3+5",
    )  # fmt: skip
    plan = Plan(one_f_one_b(profile), profile, CommMode.IDEAL, replica_schedules=split)
    assert plan.schedule_of(1) is split.schedules[1]
    with SimEngine() as engine:
        timeline = engine.run(plan, 0, NO_FAULTS).timeline
        balanced = engine.run(dataclasses.replace(plan, replica_schedules=None), 0, NO_FAULTS)
    forwards = {
        r: sorted(o.microbatch for o in timeline.ops if (o.kind.value, o.stage, o.replica) ==
                  ("F", 1, r))
        for r in (0, 1)
    }  # fmt: skip
    assert forwards == {0: [0, 1, 2], 1: [0, 1, 2, 3, 4]}
    ends = {r: max(o.end_ms for o in timeline.ops if o.replica == r) for r in (0, 1)}
    assert ends == {0: 80.0, 1: 120.0}
    assert compute_metrics(timeline, 0).iteration_time_ms == 120.0
    assert compute_metrics(balanced.timeline, 0).iteration_time_ms == 100.0
    for counts in ((4, 3), (3, 3, 2)):  # 7 microbatches; three replicas
        with pytest.raises(ConfigError, match="do not split the global batch of 8"):
            Plan(
                plan.schedule,
                profile,
                replica_schedules=ReplicaSchedules(
                    tuple(
                        one_f_one_b(dataclasses.replace(profile, num_microbatches=m))
                        for m in counts
                    )
                ),
            )


def test_a_schedule_at_the_address_of_a_validated_one_is_still_validated() -> None:
    """An engine validates a schedule object once, by id; a freed schedule's id is taken by
    the next object made, so an invalid schedule there ran unvalidated (an op missing from
    the timeline). The engine holds what it validated: another object is validated anew."""
    profile = Profile.uniform(2, 2, 1, 1, 1)
    good = Schedule.from_text(
        [["F0", "F1", "B0", "B1", "W0", "W1"], ["F0", "B0", "F1", "B1", "W0", "W1"]]
    )
    bad = Schedule.from_text([["F0", "F1", "B0", "B1", "W0"], ["F0", "B0", "F1", "B1", "W0", "W1"]])
    validated = {id(bad): good}  # as if `good` had been validated there and freed
    with pytest.raises(ScheduleError, match="op W1 is missing"):
        Plan(bad, profile, CommMode.IDEAL).validate(validated)
    Plan(good, profile, CommMode.IDEAL).validate(validated)
    assert validated[id(good)] is good


def _moves(engine: SimEngine, plan: Plan, faults: str, num_iterations: int) -> list[set]:
    """Per iteration, the (link, direction, NIC left, NIC taken) of its failovers."""
    view = parse_yaml(faults)
    moves = []
    for k in range(num_iterations):
        topology = plan.topology or plan.profile.topology
        timeline = engine.run(plan, k, view.at(k, topology, rates=NO_RATES)).timeline
        moves.append({(f.link, f.direction, f.nic_from, f.nic_to) for f in timeline.failovers})
    return moves


def test_a_moved_link_direction_meets_its_new_nic_s_faults_and_fails_back() -> None:
    """PP 2 over delegates. Iteration 0: rnic0 of host 1 down (repaired after it): both
    directions of link 0-1 move to rnic1. Iteration 1: a 5 ms delay on the host pair (on
    rnic0's plane) and 3 ms on rnic1 of host 1: they take rnic1's 3 ms. Iteration 2: rnic1
    of host 1 down: they fail back to the repaired rnic0 and meet the pair's 5 ms."""
    profile = Profile.uniform(2, 2, 1, 1, 1, message_bytes=4096, num_delegates=1)
    plan = Plan(one_f_one_b(profile), profile, CommMode.DELEGATED)
    faults = (
        '[{start_iteration: 0, end_iteration: 1, nic: "host1:rnic0", down: true},'
        " {start_iteration: 1, hosts: [0, 1], delay_ms: 5},"
        ' {start_iteration: 1, nic: "host1:rnic1", delay_ms: 3},'
        ' {start_iteration: 2, nic: "host1:rnic1", down: true}]'
    )
    engine = SimEngine()
    both = ("forward", "backward")
    assert _moves(engine, plan, faults, 3) == [
        {("0-1", d, "rnic0", "rnic1") for d in both},
        set(),
        {("0-1", d, "rnic1", "rnic0") for d in both},
    ]
    view = parse_yaml(faults)
    engine = SimEngine()
    fault_ms = []
    for k in range(3):
        timeline = engine.run(plan, k, view.at(k, profile.topology, rates=NO_RATES)).timeline
        fault_ms.append({m.fault_ms for m in timeline.messages})
    assert fault_ms == [{0.0}, {3.0}, {5.0}]


def test_a_rank_swap_s_new_delegates_start_on_the_first_nic_up_at_both_hosts() -> None:
    """rnic0 of host 1 down for good, 3 ms on its rnic1: link 0-1 moves in iteration 0 and
    stays on rnic1 in iteration 1; a swap of the two stages' workers in iteration 2 gives
    both directions new delegates (either end's worker changed), which start on rnic1, the
    first NIC up at both hosts, as the runtimes' new pairs do: no move (they started on
    rnic0 and moved again, 4 failovers where the testbed recorded none), and the messages
    meet rnic1's 3 ms."""
    profile = Profile.uniform(2, 2, 1, 1, 1, message_bytes=4096, num_delegates=1)
    plan = Plan(one_f_one_b(profile), profile, CommMode.DELEGATED)
    swapped = dataclasses.replace(
        plan, topology=profile.topology.swapped(Position(0, 0), Position(1, 0))
    )
    faults = (
        '[{start_iteration: 0, nic: "host1:rnic0", down: true},'
        ' {start_iteration: 0, nic: "host1:rnic1", delay_ms: 3}]'
    )
    engine = SimEngine()
    moved = {("0-1", d, "rnic0", "rnic1") for d in ("forward", "backward")}
    assert _moves(engine, plan, faults, 2) == [moved, set()]
    timeline = engine.run(
        swapped, 2, parse_yaml(faults).at(2, swapped.topology, rates=NO_RATES)
    ).timeline
    assert timeline.swaps and timeline.failovers == ()
    assert {m.fault_ms for m in timeline.messages} == {3.0}


def test_a_restart_back_to_iteration_0_keeps_the_clock_a_new_run_starts_it_again() -> None:
    """Iteration 0 right after a restart is the same run again, later on its clock (as in
    the runtimes); iteration 0 with no restart before it is a new run, at time 0."""
    profile = Profile.uniform(2, 2, 10, 10, 10)
    plan = Plan(one_f_one_b(profile), profile, CommMode.IDEAL)

    def span(iteration: int) -> tuple[float, float]:
        (record,) = engine.run(plan, iteration, NO_FAULTS).timeline.iterations
        return record.start_ms, record.end_ms

    with SimEngine() as engine:
        assert [span(0), span(1)] == [(0.0, 90.0), (90.0, 180.0)]
        engine.restart()
        assert [span(0), span(1)] == [(180.0, 270.0), (270.0, 360.0)]
        assert span(0) == (0.0, 90.0)  # a new run


def test_a_new_run_on_a_reused_engine_starts_afresh_as_on_a_new_one() -> None:
    """Iteration 0 with no restart before it is a new run: its processes start on the
    default placement (the last run ended on a swapped one: a plan on the default one swaps
    nothing) and it repeats no iteration of the last run (`same_as` names one of its own).
    8 Gbit/s and 1 ms of latency on the DP links, as above."""
    profile = Profile.uniform(
        2, 4, 1, 1, 1, num_replicas=2, allreduce_bytes=1_000_000, dp_bandwidth_gbps=8.0,
        link_latency_ms=1.0,
    )  # fmt: skip
    plain = Plan(one_f_one_b(profile), profile, CommMode.DIRECT)
    swapped = dataclasses.replace(
        plain, topology=Topology(2, 2).dp_pair_onto_pp(Link.parse("dp0:0-1"))
    )
    ideal = dataclasses.replace(plain, comm=CommMode.IDEAL)
    fresh = SimEngine().run(plain, 0, NO_FAULTS)
    engine = SimEngine()
    engine.run(plain, 0, NO_FAULTS)
    assert engine.run(swapped, 1, NO_FAULTS).timeline.swaps  # it ends on the swapped placement
    again = engine.run(plain, 0, NO_FAULTS)  # a new run
    assert again.timeline.swaps == () and again.timeline == fresh.timeline
    assert again.timeline.iterations[0][:3] == (0, 0.0, 23.0)
    assert engine.run(ideal, 1, NO_FAULTS).same_as is None
    assert engine.run(ideal, 0, NO_FAULTS).same_as is None  # a new run: not the last one's 1


def test_a_rank_swap_keeps_a_pair_whose_workers_stay_on_the_nic_it_moved_to() -> None:
    """PP 3 x DP 2 over delegates; host 5 (stage 2 of replica 1) has rnic0 down in
    iteration 0 (repaired after it) and 3 ms on rnic1: replica 1's link 1-2 moves to rnic1.
    Falcon's swap of dp0:0-1 in iteration 1 moves the workers of stage 0 of replica 1 and
    stage 1 of replica 0: link 1-2 of replica 1 keeps its workers, so its pair stays on
    rnic1 (3 ms, no move), where a new pair would start on the repaired rnic0."""
    profile = Profile.uniform(3, 3, 1, 1, 1, message_bytes=4096, num_delegates=1, num_replicas=2)
    plan = Plan(one_f_one_b(profile), profile, CommMode.DELEGATED)
    swapped = dataclasses.replace(
        plan, topology=profile.topology.dp_pair_onto_pp(Link.parse("dp0:0-1"))
    )
    view = parse_yaml(
        '[{start_iteration: 0, end_iteration: 1, nic: "host5:rnic0", down: true},'
        ' {start_iteration: 0, nic: "host5:rnic1", delay_ms: 3}]'
    )
    engine = SimEngine()
    seen = []
    for k, p in enumerate((plan, swapped)):
        faults = view.at(k, p.topology or profile.topology, rates=NO_RATES)
        timeline = engine.run(p, k, faults).timeline
        moves = {(f.link, f.direction, f.replica, f.nic_to) for f in timeline.failovers}
        delays = {(m.link, m.replica, m.fault_ms) for m in timeline.messages if m.fault_ms}
        seen.append((bool(timeline.swaps), moves, delays))
    both = ("forward", "backward")
    assert seen == [
        (False, {("1-2", d, 1, "rnic1") for d in both}, {("1-2", 1, 3.0)}),
        (True, set(), {("1-2", 1, 3.0)}),
    ]
