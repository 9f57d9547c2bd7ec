"""What the fault model assigns messages: pure, seeded, on the hosts a fault hits."""

import random
import statistics

import pytest

from injectors.fault_files import parse_yaml
from injectors.fault_model import InForce
from pipeline.faults import first_route_up, route_over
from pipeline.link_rates import NO_RATES
from pipeline.profile import Profile
from pipeline.topology import Link, Position, Topology

FOUR = Topology(4)


def _model(rows: str, seed: int = 0):
    return parse_yaml(rows, seed)


def test_jitter_is_a_pure_function_of_the_message() -> None:
    model = _model('[{start_iteration: 0, links: ["0-1"], delay_ms: 10, jitter_ms: 4}]', seed=7)
    draws = [
        model.at(2, FOUR, rates=NO_RATES).message_fault(Link.pp(0, 0), "forward", "F", m).delay_ms
        for m in range(50)
    ]
    again = [
        model.at(2, FOUR, rates=NO_RATES).message_fault(Link.pp(0, 0), "forward", "F", m).delay_ms
        for m in range(50)
    ]
    assert draws == again and all(6 <= d <= 14 for d in draws) and len(set(draws)) > 40
    other_seed = _model('[{start_iteration: 0, links: ["0-1"], delay_ms: 10, jitter_ms: 4}]', 8)
    assert (
        other_seed.at(2, FOUR, rates=NO_RATES)
        .message_fault(Link.pp(0, 0), "forward", "F", 0)
        .delay_ms
        != (draws[0])
    )
    assert (
        model.at(2, FOUR, rates=NO_RATES).message_fault(Link.pp(1, 0), "forward", "F", 0).delay_ms
        == 0
    )


def test_a_cap_a_stall_and_their_directions() -> None:
    model = _model(
        '[{start_iteration: 3, links: ["0-1"], bandwidth_gbps: 0.1},'
        ' {start_iteration: 3, links: ["0-1"], stall_ms: 50}]'
    )
    in_force = model.at(3, FOUR, rates=NO_RATES)
    link = Link.pp(0, 0)
    mbit = 125_000  # 1 Mbit at 0.1 Gbit/s: 10 ms
    first = in_force.message_fault(link, "backward", "B", 0, mbit)
    second = in_force.message_fault(link, "backward", "B", 1, mbit)
    forward = in_force.message_fault(link, "forward", "F", 1, mbit)
    # each direction stalls once; of each delay the cap's 10 ms is the wire's (cap_ms)
    assert [(f.delay_ms, f.cap_ms) for f in (first, second, forward)] == [
        (60.0, 10.0), (10.0, 10.0), (60.0, 10.0)
    ]  # fmt: skip
    assert in_force.message_fault(Link.pp(1, 0), "forward", "F", 0, mbit).cap_ms == 0.0
    assert (
        model.at(4, FOUR, rates=NO_RATES).message_fault(link, "forward", "F", 0, mbit).delay_ms
        == 10.0
    )


@pytest.mark.parametrize("second_ms", [50.0, 80.0])
def test_a_second_stall_row_in_an_iteration_is_paid_from_its_start(second_ms: float) -> None:
    """Two stall rows on one link in one iteration, the second from 100 ms: the first
    message at or after each row's start waits that row's stall (once per direction). The
    second was never paid (the sender had paid "a stall"), where the testbed's wire paid it
    when its value differed from the first's: 350 ms in the simulator, 484 on the testbed."""
    model = _model(
        '[{start_iteration: 1, links: ["0-1"], stall_ms: 50},'
        f' {{start_iteration: 1, at_ms: 100, links: ["0-1"], stall_ms: {second_ms}}}]'
    )
    in_force = model.at(1, FOUR, rates=NO_RATES)
    link = Link.pp(0, 0)
    delays = [
        in_force.message_fault(link, direction, "F", m, offset_ms=offset_ms).delay_ms
        for direction, m, offset_ms in [
            ("forward", 0, 10.0),
            ("forward", 1, 20.0),
            ("forward", 2, 110.0),
            ("forward", 3, 120.0),
            ("backward", 0, 130.0),  # the first backward: after the second row's start
        ]
    ]
    assert delays == [50.0, 0.0, second_ms, 0.0, second_ms]


