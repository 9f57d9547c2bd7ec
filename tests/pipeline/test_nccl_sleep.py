"""The paper's GPU path as its artifact injects delays (pipeline.nccl_sleep, comm nccl-sleep)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given

from baselines.one_f_one_b import one_f_one_b
from injectors.fault_files import parse_yaml
from pipeline.errors import LinkFailure, ScheduleError
from pipeline.faults import MessageFault
from pipeline.host_costs import FREE, CostCurve, HostCosts, RingLag
from pipeline.profile import Profile
from pipeline.simulator import CommMode, LinkComm, simulate
from pipeline.topology import Link
from pipeline.zero_bubble import zb_h1
from tests.strategies import profiles


def _profile(num_stages: int, delay_ms: dict[int, float] | None = None) -> Profile:
    delays = tuple((delay_ms or {}).get(i, 0.0) for i in range(num_stages - 1))
    return Profile(
        num_stages=num_stages,
        num_microbatches=2 * num_stages,
        t_f_ms=(10.0,) * num_stages,
        t_b_ms=(10.0,) * num_stages,
        t_w_ms=(10.0,) * num_stages,
        delay_ms=delays,
    )


def _end_ms(schedule, profile: Profile) -> float:  # type: ignore[no-untyped-def]
    return simulate(schedule, profile, CommMode.NCCL_SLEEP).iterations[0].end_ms


def _sleeps(schedule, profile: Profile) -> dict[tuple[str, str], set[float]]:  # type: ignore[no-untyped-def]
    timeline = simulate(schedule, profile, CommMode.NCCL_SLEEP)
    found: dict[tuple[str, str], set[float]] = {}
    for m in timeline.messages:
        found.setdefault((m.link, m.direction), set()).add(m.fault_ms)
    return found


def test_without_delays_it_is_the_ideal_pipeline() -> None:
    """No sleep, messages instantaneous: both runtimes' orders give the ideal times."""
    for build in (one_f_one_b, zb_h1):
        profile = _profile(4)
        schedule = build(profile)
        ideal = simulate(schedule, profile, CommMode.IDEAL).iterations[0].end_ms
        assert _end_ms(schedule, profile) == pytest.approx(ideal)


def test_megatron_batched_calls_count_stage_2_to_1_on_link_2_3() -> None:
    """On the PP group's communicator the injector takes peer rank 1 for 'the next stage':
    stage 2's gradients to stage 1 sleep when link 2-3 is slow, and not when 1-2 is."""
    schedule = one_f_one_b(_profile(4))
    slow_2_3 = _sleeps(schedule, _profile(4, {2: 30.0}))
    assert slow_2_3[("2-3", "forward")] == slow_2_3[("2-3", "backward")] == {30.0}
    assert slow_2_3[("1-2", "backward")] == {30.0}  # the injector's misreading
    assert slow_2_3[("1-2", "forward")] == slow_2_3[("0-1", "backward")] == {0.0}
    slow_1_2 = _sleeps(schedule, _profile(4, {1: 30.0}))
    assert slow_1_2[("1-2", "forward")] == {30.0}
    assert slow_1_2[("1-2", "backward")] == {0.0}


def test_zero_bubble_pair_communicators_sleep_on_the_slow_link_only() -> None:
    schedule = zb_h1(_profile(4))
    found = _sleeps(schedule, _profile(4, {2: 30.0}))
    assert found[("2-3", "forward")] == found[("2-3", "backward")] == {30.0}
    assert found[("1-2", "backward")] == found[("0-1", "forward")] == {0.0}


def test_a_sleep_holds_its_senders_queue() -> None:
    """Two stages, one microbatch per op: stage 0's F1 waits behind F0's send and its
    sleep on the one dispatch queue, so F1 starts at 10 + 40 ms, not at 10 ms."""
    profile = dataclasses.replace(_profile(2, {0: 40.0}), num_microbatches=2)
    timeline = simulate(zb_h1(profile), profile, CommMode.NCCL_SLEEP)
    starts = {(r.stage, str(r.kind), r.microbatch): r.start_ms for r in timeline.ops}
    assert starts[0, "F", 0] == 0.0
    assert starts[0, "F", 1] == pytest.approx(50.0)
    assert starts[1, "F", 0] == pytest.approx(50.0)  # the activation left after the sleep


def test_megatron_round_trips_serialise_on_the_last_link() -> None:
    """1F1B with link 2-3 slow pays more than with link 0-1 slow at S = 4 (the injector's
    misreading adds stage 2's sends to stage 1), as the paper's Fig. 16 shows for 7B."""
    schedule = one_f_one_b(_profile(4))
    first = _end_ms(schedule, _profile(4, {0: 60.0}))
    last = _end_ms(schedule, _profile(4, {2: 60.0}))
    assert last > first + 100.0


