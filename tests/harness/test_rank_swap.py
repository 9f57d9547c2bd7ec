"""A fault stays on its hosts; a rank swap moves which logical link it slows (emulated: the
processes really play other stages)."""

import dataclasses
import math
import os
import shutil
import statistics

import pytest

from baselines import one_f_one_b
from harness.loop import Recovery
from harness.network import _base_states
from harness.runner import fixed_plan, run_configuration
from injectors.fault_files import parse_yaml
from injectors.wire import WireState
from pipeline.engines import Plan
from pipeline.profile import Profile
from pipeline.simulator import CommMode
from pipeline.timeline import Timeline
from pipeline.topology import Link, Position, Topology

DELAY_MS = 60.0
PROFILE = Profile.uniform(4, 4, 2, 2, 2, message_bytes=1024)
SWAPPED = Topology(4).swapped(Position(1), Position(3))  # host 1 plays stage 3, host 3 stage 1


@dataclasses.dataclass
class _SwapAt:
    """`profile`'s default placement, then `swapped` from iteration `at` on (default: stages
    1 and 3 of PROFILE swap places)."""

    at: int
    profile: Profile = PROFILE
    swapped: Topology = SWAPPED
    comm: CommMode = CommMode.DIRECT
    name: str = "swap"
    fixed: Plan = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.fixed = fixed_plan(one_f_one_b(self.profile), self.profile, self.comm).fixed

    def plan(self, iteration: int) -> Plan:
        topology = self.profile.topology if iteration < self.at else self.swapped
        return dataclasses.replace(self.fixed, topology=topology)

    def observe(self, iteration: int, timeline: Timeline) -> None:
        pass

    def restarted(self, iteration: int, *, stragglers: bool, at_ms: float = math.inf) -> None:
        pass


def _slow_links(timeline: Timeline, iteration: int) -> set[str]:
    """The links whose messages took the delay: the hook's fault_ms, or on the wire a median
    arrival that late (load adds time, it never takes the delay away; 1 KiB messages are
    otherwise there in well under a millisecond)."""
    by_link: dict[str, list[float]] = {}
    for m in timeline.messages:
        if m.iteration == iteration:
            took = max(m.fault_ms, m.arrival_ms - m.send_start_ms)
            by_link.setdefault(m.link, []).append(took)
    return {link for link, took in by_link.items() if statistics.median(took) >= DELAY_MS}


def _check(timeline: Timeline) -> None:
    before, after = timeline.iterations[1], timeline.iterations[3]
    # Hosts 1 and 2 carry link 1-2, then (host 3 on stage 1, host 1 on stage 3) link 2-3.
    assert _slow_links(timeline, 1) == {"1-2"}
    assert _slow_links(timeline, 3) == {"2-3"}
    assert before.pids[3] == after.pids[1] and before.pids[1] == after.pids[3]
    assert before.pids[0] == after.pids[0] and before.pids[2] == after.pids[2]


def test_a_host_pair_delay_moves_with_a_swap_in_sim() -> None:
    faults = parse_yaml(f"[{{start_iteration: 0, hosts: [1, 2], delay_ms: {DELAY_MS}}}]")
    run = run_configuration(_SwapAt(3), num_iterations=4, num_warmup_iterations=0, faults=faults)
    assert run.timeline is not None
    assert _slow_links(run.timeline, 1) == {"1-2"} and _slow_links(run.timeline, 3) == {"2-3"}
    assert run.controller == "swap"


@pytest.mark.multiprocess
def test_a_host_pair_delay_moves_with_a_swap_through_the_hook() -> None:
    faults = parse_yaml(f"[{{start_iteration: 0, hosts: [1, 2], delay_ms: {DELAY_MS}}}]")
    run = run_configuration(
        _SwapAt(3), backend="emulated", num_iterations=4, num_warmup_iterations=0, faults=faults
    )
    assert run.timeline is not None
    _check(run.timeline)


