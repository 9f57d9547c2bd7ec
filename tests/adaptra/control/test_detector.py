"""The straggler detector on saved timelines (the simulator's): what it names, its
estimates, and what it never reads."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest

from adaptra.control import DetectingController, LinkDetector, Thresholds, unmeasurable_kinds
from harness.policies import blind_detector_warning, system_controller
from harness.runner import run_configuration
from injectors.fault_files import parse_yaml
from pipeline.link_terms import ALL_LINK_TERMS
from pipeline.profile import Profile
from pipeline.timeline import Timeline
from pipeline.topology import Link

PROFILE = Profile.uniform(4, 8, 2, 2, 2, message_bytes=1 << 16, num_delegates=3)
DP_PROFILE = Profile.uniform(
    4, 8, 2, 2, 2, message_bytes=1 << 16, num_delegates=3, num_replicas=2,
    allreduce_bytes=750_000, dp_bucket_bytes=250_000, dp_bandwidth_gbps=8.0,
)  # fmt: skip
"""PP 4 x DP 2: every stage's ring sends 6 chunks of 125 kB each way per iteration."""


def _sim_timeline(faults_yaml: str, num_iterations: int, profile: Profile = PROFILE) -> Timeline:
    """A fixed plan's (1F1B over direct) simulated run: the detector reads its messages."""
    faults = parse_yaml(faults_yaml)
    result = run_configuration(
        system_controller("1f1b", profile, faults), num_iterations=num_iterations, faults=faults
    )
    assert result.timeline is not None
    return result.timeline


def _beliefs(timeline: Timeline, profile: Profile = PROFILE) -> list[dict[str, float]]:
    detector = LinkDetector(profile, link_terms=ALL_LINK_TERMS)  # the simulator's timelines
    by_iteration: dict[int, list] = {}
    for m in itertools.chain(timeline.messages, timeline.dp_messages):
        by_iteration.setdefault(m.iteration, []).append(m)
    return [detector.observe(k, by_iteration[k]).detected_ms for k in sorted(by_iteration)]


def test_a_slow_link_is_named_with_its_delay_from_its_first_iteration_and_until_it_ends() -> None:
    """30 ms on link 1-2 in fault iterations 5-9 (run iterations 6-10, after the warm-up)."""
    timeline = _sim_timeline(
        '[{start_iteration: 5, end_iteration: 10, links: ["1-2"], delay_ms: 30}]', 14
    )
    beliefs = _beliefs(timeline)
    assert [set(b) for b in beliefs] == [set()] * 6 + [{"1-2"}] * 5 + [set()] * 4
    assert all(b["1-2"] == pytest.approx(30.0, abs=1e-6) for b in beliefs[6:11])


def test_two_slow_links_are_told_apart() -> None:
    timeline = _sim_timeline('[{start_iteration: 0, links: ["0-1"], delay_ms: 15},'
                             ' {start_iteration: 0, links: ["2-3"], delay_ms: 40}]', 3)  # fmt: skip
    *_, last = _beliefs(timeline)
    assert set(last) == {"0-1", "2-3"}
    assert last["0-1"] == pytest.approx(15.0, rel=0.10)
    assert last["2-3"] == pytest.approx(40.0, rel=0.10)


def test_a_slow_link_from_the_start_is_found_against_the_healthy_links() -> None:
    """The profile's own 30 ms on link 1-2: slow in the first iteration the detector sees
    (the other links give the host's floor)."""
    profile = PROFILE.with_delays((0.0, 30.0, 0.0))
    timeline = _sim_timeline('[{start_iteration: 3, links: ["0-1"], delay_ms: 0}]', 2, profile)
    first, *_ = _beliefs(timeline, profile)
    assert first == {"1-2": pytest.approx(30.0, abs=1e-6)}


def test_a_slow_dp_ring_link_is_named_with_its_delay_beside_a_slow_pp_link() -> None:
    """12 ms on stage 2's ring link in fault iterations 2-4, 30 ms on PP link 0-1 in 3-5:
    each named while its delay lasts, with that delay (the simulator's times are exact)."""
    timeline = _sim_timeline(
        '[{start_iteration: 2, end_iteration: 5, links: ["dp2:0-1"], delay_ms: 12},'
        ' {start_iteration: 3, end_iteration: 6, links: ["0-1"], delay_ms: 30}]',
        8,
        DP_PROFILE,
    )
    beliefs = _beliefs(timeline, DP_PROFILE)
    assert [set(b) for b in beliefs] == [set(), set(), set(), {"dp2:0-1"},
                                         {"dp2:0-1", "0-1"}, {"dp2:0-1", "0-1"}, {"0-1"},
                                         set(), set()]  # fmt: skip
    assert all(b["dp2:0-1"] == pytest.approx(12.0, abs=1e-6) for b in beliefs[3:6])
    assert all(b["0-1"] == pytest.approx(30.0, abs=1e-6) for b in beliefs[4:7])


