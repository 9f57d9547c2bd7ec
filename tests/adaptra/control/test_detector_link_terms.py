"""The detector expects of a message only the link-model terms its engine imposes.

`HookLikeSim` (tests/hook_like.py) is the simulator imposing no link model: a hook runtime
on a free host. Its timelines are exact, so these tests assert exact decisions;
test_controller.py runs the same scenarios on the emulated runtime.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from adaptra.control import DetectingController, LinkDetector
from harness.loop import RunResult, run_loop
from harness.policies import system_controller
from harness.runner import link_terms, run_configuration
from injectors.fault_files import parse_yaml
from pipeline.engines.sim import SimEngine
from pipeline.errors import ConfigError
from pipeline.faults import NO_FAULTS, FaultView
from pipeline.link_terms import ALL_LINK_TERMS, NO_LINK_TERMS, LinkTerms
from pipeline.profile import Profile
from tests.hook_like import HookLikeSim

DP_PROFILE = Profile.uniform(
    2, 4, 2, 2, 2, message_bytes=4096, num_delegates=2, num_replicas=2,
    allreduce_bytes=(1_000_000, 100_000), link_bandwidth_gbps=0.1,
)  # fmt: skip
"""PP 2 x DP 2 at 0.1 Gbit/s: stage 0's ring sends chunks of 500 kB (40 ms on the modelled
wire), stage 1's of 50 kB (4 ms); a PP message of 4 KiB takes 0.33 ms."""

DELEGATE_PROFILE = dataclasses.replace(
    Profile.uniform(3, 8, 2, 2, 2, message_bytes=4096, num_delegates=4), delegate_gbps=0.003
)
"""A delegate's own rate of 3 Mbit/s: a delegated 4 KiB message is modelled 10.9 ms."""

REPAIRED = "[{start_iteration: 1, end_iteration: 2, links: ['1-2'], delay_ms: 30}]"
"""30 ms on link 1-2 in measured iteration 1 only."""


def _hook_like_run(
    profile: Profile, faults: FaultView, num_iterations: int
) -> tuple[RunResult, DetectingController]:
    controller = system_controller("adaptra", profile, faults, link_terms=NO_LINK_TERMS)
    assert isinstance(controller, DetectingController)
    with HookLikeSim() as engine:
        result = run_loop(engine, controller, num_iterations=num_iterations, faults=faults)
    return result, controller


def _detected(result: RunResult) -> list[dict[str, float]]:
    return [d.detected_ms for d in result.decisions]


def test_kept_in_drops_the_terms_an_engine_does_not_impose() -> None:
    profile = dataclasses.replace(DELEGATE_PROFILE, link_latency_ms=0.5, dp_bandwidth_gbps=2.0)
    assert ALL_LINK_TERMS.kept_in(profile) == profile
    bare = NO_LINK_TERMS.kept_in(profile)
    assert (bare.wire_ms(), bare.delegated_wire_ms(), bare.dp_wire_ms(1_000_000)) == (0, 0, 0)
    capped = LinkTerms(latency=False, bandwidth=True, delegate_rate=False).kept_in(DP_PROFILE)
    assert capped.dp_wire_ms(500_000) == pytest.approx(40.0)
    assert capped.delegated_wire_ms() == capped.wire_ms() == pytest.approx(0.32768)
    assert str(NO_LINK_TERMS) == "no link-model terms"
    assert str(ALL_LINK_TERMS) == "latency, bandwidth, delegate rate"


