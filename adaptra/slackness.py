"""Slackness analysis (docs/paper.md): warm-up counts, Theorem 1 and Eq. (1).

These are the paper's predictions; the project measures where they hold (BENCHMARKS.md).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

from adaptra.generator import generate_schedule
from pipeline.profile import Profile
from pipeline.schedule import Schedule
from pipeline.simulator import simulate
from pipeline.topology import link_name

__all__ = [
    "LinkSlackness",
    "absorbed",
    "analyse",
    "eq1_absorbs",
    "slackness",
    "theorem1_threshold_ms",
]


def slackness(warmup: Sequence[int]) -> tuple[int, ...]:
    """Delta_i = x_i - x_i+1 for every link."""
    return tuple(a - b for a, b in itertools.pairwise(warmup))


def theorem1_threshold_ms(delta: int, op_time_ms: float) -> float:
    """Uniform op time t: a delay c <= (Delta - 1) t costs only Theta(c) (Theorem 1)."""
    return max(delta - 1, 0) * op_time_ms


def eq1_absorbs(profile: Profile, link_idx: int, delta: int) -> bool:
    """Eq. (1): tF_i + tB_i + 2 c_i <= Delta_i (tF_i+1 + tB_i+1): no cascading bubbles."""
    i = link_idx
    need = profile.t_f_ms[i] + profile.t_b_ms[i] + 2 * profile.delay_ms[i]
    return need <= delta * (profile.t_f_ms[i + 1] + profile.t_b_ms[i + 1]) + 1e-9


@dataclasses.dataclass(frozen=True, slots=True)
class LinkSlackness:
    link: str
    delay_ms: float
    slackness: int
    eq1_absorbed: bool
    predicted_cost_ms: float
    """Theorem 1's order of magnitude: c if absorbed, else N c / (Delta + 1)."""


def analyse(profile: Profile, schedule: Schedule) -> tuple[LinkSlackness, ...]:
    """Per link: the schedule's slackness and what Eq. (1) and Theorem 1 predict for it."""
    deltas = slackness(schedule.warmup_counts())
    result = []
    for i, delta in enumerate(deltas):
        delay = profile.delay_ms[i]
        absorbed = eq1_absorbs(profile, i, delta)
        cost = delay if absorbed else profile.num_microbatches * delay / (max(delta, 0) + 1)
        result.append(LinkSlackness(link_name(i), delay, delta, absorbed, cost))
    return tuple(result)


def absorbed(profile: Profile, warmup: Sequence[int]) -> bool:
    """The paper's "absorbed": the counts, generated under the delays, cost at most the sum of
    the delays over the same counts generated without them (only the latency is paid)."""
    fault_free = dataclasses.replace(profile, delay_ms=(0.0,) * len(profile.delay_ms))
    delayed_ms = simulate(generate_schedule(profile, warmup), profile).iterations[0].end_ms
    base_ms = simulate(generate_schedule(fault_free, warmup), fault_free).iterations[0].end_ms
    return delayed_ms - base_ms <= sum(profile.delay_ms) + 1e-9
