"""The emulated engine on a namespace testbed: a fault timeline's caps, stalls and NIC
failures applied in the network at their iteration boundaries and offsets (needs root)."""

import math
import os
import shutil
import statistics
import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from baselines import one_f_one_b
from harness.loop import Recovery
from harness.network import (
    _base_states,
    _gloo_gave_up,
    _lasting,
    _network,
    _NetworkEngine,
    _nics_up,
    _wire_changes,
)
from harness.runner import fixed_plan, run_configuration
from injectors.fault_files import parse_yaml
from injectors.fault_model import Effect, Held
from injectors.wire import WireState
from pipeline.engines import Outcome, Plan
from pipeline.errors import ConfigError
from pipeline.faults import NO_FAULTS
from pipeline.link_rates import NO_RATES
from pipeline.profile import Profile
from pipeline.runtime.remote_error import RemoteError, WorkerCrash, WorkerTimeout, worker_error
from pipeline.timeline import Timeline
from pipeline.topology import Link, Topology

KIB_64 = 64 * 1024
CAP_GBPS = 0.008  # 64 KiB take 65.5 ms at 8 Mbit/s
STALL_MS = 600.0
TIMEOUT_S = 3.0


def test_a_stall_stays_in_the_iteration_s_later_states() -> None:
    """A cap from 30 ms keeps the stall from 10 ms (the wire pays it once per direction, so a
    first frame after 30 ms still waits it, as the fault model's first message does)."""
    stall, cap = Effect(stall_ms=50.0), Effect(bandwidth_gbps=1.0)
    changes = _wire_changes(WireState(delay_ms=5.0), (Held(stall, 10.0), Held(cap, 30.0)), "s")
    assert [(at, f.stall_ms, f.rate_bit_s, f.delay_ms) for at, f, _ in changes] == [
        (0.0, 0.0, None, 5.0),
        (10.0, 50.0, None, 5.0),
        (30.0, 50.0, 1e9, 5.0),
    ]


def test_a_second_stall_row_begins_a_stall_of_its_own_on_the_wire() -> None:
    """Two stall rows of 100 ms on 0-1 in iteration 1, from 0 and from 150 ms: the wire's
    states say where each began, so it pays the second too (it paid a second stall only of
    another value: 350 ms in the simulator, as many on the testbed, 484 with 120 ms)."""
    faults = parse_yaml(
        '[{start_iteration: 1, links: ["0-1"], stall_ms: 100},'
        ' {start_iteration: 1, at_ms: 150, links: ["0-1"], stall_ms: 100},'
        ' {start_iteration: 1, at_ms: 200, links: ["0-1"], delay_ms: 5}]'
    )
    wires = _network(faults.at(1, Topology(2), rates=NO_RATES), {}, 1).wires
    assert [(at, f.stall_ms, f.stall_since_ms, b.stall_since_ms) for at, f, b in wires[0, 1]] == [
        (0.0, 100.0, 0.0, 0.0),
        (150.0, 100.0, 150.0, 150.0),
        (200.0, 100.0, 150.0, 150.0),
    ]


def test_a_delay_replaced_inside_an_iteration_holds_on_the_wire_until_then() -> None:
    faults = parse_yaml(
        '[{start_iteration: 0, links: ["0-1"], delay_ms: 50},'
        ' {start_iteration: 1, at_ms: 100, links: ["0-1"], delay_ms: 10}]'
    )
    wires = _network(faults.at(1, Topology(2), rates=NO_RATES), {}, 1).wires
    assert [(at, f.delay_ms, b.delay_ms) for at, f, b in wires[0, 1]] == [
        (0.0, 50.0, 50.0),
        (100.0, 10.0, 10.0),
    ]


def test_a_nic_repaired_inside_an_iteration_is_down_until_then() -> None:
    faults = parse_yaml(
        '[{start_iteration: 0, nic: "host1:rnic0", down: true},'
        ' {start_iteration: 2, at_ms: 80, nic: "host1:rnic0", delay_ms: 0}]'
    )
    topology = Topology(4)
    assert _network(faults.at(1, topology, rates=NO_RATES), {}, 1).nics_down == {
        (1, 0): ((0.0, math.inf),)
    }
    assert _network(faults.at(2, topology, rates=NO_RATES), {}, 2).nics_down == {
        (1, 0): ((0.0, 80.0),)
    }
    assert _network(faults.at(3, topology, rates=NO_RATES), {}, 3).nics_down == {}


