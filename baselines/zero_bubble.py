"""ZeroBubble's handcrafted schedules ZB-H1 and ZB-H2 (Qi et al., ICLR 2024, section 3).

Both split the backward into B and W and share one shape: x_i warm-up forwards, then a
steady phase of B, W, F per step in which stage i runs the W of `lag_i` steps ago, then the
W's left over. ZB-H1 keeps 1F1B's warm-up (x_i = S - i) and lags W by i steps: peak memory
S microbatches, bubble (S-1)(tF+tB-tW). ZB-H2 warms up with x_i = 2(S-i) - 1 forwards and
lags W by 2i steps: peak memory 2S-1, bubble (S-1)(tF+tB-2tW).
"""

from __future__ import annotations

from pipeline.ops import Op, OpKind
from pipeline.profile import Profile
from pipeline.schedule import Schedule, check_memory

__all__ = ["zb_h1", "zb_h2"]


def _stage_order(num_microbatches: int, num_warmup: int, w_lag: int) -> tuple[Op, ...]:
    num_warmup = min(num_warmup, num_microbatches)
    ops = [Op(OpKind.F, m) for m in range(num_warmup)]
    num_forwards, num_weights = num_warmup, 0
    for step in range(num_microbatches):
        ops.append(Op(OpKind.B, step))
        if step >= w_lag:
            ops.append(Op(OpKind.W, num_weights))
            num_weights += 1
        if num_forwards < num_microbatches:
            ops.append(Op(OpKind.F, num_forwards))
            num_forwards += 1
    ops += [Op(OpKind.W, m) for m in range(num_weights, num_microbatches)]
    return tuple(ops)


def zb_h1(profile: Profile) -> Schedule:
    """ZB-H1: 1F1B's memory (S in-flight microbatches on stage 0), a third of its bubble."""
    num_stages = profile.num_stages
    schedule = Schedule(
        tuple(_stage_order(profile.num_microbatches, num_stages - i, i) for i in range(num_stages))
    )
    check_memory(schedule, profile.mem_limit, "zb-h1")
    return schedule


def zb_h2(profile: Profile) -> Schedule:
    """ZB-H2: 2S-1 in-flight microbatches buy a zero bubble when tF + tB = 2 tW."""
    num_stages = profile.num_stages
    schedule = Schedule(
        tuple(
            _stage_order(profile.num_microbatches, 2 * (num_stages - i) - 1, 2 * i)
            for i in range(num_stages)
        )
    )
    check_memory(schedule, profile.mem_limit, "zb-h2")
    return schedule