def test_the_injected_delay_in_the_records_changes_nothing() -> None:
    """`fault_ms` (what the fault model injected) scrambled, PP and DP: the same beliefs."""
    timeline = _sim_timeline(
        '[{start_iteration: 2, end_iteration: 5, links: ["0-1"], delay_ms: 25},'
        ' {start_iteration: 3, end_iteration: 5, links: ["dp1:0-1"], delay_ms: 15}]',
        7,
        DP_PROFILE,
    )
    rng = random.Random(1)
    tampered = dataclasses.replace(
        timeline,
        messages=tuple(m._replace(fault_ms=rng.uniform(0, 100)) for m in timeline.messages),
        dp_messages=tuple(m._replace(fault_ms=rng.uniform(0, 100)) for m in timeline.dp_messages),
    )
    assert _beliefs(tampered, DP_PROFILE) == _beliefs(timeline, DP_PROFILE)
    assert {link for b in _beliefs(timeline, DP_PROFILE) for link in b} == {"0-1", "dp1:0-1"}


def test_hysteresis_keeps_a_wavering_link_slow_between_the_thresholds() -> None:
    """A delay of 10 ms, then 6 ms (between recovery 4 and onset 8): still slow; then 3 ms:
    healthy."""
    timeline = _sim_timeline(
        '[{start_iteration: 0, links: ["0-1"], delay_ms: 10},'
        ' {start_iteration: 2, links: ["0-1"], delay_ms: 6},'
        ' {start_iteration: 4, links: ["0-1"], delay_ms: 3}]',
        6,
    )
    assert [set(b) for b in _beliefs(timeline)] == [set()] + [{"0-1"}] * 4 + [set()] * 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"onset_ms": 2.0, "recovery_ms": 3.0}, "recovery_ms"),
        ({"replan_ms": -1}, "margins"),
        ({"slow_direction_ms": 0.0}, "slow_direction_ms"),
        ({"slow_direction_ms": 9.0}, "slow_direction_ms"),
    ],
)
def test_bad_thresholds_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Thresholds(**kwargs)


def test_the_re_plan_margin_is_3_ms_or_10_percent() -> None:
    thresholds = Thresholds()
    assert not thresholds.moved(30.0, 32.9) and thresholds.moved(30.0, 33.1)
    assert not thresholds.moved(60.0, 65.9) and thresholds.moved(60.0, 66.1)


def _late(timeline: Timeline, iteration: int, num_late: int, late_ms: float) -> Timeline:
    """`timeline` with the first `num_late` gradients of link 1-2 in `iteration` stamped
    `late_ms` late (as by a receiver that was not scheduled)."""
    late = 0
    messages = []
    for m in timeline.messages:
        if (m.iteration, m.link, m.direction) == (iteration, "1-2", "backward") and late < num_late:
            m = m._replace(arrival_ms=m.arrival_ms + late_ms)
            late += 1
        messages.append(m)
    assert late == num_late
    return dataclasses.replace(timeline, messages=tuple(messages))


def test_late_stamps_on_most_of_a_direction_s_messages_are_no_straggler() -> None:
    """Load only makes stamps late: 5 of a direction's 8 messages stamped 20 ms late move its
    median (the estimate) but not its lower quartile (the evidence), so no link is called
    slow; all 8 late (a delayed link) is one, with its 20 ms."""
    timeline = _sim_timeline('[{start_iteration: 0, links: ["0-1"], delay_ms: 0}]', 4)
    detector = LinkDetector(PROFILE, link_terms=ALL_LINK_TERMS)
    stamped_late = _late(timeline, 2, 5, 20.0)
    directions = detector.direction_times(m for m in stamped_late.messages if m.iteration == 2)
    times = directions[("1-2", "backward", 0)]
    assert times.median_ms - times.lower_quartile_ms == pytest.approx(20.0, abs=1e-6)
    assert _beliefs(stamped_late) == [{}] * 5  # the warm-up iteration, then 4 measured
    assert _beliefs(_late(timeline, 2, 8, 20.0))[2] == {"1-2": pytest.approx(20.0, abs=1e-6)}


