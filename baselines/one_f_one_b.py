"""1F1B (PipeDream-flush, Megatron's default) with a fused backward BW."""

from __future__ import annotations

from pipeline.ops import Op, OpKind
from pipeline.profile import Profile
from pipeline.schedule import Schedule, check_memory

__all__ = ["one_f_one_b"]


def _stage_order(stage_idx: int, num_stages: int, num_microbatches: int) -> tuple[Op, ...]:
    # Megatron runs S-1-i warm-up forwards, then alternates F and BW: x_i = S - i.
    num_warmup = min(num_stages - 1 - stage_idx, num_microbatches)
    ops = [Op(OpKind.F, m) for m in range(num_warmup)]
    for m in range(num_microbatches - num_warmup):
        ops += [Op(OpKind.F, num_warmup + m), Op(OpKind.BW, m)]
    ops += [Op(OpKind.BW, m) for m in range(num_microbatches - num_warmup, num_microbatches)]
    return tuple(ops)


def one_f_one_b(profile: Profile) -> Schedule:
    """1F1B for the profile's S and N; refused if its S - i in-flight forwards exceed mem_limit."""
    schedule = Schedule(
        tuple(
            _stage_order(i, profile.num_stages, profile.num_microbatches)
            for i in range(profile.num_stages)
        )
    )
    check_memory(schedule, profile.mem_limit, "1f1b")
    return schedule
