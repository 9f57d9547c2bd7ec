"""Event-driven schedule generation: stages pick their next op as time unfolds.

The engine behind Algorithm 4 and the ZeroBubble heuristic. It simulates the `ideal` mode
(docs/design.md) with no time step: at each event time, all completions and arrivals are applied
first, then every idle stage, in stage-index order, asks its chooser which kind of op to run;
the lowest ready microbatch of that kind starts. What a chooser decides is the policy; this
module knows none.

Event times are sums of the profile's times in floating point, so two events at one instant
in exact arithmetic can differ in their last bits (0.9 + 0.3 + 0.6 and 0.9 + 0.9 ms are 2e-16
apart), and which came first was rounding's choice: a profile written in tenths of a ms got
another order than the same profile in ms (8 % slower on one). Events up to `tie_limit_ms`
after an instant are at it, and an op starts when its stage is free and its input is there,
as the simulator times it, not at the instant.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from pipeline.errors import ScheduleError
from pipeline.ops import MEMORY_DELTA, Op, OpKind
from pipeline.profile import Profile
from pipeline.schedule import Schedule

__all__ = ["TIE_TOLERANCE", "Chooser", "StageState", "generate", "tie_limit_ms"]

TIE_TOLERANCE = 1e-9
"""Events within this fraction of the time after an instant (at least 1e-9 ms) are at it: far
above the rounding of a sum of an iteration's times (about 1e-16 of it per term), far below
any two times a profile means to be apart."""


def tie_limit_ms(now_ms: float) -> float:
    """The latest event time that is at the instant `now_ms` (the module's docstring)."""
    return now_ms + TIE_TOLERANCE * max(1.0, now_ms)


class StageState:
    """What a chooser may read about its stage; owned and updated by `generate` only."""

    __slots__ = ("memory", "num_b", "num_f", "num_w", "ready_b", "ready_f", "ready_w", "stage")

    def __init__(self, stage: int) -> None:
        self.stage = stage
        self.ready_f: list[int] = []  # heaps of microbatch indices whose op may start now
        self.ready_b: list[int] = []
        self.ready_w: list[int] = []
        self.num_f = self.num_b = self.num_w = 0  # ops started so far, by kind
        self.memory = 0.0  # running activation count, in microbatches


Chooser = Callable[[StageState], OpKind | None]
"""Returns F, B or W (the kind to start now), or None to stay idle until the next event."""

_ARRIVAL, _END = 0, 1


def generate(profile: Profile, choosers: Sequence[Chooser]) -> Schedule:
    """Run the choosers (one per stage) until every op has started; return the op orders."""
    num_stages, num_microbatches = profile.num_stages, profile.num_microbatches
    if len(choosers) != num_stages:
        raise ValueError(f"need one chooser per stage ({num_stages}), got {len(choosers)}")
    transfer = [profile.transfer_ms(i) for i in range(num_stages - 1)]
    duration = {OpKind.F: profile.t_f_ms, OpKind.B: profile.t_b_ms, OpKind.W: profile.t_w_ms}
    states = [StageState(i) for i in range(num_stages)]
    states[0].ready_f = list(range(num_microbatches))
    orders: list[list[Op]] = [[] for _ in range(num_stages)]
    busy_until = [0.0] * num_stages
    # ready_at[stage][kind][m]: when op (kind, m) may start on the stage as far as its input goes
    ready_at = [{kind: [0.0] * num_microbatches for kind in duration} for _ in range(num_stages)]
    events: list[tuple[float, int, int, int, OpKind, int]] = []  # (t, seq, type, stage, kind, m)
    seq = 0
    now = 0.0
    total = 3 * num_microbatches * num_stages
    started = 0
    while True:
        woken: set[int] = set()  # only stages with news may decide differently than before
        limit = tie_limit_ms(now)
        while events and events[0][0] <= limit:
            at, _, event, stage_idx, kind, m = heapq.heappop(events)
            woken.add(stage_idx)
            state = states[stage_idx]
            if event == _ARRIVAL:
                ready_at[stage_idx][kind][m] = at
                heapq.heappush(state.ready_f if kind is OpKind.F else state.ready_b, m)
                continue
            if kind is OpKind.F:
                if stage_idx == num_stages - 1:
                    ready_at[stage_idx][OpKind.B][m] = at
                    heapq.heappush(state.ready_b, m)
                else:
                    seq += 1
                    heapq.heappush(
                        events,
                        (at + transfer[stage_idx], seq, _ARRIVAL, stage_idx + 1, OpKind.F, m),
                    )
            elif kind is OpKind.B:
                ready_at[stage_idx][OpKind.W][m] = at
                heapq.heappush(state.ready_w, m)
                if stage_idx > 0:
                    seq += 1
                    arrival = at + transfer[stage_idx - 1]
                    heapq.heappush(events, (arrival, seq, _ARRIVAL, stage_idx - 1, OpKind.B, m))
        for stage_idx in sorted(woken) if now else range(num_stages):
            if busy_until[stage_idx] > limit:
                continue
            state = states[stage_idx]
            choice = choosers[stage_idx](state)
            if choice is None:
                continue
            ready = (
                state.ready_f
                if choice is OpKind.F
                else (state.ready_b if choice is OpKind.B else state.ready_w)
            )
            if not ready:
                raise ScheduleError(f"stage {stage_idx}: chooser picked {choice} but none is ready")
            m = heapq.heappop(ready)
            if choice is OpKind.F:
                state.num_f += 1
            elif choice is OpKind.B:
                state.num_b += 1
            else:
                state.num_w += 1
            state.memory += MEMORY_DELTA[choice]
            orders[stage_idx].append(Op(choice, m))
            start = max(busy_until[stage_idx], ready_at[stage_idx][choice][m])
            end = start + duration[choice][stage_idx]
            busy_until[stage_idx] = end
            seq += 1
            heapq.heappush(events, (end, seq, _END, stage_idx, choice, m))
            started += 1
        if not events:
            break
        now = events[0][0]
    if started != total:
        stuck = [
            f"stage {i} after {len(o)} ops"
            for i, o in enumerate(orders)
            if len(o) < 3 * num_microbatches
        ]
        raise ScheduleError(
            "generation stalled: the choosers left ops unscheduled at " + ", ".join(stuck)
        )
    return Schedule(tuple(tuple(order) for order in orders))