def test_a_fresh_job_s_first_iteration_calls_a_link_slow_on_every_direction_only() -> None:
    """The first iteration of freshly started workers: one direction of one replica stamped
    late throughout (a receiver still starting, on a loaded host: 60-90 ms, a review's
    emulated runs, 2 of 10 warm-ups) was a slow link, and Adaptra ran the next iteration on
    the delegates with a plan for it. Cold, a link is slow on its every direction's evidence
    (a delay in the network, as a profile's, slows them all); the same late stamps in a
    later iteration are a slow link still."""
    healthy = _sim_timeline('[{start_iteration: 0, links: ["0-1"], delay_ms: 0}]', 2)
    static = _sim_timeline(  # the profile's delay, from the warm-up on
        '[{start_iteration: 0, links: ["0-1"], delay_ms: 0}]', 1, PROFILE.with_delays([0, 30, 0])
    )

    def belief(timeline: Timeline, iteration: int, *, cold: bool) -> dict[str, float]:
        detector = LinkDetector(PROFILE, link_terms=ALL_LINK_TERMS)
        for k in range(iteration + 1):
            directions = detector.direction_times(m for m in timeline.messages if m.iteration == k)
            seen = detector.believe(k, directions, cold=cold and k == 0)
        return seen.detected_ms

    assert belief(_late(healthy, 0, 8, 60.0), 0, cold=True) == {}
    assert belief(_late(healthy, 0, 8, 60.0), 0, cold=False) == {"1-2": pytest.approx(60.0)}
    assert belief(_late(healthy, 1, 8, 60.0), 1, cold=True) == {"1-2": pytest.approx(60.0)}
    assert belief(static, 0, cold=True) == {"1-2": pytest.approx(30.0)}


def test_the_controllers_judge_the_first_iteration_after_a_start_or_a_restart_cold() -> None:
    """The workers start fresh at the run's start and at each restart: Adaptra's controller
    judges the first iteration after either cold (one late direction is no slow link), the
    next not."""
    healthy = _sim_timeline('[{start_iteration: 0, links: ["0-1"], delay_ms: 0}]', 3)
    late = healthy
    for k in (0, 2, 3):
        late = _late(late, k, 8, 60.0)
    parts = late.split()
    controller = DetectingController(PROFILE, link_terms=ALL_LINK_TERMS)
    believed = []
    for k, part in enumerate(parts):
        if k == 2:
            controller.restarted(2, stragglers=False)
        controller.observe(k, part)
        believed.append(dict(controller.plan(k + 1).believed_ms))
    assert believed == [{}, {}, {}, {"1-2": pytest.approx(60.0, abs=1e-6)}]


def test_a_jittered_delay_is_estimated_without_bias_over_every_replica_or_one() -> None:
    """30 +- 30 ms on link 1-2 at DP 4, on every replica or replica 1 only, 30 iterations:
    the estimates' mean is the delay's (was the largest of 8 or 2 noisy medians: 43.0 and
    33.2 ms); without jitter, replica 1's alone is exact (its healthy replicas left out)."""
    profile = dataclasses.replace(
        PROFILE, num_replicas=4, allreduce_bytes=(1000,) * 4, dp_bucket_bytes=1000
    )
    for link in ("1-2", "pp1:1-2"):
        timeline = _sim_timeline(
            f'[{{start_iteration: 0, links: ["{link}"], delay_ms: 30, jitter_ms: 30}}]', 30, profile
        )
        estimates = [b["1-2"] for b in _beliefs(timeline, profile)[1:]]
        assert len(estimates) == 30
        assert 28.0 < sum(estimates) / len(estimates) < 32.0, (link, estimates)
    timeline = _sim_timeline('[{start_iteration: 0, links: ["pp1:1-2"], delay_ms: 30}]', 3, profile)
    assert _beliefs(timeline, profile)[1:] == [{"1-2": pytest.approx(30.0, abs=1e-6)}] * 3


def test_the_kinds_a_profile_s_own_delays_leave_without_a_healthy_link() -> None:
    """Every PP link delayed (one link at 2 stages), or every stage's ring: no floor."""
    two = Profile.uniform(2, 4, 1, 1, 1)
    assert unmeasurable_kinds(two) == ()
    assert unmeasurable_kinds(two.with_delays([30.0])) == ("PP",)
    assert unmeasurable_kinds(Profile.uniform(4, 4, 1, 1, 1).with_delays([30.0, 0.0, 0.0])) == ()
    assert unmeasurable_kinds(Profile.uniform(3, 4, 1, 1, 1).with_delays([5.0, 5.0])) == ("PP",)
    dp = Profile.uniform(2, 4, 1, 1, 1, num_replicas=2)
    rings = {Link.dp(0, 0): 20.0, Link.dp(1, 0): 20.0}
    assert unmeasurable_kinds(dp.with_delays([0.0], rings)) == ("DP",)
    assert unmeasurable_kinds(dp.with_delays([10.0], {Link.dp(0, 0): 20.0})) == ("PP",)
    assert unmeasurable_kinds(Profile.uniform(1, 4, 1, 1, 1)) == ()


