import pytest
from hypothesis import given
from hypothesis import strategies as st

from adaptra.generator import Policy, generate_policy, generate_schedule
from adaptra.planning import algorithm1
from adaptra.policy_timing import time_policy
from pipeline.errors import ConfigError, ScheduleError
from pipeline.generator import generate
from pipeline.ops import OpKind
from pipeline.profile import Profile
from pipeline.schedule import Schedule, peak_memory, validate_schedule
from pipeline.simulator import simulate
from pipeline.zb_auto import zb_order
from tests.strategies import profiles


def test_reproduces_the_fig4_fixture_op_for_op(fig4_fixture: dict) -> None:
    profile = Profile.from_dict(fig4_fixture["profile"])
    assert generate_schedule(profile, [7, 5, 3, 1]) == Schedule.from_dict(fig4_fixture)


def test_uncapped_forwards_pile_up_behind_a_slow_link() -> None:
    # The paper (docs/paper.md): x = [1,1,1,1], 40 ms on link 0: 12 leading forwards on stage 0.
    profile = Profile.uniform(4, 12, 10, 10, 10, delay_ms=(40.0,))
    assert generate_schedule(profile, [1, 1, 1, 1]).warmup_counts()[0] == 12
    capped = generate_schedule(profile, [1, 1, 1, 1], cap_in_flight=True)
    assert capped.warmup_counts() == (1, 1, 1, 1)
    # #F - #B < 1 admits F, B, F: the W still pending holds half a microbatch.
    assert max(peak_memory(ops) for ops in capped.stages) == 1.5


def test_a_cap_below_the_warmup_makes_the_warmup_exact() -> None:
    # 40 ms on link 0: B>F>W alone runs all 12 forwards on stage 0 before B0 returns.
    profile = Profile.uniform(4, 12, 10, 10, 10, delay_ms=(40.0,))
    assert generate_policy(profile, Policy.uncapped((7, 5, 3, 1))).warmup_counts()[0] == 12
    exact = generate_policy(profile, Policy((7, 5, 3, 1), (4, None, None, None)))
    assert exact.warmup_counts() == (7, 5, 3, 1)
    stage0 = [str(op) for op in exact.stages[0]]
    # After 7 forwards, #F - #B < 4 first holds after B3: W's fill the wait.
    assert stage0[:16] == [
        *(f"F{m}" for m in range(7)),
        "B0",
        "W0",
        "B1",
        "W1",
        "B2",
        "W2",
        "B3",
        "F7",
        "B4",
    ]


@given(profiles(max_stages=5), st.data())
def test_generated_schedules_are_valid_and_within_memory(profile: Profile, data) -> None:
    limit = data.draw(st.one_of(st.none(), st.integers(1, 2 * profile.num_stages)))
    limited = Profile.from_dict({**profile.to_dict(), "mem_limit": limit})
    warmup = algorithm1(limited).warmup
    cap = data.draw(st.booleans())
    schedule = generate_schedule(limited, warmup, cap_in_flight=cap)
    validate_schedule(schedule, profile.num_stages, profile.num_microbatches)
    if limit is not None:
        assert all(peak_memory(ops) <= limit for ops in schedule.stages)
    if cap:
        assert all(a >= b for a, b in zip(warmup, schedule.warmup_counts(), strict=True))


def test_a_chooser_that_never_chooses_is_reported() -> None:
    profile = Profile.uniform(2, 2, 1, 1, 1)
    with pytest.raises(ScheduleError, match="generation stalled: .*stage 0 after 0 ops"):
        generate(profile, [lambda state: None, lambda state: None])
    with pytest.raises(ScheduleError, match="stage 0: chooser picked B but none is ready"):
        generate(profile, [lambda state: OpKind.B, lambda state: None])


@pytest.mark.parametrize(
    ("mem_limit", "warmup", "message"),
    [
        (None, (5, 1), r"stage 0's warm-up count is 5: above the 4 microbatches \(x_i <= N\)$"),
        (2.5, (1, 3), r"stage 1's warm-up count is 3: above the memory limit of 2\.5 .*= 2\)$"),
        (None, (0, 1), r"stage 0's warm-up count is 0: every stage starts with a forward"),
    ],
)
def test_a_warmup_count_no_stage_can_reach_is_refused_alike_by_both_engines(
    mem_limit: float | None, warmup: tuple[int, ...], message: str
) -> None:
    """Above N or floor(mem_limit) the chooser waits for forwards that never come: the
    generator said only "generation stalled ... at stage 0 after 4 ops"."""
    profile = Profile.uniform(2, 4, 10, 10, 10, mem_limit=mem_limit)
    with pytest.raises(ConfigError, match=message):
        generate_schedule(profile, warmup)
    with pytest.raises(ConfigError, match=message):  # the fast engine alike
        time_policy(profile, Policy.uncapped(warmup))
    with pytest.raises(ConfigError, match="the policy has 1 caps for the profile's 2 stages"):
        time_policy(profile, Policy((1, 1), (None,)))