def test_a_cap_on_a_link_the_profile_caps_adds_only_what_the_lower_rate_takes_beyond() -> None:
    """A cap replaces the link's own rate (the profile's) where slower, as on the testbed
    (the pair's htb cap and the wire's both hold): a 1 Mbit message on a 0.1 Gbit/s link
    takes 10 ms there; under a 0.05 Gbit/s cap 20 ms, 10 ms more (once: 20 more); under a
    cap of the link's rate or above, nothing more (once: 10). The lowest cap on the route
    holds (a pair's and a NIC's once added up). The simulator and the runtime's hook ask the
    same `InForce`, on the profile's `link_rates`."""
    rates = Profile.uniform(4, 4, 1, 1, 1, link_bandwidth_gbps=0.1).link_rates
    link, mbit = Link.pp(0, 0), 125_000

    def fault_ms(rows: str) -> float:
        in_force = _model(rows).at(0, FOUR, rates=rates)
        return in_force.message_fault(link, "forward", "F", 0, mbit).delay_ms

    cap = '[{{start_iteration: 0, links: ["0-1"], bandwidth_gbps: {}}}]'
    assert fault_ms(cap.format(0.05)) == pytest.approx(10.0)
    assert fault_ms(cap.format(0.1)) == fault_ms(cap.format(1.0)) == 0.0
    both = (
        '[{start_iteration: 0, links: ["0-1"], bandwidth_gbps: 0.05},'
        ' {start_iteration: 0, nic: "host1:rnic0", bandwidth_gbps: 0.025}]'
    )
    assert fault_ms(both) == pytest.approx(40.0 - 10.0)
    # A profile without bandwidth: the cap's whole time, as before.
    assert _model(cap.format(0.05)).at(0, FOUR, rates=NO_RATES).message_fault(
        link, "forward", "F", 0, mbit
    ).delay_ms == pytest.approx(20.0)


def test_a_nic_stall_is_paid_once_by_each_worker_sending_through_it() -> None:
    """Each worker keeps its own view's state, so each pays a stall once per direction: on
    host 1's NIC the activations of stages 0 (0-1) and 1 (1-2) both wait; the simulator,
    which shares one view, made only the first of them wait. Stage 1 of replica 0 sends
    forward on PP link 1-2 and its DP ring's dp1:0-1: one sender, one stall."""
    model = _model('[{start_iteration: 0, nic: "host1:rnic0", stall_ms: 50}]')
    in_force = model.at(0, Topology(3), rates=NO_RATES)
    delays = [
        in_force.message_fault(link, direction, "F", 0).delay_ms
        for link, direction in [
            (Link.pp(0, 0), "forward"),
            (Link.pp(1, 0), "forward"),
            (Link.pp(1, 0), "forward"),
            (Link.pp(0, 0), "backward"),
            (Link.pp(1, 0), "backward"),
        ]
    ]
    assert delays == [50.0, 50.0, 0.0, 50.0, 50.0]
    two_replicas = _model('[{start_iteration: 0, nic: "host1:rnic0", stall_ms: 50}]').at(
        0, Topology(3, 2), rates=NO_RATES
    )
    assert two_replicas.message_fault(Link.pp(1, 0), "forward", "F", 0).delay_ms == 50.0
    assert two_replicas.message_fault(Link.dp(1, 0), "forward", "F", 0).delay_ms == 0.0
    assert Link.dp(1, 0).sender("forward") == Link.pp(1, 0).sender("forward") == Position(1, 0)
    assert Link.dp(2, 0, 1).sender("backward") == Position(2, 1)


def test_at_ms_end_iteration_and_a_zero_delay_end_events() -> None:
    model = _model(
        '[{start_iteration: 1, at_ms: 30, end_iteration: 3, links: ["1-2"], delay_ms: 5},'
        ' {start_iteration: 4, links: ["2-3"], delay_ms: 7},'
        ' {start_iteration: 6, links: ["2-3"], delay_ms: 0}]'
    )

    def delay(k: int, stage: int, offset_ms: float = 0.0) -> float:
        return (
            model.at(k, FOUR, rates=NO_RATES)
            .message_fault(Link.pp(stage, 0), "forward", "F", 0, 0, offset_ms)
            .delay_ms
        )

    assert (delay(1, 1, 29.9), delay(1, 1, 30.0), delay(2, 1), delay(3, 1)) == (0, 5, 5, 0)
    assert (delay(5, 2), delay(6, 2)) == (7, 0)
    assert model.pp_delays_ms(5, FOUR) == (0.0, 0.0, 7.0)


