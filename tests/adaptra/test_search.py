"""The policy search: never worse than its starts, within its budget, stopped by the bound."""

from hypothesis import given
from hypothesis import strategies as st

from adaptra.bounds import iteration_lower_bound_ms
from adaptra.generator import Policy
from adaptra.planning import algorithm2
from adaptra.policy_timing import time_policy
from adaptra.search import policy_neighbours, search_policy
from pipeline.profile import Profile
from tests.adaptra.worst_profiles import WORST_PAPER
from tests.strategies import profiles


@given(profiles(max_stages=5), st.integers(1, 30))
def test_never_worse_than_its_start_and_within_budget(profile: Profile, budget: int) -> None:
    start = Policy.uncapped(algorithm2(profile).warmup)
    found = search_policy(profile, [start], x_cap=profile.num_microbatches, max_candidates=budget)
    assert found.iteration_time_ms <= time_policy(profile, start).iteration_time_ms
    assert found.iteration_time_ms == time_policy(profile, found.policy).iteration_time_ms
    assert found.num_candidates <= max(budget, 2)  # the start and its twin are always timed


def test_exact_warmup_twin_and_climb_reach_the_worst_profile_optimum() -> None:
    start = Policy.uncapped((11, 9, 7, 5, 3, 1))  # Algorithm 2's plan: 922 ms
    assert algorithm2(WORST_PAPER).warmup == start.warmup
    assert time_policy(WORST_PAPER, start).warmup_counts == (18, 18, 14, 8, 4, 1)
    found = search_policy(WORST_PAPER, [start], x_cap=18, max_candidates=1000)
    # Exact warm-ups (18, 15, 12, 7, 4, 1) capped at the plan: 1 ms above the optimum.
    assert found.policy == Policy((18, 15, 12, 7, 4, 1), (11, 9, 7, 5, 3, 1))
    assert found.iteration_time_ms == 888.0
    assert not found.at_lower_bound


def test_stops_as_soon_as_the_bound_is_met(fig4_fixture: dict) -> None:
    profile = Profile.from_dict(fig4_fixture["profile"])
    found = search_policy(
        profile,
        [Policy.uncapped((7, 5, 3, 1))],
        x_cap=12,
        max_candidates=1000,
        lower_bound_ms=iteration_lower_bound_ms(profile),
    )
    assert found.at_lower_bound and found.iteration_time_ms == 390.0
    assert found.num_candidates == 1  # the start alone: no twin once the bound is met


def test_neighbours_change_one_knob_within_the_limits() -> None:
    policy = Policy((5, 3, 1), (None, 2, None))
    neighbours = list(policy_neighbours(policy, x_cap=5, num_microbatches=6))
    assert [(n.warmup, n.in_flight_caps) for n in neighbours] == [
        ((4, 3, 1), (None, 2, None)),  # x_i down
        ((5, 2, 1), (None, 2, None)),
        ((4, 2, 1), (None, 2, None)),  # link 1's slackness down: x_0 and x_1
        ((5, 4, 1), (None, 2, None)),  # x_i up (x_0 is at x_cap)
        ((5, 3, 2), (None, 2, None)),
        ((5, 3, 1), (4, 2, None)),  # a cap switched on at x_0 - 1 or x_0
        ((5, 3, 1), (5, 2, None)),
        ((5, 3, 1), (None, 1, None)),  # a cap moved
        ((5, 3, 1), (None, 3, None)),
        ((5, 3, 1), (None, 2, 1)),  # x_2 - 1 = 0 is no cap; x_2 = 1 is one
    ]
    wide = list(policy_neighbours(Policy((5, 3, 1), (5, 2, 1)), x_cap=6, num_microbatches=6))
    assert Policy((5, 3, 1), (None, 2, 1)) in wide  # k_0 = 6 = N: no cap


@given(
    st.lists(st.integers(1, 8), min_size=2, max_size=6),
    st.integers(1, 8),
)
def test_every_neighbour_keeps_each_warmup_in_one_to_the_cap(warmup: list[int], x_cap: int) -> None:
    """A slackness step moves x_0..x_i together: where the warm-ups do not fall stage by
    stage, it took some of them to 0 or past the cap ((1, 2, 1) gave (0, 1, 1))."""
    capped = [min(x, x_cap) for x in warmup]
    for neighbour in policy_neighbours(Policy.uncapped(tuple(capped)), x_cap, num_microbatches=8):
        assert all(1 <= x <= x_cap for x in neighbour.warmup), (capped, neighbour.warmup)