class _DownLink:
    """An iteration's faults: PP link 1-2 of replica 0 down."""

    def message_fault(self, link, direction, kind, microbatch, num_bytes=0, offset_ms=0.0, nic=0):  # type: ignore[no-untyped-def]
        return MessageFault(failed=link == Link.pp(1, 0))

    def affects(self, link: Link) -> bool:
        return link == Link.pp(1, 0)

    def cache_key(self) -> None:
        return None


def test_a_failed_link_is_a_link_failure() -> None:
    profile = _profile(4)
    faults = _DownLink()
    with pytest.raises(LinkFailure, match="link pp0:1-2"):
        simulate(one_f_one_b(profile), profile, CommMode.NCCL_SLEEP, faults=faults)


@dataclasses.dataclass
class _DownFrom:
    """An iteration's faults: one PP link of replica 0 down from `from_ms` into it; every
    question asked is logged (link, direction, kind, microbatch)."""

    link: Link
    from_ms: float
    asked: list[tuple[str, str, str, int]] = dataclasses.field(default_factory=list)

    def message_fault(self, link, direction, kind, microbatch, num_bytes=0, offset_ms=0.0, nic=0):  # type: ignore[no-untyped-def]
        self.asked.append((str(link), direction, kind, microbatch))
        return MessageFault(failed=link == self.link and offset_ms >= self.from_ms)

    def affects(self, link: Link) -> bool:
        return link == self.link

    def cache_key(self) -> None:
        return None


def test_a_misread_send_fails_on_its_own_link_only() -> None:
    """1F1B's fault-free sends (10 ms ops): at S = 4 link 1-2's last activation leaves at
    230 ms, stage 2's gradients to stage 1 at 260 and 290 ms, stage 3's last to stage 2 at
    270 ms; at S = 3 link 1-2's last activation at 170 ms, the last gradient at 200 ms. The
    injector counts stage 2's gradients to stage 1 on link 2-3 (or, at S = 3, on none), but
    they go over 1-2: they fail when 1-2 is down, as in every other mode, and not when 2-3
    is (its own messages all gone)."""
    four, three = Profile.uniform(4, 8, 10.0, 10.0, 10.0), Profile.uniform(3, 6, 10.0, 10.0, 10.0)
    for profile, from_ms, microbatch, at_ms in ((four, 231.0, 6, 260.0), (three, 171.0, 5, 200.0)):
        down_1_2 = _DownFrom(Link.pp(1, 0), from_ms)
        with pytest.raises(LinkFailure) as failure:
            simulate(one_f_one_b(profile), profile, CommMode.NCCL_SLEEP, faults=down_1_2)
        assert f"backward message of microbatch {microbatch} on link pp0:1-2" in str(failure.value)
        assert failure.value.at_ms == at_ms
    down_2_3 = _DownFrom(Link.pp(2, 0), 271.0)
    timeline = simulate(one_f_one_b(four), four, CommMode.NCCL_SLEEP, faults=down_2_3)
    assert timeline == simulate(one_f_one_b(four), four, CommMode.NCCL_SLEEP)
    # Stage 2's gradient to stage 1: its own link first (can it go), then the counted one.
    asked = [a for a in down_2_3.asked if a[2:] == ("B", 7) and a[0] != "pp0:0-1"]
    assert asked == [("pp0:2-3", "backward", "B", 7), ("pp0:1-2", "backward", "B", 7),
                     ("pp0:2-3", "forward", "B", 7)]  # fmt: skip


_CAPPED_STARTS = {  # (stages, capped link) -> each stage's op starts, ms, in its order
    (3, "1-2"): [[0, 10, 100, 230, 340, 450], [10, 100, 210, 230, 320, 430],
                 [100, 110, 210, 220, 320, 330]],
    (4, "1-2"): [[0, 10, 100, 190, 320, 430, 540, 640], [10, 100, 190, 300, 320, 410, 520, 620],
                 [100, 190, 200, 300, 310, 410, 420, 520],
                 [110, 120, 200, 210, 310, 320, 420, 430]],
    (4, "2-3"): [[0, 10, 20, 110, 260, 370, 480, 590], [10, 20, 110, 240, 260, 350, 460, 570],
                 [20, 110, 220, 240, 330, 350, 440, 550],
                 [110, 120, 220, 230, 330, 340, 440, 450]],
}  # fmt: skip


@pytest.mark.parametrize(("num_stages", "capped", "end_ms"), [(3, "1-2", 470.0),
                         (4, "1-2", 660.0), (4, "2-3", 610.0)])  # fmt: skip