def test_a_stall_in_force_in_the_next_iteration_too_is_set_again() -> None:
    """The same stall in iterations 1 and 2 is paid in each (by each sender): the wire is
    set again at iteration 2's start, where a steady delay stays as it is."""
    faults = parse_yaml(
        '[{start_iteration: 1, links: ["0-1"], stall_ms: 200},'
        ' {start_iteration: 1, links: ["1-2"], delay_ms: 5},'
        ' {start_iteration: 2, links: ["0-1"], stall_ms: 200}]'
    )
    topology = Topology(3)
    first, second = (_network(faults.at(k, topology, rates=NO_RATES), {}, k).wires for k in (1, 2))
    assert first[0, 1] == second[0, 1] and first[0, 1][0][1].stall_ms == 200.0
    assert not _lasting(second[0, 1])  # set again
    assert first[1, 2] == second[1, 2] and _lasting(second[1, 2])  # in force already


def test_a_nic_down_again_later_in_the_next_iteration_is_up_until_then() -> None:
    """Down through iteration 1, then down again from 50 ms into iteration 2: it comes up as
    iteration 2 starts (its timer takes it down at 50 ms); one down from the start stays."""
    faults = parse_yaml(
        '[{start_iteration: 1, end_iteration: 2, nic: "host1:rnic0", down: true},'
        ' {start_iteration: 1, nic: "host2:rnic0", down: true},'
        ' {start_iteration: 2, at_ms: 50, nic: "host1:rnic0", down: true}]'
    )
    network = _network(faults.at(2, Topology(4), rates=NO_RATES), {}, 2)
    assert network.nics_down == {(1, 0): ((50.0, math.inf),), (2, 0): ((0.0, math.inf),)}
    assert _nics_up({(1, 0), (2, 0)}, network) == {(1, 0)}


_TWO_OUTAGES = parse_yaml(
    '[{start_iteration: 1, at_ms: 10, nic: "host1:rnic0", down: true},'
    ' {start_iteration: 1, at_ms: 20, nic: "host1:rnic0", delay_ms: 0},'
    ' {start_iteration: 1, at_ms: 50, nic: "host1:rnic0", down: true},'
    ' {start_iteration: 1, at_ms: 60, nic: "host1:rnic0", delay_ms: 0}]'
)


def test_a_nic_down_twice_in_an_iteration_is_up_between() -> None:
    """Down 10-20 ms and 50-60 ms in the fault model (and the simulator) was one testbed
    outage of 10-60 ms: now two, up from 20 to 50 ms."""
    network = _network(_TWO_OUTAGES.at(1, Topology(4), rates=NO_RATES), {}, 1)
    assert network.nics_down == {(1, 0): ((10.0, 20.0), (50.0, 60.0))}


def test_the_testbed_takes_a_nic_down_twice_and_brings_it_up_between() -> None:
    """The timers take the NIC down and up in the fault model's order, at its offsets."""
    profile = Profile.uniform(4, 4, 1, 1, 1)
    bed = _RecordingBed(4)
    engine = _NetworkEngine(bed, profile, timeout_s=1.0)  # type: ignore[arg-type]
    inner = _PlanRecorder(engine._start, done=lambda: len(bed.links) == 4)
    engine._inner = inner  # type: ignore[assignment]
    faults = _TWO_OUTAGES.at(1, Topology(4), rates=NO_RATES)
    engine.run(Plan(one_f_one_b(profile), profile), 1, faults)
    assert bed.links == [(1, 0, False), (1, 0, True), (1, 0, False), (1, 0, True)]
    assert [(change.host, change.plane, change.up) for change in engine.nic_changes] == [
        (1, 0, False),
        (1, 0, True),
        (1, 0, False),
        (1, 0, True),
    ]


