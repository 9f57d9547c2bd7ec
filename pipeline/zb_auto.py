"""ZeroBubble's automatic heuristic (`zb`), the static ZB baseline of the paper's experiments.

Two systems use these schedules, so they are in pipeline/: the ZB baselines (`baselines`)
and Adaptra's scheduler, which keeps a ZeroBubble order where it is faster than its own.

A simplified reading of ZeroBubble's greedy scheduler (Qi et al., 2024, section 3.3): before
the first B, start forwards while memory allows; then alternate F and B, and run a W whenever
neither is ready (W fills gaps) or memory is full. The order is generated for the fault-free
profile and then replayed as is under any fault: that is what "static" means here. ZeroBubble
also weighs whether a gap is longer than tW; this version fills every gap.

It is not the paper's Fig. 4 ZB order (`tests/assets/fig4_zb_order.json`). On the Fig. 4
profile (S=4, N=12, 10 ms ops) both have warm-ups 7, 5, 3, 1 and take 390 ms fault-free, but
this one holds at most 2S microbatches pending (F started, W not yet run), so W's run
earlier: peak memory 7.5 microbatches on stage 0 against the fixture's 9.5. Replayed with a
delay on link 0-1 (`ideal` mode) it takes 470/550/630 ms at 20/30/40 ms, where the fixture
(the paper's figures) takes 440/500/560. Counting pending as F - B, or no cap at all, gives
the fixture there but lets W's pile up with N (peak 35.5 at S=4, N=64; 143.5 at S=16, N=256),
which no real ZeroBubble does; so the 2S rule stays, and every `zb` and `adaptra-cpu` figure
is this order's, not the fixture's (tests/pipeline/test_zb_auto.py checks both).
"""

from __future__ import annotations

import dataclasses
import math

from pipeline.generator import Chooser, StageState, generate
from pipeline.ops import OpKind
from pipeline.profile import Profile
from pipeline.schedule import Schedule

__all__ = ["zb_auto", "zb_order"]


def _chooser(max_pending: int, mem_limit: float | None) -> Chooser:
    memory_cap = math.inf if mem_limit is None else mem_limit
    last: list[OpKind | None] = [None]

    def choose(state: StageState) -> OpKind | None:
        may_forward = (
            bool(state.ready_f)
            and state.num_f - state.num_w < max_pending
            and state.memory + 1 <= memory_cap
        )
        if state.num_b == 0 and may_forward and not state.ready_b:
            kind: OpKind | None = OpKind.F
        elif state.ready_b and (last[0] is not OpKind.B or not may_forward):
            kind = OpKind.B
        elif may_forward:
            kind = OpKind.F
        elif state.ready_w:
            kind = OpKind.W
        else:
            kind = None
        if kind is not None and kind is not OpKind.W:
            last[0] = kind
        return kind

    return choose


def zb_auto(profile: Profile) -> Schedule:
    """The fault-free ZB order: at most 2S pending microbatches per stage unless mem_limit."""
    return zb_order(dataclasses.replace(profile, delay_ms=(0.0,) * (profile.num_stages - 1)))


def zb_order(profile: Profile) -> Schedule:
    """The heuristic's order generated under `profile` as it is (its delays included)."""
    max_pending = 2 * profile.num_stages
    return generate(
        profile, [_chooser(max_pending, profile.mem_limit) for _ in range(profile.num_stages)]
    )