def test_a_fault_stays_on_its_hosts_when_a_swap_moves_the_logical_link() -> None:
    model = _model("[{start_iteration: 0, hosts: [1, 2], delay_ms: 25}]")
    swapped = FOUR.swapped(Position(1), Position(2))  # hosts 1 and 2 trade stages
    before = [
        model.at(0, FOUR, rates=NO_RATES).message_fault(Link.pp(s, 0), "forward", "F", 0).delay_ms
        for s in range(3)
    ]
    after = [
        model.at(0, swapped, rates=NO_RATES)
        .message_fault(Link.pp(s, 0), "forward", "F", 0)
        .delay_ms
        for s in range(3)
    ]
    assert before == [0.0, 25.0, 0.0]
    # Link 0-1 now runs host 0 -> host 2, 1-2 host 2 -> host 1 (the slow pair), 2-3 host 1 -> 3.
    assert after == [0.0, 25.0, 0.0] and swapped.hosts_of(Link.pp(1, 0)) == (2, 1)
    model_13 = _model("[{start_iteration: 0, hosts: [1, 3], delay_ms: 25}]")
    moved = [
        model_13.at(0, swapped, rates=NO_RATES)
        .message_fault(Link.pp(s, 0), "forward", "F", 0)
        .delay_ms
        for s in range(3)
    ]
    assert moved == [0.0, 0.0, 25.0]  # hosts 1-3 carried no link; now 2-3 (host 1 plays 2)


def test_a_nic_down_fails_every_message_routed_through_it() -> None:
    model = _model('[{start_iteration: 2, nic: "host2:rnic0", down: true}]')
    in_force = model.at(2, FOUR, rates=NO_RATES)
    failed = [in_force.message_fault(Link.pp(s, 0), "forward", "F", 0).failed for s in range(3)]
    assert failed == [False, True, True]  # links 1-2 and 2-3 touch host 2
    assert not model.has_failure(1, FOUR) and model.has_failure(2, FOUR)
    rnic1 = _model('[{start_iteration: 0, nic: "host2:rnic1", down: true}]').at(
        0, FOUR, rates=NO_RATES
    )
    assert not rnic1.message_fault(Link.pp(1, 0), "forward", "F", 0).failed  # not on the route


