"""The detector's floor is kept per kind of link, path and message size: on a host whose
costs differ by a message's size (a DP ring's lag grows with its chunk) or by its path (a
delegate's transfer costs less than the direct path's send and receive), healthy links are
no stragglers and slow ones are found at their delay. Simulated runs: exact times."""

from __future__ import annotations

import dataclasses
import functools
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptra.control import DetectingController, LinkDetector, unmeasurable_kinds
from harness.policies import blind_detector_warning, system_controller
from harness.runner import run_configuration
from injectors.fault_files import parse_yaml
from pipeline.host_costs import CostCurve, HostCosts, RingLag
from pipeline.link_terms import ALL_LINK_TERMS
from pipeline.profile import Profile
from pipeline.timeline import MessageRecord, Timeline
from pipeline.topology import Link

MB = 1_000_000
MiB = 1 << 20

RING_HOST = HostCosts(ring_lag_ms_by_rings=RingLag(((1, CostCurve(((MB, 0.8), (40 * MB, 32.0)))),)))
"""A DP ring's chunk lags 0.8 ms per MB (BENCHMARKS.md's measured 40 MB chunks)."""

UNEQUAL_RINGS = Profile.uniform(
    4, 8, 10, 10, 10, message_bytes=1 << 16, num_delegates=3, num_replicas=2,
    allreduce_bytes=(160 * MB, 2 * MB, 2 * MB, 2 * MB), dp_bucket_bytes=80 * MB,
    dp_bandwidth_gbps=400.0,
)  # fmt: skip
"""PP 4 x DP 2: stage 0's ring sends chunks of 40 MB (31.2 ms more lag on RING_HOST than
the others' chunks of 1 MB)."""


def test_a_healthy_ring_of_big_chunks_is_no_straggler_where_the_ring_lag_grows_with_them() -> None:
    """With one DP floor for every chunk size, the rings of 1 MB chunks set it, and stage
    0's healthy ring was 31.2 ms above it in every iteration: called slow and swapped onto a
    PP edge with no fault anywhere. Compared with its own size's floor, it is healthy."""
    for system in ("adaptra", "adaptra-cpu"):
        controller = system_controller(system, UNEQUAL_RINGS)
        result = run_configuration(controller, num_iterations=6, host=RING_HOST)
        assert [d.detected_ms for d in result.decisions] == [{}] * 6, system
        assert controller.swaps.num_swaps == 0  # type: ignore[attr-defined]


@functools.cache
def _unequal_rings_timeline() -> Timeline:
    """1F1B over direct on RING_HOST, 20 ms on the big-chunk ring's link dp0:0-1 in measured
    iterations 2-3 and 15 ms on PP link 1-2 in 3-4 (a warm-up iteration first)."""
    faults = parse_yaml(
        '[{start_iteration: 2, end_iteration: 4, links: ["dp0:0-1"], delay_ms: 20},'
        ' {start_iteration: 3, end_iteration: 5, links: ["1-2"], delay_ms: 15}]'
    )
    controller = system_controller("1f1b", UNEQUAL_RINGS, faults)
    result = run_configuration(controller, num_iterations=6, faults=faults, host=RING_HOST)
    assert result.timeline is not None
    return result.timeline


def _beliefs(timeline: Timeline) -> list[dict[str, float]]:
    detector = LinkDetector(UNEQUAL_RINGS, link_terms=ALL_LINK_TERMS)
    by_iteration: dict[int, list[MessageRecord]] = {}
    for m in itertools.chain(timeline.messages, timeline.dp_messages):
        by_iteration.setdefault(m.iteration, []).append(m)
    return [detector.observe(k, by_iteration[k]).detected_ms for k in sorted(by_iteration)]


def test_a_slow_link_of_a_ring_of_big_chunks_is_found_at_its_delay() -> None:
    """No other ring's chunks are as large, so its floor is its own healthy iterations':
    20 ms on dp0:0-1 is found at 20 ms, beside 15 ms on PP link 1-2 (run iterations: the
    warm-up first)."""
    assert _beliefs(_unequal_rings_timeline()) == [
        {}, {}, {}, {"dp0:0-1": 20.0}, {"dp0:0-1": 20.0, "1-2": 15.0}, {"1-2": 15.0}, {},
    ]  # fmt: skip


def _with_host_costs(timeline: Timeline, extra_ms: dict[tuple[bool, int], float]) -> Timeline:
    """`timeline` with each message stamped later by its class's extra host cost
    (`extra_ms[a DP message, its size]`, 0 where not given)."""

    def later(m: MessageRecord, dp: bool) -> MessageRecord:
        return m._replace(arrival_ms=m.arrival_ms + extra_ms.get((dp, m.num_bytes), 0.0))

    return Timeline(
        num_stages=timeline.num_stages,
        ops=timeline.ops,
        messages=tuple(later(m, False) for m in timeline.messages),
        iterations=timeline.iterations,
        failovers=timeline.failovers,
        dp_messages=tuple(later(m, True) for m in timeline.dp_messages),
    )


