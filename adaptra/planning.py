"""Warm-up planning: Algorithm 1 (no straggler known) and Algorithm 2 (adapt to delays).

Algorithm 2 as printed clips each slackness on its own and can ask for x_0 > N; ours keeps
every x_i <= N (and <= the memory limit), every Delta_i >= 1 where that is possible, and says
which links got less slackness than they asked for. Where stage i+1 has no F or B time, the
printed request divides by 0: see _requested_slackness.
"""

from __future__ import annotations

import dataclasses
import math

from adaptra.slackness import slackness
from pipeline.errors import ConfigError
from pipeline.profile import Profile

__all__ = ["WarmupPlan", "algorithm1", "algorithm2", "authors_warmup", "max_warmup"]


@dataclasses.dataclass(frozen=True, slots=True)
class WarmupPlan:
    warmup: tuple[int, ...]
    """x_i: warm-up forwards of stage i."""
    requested_slackness: tuple[int, ...]
    """Delta_i each link asked for (link i joins stage i and i+1)."""
    under_protected: tuple[int, ...]
    """Links whose slackness is below the request because x_0 hit its cap (a delayed link into
    a stage with no F or B time, which no slackness protects by Eq. (1), asks for all that
    x_0's cap leaves it)."""

    @property
    def slackness(self) -> tuple[int, ...]:
        return slackness(self.warmup)


def max_warmup(profile: Profile) -> int:
    """x_max: min(N, the memory limit in microbatches); with no limit, ZB-H2's 2S - 1."""
    limit = 2 * profile.num_stages - 1 if profile.mem_limit is None else profile.mem_limit
    return max(1, min(profile.num_microbatches, math.floor(limit)))


def algorithm1(profile: Profile) -> WarmupPlan:
    """Spread x_max - 1 of slackness as evenly as possible (maximises min Delta_i)."""
    num_stages = profile.num_stages
    x_max = max_warmup(profile)
    if num_stages == 1:
        return WarmupPlan((x_max,), (), ())
    base, remainder = divmod(x_max - 1, num_stages - 1)
    slackness = [base + 1 if i < remainder else base for i in range(num_stages - 1)]
    return WarmupPlan(_warmup_from(slackness), tuple(slackness), ())


def _warmup_from(slackness: list[int]) -> tuple[int, ...]:
    warmup = [1]
    for delta in reversed(slackness):
        warmup.append(warmup[-1] + delta)
    return tuple(reversed(warmup))


def _requested_slackness(profile: Profile) -> list[int | None]:
    """Algorithm 2's per-link request, max(ceil((tF_i + tB_i + 2c_i) / (tF_i+1 + tB_i+1)), 2).

    Where stage i+1's tF + tB is 0, Eq. (1) weighs nothing against the link: without a delay
    on it the request is the floor, 2 (nothing to absorb); with one, no slackness meets
    Eq. (1), and the request is None: as much as the other links leave it."""
    requests: list[int | None] = []
    for i in range(profile.num_stages - 1):
        numerator = profile.t_f_ms[i] + profile.t_b_ms[i] + 2 * profile.delay_ms[i]
        denominator = profile.t_f_ms[i + 1] + profile.t_b_ms[i + 1]
        if denominator > 0:
            requests.append(max(2, math.ceil(numerator / denominator - 1e-9)))
        else:
            requests.append(None if profile.delay_ms[i] > 0 else 2)
    return requests


def _fit(
    requests: list[int], unbounded: list[bool], budget: int, delays: tuple[float, ...]
) -> list[int]:
    """Slackness with sum <= budget: 1 per link first, then units to the largest deficits,
    those of the links Eq. (1) can be met on (not `unbounded`) first, then the larger delay's."""
    num_links = len(requests)
    if sum(requests) <= budget:
        return list(requests)
    given = [1 if budget >= num_links else 0] * num_links  # never below 0, whatever the budget
    spare = budget - sum(given)
    while spare > 0:
        short = [
            (not unbounded[i], requests[i] - given[i], delays[i], -i)
            for i in range(num_links)
            if given[i] < requests[i]
        ]
        if not short:
            break
        given[-max(short)[3]] += 1
        spare -= 1
    return given


def algorithm2(profile: Profile, x_cap: int | None = None) -> WarmupPlan:
    """Slackness for the profile's delays and op times, within x_0 <= `x_cap`.

    The cap defaults to min(N, memory limit): activations beyond device memory can be
    offloaded in the paper, but a schedule can never hold more than N microbatches. A cap
    below 1 is a ConfigError: the last stage's x is 1, and x never grows along the pipeline.
    """
    if x_cap is not None and x_cap < 1:
        raise ConfigError(f"x_cap must be >= 1 (every stage runs a warm-up forward), got {x_cap}")
    num_stages = profile.num_stages
    cap = profile.num_microbatches if profile.mem_limit is None else max_warmup(profile)
    cap = cap if x_cap is None else min(cap, x_cap)
    if num_stages == 1:
        return WarmupPlan((min(cap, 1),), (), ())
    asked = _requested_slackness(profile)
    unbounded = [request is None for request in asked]
    most = max(2, cap - 1 - (num_stages - 2))  # x_0's cap less 1 for every other link
    requests = [most if request is None else request for request in asked]
    slackness = _fit(requests, unbounded, cap - 1, profile.delay_ms)
    under = tuple(i for i in range(num_stages - 1) if slackness[i] < requests[i])
    return WarmupPlan(_warmup_from(slackness), tuple(requests), under)


def authors_warmup(profile: Profile) -> tuple[int, ...]:
    """The authors' released rule, x_i = x_i+1 + ceil(c_i / tF_i) + 2, capped at N."""
    warmup = [1]
    for i in reversed(range(profile.num_stages - 1)):
        t_f = profile.t_f_ms[i]
        step = math.ceil(profile.delay_ms[i] / t_f - 1e-9) if t_f > 0 else 0
        warmup.append(min(profile.num_microbatches, warmup[-1] + step + 2))
    return tuple(reversed(warmup))