@pytest.mark.multiprocess
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root"
)
def test_a_host_pair_delay_moves_with_a_swap_in_the_testbed() -> None:
    """The delay is on the wire between hosts 1 and 2 (a userspace delay wire): after the
    swap the processes in those namespaces play stages 3 and 2, so link 2-3 arrives late."""
    faults = parse_yaml(f"[{{start_iteration: 0, hosts: [1, 2], delay_ms: {DELAY_MS}}}]")
    run = run_configuration(
        _SwapAt(3),
        backend="emulated",
        injection="network",
        num_iterations=4,
        num_warmup_iterations=0,
        faults=faults,
    )
    assert run.timeline is not None
    assert all(m.fault_ms == 0.0 for m in run.timeline.messages)  # the wire delays, not a hook
    _check(run.timeline)


@pytest.mark.multiprocess
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root"
)
def test_the_testbed_applies_each_event_at_its_iteration_boundary() -> None:
    """A delay on link 0-1 from iteration 1 to 3 and on 2-3 from 2 on: the wires change
    between iterations while the same workers keep running."""
    faults = parse_yaml(
        f'[{{start_iteration: 1, end_iteration: 3, links: ["0-1"], delay_ms: {DELAY_MS}}},'
        f' {{start_iteration: 2, links: ["2-3"], delay_ms: {DELAY_MS}}}]'
    )
    run = run_configuration(
        fixed_plan(one_f_one_b(PROFILE), PROFILE),
        backend="emulated",
        injection="network",
        num_iterations=4,
        num_warmup_iterations=1,  # connections are made in the warm-up
        faults=faults,
    )
    assert run.timeline is not None
    slow = [_slow_links(run.timeline, k) for k in range(1, 5)]
    assert slow == [set(), {"0-1"}, {"0-1", "2-3"}, {"2-3"}]
    assert len({record.pids for record in run.timeline.iterations}) == 1  # no restart


DP_PROFILE = Profile.uniform(2, 4, 2, 2, 2, message_bytes=1024, num_replicas=2)
DP_PROFILE = dataclasses.replace(DP_PROFILE, allreduce_bytes=(4096, 4096))
DP_SWAPPED = Topology(2, 2).swapped(Position(0, 1), Position(1, 0))
"""Host 1 plays stage 0 of replica 1, host 2 stage 1 of replica 0: hosts 0-1 carried PP link
pp0:0-1, now they carry DP link dp0:0-1."""


def _slow_pp_links(timeline: Timeline, iteration: int) -> set[tuple[str, int]]:
    slow = set()
    for link, replica in {(m.link, m.replica) for m in timeline.messages}:
        took = [
            max(m.fault_ms, m.arrival_ms - m.send_start_ms)
            for m in timeline.messages
            if (m.iteration, m.link, m.replica) == (iteration, link, replica)
        ]
        if statistics.median(took) >= DELAY_MS:
            slow.add((link, replica))
    return slow


@pytest.mark.multiprocess
@pytest.mark.parametrize("backend", ["sim", "emulated"])
def test_a_swap_across_replicas_moves_a_pp_delay_onto_a_dp_link(backend: str) -> None:
    """The DP ring follows the placement: after the swap the slow pair's messages are the
    stage-0 all-reduce's (each waits the delay), and no PP message is slow any more."""
    faults = parse_yaml(f"[{{start_iteration: 0, hosts: [0, 1], delay_ms: {DELAY_MS}}}]")
    run = run_configuration(
        _SwapAt(2, DP_PROFILE, DP_SWAPPED),
        backend=backend,
        num_iterations=3,
        num_warmup_iterations=0,
        faults=faults,
    )
    assert run.timeline is not None
    timeline = run.timeline
    assert _slow_pp_links(timeline, 1) == {("0-1", 0)}
    assert _slow_pp_links(timeline, 2) == set()
    assert timeline.iterations[2].step_time_ms >= 2 * DELAY_MS  # 2 ring steps, each delayed
    if backend == "emulated":
        before, after = timeline.iterations[1].pids, timeline.iterations[2].pids
        assert (after[1], after[2]) == (before[2], before[1])  # by position index


