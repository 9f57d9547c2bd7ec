"""The cheap lower bound: never above the proven optimum, and tight where stage 0 is busy."""

from hypothesis import given, settings

from adaptra.bounds import iteration_lower_bound_ms
from adaptra.exact import solve_exact
from pipeline.profile import Profile
from tests.adaptra.worst_profiles import WORST_PAPER
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


@settings(max_examples=25)
@given(profiles(max_stages=3, with_delays=True))
def test_bound_never_exceeds_the_proven_optimum(profile: Profile) -> None:
    exact = solve_exact(profile, time_limit_s=5)
    assert iteration_lower_bound_ms(profile) <= exact.iteration_time_ms + 1e-9
    if exact.optimal and exact.exact_in_ms:
        assert iteration_lower_bound_ms(profile) <= exact.lower_bound_ms + 1e-9