def test_a_timeline_that_slows_every_pp_link_from_an_unwarmed_start_is_warned_of() -> None:
    """2 stages, 20 ms on the one PP link from measured iteration 0: after a healthy warm-up
    iteration the detector has a floor and finds it; with no warm-up the delay is in the
    floor from the first iteration, and it finds nothing: the run warns of that (it only
    looked at the profile's delays). One replica's link of two leaves the other's floor."""
    profile = Profile.uniform(2, 4, 5, 5, 5)
    faults = parse_yaml('[{start_iteration: 0, links: ["0-1"], delay_ms: 20}]')
    detected = {}
    for warmup in (0, 1):
        controller = system_controller("adaptra", profile, faults)
        result = run_configuration(
            controller, num_iterations=4, num_warmup_iterations=warmup, faults=faults
        )
        detected[warmup] = [d.detected_ms for d in result.decisions]
    assert detected == {0: [{}] * 4, 1: [{}] + [{"0-1": 20.0}] * 3}
    warning = blind_detector_warning("adaptra", profile, faults, num_warmup_iterations=0)
    assert warning == (
        "warning: adaptra finds slow links by comparing them with healthy ones, and every PP "
        "link here is delayed from the first iteration: it will see none slow (run a warm-up "
        "iteration first, or delay some of the links only)"
    )
    assert blind_detector_warning("adaptra", profile, faults, num_warmup_iterations=1) is None
    assert blind_detector_warning("zb", profile, faults, num_warmup_iterations=0) is None
    replicas = Profile.uniform(2, 4, 5, 5, 5, num_replicas=2)
    one = parse_yaml('[{start_iteration: 0, links: ["pp1:0-1"], delay_ms: 20}]')
    both = parse_yaml('[{start_iteration: 0, links: ["0-1"], delay_ms: 20}]')
    assert blind_detector_warning("adaptra", replicas, one, num_warmup_iterations=0) is None
    assert blind_detector_warning("adaptra", replicas, both, num_warmup_iterations=0)
    rings = parse_yaml('[{start_iteration: 0, links: ["dp0:0-1", "dp1:0-1"], delay_ms: 20}]')
    warning = blind_detector_warning("adaptra-cpu", replicas, rings, num_warmup_iterations=0)
    assert warning is not None and "every DP link here is delayed" in warning


def _loaded(timeline: Timeline, seed: int) -> Timeline:
    """`timeline` as a loaded host stamps it: in each iteration and link direction, up to
    half of the messages (how many drawn per direction) arrive 16-50 ms late (a receiver not
    scheduled; load only ever adds time), enough to move the direction's median past the
    8 ms onset, not its lower quartile."""
    rng = random.Random(seed)
    by_direction: dict[tuple[int, str, str, int], list[int]] = {}
    records = [*timeline.messages, *timeline.dp_messages]
    for index, m in enumerate(records):
        by_direction.setdefault((m.iteration, m.link, m.direction, m.replica), []).append(index)
    late = set()
    for indices in by_direction.values():
        late |= set(rng.sample(indices, rng.randint(0, len(indices) // 2)))
    stamped = [
        m._replace(arrival_ms=m.arrival_ms + rng.uniform(16.0, 50.0)) if i in late else m
        for i, m in enumerate(records)
    ]
    num_pp = len(timeline.messages)
    return dataclasses.replace(
        timeline, messages=tuple(stamped[:num_pp]), dp_messages=tuple(stamped[num_pp:])
    )


def test_a_load_s_late_stamps_are_no_slow_link_but_a_delay_on_every_message_is() -> None:
    """60 healthy iterations whose directions each have up to half of their messages stamped
    16-50 ms late (what busy processes beside the receivers do; CI once saw a healthy
    direction's median reach the onset, when the median was the evidence): no alarm, PP or
    DP, as the lower quartile moves only when most messages are late. A 20 ms delay on link
    1-2 under the same load is found in every iteration it lasts, at 20 ms or more."""
    healthy = _sim_timeline('[{start_iteration: 70, links: ["0-1"], delay_ms: 1}]', 60, DP_PROFILE)
    for seed in range(3):
        assert all(not b for b in _beliefs(_loaded(healthy, seed), DP_PROFILE))
    slow = _sim_timeline(
        '[{start_iteration: 20, end_iteration: 40, links: ["1-2"], delay_ms: 20}]', 60, DP_PROFILE
    )
    beliefs = _beliefs(_loaded(slow, 0), DP_PROFILE)
    assert [k for k, b in enumerate(beliefs) if b] == list(range(21, 41))  # run iterations
    assert all(set(b) == {"1-2"} and b["1-2"] >= 20.0 for b in beliefs[21:41])