def test_a_route_is_over_one_nic_at_both_ends_and_a_host_pair_is_on_the_first() -> None:
    """Link 1-2 runs between hosts 1 and 2. A NIC's failure or delay is on the routes over
    that NIC; a host pair's (a link's) on the route over rnic0 only, as on the testbed, so a
    failover to rnic1 leaves it. `route_over` keeps a NIC while its route is up, else takes
    the first NIC whose route is up, and fails where none is (from 5 ms here). A new pair of
    delegates starts on the first NIC whose route is up (`first_route_up`, at 1 and 6 ms; 0
    where none is), as `route_failed` tells without a message."""
    rows = {
        "rnic0 of host 2 down": '[{start_iteration: 0, nic: "host2:rnic0", down: true}]',
        "host pair down": '[{start_iteration: 0, links: ["1-2"], down: true}]',
        "both of host 2 down": '[{start_iteration: 0, nic: "host2:rnic0", down: true},'
        ' {start_iteration: 0, at_ms: 5, nic: "host2:rnic1", down: true}]',
        "rnic0 of 1, rnic1 of 2 down": '[{start_iteration: 0, nic: "host1:rnic0", down: true},'
        ' {start_iteration: 0, at_ms: 5, nic: "host2:rnic1", down: true}]',
        "rnic1 of host 1 slow": '[{start_iteration: 0, nic: "host1:rnic1", delay_ms: 3}]',
        "host pair slow": "[{start_iteration: 0, hosts: [1, 2], delay_ms: 4}]",
    }
    link = Link.pp(1, 0)
    seen = {}
    for name, row in rows.items():
        in_force = _model(row).at(0, FOUR, rates=NO_RATES)
        over = {
            (nic, t): in_force.message_fault(link, "forward", "F", 0, 0, t, nic)
            for nic in (0, 1)
            for t in (1, 6)
        }
        seen[name] = {key: "down" if f.failed else f.delay_ms for key, f in over.items()}
        assert {key: in_force.route_failed(link, *key) for key in over} == {
            key: f.failed for key, f in over.items()
        }
        seen[name]["start"] = tuple(first_route_up(in_force, link, 2, t) for t in (1, 6))
        routes = [route_over(in_force, nic, 2, link, "forward", "F", 0, 0, 6) for nic in (0, 1)]
        seen[name]["route"] = tuple(None if r.fault.failed else r.nic for r in routes)
    assert seen == {
        "rnic0 of host 2 down": {
            (0, 1): "down", (0, 6): "down", (1, 1): 0, (1, 6): 0, "route": (1, 1),
            "start": (1, 1),
        },
        "host pair down": {
            (0, 1): "down", (0, 6): "down", (1, 1): 0, (1, 6): 0, "route": (1, 1),
            "start": (1, 1),
        },
        "both of host 2 down": {
            (0, 1): "down", (0, 6): "down", (1, 1): 0, (1, 6): "down", "route": (None, None),
            "start": (1, 0),
        },
        "rnic0 of 1, rnic1 of 2 down": {
            (0, 1): "down", (0, 6): "down", (1, 1): 0, (1, 6): "down", "route": (None, None),
            "start": (1, 0),
        },
        "rnic1 of host 1 slow": {
            (0, 1): 0, (0, 6): 0, (1, 1): 3, (1, 6): 3, "route": (0, 1), "start": (0, 0)
        },
        "host pair slow": {
            (0, 1): 4, (0, 6): 4, (1, 1): 0, (1, 6): 0, "route": (0, 1), "start": (0, 0)
        },
    }  # fmt: skip
    one_nic = Topology(4, nics=("rnic0",))
    lone = _model(rows["rnic0 of host 2 down"]).at(0, one_nic, rates=NO_RATES)
    assert route_over(lone, 0, 1, link, "forward", "F", 0).fault.failed  # nothing to move to


def test_a_failed_route_pays_no_stall() -> None:
    """A stall on the host pair and rnic0 of host 1 down: the message asked over rnic0 fails
    and leaves the stall unpaid, so the first message over a route through the pair pays it
    (its state is the sender's: a failed route changes none)."""
    model = _model(
        "[{start_iteration: 0, hosts: [1, 2], stall_ms: 7},"
        ' {start_iteration: 0, at_ms: 5, nic: "host1:rnic0", down: true}]'
    )
    in_force = model.at(0, FOUR, rates=NO_RATES)
    link = Link.pp(1, 0)
    assert in_force.message_fault(link, "forward", "F", 0, 0, 6.0).failed
    assert in_force.message_fault(link, "forward", "F", 1, 0, 1.0).delay_ms == 7.0
    assert in_force.message_fault(link, "forward", "F", 2, 0, 2.0).delay_ms == 0.0


def test_a_redrawn_normal_delay_follows_the_clock() -> None:
    model = _model(
        '[{start_iteration: 0, links: ["0-1"], distribution: {normal: {mean_ms: 20, std_ms: 4},'
        " redraw_every_ms: [10, 10]}}]"
    )
    in_force = model.at(0, FOUR, rates=NO_RATES)
    values = [
        in_force.message_fault(Link.pp(0, 0), "forward", "F", 0, 0, t).delay_ms
        for t in range(0, 20_000, 10)
    ]
    held = [
        in_force.message_fault(Link.pp(0, 0), "forward", "F", 0, 0, t).delay_ms for t in (1, 5, 9)
    ]
    assert len(set(held)) == 1  # one draw held for 10 ms
    assert abs(statistics.fmean(values) - 20) < 0.5 and abs(statistics.stdev(values) - 4) < 0.5