@settings(max_examples=40, deadline=None)
@given(
    pp_ms=st.floats(0, 50),
    big_chunk_ms=st.floats(0, 50),
    small_chunk_ms=st.floats(0, 50),
)
def test_a_host_cost_per_kind_and_size_changes_no_belief(
    pp_ms: float, big_chunk_ms: float, small_chunk_ms: float
) -> None:
    """What a host adds to every message of one kind and size, from the first iteration on,
    is in that class's floor: the beliefs are the same whatever it is (one floor for all DP
    chunks called the ring whose chunks cost more slow)."""
    timeline = _unequal_rings_timeline()
    costs = {(False, 1 << 16): pp_ms, (True, 40 * MB): big_chunk_ms, (True, MB): small_chunk_ms}
    beliefs = _beliefs(_with_host_costs(timeline, costs))
    expected = _beliefs(timeline)
    assert [set(b) for b in beliefs] == [set(b) for b in expected]
    assert beliefs == [pytest.approx(b, abs=1e-6) for b in expected]


DIRECT_COSTS_TWICE = HostCosts(
    send_ms_by_bytes=CostCurve(((MiB, 0.25), (64 * MiB, 16.0))),
    receive_lag_ms_by_bytes=CostCurve(((MiB, 0.25), (64 * MiB, 16.0))),
    delegate_transfer_ms_by_bytes=CostCurve(((MiB, 0.25), (64 * MiB, 16.0))),
)
"""The direct path's send and receive lag each cost what a delegate's transfer does
(BENCHMARKS.md: together 1.7-2.2x it at 1-8 MiB), 0.25 ms per MiB."""

REPAIRED = '[{start_iteration: 3, end_iteration: 6, links: ["LINK"], delay_ms: 30}]'
"""30 ms on a PP link in measured iterations 3-5, then repaired."""


def _adaptra_run(profile: Profile, link: str) -> tuple[list[dict[str, float]], list[str], int]:
    faults = parse_yaml(REPAIRED.replace("LINK", link))
    controller = system_controller("adaptra", profile, faults)
    assert isinstance(controller, DetectingController)
    result = run_configuration(
        controller, num_iterations=12, faults=faults, host=DIRECT_COSTS_TWICE
    )
    detected = [d.detected_ms for d in result.decisions]
    return detected, [d.comm[link] for d in result.decisions], controller.num_replans


def test_the_direct_and_the_delegated_path_each_have_their_floor() -> None:
    """32 MiB messages cost the host 8 ms less over a delegate. With one PP floor, the
    delegated iterations set it 8 ms low, and after the repair every direct iteration called
    all three links slow at 8 ms: direct, delegated, direct, ... each iteration. With a
    floor per path: the slow link at 30 ms while it is slow (its delegated iterations
    measured against the two healthy links' delegated messages), then direct and nothing
    slow."""
    profile = Profile.uniform(4, 8, 20, 20, 20, message_bytes=32 * MiB, num_delegates=3)
    detected, comm, num_replans = _adaptra_run(profile, "1-2")
    assert detected == [{}] * 4 + [{"1-2": 30.0}] * 3 + [{}] * 5
    assert comm == ["direct"] * 4 + ["delegated"] * 3 + ["direct"] * 5
    assert num_replans == 2  # the onset and the recovery


def test_a_two_stage_pipeline_s_slow_link_is_measured_against_the_direct_floor() -> None:
    """2 stages: over delegates the one PP link is slow, so no healthy delegated message
    sets that path's floor; the direct path's stands in (the 8 ms the delegate saves the
    host is then in the estimate) and the link stays slow until it is repaired, with no
    flapping."""
    profile = Profile.uniform(2, 8, 20, 20, 20, message_bytes=32 * MiB, num_delegates=3)
    detected, comm, num_replans = _adaptra_run(profile, "0-1")
    assert detected == [{}] * 4 + [{"0-1": 30.0}] + [{"0-1": 22.0}] * 2 + [{}] * 5
    assert comm == ["direct"] * 4 + ["delegated"] * 3 + ["direct"] * 5
    assert num_replans == 3  # the onset, its first delegated estimate, the recovery