def test_a_nic_repaired_as_its_sibling_fails_comes_up_first() -> None:
    """rnic0 down in iteration 3, back up at 4 as rnic1 goes down: the testbed took rnic1
    down before bringing rnic0 up, the host had no NIC for a moment, its delegates none to
    move to, and the Adaptra systems restarted where the simulator and the hook fail over."""
    profile = Profile.uniform(2, 4, 1, 1, 1)
    faults = parse_yaml(
        '[{start_iteration: 3, end_iteration: 4, nic: "host1:rnic0", down: true},'
        ' {start_iteration: 4, end_iteration: 5, nic: "host1:rnic1", down: true}]'
    )
    bed = _RecordingBed(2)
    engine = _NetworkEngine(bed, profile, timeout_s=1.0)  # type: ignore[arg-type]
    engine._inner = _PlanRecorder()  # type: ignore[assignment]
    for iteration in (3, 4, 5):
        engine.run(
            Plan(one_f_one_b(profile), profile),
            iteration,
            faults.at(iteration, Topology(2), rates=NO_RATES),
        )
    assert bed.links == [(1, 0, False), (1, 0, True), (1, 1, False), (1, 1, True)]


def test_a_restart_forgets_the_hosts_neighbours_before_the_fresh_pool() -> None:
    """An outage leaves neighbour entries unresolved: the fresh pool's first connects met
    them (gloo's "No route to host", a retry, a slower restart)."""
    bed = _RecordingBed(2)
    engine = _NetworkEngine(bed, Profile.uniform(2, 4, 1, 1, 1), timeout_s=1.0)  # type: ignore[arg-type]
    engine._inner = _PlanRecorder()  # type: ignore[assignment]
    engine.restart()
    assert bed.forgotten == 1


def test_a_nic_takes_down_only() -> None:
    faults = parse_yaml('[{start_iteration: 0, nic: "host1:rnic0", delay_ms: 5}]')
    with pytest.raises(ConfigError, match="takes a NIC down, not another effect"):
        _network(faults.at(0, Topology(4), rates=NO_RATES), {}, 0)


def _transfer_ms(timeline: Timeline, iteration: int, link: str) -> list[float]:
    return [
        m.arrival_ms - m.send_start_ms
        for m in timeline.messages
        if m.iteration == iteration and m.link == link
    ]


@pytest.mark.multiprocess
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root"
)
def test_caps_stalls_and_a_nic_failure_in_the_testbed_as_in_sim() -> None:
    """Link 1-2 capped from iteration 1, link 2-3 stalled 40 ms into iteration 2, host 1's
    NIC down from iteration 3 (checkpoints every 2): the workers keep running until the NIC
    fails; they notice it by their transport timeout, and the run restarts once from the
    checkpoint at 2 on a repaired testbed, as sim does. Load only adds time: every bound is
    a floor the fault sets (unfaulted, 64 KiB arrive in about a millisecond)."""
    faults = parse_yaml(
        f'[{{start_iteration: 1, end_iteration: 3, links: ["1-2"], bandwidth_gbps: {CAP_GBPS}}},'
        f' {{start_iteration: 2, at_ms: 40, links: ["2-3"], stall_ms: {STALL_MS}}},'
        ' {start_iteration: 3, nic: "host1:rnic0", down: true}]'
    )
    profile = Profile.uniform(4, 4, 1, 1, 1, message_bytes=KIB_64)
    recovery = Recovery(checkpoint_every=2, transport_timeout_s=TIMEOUT_S)
    runs = {
        injection: run_configuration(
            fixed_plan(one_f_one_b(profile), profile),
            backend=backend,
            injection=injection,
            num_iterations=5,
            num_warmup_iterations=1,
            faults=faults,
            recovery=recovery,
        )
        for backend, injection in (("sim", "hook"), ("emulated", "network"))
    }
    sim, network = runs["hook"], runs["network"]
    assert (network.restarts, network.lost_iterations) == (sim.restarts, sim.lost_iterations)
    assert (sim.restarts, sim.lost_iterations) == (1, 1)
    assert network.iterations == sim.iterations == (0, 1, 2, 2, 3, 4)
    assert network.restart_model_ms >= TIMEOUT_S * 1000  # noticed by the timeout, measured
    assert network.timeline is not None
    timeline = network.timeline  # its iterations count the warm-up: fault iteration i is i + 1
    capped = 8 * KIB_64 / (CAP_GBPS * 1e6)
    # Capped in fault iterations 1 and 2, also when 2 runs again after the restart: host 1's
    # wire end came back up with its route (else its sends would bypass the wire).
    assert len(_transfer_ms(timeline, 3, "1-2")) == 2 * len(_transfer_ms(timeline, 2, "1-2"))
    assert min(_transfer_ms(timeline, 2, "1-2") + _transfer_ms(timeline, 3, "1-2")) >= 0.9 * capped
    assert max(_transfer_ms(timeline, 3, "2-3")) >= STALL_MS
    assert timeline.iterations[3].end_ms - timeline.iterations[3].start_ms >= STALL_MS
    assert len({record.pids for record in timeline.iterations[:4]}) == 1  # same workers
    assert timeline.iterations[4].pids != timeline.iterations[3].pids  # a fresh pool