def test_a_cap_is_its_own_link_s_wire_time_whichever_link_the_sleep_is_counted_on(
    num_stages: int, capped: str, end_ms: float
) -> None:
    """1F1B, S microbatches of 10 ms F and 20 ms B+W, 10 MB messages on unlimited links, a
    1 Gbit/s cap on one link: each message over it is 80 ms longer on the wire (from when
    send and receive meet), in both directions, and no sleep. Stage 2's gradients go over
    1-2 whatever link the injector counts them on (2-3 at S = 4, none at S = 3): a cap on
    1-2 holds them 80 ms (it was dropped: 0 ms), one on 2-3 does not (it held them 80 ms
    of sleep). By hand, every send a call's synchronize waits for: at S = 3, stage 1's F0
    goes at 20 and is at stage 2 at 100; stage 2's BW0 ends at 130, its gradient meets
    stage 1's receive (posted with F1's send at 110) and is there at 210, when stage 1's
    BW0 starts; ... stage 0's BW2 ends at 470. Every op's start is as worked out."""
    profile = Profile.uniform(num_stages, num_stages, 10, 10, 10, message_bytes=10_000_000)
    faults = parse_yaml(f'- {{start_iteration: 0, links: ["{capped}"], bandwidth_gbps: 1}}')
    view = faults.at(0, profile.topology, rates=profile.link_rates)
    timeline = simulate(one_f_one_b(profile), profile, CommMode.NCCL_SLEEP, faults=view)
    for message in timeline.messages:
        cap_ms = 80.0 if message.link == capped else 0.0
        assert message.fault_ms == pytest.approx(cap_ms)  # no sleep: the cap alone
        assert message.arrival_ms - message.wire_start_ms == pytest.approx(cap_ms)
    starts = [sorted(r.start_ms for r in timeline.ops if r.stage == s) for s in range(num_stages)]
    assert starts == _CAPPED_STARTS[num_stages, capped]
    assert timeline.iterations[0].end_ms == end_ms


def test_a_misread_send_sleeps_the_counted_link_s_delay_and_takes_its_own_link_s_cap() -> None:
    """S = 4: 30 ms delay and a 1 Gbit/s cap on 2-3, a 1 Gbit/s cap on 1-2: stage 2's
    gradients to stage 1 sleep 2-3's 30 ms (the misreading) and take 1-2's 80 ms cap."""
    profile = Profile.uniform(4, 4, 10, 10, 10, message_bytes=10_000_000)
    faults = parse_yaml(
        '[{start_iteration: 0, links: ["2-3"], delay_ms: 30},'
        ' {start_iteration: 0, links: ["1-2", "2-3"], bandwidth_gbps: 1}]'
    )
    view = faults.at(0, profile.topology, rates=profile.link_rates)
    timeline = simulate(one_f_one_b(profile), profile, CommMode.NCCL_SLEEP, faults=view)
    found: dict[tuple[str, str], set[tuple[float, float]]] = {}
    for m in timeline.messages:
        key = (m.link, m.direction)
        found.setdefault(key, set()).add((m.fault_ms, round(m.arrival_ms - m.wire_start_ms, 9)))
    assert found[("1-2", "backward")] == {(110.0, 80.0)}  # 30 slept, 80 on the wire
    assert found[("1-2", "forward")] == {(80.0, 80.0)}
    assert found[("2-3", "forward")] == found[("2-3", "backward")] == {(110.0, 80.0)}
    assert found[("0-1", "forward")] == found[("0-1", "backward")] == {(0.0, 0.0)}


def test_it_mixes_with_no_other_mode() -> None:
    profile = _profile(3)
    mixed = (LinkComm(Link.pp(0), "forward", CommMode.DELEGATED),)
    with pytest.raises(ScheduleError, match="nccl-sleep"):
        simulate(one_f_one_b(profile), profile, CommMode.NCCL_SLEEP, link_comms=mixed)


@given(profiles(max_stages=4, with_delays=False))
def test_no_message_leaves_before_its_op_ends_nor_the_pipeline_beats_ideal(
    profile: Profile,
) -> None:
    """With nothing injected, NCCL's queues only hold things back: every message meets its
    receive after the op producing it ended (also zero-length ops, whose send and op share
    an instant) and neither runtime's order ends before the ideal pipeline."""
    for build in (one_f_one_b, zb_h1):
        schedule = build(profile)
        timeline = simulate(schedule, profile, CommMode.NCCL_SLEEP)
        for message in timeline.messages:
            assert message.wire_start_ms >= message.send_start_ms - 1e-9  # (done - wire) rounds
        ideal = simulate(schedule, profile, CommMode.IDEAL).iterations[0].end_ms
        assert timeline.iterations[0].end_ms >= ideal - 1e-9


def test_it_takes_no_host_costs_also_in_its_dp_ring() -> None:
    """A calibration's host costs are the CPU runtimes': NCCL's all-reduce paid its send and
    ring lag (a 24 ms step where a free host's is 0)."""
    profile = Profile.uniform(2, 2, 1.0, 1.0, 1.0, num_replicas=2, allreduce_bytes=(1000, 1000))
    host = HostCosts(
        send_ms_by_bytes=CostCurve.line(5.0),
        op_overhead_ms=3.0,
        ring_lag_ms_by_rings=RingLag.by_rings_alone(CostCurve(((1, 7.0),))),
    )
    timelines = [
        simulate(one_f_one_b(profile), profile, CommMode.NCCL_SLEEP, host=h) for h in (FREE, host)
    ]
    assert timelines[1].iterations == timelines[0].iterations
    assert timelines[1].ops == timelines[0].ops