def test_a_redrawn_delay_does_not_depend_on_which_messages_asked_before() -> None:
    """The values are drawn once per iteration, as far as asked: a message asking late in
    the iteration, then one asking early, see what each would see alone."""
    model = _model(
        '[{start_iteration: 0, links: ["0-1"], distribution: {normal: {mean_ms: 20, std_ms: 4},'
        " redraw_every_ms: [1, 3]}}]"
    )

    def delay_ms(in_force: InForce, offset_ms: float) -> float:
        return in_force.message_fault(Link.pp(0, 0), "forward", "F", 0, 0, offset_ms).delay_ms

    offsets = [5000.0, 3.0, 2999.5, 0.0, 5000.0, 1.0, 4000.25]
    shared = model.at(0, FOUR, rates=NO_RATES)
    assert [delay_ms(shared, t) for t in offsets] == [
        delay_ms(model.at(0, FOUR, rates=NO_RATES), t) for t in offsets
    ]
    assert delay_ms(model.at(1, FOUR, rates=NO_RATES), 5000.0) != delay_ms(
        shared, 5000.0
    )  # a new iteration's


def test_a_redrawn_delay_an_hour_into_an_iteration_draws_only_its_own_block() -> None:
    """A message an hour into an iteration under 1 ms redraws asks for one block of values,
    not the 3.6 million before it (which took seconds and hundreds of MB per worker); a
    block dropped from the few kept is drawn again the same."""
    model = _model(
        '[{start_iteration: 0, links: ["0-1"], distribution: {normal: {mean_ms: 20, std_ms: 4},'
        " redraw_every_ms: [1, 1]}}]"
    )
    in_force = model.at(0, FOUR, rates=NO_RATES)

    def delay_ms(offset_ms: float) -> float:
        return in_force.message_fault(Link.pp(0, 0), "forward", "F", 0, 0, offset_ms).delay_ms

    early = [delay_ms(t) for t in (0.5, 10.5, 1000.5)]
    late = [delay_ms(3_600_000.0 + t) for t in range(0, 10 * 1024, 1024)]  # ten blocks
    (redraws,) = in_force._redraws.values()
    drawn = sum(len(block.values_ms) for block in redraws.blocks.values())
    assert len(redraws.blocks) == 4 and drawn <= 4 * 1025
    assert len(set(late)) > 1 and all(v >= 0 for v in late)
    assert [delay_ms(t) for t in (0.5, 10.5, 1000.5)] == early  # block 0, drawn again
    alone = model.at(0, FOUR, rates=NO_RATES)
    assert early == [
        alone.message_fault(Link.pp(0, 0), "forward", "F", 0, 0, t).delay_ms
        for t in (0.5, 10.5, 1000.5)
    ]


def test_an_event_replaced_inside_an_iteration_holds_until_its_replacement_starts() -> None:
    """Messages sent before the new event's `at_ms` still meet the old one."""
    model = _model(
        '[{start_iteration: 0, links: ["0-1"], delay_ms: 50},'
        ' {start_iteration: 1, at_ms: 100, links: ["0-1"], delay_ms: 10}]'
    )

    def delays_ms(iteration: int) -> list[float]:
        in_force = model.at(iteration, FOUR, rates=NO_RATES)
        return [
            in_force.message_fault(Link.pp(0, 0), "forward", "F", 0, 0, t).delay_ms
            for t in (0.0, 50.0, 99.9, 100.0, 150.0)
        ]

    assert delays_ms(0) == [50.0] * 5
    assert delays_ms(1) == [50.0, 50.0, 50.0, 10.0, 10.0]
    assert delays_ms(2) == [10.0] * 5
    assert model.pp_delays_ms(1, FOUR)[0] == 10.0  # what holds at the iteration's end


def test_a_failure_ended_inside_an_iteration_fails_the_messages_before_its_end() -> None:
    model = _model(
        '[{start_iteration: 0, links: ["0-1"], down: true},'
        ' {start_iteration: 1, at_ms: 100, links: ["0-1"], delay_ms: 0}]'
    )
    in_force = model.at(1, FOUR, rates=NO_RATES)
    failed = [
        in_force.message_fault(Link.pp(0, 0), "forward", "F", 0, 0, t).failed
        for t in (0.0, 50.0, 100.0, 150.0)
    ]
    assert failed == [True, True, False, False]
    assert model.has_failure(1, FOUR) and not model.has_failure(2, FOUR)