def test_a_ring_alone_in_its_chunk_size_and_slow_from_the_start_is_warned_of() -> None:
    """No other stage's ring sends 40 MB chunks: delayed from the first iteration (no
    warm-up), dp0:0-1 is in its own floor and seen by none, and the run warns; the same
    delay on a ring of 1 MB chunks is found against the other two."""
    detected, warnings = {}, {}
    for link in ("dp0:0-1", "dp1:0-1"):
        faults = parse_yaml(f'[{{start_iteration: 0, links: ["{link}"], delay_ms: 20}}]')
        controller = system_controller("adaptra-cpu", UNEQUAL_RINGS, faults)
        result = run_configuration(
            controller, num_iterations=3, num_warmup_iterations=0, faults=faults, host=RING_HOST
        )
        detected[link] = [d.detected_ms for d in result.decisions]
        warnings[link] = blind_detector_warning(
            "adaptra-cpu", UNEQUAL_RINGS, faults, num_warmup_iterations=0
        )
    assert detected == {"dp0:0-1": [{}] * 3, "dp1:0-1": [{}] + [{"dp1:0-1": 20.0}] * 2}
    assert warnings == {
        "dp0:0-1": "warning: adaptra-cpu finds slow links by comparing them with healthy ones, "
        "and every DP link with chunks of one size here is delayed from the first iteration: "
        "it will see none of them slow (run a warm-up iteration first, or delay some of the "
        "links only)",
        "dp1:0-1": None,
    }
    alone = UNEQUAL_RINGS.with_delays([0.0] * 3, {Link.dp(0, 0): 20.0})
    assert unmeasurable_kinds(alone) == ("DP",)
    assert unmeasurable_kinds(UNEQUAL_RINGS.with_delays([0.0] * 3, {Link.dp(1, 0): 20.0})) == ()


def test_a_pp_link_that_turns_slow_in_the_first_delegated_iteration_is_found() -> None:
    """3 stages: 30 ms on 0-1 from measured iteration 2 (Adaptra delegates from 3), 20 ms on
    1-2 from 3, its first delegated iteration. 1-2 was the only link over delegates not
    believed slow, so it set that path's floor with its own 20 ms and was never seen, and
    0-1 was estimated 10 ms above it: 0-1 at 10 ms, 1-2 healthy to the end. Judged first
    against the direct path's floor, it is slow and sets none."""
    profile = Profile.uniform(3, 8, 10, 10, 10, message_bytes=1 << 16, num_delegates=3)
    faults = parse_yaml(
        '[{start_iteration: 2, links: ["0-1"], delay_ms: 30},'
        ' {start_iteration: 3, links: ["1-2"], delay_ms: 20}]'
    )
    result = run_configuration(
        system_controller("adaptra", profile, faults), num_iterations=8, faults=faults
    )
    assert [d.detected_ms for d in result.decisions] == (
        [{}] * 3 + [{"0-1": 30.0}] + [{"0-1": 30.0, "1-2": 20.0}] * 4
    )
    assert [d.comm["1-2"] for d in result.decisions] == ["direct"] * 3 + ["delegated"] * 5
    assert result.iteration_times_ms[3:] == (360.0,) + (310.0,) * 4  # (for 0-1 at 10 ms: 360)


def test_healthy_rings_are_no_stragglers_where_their_chunks_cost_more_over_delegates() -> None:
    """Rings of 40 MB chunks on stages 0-1 lag 0.8 ms per MB, 1.6 with the PP messages over
    delegates (the calibrated ring's step was 1.1-2.5x at 8-40 MB chunks: BENCHMARKS.md);
    30 ms on PP link 1-2 in measured iterations 3-6. Their first delegated iteration is
    looked at against the least of their class now: against the direct path's floor, as a
    PP class's is, they were 32 ms slow, two healthy ring links called slow and one
    swapped."""
    host = HostCosts(
        ring_lag_ms_by_rings=RingLag(((1, CostCurve(((MB, 0.8), (40 * MB, 32.0)))),)),
        delegated_ring_lag_ms_by_rings=RingLag(((1, CostCurve(((MB, 1.6), (40 * MB, 64.0)))),)),
    )
    profile = dataclasses.replace(UNEQUAL_RINGS, allreduce_bytes=(160 * MB,) * 2 + (2 * MB,) * 2)
    faults = parse_yaml('[{start_iteration: 3, end_iteration: 7, links: ["1-2"], delay_ms: 30}]')
    controller = system_controller("adaptra", profile, faults)
    result = run_configuration(controller, num_iterations=10, faults=faults, host=host)
    assert [d.detected_ms for d in result.decisions] == ([{}] * 4 + [{"1-2": 30.0}] * 4 + [{}] * 2)
    assert controller.swaps.num_swaps == 0  # type: ignore[attr-defined]