@pytest.mark.multiprocess
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root"
)
def test_a_cap_on_a_link_the_profile_caps_holds_the_lower_rate_in_sim_and_network() -> None:
    """64 KiB messages on a 0.1 Gbit/s link (5.2 ms each), capped at 0.05 Gbit/s from
    iteration 1: the lower rate holds, 10.5 ms a message, in the simulator (which once added
    the cap's 10.5 ms to the link's 5.2) and on the testbed (the pair's htb cap and the
    wire's cap at the lower of the two). Load only adds time: the testbed's every message is
    a floor above 0.9 x the simulator's."""
    profile = Profile.uniform(2, 2, 2, 2, 2, message_bytes=KIB_64, link_bandwidth_gbps=0.1)
    faults = parse_yaml('[{start_iteration: 1, links: ["0-1"], bandwidth_gbps: 0.05}]')
    transit: dict[str, list[float]] = {}
    for backend, injection in (("sim", "hook"), ("emulated", "network")):
        result = run_configuration(
            fixed_plan(one_f_one_b(profile), profile),
            backend=backend,
            injection=injection,
            num_iterations=2,
            faults=faults,
        )
        assert result.timeline is not None
        transit[backend] = [
            m.arrival_ms - m.wire_start_ms for m in result.timeline.messages if m.iteration == 2
        ]
    lower_rate_ms = 8 * KIB_64 / (0.05 * 1e6)
    assert transit["sim"] == pytest.approx([lower_rate_ms] * 4)
    assert len(transit["emulated"]) == 4
    assert min(transit["emulated"]) >= 0.9 * lower_rate_ms, transit


def test_what_counts_as_gloo_giving_up_on_a_dead_nic() -> None:
    """A timed-out wait or send, a connection the transport saw break (its ConnectionError,
    chained from gloo's), or gloo's bare RuntimeError (by its text) in a worker; a worker that
    died without a word, or raised something else (a RuntimeError of the model's too), is not
    a link failure."""
    bare = RemoteError.from_exception(
        RuntimeError("Application timeout caused pair closure"), rank=0, stage=0, replica=0
    )
    try:
        try:
            raise RuntimeError("[pair.cc:598] Connection reset by peer")
        except RuntimeError as err:
            raise ConnectionError(
                "sending the activation of microbatch 0 to rank 1 on link 0-1 failed: "
                "[pair.cc:598] Connection reset by peer"
            ) from err
    except ConnectionError as err:
        sent = RemoteError.from_exception(err, rank=0, stage=0, replica=0, iteration=0, op="F0")
    bug = RemoteError.from_exception(KeyError("x"), rank=0, stage=0, replica=0)
    shape = RemoteError.from_exception(
        RuntimeError("shape '[2, 3]' is invalid for input of size 5"), rank=0, stage=0, replica=0
    )
    gloo_bare = RemoteError.from_exception(
        RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed"),
        rank=0, stage=0, replica=0,
    )  # fmt: skip
    disk_full = RemoteError.from_exception(
        RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed"),
        rank=0, stage=0, replica=0,
    )  # fmt: skip
    assert _gloo_gave_up(WorkerTimeout("no answer", rank=1))
    assert _gloo_gave_up(worker_error(sent))  # a WorkerCrash naming the send
    assert _gloo_gave_up(WorkerCrash("rank 0: RuntimeError", rank=0, remote=bare))
    assert not _gloo_gave_up(WorkerCrash("rank 0 exited with code -9", rank=0))
    assert not _gloo_gave_up(WorkerCrash("rank 0: KeyError", rank=0, remote=bug))
    assert _gloo_gave_up(WorkerCrash("rank 0: RuntimeError", rank=0, remote=gloo_bare))
    assert not _gloo_gave_up(WorkerCrash("rank 0: RuntimeError", rank=0, remote=shape))
    assert not _gloo_gave_up(WorkerCrash("rank 0: RuntimeError", rank=0, remote=disk_full))