def test_the_longest_hold_adds_the_kinds_on_one_unit_and_counts_a_cap() -> None:
    model = _model(
        '[{start_iteration: 0, links: ["1-2"], bandwidth_gbps: 0.008},'
        ' {start_iteration: 0, links: ["2-3"], down: true},'
        ' {start_iteration: 0, links: ["0-1"], delay_ms: 500, jitter_ms: 100},'
        ' {start_iteration: 1, links: ["0-1"], stall_ms: 300},'
        ' {start_iteration: 2, links: ["0-1"], delay_ms: 700}]'  # replaces the first delay
    )
    # The stall holds in iteration 1 only, beside the first delay; the second holds alone.
    assert model.longest_hold_ms(FOUR) == 500 + 100 + 300
    # 1 MB at 8 Mbit/s: 1000 ms on link 1-2 alone, the longest then.
    assert model.longest_hold_ms(FOUR, message_bytes=1_000_000) == 1000.0


def test_the_longest_hold_adds_only_what_is_in_force_together() -> None:
    """Two 600 ms delays on one route, in iterations 0-2 and 5-7: no message meets both."""
    model = _model(
        '[{start_iteration: 0, end_iteration: 3, nic: "host1:rnic0", delay_ms: 600},'
        ' {start_iteration: 5, end_iteration: 8, links: ["0-1"], delay_ms: 600}]'
    )
    assert model.longest_hold_ms(FOUR) == 600.0
    overlapping = _model(
        '[{start_iteration: 0, end_iteration: 6, nic: "host1:rnic0", delay_ms: 600},'
        ' {start_iteration: 5, end_iteration: 8, links: ["0-1"], delay_ms: 600}]'
    )
    assert overlapping.longest_hold_ms(FOUR) == 1200.0


def test_the_longest_hold_adds_the_units_on_one_route() -> None:
    """Events on different targets add where one message's route meets them all: a host
    pair's delay, one of its hosts' first NIC's delay and a stall on the pair (a delay on the
    second NIC is on another route: a message over it leaves the pair's faults, which are
    on the first NIC's plane); caps do not add, the route's lowest holds."""
    rows = (
        '[{start_iteration: 0, links: ["0-1"], delay_ms: 100},'
        ' {start_iteration: 0, nic: "host1:rnic0", delay_ms: 100},'
        " {start_iteration: 0, hosts: [0, 1], stall_ms: 50},"
        ' {start_iteration: 0, nic: "host2:rnic1", delay_ms: 120}'
    )
    model = _model(rows + "]")
    in_force = model.at(0, FOUR, rates=NO_RATES)
    held_ms = in_force.message_fault(Link.pp(0, 0), "forward", "F", 0).delay_ms
    assert held_ms == 250.0 == model.longest_hold_ms(FOUR)
    # host 1's second NIC and host 2's: 120 ms, less than the first route's 250.
    assert in_force.message_fault(Link.pp(1, 0), "forward", "F", 0, nic=1).delay_ms == 120.0
    # Two caps on one route: the lower holds, once (1 MB at 8 and 16 Mbit/s: 1000 ms, not
    # 1500); a delay on the route's NIC adds to it.
    capped = _model(
        '[{start_iteration: 0, links: ["0-1"], bandwidth_gbps: 0.008},'
        ' {start_iteration: 0, nic: "host0:rnic0", bandwidth_gbps: 0.016},'
        ' {start_iteration: 0, nic: "host0:rnic0", delay_ms: 30}]'
    )
    fault = capped.at(0, FOUR, rates=NO_RATES).message_fault(
        Link.pp(0, 0), "forward", "F", 0, 1_000_000
    )
    assert fault.delay_ms == 1030.0 == capped.longest_hold_ms(FOUR, 1_000_000)


