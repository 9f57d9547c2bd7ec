"""The cheap lower bound: never above the proven optimum or any policy's time, and tight where
forwards reach a stage at an upstream stage's pace."""

from hypothesis import given, settings

from adaptra.bounds import iteration_lower_bound_ms, release_times_ms
from adaptra.exact import solve_exact
from adaptra.generator import Policy
from adaptra.policy_timing import time_policy
from adaptra.scheduler import plan_adaptra
from pipeline.profile import Profile
from pipeline.simulator import CommMode, simulate
from tests.adaptra.worst_profiles import LATE_LAST_STAGE, WORST_PAPER
from tests.strategies import profiles


def test_fig4_bound_is_the_zero_bubble_time() -> None:
    # Stage 3 starts at 30 ms and has 12 x 30 ms of work; so does stage 0 with B0 back at 70.
    assert iteration_lower_bound_ms(Profile.uniform(4, 12, 10, 10, 10)) == 390.0
    # 40 ms on link 0: stage 3 starts at 70 ms (Fig. 5's optimum, 430 ms; stage 0 gets B0
    # back at 150 ms and needs 12 x 20 ms more: 390 ms).
    delayed = Profile.uniform(4, 12, 10, 10, 10, delay_ms=(40.0,))
    assert iteration_lower_bound_ms(delayed) == 430.0


def test_bound_is_tight_on_the_worst_benchmark_profile() -> None:
    # B0 reaches stage 0 at 221 ms (109 forward, 112 back), then 18 x (17 + 20) ms.
    assert iteration_lower_bound_ms(WORST_PAPER) == 887.0


def test_forwards_reach_a_stage_at_the_slowest_upstream_rate() -> None:
    # Stage 6 gets its first gradient back at 230 ms (50 ms each way on link 6-7). Stage 1's
    # 20 ms forwards pace every stage after it, so stage 6 has had 7 of its 24 forwards by
    # then, not the 14 its own 10 ms forwards would allow: 230 + 24 x (20 + 19) + 17 x 10.
    forward, backward, _ = release_times_ms(LATE_LAST_STAGE)[6]
    assert backward[0] == 230.0
    assert sum(release < 230.0 for release in forward) == 7
    assert iteration_lower_bound_ms(LATE_LAST_STAGE) == 1336.0
    # A schedule meets it, so it is the optimum, and the default call stops at its first
    # candidate.
    found = plan_adaptra(LATE_LAST_STAGE, exact_time_limit_s=0)
    assert found.num_candidates == 1
    timed = simulate(found.schedule, LATE_LAST_STAGE, CommMode.IDEAL).iterations[0].end_ms
    assert timed == 1336.0


@settings(max_examples=60)
@given(profiles(max_stages=5, with_delays=True))
def test_bound_never_exceeds_a_policy_time(profile: Profile) -> None:
    bound_ms = iteration_lower_bound_ms(profile)
    for warmup in (1, profile.num_stages, profile.num_microbatches):
        policy = Policy.uncapped(
            tuple(min(warmup, profile.num_microbatches) for _ in range(profile.num_stages))
        )
        assert bound_ms <= time_policy(profile, policy).iteration_time_ms + 1e-9


@settings(max_examples=25)
@given(profiles(max_stages=3, with_delays=True))
def test_bound_never_exceeds_the_proven_optimum(profile: Profile) -> None:
    exact = solve_exact(profile, time_limit_s=5)
    assert iteration_lower_bound_ms(profile) <= exact.iteration_time_ms + 1e-9
    if exact.optimal and exact.exact_in_ms:
        assert iteration_lower_bound_ms(profile) <= exact.lower_bound_ms + 1e-9
