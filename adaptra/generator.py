"""Algorithm 3 (operator selection) as a chooser for the event-driven generator (Alg. 4)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from pipeline.errors import ConfigError
from pipeline.generator import Chooser, StageState, generate
from pipeline.ops import OpKind
from pipeline.profile import Profile
from pipeline.schedule import Schedule

__all__ = [
    "Policy",
    "algorithm3_chooser",
    "check_policy",
    "generate_policy",
    "generate_schedule",
]


@dataclasses.dataclass(frozen=True, slots=True)
class Policy:
    """Algorithm 3's knobs, per stage."""

    warmup: tuple[int, ...]
    """x_i: only forwards until x_i have started."""
    in_flight_caps: tuple[int | None, ...]
    """k_i: after the warm-up, a forward also needs #F - #B < k_i; None: no cap."""

    @classmethod
    def uncapped(cls, warmup: tuple[int, ...]) -> Policy:
        return cls(tuple(warmup), (None,) * len(warmup))

    @classmethod
    def capped_at_warmup(cls, warmup: tuple[int, ...]) -> Policy:
        """At most x_i forwards in flight (the paper's in-flight cap)."""
        return cls(tuple(warmup), tuple(warmup))


def algorithm3_chooser(
    num_warmup: int, max_in_flight: float | None, mem_limit: float | None
) -> Chooser:
    """Warm-up: only F until `num_warmup` have started; then B > F > W among ready ops.

    An F also needs memory + 1 <= `mem_limit` and, after the warm-up, #F - #B <
    `max_in_flight` (None: no cap). A cap below `num_warmup` makes the warm-up exact: no
    further F until enough B have run.
    """
    in_flight_cap = math.inf if max_in_flight is None else max_in_flight
    memory_cap = math.inf if mem_limit is None else mem_limit

    def choose(state: StageState) -> OpKind | None:
        may_forward = state.ready_f and state.memory + 1 <= memory_cap
        if state.num_f < num_warmup:
            return OpKind.F if may_forward else None
        if state.ready_b:
            return OpKind.B
        if may_forward and state.num_f - state.num_b < in_flight_cap:
            return OpKind.F
        if state.ready_w:
            return OpKind.W
        return None

    return choose


def generate_schedule(
    profile: Profile, warmup: Sequence[int], *, cap_in_flight: bool = False
) -> Schedule:
    """Algorithm 4: the schedule the warm-up counts `warmup` produce under the profile."""
    warmup = tuple(warmup)
    policy = Policy.capped_at_warmup(warmup) if cap_in_flight else Policy.uncapped(warmup)
    return generate_policy(profile, policy)


def check_policy(profile: Profile, policy: Policy) -> None:
    """A ConfigError unless the policy has a warm-up count and a cap per stage and every
    warm-up count x_i is within 1 <= x_i <= min(N, floor(mem_limit)): a stage runs only
    forwards until x_i have started, so more than N, or than memory holds, never end."""
    num_stages = profile.num_stages
    for name, values in (("warm-up counts", policy.warmup), ("caps", policy.in_flight_caps)):
        if len(values) != num_stages:
            raise ConfigError(
                f"the policy has {len(values)} {name} for the profile's {num_stages} stages"
            )
    num_microbatches = profile.num_microbatches
    for stage_idx, x in enumerate(policy.warmup):
        if x < 1:
            bound = "every stage starts with a forward: x_i >= 1"
        elif x > num_microbatches:
            bound = f"above the {num_microbatches} microbatches (x_i <= N)"
        elif profile.mem_limit is not None and x > math.floor(profile.mem_limit):
            bound = (
                f"above the memory limit of {profile.mem_limit:g} microbatches of activations "
                f"(x_i <= floor(mem_limit) = {math.floor(profile.mem_limit)})"
            )
        else:
            continue
        raise ConfigError(f"stage {stage_idx}'s warm-up count is {x}: {bound}")


def generate_policy(profile: Profile, policy: Policy) -> Schedule:
    """Algorithm 4 with per-stage warm-up counts and in-flight caps; a ConfigError for a
    policy `check_policy` refuses."""
    check_policy(profile, policy)
    choosers = [
        algorithm3_chooser(x, k, profile.mem_limit)
        for x, k in zip(policy.warmup, policy.in_flight_caps, strict=True)
    ]
    return generate(profile, choosers)
