"""Seeded random profiles for studies, benchmarks and tests (the paper's Fig. 19 style)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from pipeline.profile import Profile

__all__ = ["random_one_slow_link", "random_profile"]


def random_profile(
    rng: random.Random,
    num_stages: int,
    num_microbatches: int,
    *,
    low_ms: int,
    high_ms: int,
    delay_ms: Sequence[float] = (),
) -> Profile:
    """Every op time randint(low_ms, high_ms), drawn per stage and per op kind (F, B, W)."""

    def times() -> tuple[float, ...]:
        return tuple(float(rng.randint(low_ms, high_ms)) for _ in range(num_stages))

    t_f, t_b, t_w = times(), times(), times()
    return Profile(
        num_stages=num_stages,
        num_microbatches=num_microbatches,
        t_f_ms=t_f,
        t_b_ms=t_b,
        t_w_ms=t_w,
        delay_ms=tuple(delay_ms),
    )


def random_one_slow_link(rng: random.Random) -> tuple[Profile, int]:
    """The Eq. (1) study's profiles: S in 2..4, N in 2S..3S, times 5-20 ms, one slow link
    (returned with the profile) with 1-40 ms."""
    num_stages = rng.randint(2, 4)
    num_microbatches = rng.randint(2 * num_stages, 3 * num_stages)
    slow_link = rng.randrange(num_stages - 1)
    delay = float(rng.randint(1, 40))
    delays = [delay if i == slow_link else 0.0 for i in range(num_stages - 1)]
    profile = random_profile(
        rng, num_stages, num_microbatches, low_ms=5, high_ms=20, delay_ms=delays
    )
    return profile, slow_link