@pytest.mark.multiprocess
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root"
)
def test_delegates_on_the_testbed_carry_the_slow_link_on_its_wire() -> None:
    """A 40 ms delay on the wire of hosts 0-1, Adaptra-CPU (ZB over delegates): the delegates
    listen on their hosts' NICs, so the delegated messages of link 0-1 cross that wire and
    wait its delay there, while the sending trainer only copies them out."""
    from harness.network import TESTBED_LINK_TERMS
    from harness.policies import system_controller

    delay_ms = 40.0
    profile = Profile.uniform(4, 8, 5, 5, 5, message_bytes=KIB_64, num_delegates=2)
    profile = profile.with_delays([delay_ms, 0.0, 0.0])
    result = run_configuration(
        system_controller("adaptra-cpu", profile, link_terms=TESTBED_LINK_TERMS),
        backend="emulated",
        injection="network",
        num_iterations=2,
        delegated=True,
    )
    assert result.timeline is not None
    workers = set(result.timeline.iterations[-1].pids)
    messages = result.timeline.messages
    slow = [m for m in messages if m.link == "0-1"]
    assert {m.direction for m in slow} == {"forward", "backward"} and len(slow) == 3 * 2 * 8
    assert all(m.carrier_pid not in workers for m in messages)  # every one by a delegate
    assert all(m.fault_ms == 0.0 for m in messages)  # no sleep: the delay is the network's
    assert min(m.arrival_ms - m.wire_start_ms for m in slow) >= delay_ms  # on the wire
    # not the trainer: a trainer that held each the delay would hold every one at least that
    # long; load may stretch a few hand-offs (the median of 48 is load-proof)
    assert statistics.median(m.send_end_ms - m.send_start_ms for m in slow) < delay_ms
    fast = [m.arrival_ms - m.wire_start_ms for m in messages if m.link != "0-1"]
    assert sorted(fast)[len(fast) // 2] < delay_ms  # the other links' wires are not delayed


class _RecordingBed:
    """What `_NetworkEngine._place` leaves in force on a testbed: each (src, dst, plane)'s
    cap and each (pair, plane)'s wire state (no namespaces: the bookkeeping alone)."""

    def __init__(self, num_hosts: int) -> None:
        self.num_hosts = num_hosts
        self.caps: dict[tuple[int, int, int], float | None] = {}
        self.wires: dict[tuple[int, int, int], WireState] = {}
        self.links: list[tuple[int, int, bool]] = []
        """Every NIC taken down (False) or brought up (True), in order: (host, plane, up)."""
        self.forgotten = 0
        """How often the hosts' neighbour entries were forgotten (a restart)."""

    def address(self, host: int, plane: int = 0) -> str:
        return f"10.{plane}.0.{host + 1}"

    def launcher(self) -> None:
        return None

    def cap_bandwidth(self, src: int, dst: int, plane: int, rate_mbit: float) -> None:
        self.caps[src, dst, plane] = rate_mbit * 1e6

    def uncap_bandwidth(self, src: int, dst: int, plane: int) -> None:
        self.caps[src, dst, plane] = None

    def set_wire(
        self,
        host_a: int,
        host_b: int,
        plane: int,
        forward: WireState,
        backward: WireState | None = None,
        *,
        at: float = 0.0,
        scheduled: bool = False,
    ) -> None:
        self.wires[host_a, host_b, plane] = forward

    def set_link(self, host: int, plane: int, up: bool) -> float:
        self.links.append((host, plane, up))
        return time.monotonic()

    def check_wires(self) -> None:
        pass

    def forget_neighbours(self) -> int:
        self.forgotten += 1
        return 0

    def rnic1(self, pair: tuple[int, int]) -> tuple[float, float | None]:
        """(delay, rate) of the pair's traffic on rnic1: its wire's state rules where it has
        one, else no delay and the caps."""
        wire = self.wires.get((*pair, 1))
        if wire is not None:
            return wire.delay_ms, wire.rate_bit_s
        assert self.caps.get((*pair, 1)) == self.caps.get((pair[1], pair[0], 1))
        return 0.0, self.caps.get((*pair, 1))


@given(st.lists(st.permutations(range(6)), min_size=1, max_size=4))
@settings(max_examples=50, deadline=None)
def test_the_testbed_s_caps_and_delays_follow_each_placement_s_roles(
    placements: list[list[int]],
) -> None:
    """Whatever placements follow one another, every pair's caps (every data NIC) and its
    rnic1 state are the role's it plays under the last one (`_base_states`): a pair that
    had a delay and then a role without one keeps no stale delay or rate; a pair with no
    role is uncapped."""
    profile = Profile.uniform(
        3, 4, 1, 1, 1, num_replicas=2, delay_ms=(30.0, 0.0), link_bandwidth_gbps=1.0,
        dp_bandwidth_gbps=5.0, dp_delay_ms=((Link.dp(1, 0), 10.0),),
    )  # fmt: skip
    bed = _RecordingBed(6)
    engine = _NetworkEngine(bed, profile, timeout_s=1.0)  # type: ignore[arg-type]
    for workers in placements:
        topology = Topology(3, 2, placement=tuple(workers))
        engine._place(topology)
        base = _base_states(profile, topology)
        for a in range(6):
            for b in range(a + 1, 6):
                role = base.get((a, b), WireState())
                for plane in (0, 1):
                    for key in ((a, b, plane), (b, a, plane)):
                        assert bed.caps.get(key) == role.rate_bit_s
                assert bed.rnic1((a, b)) == (role.delay_ms, role.rate_bit_s)


class _PlanRecorder:
    """An inner engine that keeps the plans it is asked to run (no workers); with an
    `on_start`, its iterations start as they are asked for and last until `done()` (a hang
    guard of 10 s)."""

    def __init__(
        self, on_start: Callable[[float], None] | None = None, done: Callable[[], bool] = bool
    ) -> None:
        self.plans: list[Plan] = []
        self.on_start, self.done = on_start, done

    def restart(self) -> None:
        self.plans.clear()

    def run(self, plan: Plan, iteration: int, faults: object, **_: object) -> Outcome:
        self.plans.append(plan)
        if self.on_start is not None:
            self.on_start(time.monotonic())
            deadline = time.monotonic() + 10.0
            while not self.done() and time.monotonic() < deadline:
                time.sleep(0.01)
        return Outcome(Timeline(plan.profile.num_stages, (), (), ()))


def test_the_workers_plans_carry_no_delay_the_testbed_puts_on_the_wire() -> None:
    """The profile's PP and DP ring delays go on the pairs' wires, once: the workers' plan
    has neither (a DP delay kept there was slept by the workers and delayed by the wire,
    a DP step of 242 ms where the simulator has 120)."""
    dp_links = (Link.dp(0, 0), Link.dp(1, 0))
    profile = Profile.uniform(
        2, 2, 2, 2, 2, num_replicas=2, delay_ms=(30.0,),
        dp_delay_ms=tuple((link, 60.0) for link in dp_links),
    )  # fmt: skip
    bed = _RecordingBed(4)
    engine = _NetworkEngine(bed, profile, timeout_s=1.0)  # type: ignore[arg-type]
    inner = _PlanRecorder()
    engine._inner = inner  # type: ignore[assignment]
    engine.run(Plan(one_f_one_b(profile), profile), 0, NO_FAULTS)
    (sent,) = inner.plans
    assert sent.profile.delay_ms == (0.0,)
    assert [sent.profile.dp_delay_for(link) for link in dp_links] == [0.0, 0.0]
    on_wire = {}
    for link in (Link.pp(0, 0), Link.pp(0, 1), *dp_links):
        a, b = sorted(profile.topology.hosts_of(link))
        on_wire[str(link)] = bed.wires[a, b, 0].delay_ms
    assert on_wire == {"pp0:0-1": 30.0, "pp1:0-1": 30.0, "dp0:0-1": 60.0, "dp1:0-1": 60.0}


def test_a_plan_with_other_dp_delays_than_the_run_s_is_refused() -> None:
    profile = Profile.uniform(2, 2, 2, 2, 2, num_replicas=2, dp_delay_ms=((Link.dp(0, 0), 60.0),))
    engine = _NetworkEngine(_RecordingBed(4), profile, timeout_s=1.0)  # type: ignore[arg-type]
    engine._inner = _PlanRecorder()  # type: ignore[assignment]
    other = profile.with_delays(profile.delay_ms, {Link.dp(0, 0): 10.0})
    with pytest.raises(ConfigError, match=r"delays \(PP and DP\) for the whole run"):
        engine.run(Plan(one_f_one_b(other), other), 0, NO_FAULTS)
