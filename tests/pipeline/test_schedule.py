import pytest
from hypothesis import given
from hypothesis import strategies as st

from baselines import one_f_one_b, zb_h1, zb_h2
from pipeline.errors import ConfigError, DeadlockError, MemoryLimitError, ScheduleError
from pipeline.ops import Op, OpKind
from pipeline.profile import Profile
from pipeline.schedule import Schedule, check_memory, peak_memory, validate_schedule
from tests.strategies import profiles

TWO_STAGES = [["F0", "F1", "BW0", "BW1"], ["F0", "BW0", "F1", "BW1"]]


def test_json_round_trip_and_warmup(fig4_fixture: dict) -> None:
    schedule = Schedule.from_dict(fig4_fixture)
    assert Schedule.from_dict(schedule.to_dict()) == schedule
    assert schedule.warmup_counts() == (7, 5, 3, 1)
    assert schedule.num_microbatches == 12
    validate_schedule(schedule, 4, 12)


def test_missing_op_is_named() -> None:
    schedule = Schedule.from_text([["F0", "F1", "BW0"], ["F0", "BW0", "F1", "BW1"]])
    with pytest.raises(ScheduleError, match="stage 0: op B1 and W1 \\(or BW1\\) is missing"):
        validate_schedule(schedule, 2, 2)


def test_duplicated_op_is_named() -> None:
    schedule = Schedule.from_text([["F0", "F1", "BW0", "BW1", "F1"], TWO_STAGES[1]])
    with pytest.raises(ScheduleError, match="stage 0: op F1 appears more than once"):
        validate_schedule(schedule, 2, 2)


def test_mixed_fused_and_split_backward_is_rejected() -> None:
    schedule = Schedule.from_text([["F0", "F1", "BW0", "B0", "W0", "BW1"], TWO_STAGES[1]])
    with pytest.raises(ScheduleError, match="both BW0 and a split B0/W0"):
        validate_schedule(schedule, 2, 2)


def test_wrong_stage_count_and_microbatch_range() -> None:
    with pytest.raises(ScheduleError, match="schedule has 2 stages but the profile has 3"):
        validate_schedule(Schedule.from_text(TWO_STAGES), 3, 2)
    with pytest.raises(ScheduleError, match="^schedule has 1 stage but the profile has 2$"):
        validate_schedule(Schedule.from_text(TWO_STAGES[:1]), 2, 2)
    bad = Schedule.from_text([["F0", "F5", "BW0", "BW5"], TWO_STAGES[1]])
    with pytest.raises(ScheduleError, match="microbatch 5 outside 0..1"):
        validate_schedule(bad, 2, 2)


def test_impossible_order_names_stage_op_and_what_it_waits_on() -> None:
    # Stage 1 wants F1 before it has sent the gradient that stage 0 waits for: fine. But
    # stage 0 runs its backward of microbatch 1 before stage 1 ever runs F1: deadlock.
    schedule = Schedule.from_text([["F0", "BW1", "F1", "BW0"], ["F0", "F1", "BW0", "BW1"]])
    with pytest.raises(DeadlockError) as err:
        validate_schedule(schedule, 2, 2)
    assert str(err.value) == (
        "deadlock: stage 0 op BW1 waits on F1 of stage 0; stage 1 op F1 waits on F1 of stage 0"
    )


def test_w_before_its_b_is_a_deadlock() -> None:
    schedule = Schedule.from_text([["F0", "W0", "B0"]])
    with pytest.raises(DeadlockError, match="stage 0 op W0 waits on B0 of stage 0"):
        validate_schedule(schedule, 1, 1)


def test_peak_memory_and_limit() -> None:
    ops = [Op.parse(t) for t in ["F0", "F1", "B0", "F2", "W0", "BW1", "B2", "W2"]]
    assert peak_memory(ops) == 2.5
    schedule = Schedule((tuple(ops),))
    check_memory(schedule, 2.5)
    with pytest.raises(MemoryLimitError, match="needs 2.5 microbatches .* stage 0 .* is 2"):
        check_memory(schedule, 2)


BUILDERS = [one_f_one_b, zb_h1, zb_h2]


@given(profiles(with_delays=False), st.sampled_from(BUILDERS), st.integers(0, 3))
def test_generated_schedules_are_valid_or_refused(profile: Profile, build, slack: int) -> None:
    unconstrained = build(profile)
    validate_schedule(unconstrained, profile.num_stages, profile.num_microbatches)
    peak = max(peak_memory(ops) for ops in unconstrained.stages)
    limit = max(peak - 1 + slack, 0.5)
    if limit < 1:  # no schedule fits: the profile itself is refused
        with pytest.raises(ConfigError, match="mem_limit must be >= 1"):
            Profile.from_dict({**profile.to_dict(), "mem_limit": limit})
        return
    limited = Profile.from_dict({**profile.to_dict(), "mem_limit": limit})
    if peak > limit:
        with pytest.raises(MemoryLimitError):
            build(limited)
    else:
        schedule = build(limited)
        assert all(peak_memory(ops) <= limit for ops in schedule.stages)


def _break(schedule: Schedule, how: str, stage_idx: int, pos: int) -> Schedule:
    stages = [list(ops) for ops in schedule.stages]
    ops = stages[stage_idx]
    pos %= len(ops)
    if how == "drop":
        del ops[pos]
    elif how == "duplicate":
        ops.insert(pos, ops[pos])
    else:  # move a backward in front of its own forward
        backward = next(op for op in ops if op.kind in (OpKind.B, OpKind.BW))
        ops.remove(backward)
        ops.insert(ops.index(Op(OpKind.F, backward.microbatch)), backward)
    return Schedule(tuple(tuple(o) for o in stages))


@given(
    profiles(with_delays=False),
    st.sampled_from(BUILDERS),
    st.sampled_from(["drop", "duplicate", "reorder"]),
    st.integers(0, 10),
    st.integers(0, 1000),
)
def test_hand_broken_schedules_are_rejected(profile, build, how, stage_seed, pos) -> None:
    schedule = build(profile)
    broken = _break(schedule, how, stage_seed % profile.num_stages, pos)
    expected = {"drop": "is missing", "duplicate": "more than once", "reorder": "deadlock"}[how]
    with pytest.raises(ScheduleError, match=expected):
        validate_schedule(broken, profile.num_stages, profile.num_microbatches)