def test_a_cap_holds_the_largest_message_that_crosses_its_hosts() -> None:
    """S = 2, D = 2, one host per position: hosts 0, 1 play replica 0's stages, 2, 3 replica
    1's. A cap on a DP link holds that ring's largest chunk, not the PP message; a cap on a
    PP link holds the PP message (no DP ring crosses its hosts) or, where a larger route
    crosses them (the tied weight's between a replica's first and last stage), that; a NIC
    or host pair the largest of the routes through it."""
    topology = Topology(2, 2)
    first, last = (Position(0, 0), Position(0, 1)), (Position(1, 0), Position(1, 1))
    chunks = {first: 318_336, last: 316_544}  # tiny's stages' chunks at D = 2

    def hold_ms(target: str, routes: dict[tuple[Position, Position], int]) -> float:
        model = _model(f"[{{start_iteration: 0, {target}, bandwidth_gbps: 0.001}}]")
        return model.longest_hold_ms(topology, 8192, routes)  # 1 Mbit/s: 1 ms per 125 B

    assert hold_ms('links: ["dp0:0-1"]', chunks) == 2546.688
    assert hold_ms('links: ["dp1:0-1"]', chunks) == 2532.352
    assert hold_ms("hosts: [1, 3]", chunks) == 2532.352
    assert hold_ms('nic: "host2:rnic1"', chunks) == 2546.688  # dp0:0-1 failed over
    assert hold_ms('links: ["0-1"]', chunks) == 65.536  # the PP message's 8192 B
    tied = {(Position(0, r), Position(1, r)): 32_768 for r in (0, 1)}
    assert hold_ms('links: ["pp1:0-1"]', {**chunks, **tied}) == 262.144
    assert hold_ms('links: ["dp0:0-1"]', {}) == 65.536  # no routes: every message's 8192 B


def test_dp_ring_messages_meet_the_faults_on_their_hosts() -> None:
    """A fault named by a DP link hits that ring's messages, both ways; a PP link's fault is
    on other host pairs (one host per position here), so the rings do not see it."""
    dp = Topology(4, 2)
    model = _model(
        '[{start_iteration: 0, links: ["dp1:0-1"], delay_ms: 30},'
        ' {start_iteration: 0, links: ["0-1"], delay_ms: 20}]'
    )
    in_force = model.at(0, dp, rates=NO_RATES)
    assert in_force.message_fault(Link.dp(1, 0), "forward", "AR", 0).delay_ms == 30.0
    assert in_force.message_fault(Link.dp(1, 0), "backward", "AR", 5).delay_ms == 30.0
    assert in_force.message_fault(Link.dp(0, 0), "forward", "AR", 0).delay_ms == 0.0
    assert in_force.message_fault(Link.pp(0, 1), "forward", "F", 0).delay_ms == 20.0


def test_what_is_in_force_is_the_same_asked_in_any_order_as_asked_alone() -> None:
    """The model answers each run of iterations with the same events in force once (per
    topology) and reuses it: asked in a shuffled order, every iteration's answer is that of a
    fresh model asked about that iteration only (starts inside an iteration, ends, a stall,
    a zero delay, a failure, a replacement)."""
    rows = (
        '[{start_iteration: 1, at_ms: 30, end_iteration: 3, links: ["1-2"], delay_ms: 5},'
        ' {start_iteration: 2, links: ["0-1"], stall_ms: 40},'
        ' {start_iteration: 4, links: ["2-3"], delay_ms: 7},'
        ' {start_iteration: 5, nic: "host1:rnic0", down: true, end_iteration: 7},'
        ' {start_iteration: 5, at_ms: 10, links: ["2-3"], delay_ms: 9},'
        ' {start_iteration: 8, links: ["2-3"], delay_ms: 0}]'
    )
    topologies = (FOUR, Topology(4, 2), FOUR.swapped(Position(1), Position(2)))

    def answers(model, iteration: int, topology: Topology):
        return (
            model.at(iteration, topology, rates=NO_RATES).effects,
            model.pp_delays_ms(iteration, topology),
            model.dp_delays_ms(iteration, topology),
            model.has_failure(iteration, topology),
        )

    shared = _model(rows)
    asked = [(k, t) for k in range(-1, 11) for t in topologies]
    for k, t in random.Random(3).sample(asked, len(asked)):
        assert answers(shared, k, t) == answers(_model(rows), k, t), (k, t)


