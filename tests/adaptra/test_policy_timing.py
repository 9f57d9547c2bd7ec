"""The fast policy engine against the general generator and the simulator."""

import math

from hypothesis import given
from hypothesis import strategies as st

from adaptra.generator import Policy, generate_policy
from adaptra.policy_timing import schedule_policy, time_policy
from pipeline.errors import ScheduleError
from pipeline.profile import Profile
from pipeline.simulator import simulate
from tests.strategies import profiles


@st.composite
def policies(draw: st.DrawFn, profile: Profile) -> Policy:
    n = profile.num_microbatches
    x_max = n if profile.mem_limit is None else min(n, math.floor(profile.mem_limit))
    warmup = draw(
        st.lists(st.integers(1, x_max), min_size=profile.num_stages, max_size=profile.num_stages)
    )
    caps = draw(
        st.lists(
            st.one_of(st.none(), st.integers(0, n)),
            min_size=profile.num_stages,
            max_size=profile.num_stages,
        )
    )
    return Policy(tuple(warmup), tuple(caps))


@given(profiles(max_stages=5), st.data())
def test_agrees_with_the_generator_and_the_simulator(profile: Profile, data) -> None:
    limit = data.draw(st.one_of(st.none(), st.integers(1, 2 * profile.num_stages)))
    profile = Profile.from_dict({**profile.to_dict(), "mem_limit": limit})
    policy = data.draw(policies(profile))
    timing = time_policy(profile, policy)
    try:
        expected = generate_policy(profile, policy)
    except ScheduleError:
        assert timing.iteration_time_ms == math.inf
        return
    assert schedule_policy(profile, policy) == expected
    assert timing.warmup_counts == expected.warmup_counts()
    simulated = simulate(expected, profile).iterations[0].end_ms
    assert timing.iteration_time_ms == simulated


def test_fig4_policy_times_and_counts(fig4_fixture: dict) -> None:
    profile = Profile.from_dict(fig4_fixture["profile"])
    timing = time_policy(profile, Policy.uncapped((7, 5, 3, 1)))
    assert timing.iteration_time_ms == 390.0
    assert timing.warmup_counts == (7, 5, 3, 1)


def test_a_stalling_policy_is_infinite_and_refused() -> None:
    profile = Profile.uniform(2, 4, 10, 10, 10)
    stalled = Policy((1, 1), (0, None))  # stage 0 may never run a second forward
    assert time_policy(profile, stalled).iteration_time_ms == math.inf
    try:
        schedule_policy(profile, stalled)
    except ScheduleError as err:
        assert "generation stalled" in str(err)
    else:
        raise AssertionError("a stalled policy built a schedule")
