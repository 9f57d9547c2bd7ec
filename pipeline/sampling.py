"""Seeded random profiles for studies, benchmarks and tests (the paper's Fig. 19 style)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from pipeline.profile import Profile

__all__ = ["random_profile"]


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
