"""Algorithm 4 for Algorithm 3's policy, fast: the iteration time, and the schedule on demand.

The search times many policies (warm-up counts and in-flight caps per stage) and keeps one;
the general generator (`pipeline.generator`, any chooser) plus a re-simulation costs about
four times what this needs. Under Algorithm 3 every stage runs each kind of op in microbatch
order (stage 0's forwards are ordered, a link delays all its messages alike, and the chooser
takes the lowest ready microbatch), so a stage's state is three counters and the arrival
times of its inputs. This module replays the generator's event order on that state: at each
event time, all ends and arrivals first, then every woken idle stage in index order, seeing
only what had arrived before its pass began; events just after an instant are at it
(`pipeline.generator.tie_limit_ms`), and an op starts when its stage is free and its input
is there. Its schedules equal `generate_policy`'s and its times `simulate`'s in `ideal` mode
exactly (tests/adaptra/test_policy_timing.py).
"""

from __future__ import annotations

import dataclasses
import heapq
import math

from adaptra.generator import Policy, check_policy
from pipeline.errors import ScheduleError
from pipeline.generator import TIE_TOLERANCE as _TIE
from pipeline.ops import Op, OpKind
from pipeline.profile import Profile
from pipeline.schedule import Schedule

__all__ = ["PolicyTiming", "schedule_policy", "time_policy"]

_KINDS = (OpKind.F, OpKind.B, OpKind.W)


@dataclasses.dataclass(frozen=True, slots=True)
class PolicyTiming:
    """What one policy does under one profile."""

    iteration_time_ms: float
    """End of the last op; inf when the policy stalls (a cap that never lets F run)."""
    warmup_counts: tuple[int, ...]
    """Forwards each stage ran before its first B (`Schedule.warmup_counts`)."""
    op_kinds: tuple[tuple[int, ...], ...]
    """Per stage, the kinds it ran in order (0 F, 1 B, 2 W): the schedule, as each kind runs
    in microbatch order."""

    def schedule(self) -> Schedule:
        """The schedule `generate_policy` builds; the same ScheduleError if it stalls."""
        if math.isinf(self.iteration_time_ms):
            raise ScheduleError("generation stalled: the policy leaves ops unscheduled")
        stages = []
        for kinds in self.op_kinds:
            next_microbatch = [0, 0, 0]
            ops = []
            for kind in kinds:
                ops.append(Op(_KINDS[kind], next_microbatch[kind]))
                next_microbatch[kind] += 1
            stages.append(tuple(ops))
        return Schedule(tuple(stages))


def time_policy(profile: Profile, policy: Policy) -> PolicyTiming:
    """Time the schedule `generate_policy(profile, policy)` builds, without building it.

    The event loop is long because it is the search's inner loop (no calls per op). A
    ConfigError for a policy `check_policy` refuses, as `generate_policy` gives.
    """
    check_policy(profile, policy)
    num_stages, num_microbatches = profile.num_stages, profile.num_microbatches
    last = num_stages - 1
    t_f, t_b, t_w = profile.t_f_ms, profile.t_b_ms, profile.t_w_ms
    transfer = [profile.transfer_ms(i) for i in range(last)]
    caps = [math.inf if k is None else k for k in policy.in_flight_caps]
    memory_cap = math.inf if profile.mem_limit is None else profile.mem_limit
    warmup = policy.warmup
    # fwd_arrival[i][m] / bwd_arrival[i][m]: when stage i may start F m / B m (for the last
    # stage, its own F m's end); the lists grow in microbatch order.
    fwd_arrival: list[list[float]] = [[0.0] * num_microbatches] + [[] for _ in range(last)]
    bwd_arrival: list[list[float]] = [[] for _ in range(num_stages)]
    num_f, num_b, num_w = [0] * num_stages, [0] * num_stages, [0] * num_stages
    counts = [num_microbatches] * num_stages
    kinds: list[list[int]] = [[] for _ in range(num_stages)]
    busy_until = [0.0] * num_stages
    wakeups: list[tuple[float, int]] = []  # (time, stage): an end or an arrival there
    push, pop = heapq.heappush, heapq.heappop
    now = 0.0
    woken = list(range(num_stages))
    while True:
        # An arrival at `now` itself (zero op and transfer time) is seen from the next pass
        # on, as in the generator, where it is an event of its own.
        deferred: list[tuple[list[float], float, int]] | None = None
        limit = now + _TIE * (now if now > 1.0 else 1.0)  # tie_limit_ms(now), inlined
        for stage_idx in woken:
            free_ms = busy_until[stage_idx]
            if free_ms > limit:
                continue
            nf, nb, nw = num_f[stage_idx], num_b[stage_idx], num_w[stage_idx]
            grads = bwd_arrival[stage_idx]
            arrived = fwd_arrival[stage_idx]
            if nf >= warmup[stage_idx] and nb < len(grads) and grads[nb] <= limit:
                kind = 1
            else:
                if (
                    nf < len(arrived)
                    and arrived[nf] <= limit
                    and nf - 0.5 * (nb + nw) + 1 <= memory_cap
                    and (nf < warmup[stage_idx] or nf - nb < caps[stage_idx])
                ):
                    kind = 0
                elif nf < warmup[stage_idx] or nw >= nb:
                    continue
                else:
                    kind = 2
            if kind == 0:
                end = (free_ms if free_ms > arrived[nf] else arrived[nf]) + t_f[stage_idx]
                num_f[stage_idx] = nf + 1
                if stage_idx == last:
                    dest, times, arrival = stage_idx, grads, end
                else:
                    dest = stage_idx + 1
                    times, arrival = fwd_arrival[dest], end + transfer[stage_idx]
            elif kind == 1:
                end = (free_ms if free_ms > grads[nb] else grads[nb]) + t_b[stage_idx]
                num_b[stage_idx] = nb + 1
                if nb == 0:
                    counts[stage_idx] = nf
                dest = stage_idx - 1
                if dest >= 0:
                    times, arrival = bwd_arrival[dest], end + transfer[dest]
            else:
                end = free_ms + t_w[stage_idx]  # (its B ran before, on this stage)
                num_w[stage_idx] = nw + 1
                dest = -1
            kinds[stage_idx].append(kind)
            busy_until[stage_idx] = end
            push(wakeups, (end, stage_idx))
            if dest < 0:
                continue
            if arrival <= limit:
                deferred = [] if deferred is None else deferred
                deferred.append((times, arrival, dest))
                continue
            times.append(arrival)
            dest_free_ms = busy_until[dest]
            if dest_free_ms <= limit or dest_free_ms < arrival:  # else its op's end wakes it
                push(wakeups, (arrival, dest))
        for times, arrival, dest in deferred or ():
            times.append(arrival)
            push(wakeups, (arrival, dest))
        if not wakeups:
            break
        now, stage_idx = pop(wakeups)
        woken = [stage_idx]
        limit = now + _TIE * (now if now > 1.0 else 1.0)  # tie_limit_ms(now), inlined
        while wakeups and wakeups[0][0] <= limit:
            stage_idx = pop(wakeups)[1]
            if stage_idx not in woken:
                woken.append(stage_idx)
        if len(woken) > 1:
            woken.sort()
    finished = sum(num_f) + sum(num_b) + sum(num_w) == 3 * num_stages * num_microbatches
    return PolicyTiming(
        max(busy_until) if finished else math.inf,
        tuple(counts),
        tuple(tuple(k) for k in kinds),
    )


def schedule_policy(profile: Profile, policy: Policy) -> Schedule:
    """The schedule `generate_policy(profile, policy)` builds, by the fast engine."""
    return time_policy(profile, policy).schedule()
