import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adaptra.planning import algorithm1, algorithm2, authors_warmup, max_warmup
from pipeline.errors import ConfigError
from pipeline.profile import Profile
from tests.strategies import profiles


def test_algorithm1_paper_example() -> None:
    profile = Profile.uniform(4, 12, 10, 10, 10, mem_limit=8)
    assert max_warmup(profile) == 8
    plan = algorithm1(profile)
    assert plan.warmup == (8, 5, 3, 1)
    assert plan.slackness == (3, 2, 2)


def test_algorithm1_defaults_to_zb_h2_budget() -> None:
    assert algorithm1(Profile.uniform(4, 12, 10, 10, 10)).warmup == (7, 5, 3, 1)
    assert algorithm1(Profile.uniform(4, 5, 10, 10, 10)).warmup == (5, 3, 2, 1)  # x_max = N


def test_algorithm2_fig5_profiles() -> None:
    for c0, x0 in [(0, 7), (10, 7), (20, 8), (30, 9), (40, 10)]:
        plan = algorithm2(Profile.uniform(4, 12, 10, 10, 10, delay_ms=(float(c0),)))
        assert plan.warmup == (x0, 5, 3, 1)
        assert plan.under_protected == ()


def test_algorithm2_never_exceeds_n_and_reports_what_it_gave_up() -> None:
    # The printed Algorithm 2 asks for x_0 = 43 here (S=8, N=32, Delta_i = 6).
    profile = Profile.uniform(8, 32, 10, 10, 10, delay_ms=(50.0,) * 7)
    plan = algorithm2(profile)
    assert plan.requested_slackness == (6,) * 7
    assert plan.warmup[0] == 32
    assert min(plan.slackness) >= 1
    assert plan.under_protected == tuple(range(7))


def test_algorithm2_with_n_at_most_2s_protects_the_slow_link_first() -> None:
    plan = algorithm2(Profile.uniform(4, 6, 10, 10, 10, delay_ms=(50.0, 0.0, 0.0)))
    assert plan.warmup == (6, 3, 2, 1)
    assert plan.slackness == (3, 1, 1)


def test_algorithm2_asks_the_floor_of_a_link_into_a_stage_with_no_time_and_no_delay() -> None:
    """0/0 asked for 1,000,002: both links of an all-zero profile were under-protected though
    Eq. (1) holds with Delta = 2."""
    plan = algorithm2(Profile.uniform(3, 6, 0, 0, 0))
    assert plan.requested_slackness == (2, 2)
    assert plan.warmup == (5, 3, 1)
    assert plan.under_protected == ()


def test_a_link_into_a_stage_with_no_time_does_not_take_a_slow_link_s_slackness() -> None:
    """The no-delay link into a zero-time last stage asked for 1,000,002 and took the budget:
    x = (9, 8, 1), slackness (1, 7), the 30 ms link 1 of the 4 it asked for."""
    profile = Profile(
        num_stages=3,
        num_microbatches=9,
        t_f_ms=(10, 10, 0),
        t_b_ms=(10, 10, 0),
        t_w_ms=(10, 10, 10),
        delay_ms=(30.0, 0.0),
    )
    plan = algorithm2(profile)
    assert plan.requested_slackness == (4, 2)  # ceil((10 + 10 + 60) / 20)
    assert plan.warmup == (7, 3, 1)
    assert plan.under_protected == ()


def test_a_delayed_link_into_a_stage_with_no_time_gets_what_the_others_leave() -> None:
    """No slackness meets Eq. (1) there: it asks for all x_0's cap leaves it (8 - 1 - 1 = 6)
    and gets it after link 0's request of 3 is met."""
    profile = Profile(
        num_stages=3,
        num_microbatches=8,
        t_f_ms=(10, 10, 0),
        t_b_ms=(10, 10, 0),
        t_w_ms=(10, 10, 10),
        delay_ms=(20.0, 10.0),
    )
    plan = algorithm2(profile)
    assert plan.requested_slackness == (3, 6)
    assert plan.slackness == (3, 4)
    assert plan.warmup == (8, 5, 1)
    assert plan.under_protected == (1,)


@pytest.mark.parametrize("x_cap", [0, -3])
def test_algorithm2_refuses_a_cap_below_one(x_cap: int) -> None:
    # It returned warm-ups (0, -1, 0, 1) for x_cap 0.
    profile = Profile.uniform(4, 12, 10, 10, 10, delay_ms=(30.0,))
    with pytest.raises(ConfigError, match=f"x_cap must be >= 1 .*, got {x_cap}$"):
        algorithm2(profile, x_cap=x_cap)


@pytest.mark.parametrize(
    ("x_cap", "warmup"), [(1, (1, 1, 1, 1)), (2, (2, 1, 1, 1)), (5, (5, 3, 2, 1))]
)
def test_algorithm2_within_a_small_cap(x_cap: int, warmup: tuple[int, ...]) -> None:
    plan = algorithm2(Profile.uniform(4, 12, 10, 10, 10, delay_ms=(30.0,)), x_cap=x_cap)
    assert plan.warmup == warmup
    assert plan.under_protected == (0, 1, 2)


@given(profiles(max_stages=8), st.one_of(st.none(), st.integers(1, 40)))
def test_algorithm2_is_always_feasible(profile: Profile, mem_limit) -> None:
    limited = Profile.from_dict({**profile.to_dict(), "mem_limit": mem_limit})
    plan = algorithm2(limited)
    cap = (
        profile.num_microbatches if mem_limit is None else min(profile.num_microbatches, mem_limit)
    )
    assert len(plan.warmup) == profile.num_stages
    assert plan.warmup[-1] == 1
    assert plan.warmup[0] <= max(cap, 1)
    assert all(x <= profile.num_microbatches for x in plan.warmup)
    if cap >= profile.num_stages:
        assert all(delta >= 1 for delta in plan.slackness)
    for link, (given_delta, asked) in enumerate(
        zip(plan.slackness, plan.requested_slackness, strict=True)
    ):
        assert (link in plan.under_protected) == (given_delta < asked)


def test_authors_rule() -> None:
    profile = Profile.uniform(4, 12, 10, 10, 10, delay_ms=(25.0,))
    assert authors_warmup(profile) == (1 + 2 + 2 + math.ceil(25 / 10) + 2, 5, 3, 1)