KIB_64 = 64 * 1024
PP_GBPS = 0.008  # 64 KiB take 65.5 ms at 8 Mbit/s
CAPPED_PROFILE = dataclasses.replace(
    DP_PROFILE, message_bytes=KIB_64, link_bandwidth_gbps=PP_GBPS, dp_bandwidth_gbps=10.0
)


def test_the_testbed_s_base_follows_the_roles_of_a_placement() -> None:
    """Each pair gets the bandwidth and delay of the link it carries under the placement:
    after DP_SWAPPED the PP pairs and the DP pairs have changed places."""
    profile = dataclasses.replace(
        CAPPED_PROFILE, delay_ms=(30.0,), dp_delay_ms=((Link.dp(1, 0), 5.0),)
    )
    pp, dp = PP_GBPS * 1e9, 10e9
    assert _base_states(profile, profile.topology) == {
        (0, 1): WireState(delay_ms=30.0, rate_bit_s=pp),
        (2, 3): WireState(delay_ms=30.0, rate_bit_s=pp),
        (0, 2): WireState(rate_bit_s=dp),
        (1, 3): WireState(delay_ms=5.0, rate_bit_s=dp),
    }
    assert _base_states(profile, DP_SWAPPED) == {
        (0, 2): WireState(delay_ms=30.0, rate_bit_s=pp),
        (1, 3): WireState(delay_ms=30.0, rate_bit_s=pp),
        (0, 1): WireState(rate_bit_s=dp),
        (2, 3): WireState(delay_ms=5.0, rate_bit_s=dp),
    }


@pytest.mark.multiprocess
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root"
)
def test_a_swapped_pp_link_takes_its_role_s_cap_in_the_testbed() -> None:
    """PP links capped at 8 Mbit/s, DP ring links at 10 Gbit/s; from iteration 2 the pairs
    that carried the DP ring carry the PP links (DP_SWAPPED). Every PP message, before the
    swap and after it, is held by the PP cap, as the simulator and the detector expect: half
    its time at least (htb lets a burst of a 9,000-byte frame or two through at once, 9 ms
    each at this rate: 45 to 75 ms measured), where the DP cap passes 64 KiB in about 0.3
    ms. Load only adds time: a floor."""
    run = run_configuration(
        _SwapAt(2, CAPPED_PROFILE, DP_SWAPPED),
        backend="emulated",
        injection="network",
        num_iterations=3,
        num_warmup_iterations=0,
    )
    assert run.timeline is not None
    timeline = run.timeline
    before, after = timeline.iterations[1].pids, timeline.iterations[2].pids
    assert (after[1], after[2]) == (before[2], before[1])  # swapped, no restart
    capped_ms = 8 * KIB_64 / (PP_GBPS * 1e6)
    for iteration in (1, 2):
        took = [
            m.arrival_ms - m.send_start_ms for m in timeline.messages if m.iteration == iteration
        ]
        assert len(took) == 2 * 2 * CAPPED_PROFILE.num_microbatches  # 2 directions, replicas
        assert min(took) >= 0.5 * capped_ms