def test_rings_whose_chunks_differ_by_0_6_percent_share_a_floor() -> None:
    """Megatron tiny's gradients at 2 stages x DP 2 give chunks of 318,336 and 316,544 B. By
    exact size each ring was alone in its class: 20 ms on dp0:0-1 from the first iteration
    (no warm-up) set its own floor, was never seen, and the run warned of it. Sizes within
    5 % are one class (pipeline.message_sizes, as Falcon's groups): it is found against the
    other ring and swapped (Adaptra then finds the pair's PP link)."""
    profile = Profile.uniform(
        2, 4, 1, 1, 1, num_replicas=2, allreduce_bytes=(636_672, 633_088), message_bytes=8192,
        num_delegates=2,
    )  # fmt: skip
    faults = parse_yaml('[{start_iteration: 0, links: ["dp0:0-1"], delay_ms: 20}]')
    detected = {}
    for system in ("adaptra-cpu", "adaptra"):
        controller = system_controller(system, profile, faults)
        result = run_configuration(
            controller, num_iterations=5, num_warmup_iterations=0, faults=faults
        )
        detected[system] = [d.detected_ms for d in result.decisions]
        assert controller.swaps.num_swaps == 1  # type: ignore[attr-defined]
        assert blind_detector_warning(system, profile, faults, num_warmup_iterations=0) is None
    slow = {"dp0:0-1": 20.0}
    assert detected == {
        "adaptra-cpu": [{}, slow, slow, slow, {}],  # it reads the DP ring's messages only
        "adaptra": [{}, slow, slow, slow, {"0-1": 20.0}],
    }
    assert unmeasurable_kinds(profile.with_delays([0.0], {Link.dp(0, 0): 20.0})) == ()


CONCURRENT_RINGS_HOST = HostCosts(
    ring_lag_ms_by_rings=RingLag(
        ((1, CostCurve(((0, 0.0), (8 * MB, 1.0)))), (4, CostCurve(((0, 0.0), (8 * MB, 12.0)))))
    ),
    delegated_ring_lag_ms_by_rings=RingLag(
        ((1, CostCurve(((0, 0.0), (8 * MB, 1.0)))), (4, CostCurve(((0, 0.0), (8 * MB, 12.0)))))
    ),
    send_ms_by_bytes=CostCurve.line(0.2),
    receive_lag_ms_by_bytes=CostCurve.line(0.2),
)
"""An 8 MB ring chunk lags 1 ms with one stage's ring running, 12 ms with all four at once
(BENCHMARKS.md: "The ring's lag grows with the rings at once")."""

FOUR_RINGS = Profile.uniform(
    4, 8, 2, 2, 2, message_bytes=4096, num_delegates=3, num_replicas=2,
    allreduce_bytes=(32 * MB,) * 4, dp_bucket_bytes=16 * MB, dp_bandwidth_gbps=100,
)  # fmt: skip
"""PP 4 x DP 2, every stage's ring of 8 MB chunks: one size class."""


@pytest.mark.parametrize(
    ("faults_yaml", "expected", "num_swaps"),
    [
        ('[{start_iteration: 3, end_iteration: 8, links: ["1-2"], delay_ms: 30}]', [{}] * 6, 0),
        (
            '[{start_iteration: 3, end_iteration: 8, links: ["1-2"], delay_ms: 30},'
            ' {start_iteration: 11, links: ["dp2:0-1"], delay_ms: 10}]',
            [{}, {}, {"dp2:0-1": 10.0}, {"dp2:0-1": 10.0}, {"dp2:0-1": 10.0}, {"2-3": 10.0}],
            1,
        ),
    ],
)
def test_rings_back_at_once_after_a_pp_fault_are_no_stragglers(
    faults_yaml: str, expected: list[dict[str, float]], num_swaps: int
) -> None:
    """30 ms on PP link 1-2 skews the pipeline in its first (direct) iteration: the stages'
    rings run apart, lag less, and set the DP floor 7.3 ms under any ring's median with the
    four at once. Once the fault had gone, healthy dp1:0-1 and dp3:0-1 were 11 ms slow in
    every iteration and swapped onto a PP edge (and a later 10 ms on dp2:0-1 was estimated
    among them, dp0:0-1 at 9.2 ms beside it). With no ring of the class healthy against the
    floor, it rises to the least ring's now: none slow, no swap; the later fault is found at
    its delay and swapped."""
    faults = parse_yaml(faults_yaml)
    controller = system_controller("adaptra", FOUR_RINGS, faults)
    run = run_configuration(
        controller, num_iterations=16, faults=faults, delegated=True, host=CONCURRENT_RINGS_HOST
    )
    assert [d.detected_ms for d in run.decisions[4:10]] == [{"1-2": 30.0}] * 5 + [{}]
    assert [d.detected_ms for d in run.decisions[10:16]] == expected
    assert isinstance(controller, DetectingController)
    assert controller.swaps.num_swaps == num_swaps