def test_a_restart_asked_for_keeps_what_starts_in_its_iteration_a_failure_s_does_not() -> None:
    """A restart a controller asks for comes before its iteration runs: it repairs the slow
    links and failures that started before it, not those that start in it. A failure's
    restart comes after its iteration failed: it repairs the failures that started by then
    (that one's too), and no slow link."""
    model = parse_yaml(
        '[{start_iteration: 1, links: ["0-1"], delay_ms: 40},'
        ' {start_iteration: 2, links: ["1-2"], delay_ms: 10},'
        ' {start_iteration: 2, end_iteration: 3, links: ["2-3"], down: true}]'
    )
    asked = model.repaired(2, stragglers=True)
    assert asked.pp_delays_ms(2, FOUR) == (0.0, 10.0, 0.0) and asked.has_failure(2, FOUR)
    failed = model.repaired(2)
    assert failed.pp_delays_ms(2, FOUR) == (40.0, 10.0, 0.0) and not failed.has_failure(2, FOUR)


def test_a_failure_s_restart_repairs_what_had_failed_by_its_time_in_the_iteration() -> None:
    """Links 0-1 and 2-3 go down in iteration 2, at 0 and at 15 ms: a failure 1 ms into it
    repairs 0-1 only; 2-3 still goes down when iteration 2 runs again. With no time (the
    whole iteration) both are repaired."""
    model = parse_yaml(
        '[{start_iteration: 2, links: ["0-1"], down: true},'
        ' {start_iteration: 2, links: ["2-3"], down: true, at_ms: 15}]'
    )
    early = model.repaired(2, at_ms=1.0).at(2, FOUR, rates=NO_RATES)
    fails = [
        early.message_fault(Link.pp(s), "forward", "F", 0, offset_ms=20).failed for s in (0, 2)
    ]
    assert fails == [False, True]
    assert not model.repaired(2).has_failure(2, FOUR)


def test_rows_a_later_row_replaces_unexpectedly_are_found() -> None:
    """One effect of a kind holds on a unit at a time, so a later row replaces an earlier
    one: where both start together the earlier never applies; where the later ends first
    the earlier does not come back. A change of level (no end) and rows on other links or
    of other kinds are no such case."""
    model = parse_yaml(
        """
- {start_iteration: 1, end_iteration: 4, links: ["0-1"], delay_ms: 30}
- {start_iteration: 2, end_iteration: 3, links: ["0-1"], delay_ms: 10}
- {start_iteration: 2, end_iteration: 3, links: ["1-2"], delay_ms: 10}
- {start_iteration: 2, end_iteration: 3, hosts: [0, 1], bandwidth_gbps: 1}
- {start_iteration: 5, links: ["1-2"], delay_ms: 30}
- {start_iteration: 5, hosts: [1, 2], delay_ms: 10}
- {start_iteration: 6, links: ["2-3"], delay_ms: 30}
- {start_iteration: 7, links: ["2-3"], delay_ms: 10}
- {start_iteration: 8, end_iteration: 9, links: ["2-3"], delay_ms: 0}
"""
    )
    topology = Topology(4)
    rows = [(e.row, later.row, where) for e, later, where in model.replaced_rows(topology)]
    assert rows == [(1, 2, ""), (5, 6, "")]
    # an earlier row without an end does not come back either (it was not named: a delay
    # of 10 ms held to iteration 2 and 0 ms from 4 on, with no warning); a stall holds in
    # its own iteration only, so a later one does not replace it
    endless = parse_yaml(
        """
- {start_iteration: 0, links: ["0-1"], delay_ms: 10}
- {start_iteration: 2, end_iteration: 4, links: ["0-1"], delay_ms: 50}
- {start_iteration: 5, links: ["1-2"], stall_ms: 100}
- {start_iteration: 6, end_iteration: 7, links: ["1-2"], stall_ms: 100}
"""
    )
    rows = [(e.row, later.row, where) for e, later, where in endless.replaced_rows(topology)]
    assert rows == [(1, 2, "")]
    # a later row on part of the earlier's links replaces it there only
    partial = parse_yaml(
        """
- {start_iteration: 2, links: ["0-1", "1-2", "2-3"], delay_ms: 10}
- {start_iteration: 2, links: ["1-2"], delay_ms: 30}
"""
    )
    assert [(e.row, later.row, where) for e, later, where in partial.replaced_rows(topology)] == [
        (1, 2, "hosts 1-2")
    ]
