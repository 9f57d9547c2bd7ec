"""Algorithm 3 (operator selection) as a chooser for the event-driven generator (Alg. 4)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from pipeline.generator import Chooser, StageState, generate
from pipeline.ops import OpKind
from pipeline.profile import Profile
from pipeline.schedule import Schedule

__all__ = ["algorithm3_chooser", "generate_schedule"]


def algorithm3_chooser(
    num_warmup: int, max_in_flight: float | None, mem_limit: float | None
) -> Chooser:
    """Warm-up: only F until `num_warmup` have started; then B > F > W among ready ops.

    An F also needs #F - #B < `max_in_flight` (None: no cap) and memory + 1 <= `mem_limit`.
    """
    in_flight_cap = math.inf if max_in_flight is None else max_in_flight
    memory_cap = math.inf if mem_limit is None else mem_limit

    def choose(state: StageState) -> OpKind | None:
        may_forward = (
            state.ready_f
            and state.num_f - state.num_b < in_flight_cap
            and state.memory + 1 <= memory_cap
        )
        if state.num_f < num_warmup:
            return OpKind.F if may_forward else None
        if state.ready_b:
            return OpKind.B
        if may_forward:
            return OpKind.F
        if state.ready_w:
            return OpKind.W
        return None

    return choose


def generate_schedule(
    profile: Profile, warmup: Sequence[int], *, cap_in_flight: bool = False
) -> Schedule:
    """Algorithm 4: the schedule the warm-up counts `warmup` produce under the profile."""
    choosers = [
        algorithm3_chooser(x, x if cap_in_flight else None, profile.mem_limit) for x in warmup
    ]
    return generate(profile, choosers)