def _in_tenths(profile: Profile) -> Profile:
    """`profile`'s op times and delays, read as tenths of a ms (its wire free)."""
    data = profile.to_dict()
    for key in ("t_f", "t_b", "t_w", "delay_ms"):
        data[key] = [ms / 10 for ms in data[key]]
    return Profile.from_dict({**data, "message_bytes": 0, "link_latency_ms": 0.0,
                              "link_bandwidth_gbps": None})  # fmt: skip


def test_events_at_one_instant_are_at_one_instant_in_floating_point() -> None:
    """Stage 1's B0 ends at 0.9 + 0.3 + 0.6 ms and F1 arrives at 0.9 + 0.9 ms: one instant, 2e-16
    apart in floating point. The arrival counts first, as at 9 + 3 + 6 and 9 + 9 ms: stage 1
    runs F1 (ZB's F after a B) before W0, and the iteration takes 3.8 ms, not 4.1."""
    in_ms = Profile.from_dict({"stages": 2, "microbatches": 2, "t_f": [9, 3], "t_b": [8, 6],
                               "t_w": [2, 4]})  # fmt: skip
    in_tenths = _in_tenths(in_ms)
    assert zb_order(in_tenths) == zb_order(in_ms)
    stage_1 = Schedule.from_text([["F0", "B0", "F1", "B1", "W0", "W1"]]).stages[0]
    assert zb_order(in_tenths).stages[1] == stage_1
    assert simulate(zb_order(in_tenths), in_tenths).iterations[0].end_ms == pytest.approx(3.8)


@given(profiles(max_stages=5), st.data())
def test_a_profile_in_tenths_of_a_ms_gets_the_order_it_gets_in_ms(profile: Profile, data) -> None:
    """Integer times and delays have exact ties; the same in tenths (not binary fractions) has
    them only up to rounding: both generators order them alike."""
    in_ms = Profile.from_dict({**profile.to_dict(), "message_bytes": 0, "link_latency_ms": 0.0,
                               "link_bandwidth_gbps": None})  # fmt: skip
    in_tenths = _in_tenths(in_ms)
    num_stages = profile.num_stages
    counts = st.integers(1, profile.num_microbatches)
    warmup = data.draw(st.lists(counts, min_size=num_stages, max_size=num_stages))
    policy = Policy.uncapped(tuple(warmup))
    assert generate_policy(in_tenths, policy) == generate_policy(in_ms, policy)
    assert time_policy(in_tenths, policy).op_kinds == time_policy(in_ms, policy).op_kinds
    assert zb_order(in_tenths) == zb_order(in_ms)


@given(profiles(max_stages=5), st.data())
def test_a_policy_lemma1_allows_never_stalls_and_keeps_its_limits(profile: Profile, data) -> None:
    """Any warm-up counts that never grow along the pipeline (Lemma 1), with any in-flight
    caps, as the search tries them (not only Algorithm 1's): every op runs once, no stage
    passes the memory limit, each runs at least its x_i forwards first, and after the warm-up
    it starts a forward only below its cap."""
    limit = data.draw(st.one_of(st.none(), st.integers(1, 2 * profile.num_stages)))
    limited = Profile.from_dict({**profile.to_dict(), "mem_limit": limit})
    n = profile.num_microbatches
    x_max = n if limit is None else min(n, limit)
    size = profile.num_stages
    counts = st.lists(st.integers(1, x_max), min_size=size, max_size=size)
    warmup = tuple(sorted(data.draw(counts), reverse=True))
    caps = tuple(data.draw(st.one_of(st.none(), st.integers(1, n))) for _ in warmup)
    schedule = generate_policy(limited, Policy(warmup, caps))
    validate_schedule(schedule, profile.num_stages, n)
    for ops, x, cap, leading in zip(
        schedule.stages, warmup, caps, schedule.warmup_counts(), strict=True
    ):
        assert leading >= x
        if limit is not None:
            assert peak_memory(ops) <= limit
        num_f = num_b = 0
        for op in ops:
            if op.kind is OpKind.F and num_f >= x and cap is not None:
                assert num_f - num_b < cap
            num_f += op.kind is OpKind.F
            num_b += op.kind is OpKind.B
