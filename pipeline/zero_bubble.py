"""ZeroBubble's handcrafted schedules ZB-H1 and ZB-H2 (Qi et al., ICLR 2024, section 3).

Two systems use these schedules, so they are in pipeline/: the ZB baselines (`baselines`)
and Adaptra's scheduler, which keeps a ZeroBubble order where it is faster than its own.

Both split the backward into B and W and share one shape: x_i warm-up forwards, then a
steady phase of B, W, F per step in which stage i runs the W of `lag_i` steps ago, then the
W's left over. ZB-H1 keeps 1F1B's warm-up (x_i = S - i) and lags W by i steps: peak memory
S microbatches. ZB-H2 warms up with x_i = 2(S-i) - 1 forwards and lags W by 2i steps: peak
memory 2S-1.

Bubbles, with the same op times on every stage, tW <= tF and tW <= tB, N >= 2S - 1 for
ZB-H2 (tests/pipeline/test_zero_bubble.py): the paper's, (S-1)(tF+tB-tW) for ZB-H1 and
(S-1)(tF+tB-2tW) for ZB-H2 (zero when tF + tB = 2tW), are each stage's from its own first op
to its last. Its zero-bubble ZB-H2 needs consecutive iterations to overlap (the optimizer
step's synchronization bypassed), which this model, one iteration at a time, does not do:
an iteration runs from stage 0's first op, and the last stage's first F cannot start before
(S-1) tF (no schedule's bubble is smaller: adaptra/bounds.py). The iteration's bubble is
(S-1) max(tF, tB, tF+tB-tW) for ZB-H1 and (S-1) max(tF, tB-tF, tF+tB-2tW) for ZB-H2: at
tF = tB = tW = 10 ms, S = 4, N = 12 both take 390 ms, 30 ms of it bubble.
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
    """ZB-H2: 2S-1 in-flight microbatches; within each stage's span a zero bubble when
    tF + tB = 2 tW, not within one iteration (the module's docstring)."""
    num_stages = profile.num_stages
    schedule = Schedule(
        tuple(
            _stage_order(profile.num_microbatches, 2 * (num_stages - i) - 1, 2 * i)
            for i in range(num_stages)
        )
    )
    check_memory(schedule, profile.mem_limit, "zb-h2")
    return schedule
