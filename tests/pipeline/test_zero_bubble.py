"""Closed forms of the ZeroBubble paper (docs/paper.md) and 1F1B, in the simulator.

Conditions under which the formulas hold (and are asserted): the same op times on every
stage, tW <= tF and tW <= tB, no link delay, N >= S (and N >= 2S - 1 for ZB-H2). Outside
them the handcrafted schedules are still valid, only the formulas stop being exact. The
paper's bubbles count from each stage's own first op; an iteration's also has the last
stage's wait for its first input (pipeline.zero_bubble).
"""

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from adaptra.bounds import iteration_lower_bound_ms
from baselines import one_f_one_b, zb_h1, zb_h2
from pipeline.errors import MemoryLimitError
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.schedule import peak_memory
from pipeline.simulator import simulate


@st.composite
def uniform_cases(draw: st.DrawFn, min_microbatches_per_stage: int = 1):
    num_stages = draw(st.integers(1, 8))
    low = max(num_stages, min_microbatches_per_stage * num_stages - 1)
    num_microbatches = draw(st.integers(low, low + 3 * num_stages))
    t_f, t_b = draw(st.integers(1, 30)), draw(st.integers(1, 30))
    t_w = draw(st.integers(0, min(t_f, t_b)))
    return Profile.uniform(num_stages, num_microbatches, t_f, t_b, t_w)


@given(uniform_cases())
def test_1f1b_closed_form(profile: Profile) -> None:
    num_stages, n = profile.num_stages, profile.num_microbatches
    t = profile.t_f_ms[0] + profile.t_b_ms[0] + profile.t_w_ms[0]
    schedule = one_f_one_b(profile)
    metrics = compute_metrics(simulate(schedule, profile))
    assert metrics.iteration_time_ms == (n + num_stages - 1) * t
    assert schedule.warmup_counts() == tuple(min(num_stages - i, n) for i in range(num_stages))


@given(uniform_cases())
def test_zb_h1_bubble_and_memory(profile: Profile) -> None:
    s, n = profile.num_stages, profile.num_microbatches
    t_f, t_b, t_w = profile.t_f_ms[0], profile.t_b_ms[0], profile.t_w_ms[0]
    schedule = zb_h1(profile)
    metrics = compute_metrics(simulate(schedule, profile))
    assert metrics.max_stage_span_ms == n * (t_f + t_b + t_w) + (s - 1) * (t_f + t_b - t_w)
    assert max(peak_memory(ops) for ops in schedule.stages) <= s  # 1F1B's memory


@given(uniform_cases(min_microbatches_per_stage=2))
def test_zb_h2_bubble_and_memory(profile: Profile) -> None:
    s, n = profile.num_stages, profile.num_microbatches
    assume(n >= 2 * s - 1)
    t_f, t_b, t_w = profile.t_f_ms[0], profile.t_b_ms[0], profile.t_w_ms[0]
    schedule = zb_h2(profile)
    metrics = compute_metrics(simulate(schedule, profile))
    assert metrics.max_stage_span_ms == n * (t_f + t_b + t_w) + (s - 1) * (t_f + t_b - 2 * t_w)
    assert max(peak_memory(ops) for ops in schedule.stages) == 2 * s - 1
    assert schedule.warmup_counts() == tuple(2 * (s - i) - 1 for i in range(s))


@pytest.mark.parametrize(("num_stages", "num_microbatches"), [(2, 4), (4, 8), (4, 12), (8, 24)])
def test_formulas_at_fixed_points(num_stages: int, num_microbatches: int) -> None:
    profile = Profile.uniform(num_stages, num_microbatches, 10, 12, 5)
    span = {
        b.__name__: compute_metrics(simulate(b(profile), profile)).max_stage_span_ms
        for b in (zb_h1, zb_h2)
    }
    assert span["zb_h1"] == num_microbatches * 27 + (num_stages - 1) * 17
    assert span["zb_h2"] == num_microbatches * 27 + (num_stages - 1) * 12


@given(uniform_cases(min_microbatches_per_stage=2))
def test_the_iteration_s_bubble_is_never_below_the_last_stage_s_wait(profile: Profile) -> None:
    """Within one iteration ZB-H2 is not zero-bubble (its docstring said it was when
    tF + tB = 2tW): the last stage's first F waits (S-1) tF, as the lower bound says."""
    s, n = profile.num_stages, profile.num_microbatches
    assume(n >= 2 * s - 1)
    t_f, t_b, t_w = profile.t_f_ms[0], profile.t_b_ms[0], profile.t_w_ms[0]
    work = n * (t_f + t_b + t_w)
    bubble = {
        b.__name__: compute_metrics(simulate(b(profile), profile)).iteration_time_ms - work
        for b in (zb_h1, zb_h2)
    }
    assert bubble["zb_h1"] == (s - 1) * max(t_f, t_b, t_f + t_b - t_w)
    assert bubble["zb_h2"] == (s - 1) * max(t_f, t_b - t_f, t_f + t_b - 2 * t_w)
    assert bubble["zb_h2"] >= iteration_lower_bound_ms(profile) - work >= (s - 1) * t_f


def test_zb_h2_on_the_fig4_profile_takes_390_ms(fig4_fixture: dict) -> None:
    profile = Profile.from_dict(fig4_fixture["profile"])
    metrics = compute_metrics(simulate(zb_h2(profile), profile))
    assert metrics.iteration_time_ms == 390.0
    assert metrics.max_stage_span_ms == 360.0  # zero bubble, plus (S-1) tF of warm-up offset
    h1 = compute_metrics(simulate(zb_h1(profile), profile)).iteration_time_ms
    assert h1 == 390.0  # the same iteration: 30 ms of bubble in both


def test_memory_limit_is_refused_with_a_clear_error() -> None:
    profile = Profile.uniform(4, 12, 10, 10, 10, mem_limit=5)
    assert max(peak_memory(ops) for ops in zb_h1(profile).stages) == 4
    with pytest.raises(MemoryLimitError, match="zb-h2 needs 7 .* stage 0 but mem_limit is 5"):
        zb_h2(profile)