@pytest.mark.multiprocess
def test_the_delegates_are_wired_anew_at_a_swap() -> None:
    """Every PP and DP message of a delegated run goes over delegates before and after the
    swap (each to its new neighbour's), none is lost, and the swap is in the records."""
    profile = dataclasses.replace(DP_PROFILE, num_delegates=1)
    run = run_configuration(
        _SwapAt(2, profile, DP_SWAPPED, CommMode.DELEGATED),
        backend="emulated",
        delegated=True,
        num_iterations=3,
        num_warmup_iterations=0,
    )
    assert run.timeline is not None
    timeline = run.timeline
    workers = {k: set(timeline.iterations[k].pids) for k in range(3)}
    assert workers[0] == workers[1] == workers[2]  # the same workers, no restart
    for k in range(3):
        messages = [m for m in (*timeline.messages, *timeline.dp_messages) if m.iteration == k]
        assert len([m for m in messages if m.link == "0-1"]) == 2 * 2 * profile.num_microbatches
        assert len(messages) > 2 * 2 * profile.num_microbatches  # the ring's too
        assert all(m.carrier_pid not in workers[k] for m in messages)  # a delegate carried it
    carriers = {k: {m.carrier_pid for m in timeline.messages if m.iteration == k} for k in (1, 2)}
    assert carriers[1].isdisjoint(carriers[2])  # new delegates after the swap
    swaps = sorted(timeline.swaps, key=lambda r: r.stage_to)
    assert [(r.iteration, r.stage_to, r.replica_to, r.num_bytes) for r in swaps] == [
        (2, 0, 1, 0),
        (2, 1, 0, 0),
    ]  # no state in the emulated compute
    record = timeline.iterations[2]
    assert all(record.start_ms <= r.start_ms < r.end_ms <= record.end_ms for r in swaps)


def test_a_swap_costs_its_own_iteration_only_in_sim() -> None:
    """With the state transfer timed (8 x 1 MB over 8 Gbit/s: 8 ms), the swap's iteration is
    8 ms longer and no later iteration repeats it (the simulator's reuse of identical
    iterations leaves it out)."""
    profile = dataclasses.replace(DP_PROFILE, allreduce_bytes=(1_000_000, 1_000_000),
                                  dp_bandwidth_gbps=8.0)  # fmt: skip
    run = run_configuration(
        _SwapAt(3, profile, DP_SWAPPED), num_iterations=6, num_warmup_iterations=0
    )
    times = run.iteration_times_ms
    assert times[3] == pytest.approx(times[2] + 8.0)
    assert times[:3] == (times[0],) * 3 and times[4:] == (times[2],) * 2
    assert run.reused_iterations == 3  # 1 and 2 repeat 0, 5 repeats 4 (not the swap's 3)


@pytest.mark.multiprocess
@pytest.mark.parametrize(("swap_at", "checkpoint_every", "resumed_at"), [(1, 2, 2), (0, 5, 0)])
def test_after_a_restart_every_engine_swaps_again(
    swap_at: int, checkpoint_every: int, resumed_at: int
) -> None:
    """Stages 0 and 1 of replicas 1 and 0 swap places from iteration `swap_at` on; PP link
    0-1 is down in iteration 3: the job restarts from its checkpoint (iteration 2, or the
    start) on processes placed by default, so the first iteration run again swaps again,
    in the simulator as in the runtime, moving no state (the checkpoint holds it; a fresh
    run's iteration 0 holds the initial one)."""
    faults = parse_yaml('[{start_iteration: 3, end_iteration: 4, links: ["pp0:0-1"], down: true}]')
    records = {}
    for backend in ("sim", "emulated"):
        run = run_configuration(
            _SwapAt(swap_at, DP_PROFILE, DP_SWAPPED),
            backend=backend,
            num_iterations=5,
            num_warmup_iterations=0,
            faults=faults,
            recovery=Recovery(checkpoint_every=checkpoint_every),
        )
        assert run.restarts == 1 and run.timeline is not None
        records[backend] = sorted(
            (r.iteration, r.stage_to, r.replica_to, r.num_bytes if r.iteration != 1 else -1)
            for r in run.timeline.swaps
        )  # the emulated compute moves no state, the simulator the state's bytes at 1
    first = 0 if swap_at == 0 else -1
    assert (
        records["sim"]
        == records["emulated"]
        == sorted(
            [
                (swap_at, 0, 1, first),
                (swap_at, 1, 0, first),
                (resumed_at, 0, 1, 0),
                (resumed_at, 1, 0, 0),
            ]
        )
    )
