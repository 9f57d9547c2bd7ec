"""Search around Algorithm 2's answer, judged by the simulator, within a time budget.

The generator turns warm-up counts into a schedule; small changes to those counts (one link's
slackness up or down, the in-flight cap on or off) often buy a few percent that Eq. (1)'s
per-link rule cannot see. A hill climb from the planned vector keeps the best schedule
found; it stops at a local optimum or when the budget runs out, whichever comes first.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence

from adaptra.generator import generate_schedule
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.schedule import Schedule
from pipeline.simulator import CommMode, simulate

__all__ = ["Candidate", "search_warmup"]


@dataclasses.dataclass(frozen=True, slots=True)
class Candidate:
    warmup: tuple[int, ...]
    cap_in_flight: bool
    schedule: Schedule
    iteration_time_ms: float


def evaluate(profile: Profile, warmup: Sequence[int], cap_in_flight: bool) -> Candidate:
    schedule = generate_schedule(profile, warmup, cap_in_flight=cap_in_flight)
    timeline = simulate(schedule, profile, CommMode.IDEAL, validate=False)
    return Candidate(
        tuple(warmup), cap_in_flight, schedule, compute_metrics(timeline).iteration_time_ms
    )


def _neighbours(warmup: tuple[int, ...], x_cap: int) -> Iterator[tuple[int, ...]]:
    """Vectors with one link's slackness changed by one, still 1 <= ... <= x_cap, decreasing."""
    for link_idx in range(len(warmup) - 1):
        for step in (1, -1):
            # Changing Delta_i shifts x_0..x_i together.
            shifted = tuple(x + step if j <= link_idx else x for j, x in enumerate(warmup))
            if shifted[0] <= x_cap and shifted[link_idx] >= shifted[link_idx + 1] >= 1:
                yield shifted


def search_warmup(
    profile: Profile,
    starts: Sequence[tuple[int, ...]],
    *,
    x_cap: int,
    budget_ms: float,
) -> tuple[Candidate, int]:
    """Best candidate found from `starts` by hill climbing, and how many were evaluated."""
    deadline = time.perf_counter() + budget_ms / 1000.0
    seen: set[tuple[tuple[int, ...], bool]] = set()
    best: Candidate | None = None

    def consider(warmup: tuple[int, ...], cap: bool) -> bool:
        nonlocal best
        if (warmup, cap) in seen:
            return False
        seen.add((warmup, cap))
        candidate = evaluate(profile, warmup, cap)
        if best is None or candidate.iteration_time_ms < best.iteration_time_ms - 1e-9:
            best = candidate
            return True
        return False

    for start in starts:
        consider(tuple(start), False)
    assert best is not None
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        current = best
        for warmup in _neighbours(current.warmup, x_cap):
            if time.perf_counter() >= deadline:
                break
            improved |= consider(warmup, current.cap_in_flight)
        if time.perf_counter() < deadline:
            improved |= consider(current.warmup, not current.cap_in_flight)
    return best, len(seen)