def test_a_healthy_ring_of_unequal_chunks_is_no_straggler_where_no_bandwidth_is_imposed() -> None:
    """The hook runtime's healthy DP messages all take the host's time (here none): less the
    modelled 40 ms and 4 ms of their chunks, the ring of big chunks set the DP floor 36 ms
    below the other, which was called slow and swapped every iteration. Expecting only the
    imposed terms, nothing is slow and nothing moves (and each chunk size has its own floor
    now, so the wrong terms no longer call it slow either)."""
    result, controller = _hook_like_run(DP_PROFILE, NO_FAULTS, 4)
    assert _detected(result) == [{}] * 4
    assert controller.swaps.num_swaps == 0 and controller.num_replans == 0
    assert result.timeline is not None
    messages = list(itertools.chain(result.timeline.messages, result.timeline.dp_messages))
    assert LinkDetector(DP_PROFILE, link_terms=NO_LINK_TERMS).observe(1, messages).slow == set()
    # the terms wrongly expected put the rings' medians 36 ms apart, which once called the
    # ring of small chunks slow; their chunks differ in size, so each has its own floor now
    wrong = LinkDetector(DP_PROFILE, link_terms=ALL_LINK_TERMS)
    assert wrong.observe(1, messages).slow == set()
    times = wrong.direction_times(m for m in result.timeline.dp_messages if m.iteration == 1)
    assert times["dp0:0-1", "forward", 0].median_ms == pytest.approx(-40.0)
    assert times["dp1:0-1", "forward", 0].median_ms == pytest.approx(-4.0)


def test_a_slow_ring_link_is_found_at_its_delay_where_no_bandwidth_is_imposed() -> None:
    faults = parse_yaml("[{start_iteration: 1, links: ['dp1:0-1'], delay_ms: 20}]")
    result, _ = _hook_like_run(DP_PROFILE, faults, 3)
    assert _detected(result) == [{}, {}, {"dp1:0-1": 20.0}]


def test_the_delegates_modelled_rate_makes_no_flapping_after_a_repair() -> None:
    """A delegated message modelled 10.9 ms slower than a direct one, on an engine that does
    not impose it: expecting it, the delegated iterations set the PP floor 10.9 ms low, and
    every direct iteration after the repair called both healthy links slow at that (direct,
    delegated, direct, ... each iteration). Now: the slow link while it is slow, then the
    initial plan over direct and nothing slow."""
    result, controller = _hook_like_run(DELEGATE_PROFILE, parse_yaml(REPAIRED), 5)
    assert _detected(result) == [{}, {}, {"1-2": 30.0}, {}, {}]
    assert [d.comm["1-2"] for d in result.decisions] == ["direct"] * 2 + ["delegated"] + [
        "direct"
    ] * 2
    assert controller.num_replans == 2  # the onset and the recovery


@pytest.mark.parametrize(("profile", "link"), [(DP_PROFILE, "0-1"), (DELEGATE_PROFILE, "1-2")])
def test_the_simulator_decides_as_before_on_both_profiles(profile: Profile, link: str) -> None:
    """In the simulator, which imposes every term, the same scenarios: nothing on the healthy
    ring, the slow link found at exactly its delay and its recovery, no flapping."""
    faults = parse_yaml(REPAIRED.replace("1-2", link))
    controller = system_controller("adaptra", profile, faults)  # the simulator's terms
    result = run_configuration(controller, num_iterations=5, faults=faults)
    assert _detected(result) == [{}, {}, {link: 30.0}, {}, {}]
    assert controller.swaps.num_swaps == 0  # type: ignore[attr-defined]


def test_the_harness_builds_each_engine_s_terms_and_refuses_others() -> None:
    """`harness.runner.link_terms` names what each engine declares, and a run refuses a
    detector-driven controller built for other terms (before any worker starts)."""
    from harness.network import TESTBED_LINK_TERMS
    from pipeline.engines.runtime import emulated_engine

    assert link_terms("sim", "hook") == SimEngine.capabilities.link_terms == ALL_LINK_TERMS
    with emulated_engine(2) as emulated:
        assert link_terms("emulated", "hook") == emulated.capabilities.link_terms
    assert link_terms("megatron", "hook") == NO_LINK_TERMS
    assert link_terms("emulated", "network") == TESTBED_LINK_TERMS
    assert LinkTerms(latency=False, bandwidth=True, delegate_rate=False) == TESTBED_LINK_TERMS
    for system in ("adaptra", "adaptra-cpu"):
        controller = system_controller(system, DP_PROFILE)  # the simulator's terms
        with pytest.raises(ConfigError, match="the emulated engine imposes no link-model terms"):
            run_configuration(controller, backend="emulated", num_iterations=1, delegated=True)
