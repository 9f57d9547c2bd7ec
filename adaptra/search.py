"""Search around Algorithm 2's answer, judged by the simulator, within a candidate budget.

The generator turns warm-up counts into a schedule; small changes to those counts (one link's
slackness up or down, the in-flight cap on or off) sometimes buy what Eq. (1)'s per-link rule
cannot see. A hill climb from the planned vector keeps the best schedule found; it stops at a
local optimum or after `max_candidates` evaluations. The budget counts candidates, not
milliseconds, so the same profile always gives the same schedule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

from adaptra.generator import generate_schedule
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
    # One iteration from t = 0: its end is its iteration time (see pipeline.metrics).
    return Candidate(tuple(warmup), cap_in_flight, schedule, timeline.iterations[0].end_ms)


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
    max_candidates: int,
) -> tuple[Candidate, int]:
    """Best candidate found from `starts` by hill climbing, and how many were evaluated.

    Every start is evaluated, whatever the budget.
    """
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
    while improved and len(seen) < max_candidates:
        improved = False
        current = best
        for warmup in _neighbours(current.warmup, x_cap):
            if len(seen) >= max_candidates:
                break
            improved |= consider(warmup, current.cap_in_flight)
        if len(seen) < max_candidates:
            improved |= consider(current.warmup, not current.cap_in_flight)
    return best, len(seen)
