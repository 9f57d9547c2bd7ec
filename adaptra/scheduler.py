"""Adaptra's scheduler: plan warm-up counts, generate the schedule, search around it, and
solve exactly where that fits the time budget (`method` says which of these ran)."""

from __future__ import annotations

import dataclasses

from adaptra.generator import generate_schedule
from adaptra.planning import WarmupPlan, algorithm1, algorithm2, authors_warmup
from adaptra.search import search_warmup
from pipeline.profile import Profile
from pipeline.schedule import Schedule

__all__ = [
    "DEFAULT_SEARCH_OPS",
    "EXACT_AUTO_MAX_OPS",
    "EXACT_AUTO_TIME_LIMIT_S",
    "AdaptraPlan",
    "plan_adaptra",
    "plan_initial",
]

DEFAULT_SEARCH_OPS = 2000
"""Ops the default search may generate and simulate in all (a candidate costs 3 S N): two
candidates at S=8, N=32 (about 3 ms each), which keeps the default call under 10 ms there;
thirteen at S=4, N=12."""

EXACT_AUTO_MAX_OPS = 150
EXACT_AUTO_TIME_LIMIT_S = 0.5
"""Up to 150 ops (e.g. S=4, N=12) CP-SAT proves the optimum in tens of ms on 2 cores, so the
default call adds an exact solve there, warm-started from the heuristic, within 0.5 s."""


@dataclasses.dataclass(frozen=True, slots=True)
class AdaptraPlan:
    schedule: Schedule
    method: str
    plan: WarmupPlan
    """What Algorithm 1 or 2 asked for (the search may have moved away from it)."""
    iteration_time_ms: float
    num_candidates: int


def plan_initial(profile: Profile) -> Schedule:
    """Algorithm 1 + the generator; with a memory limit, forwards stay within it."""
    plan = algorithm1(profile)
    return generate_schedule(profile, plan.warmup, cap_in_flight=profile.mem_limit is not None)


def plan_adaptra(
    profile: Profile,
    *,
    search_ops: int = DEFAULT_SEARCH_OPS,
    exact_time_limit_s: float | None = None,
) -> AdaptraPlan:
    """Alg. 1 with no delay, otherwise Alg. 2; then the generator and the search within
    `search_ops`; then CP-SAT within `exact_time_limit_s` (None: only for small problems,
    see EXACT_AUTO_MAX_OPS; 0: never). The result is never worse than the heuristic's."""
    delayed = any(profile.delay_ms)
    plan = algorithm2(profile) if delayed else algorithm1(profile)
    starts = [plan.warmup]
    if delayed:
        starts.append(tuple(min(x, plan.warmup[0]) for x in authors_warmup(profile)))
    x_cap = plan.warmup[0] if profile.mem_limit is not None else profile.num_microbatches
    num_ops = 3 * profile.num_stages * profile.num_microbatches
    best, num_candidates = search_warmup(
        profile, starts, x_cap=x_cap, max_candidates=search_ops // num_ops
    )
    method = ("alg2" if delayed else "alg1") + "+generator+search"
    if exact_time_limit_s is None and num_ops <= EXACT_AUTO_MAX_OPS:
        exact_time_limit_s = EXACT_AUTO_TIME_LIMIT_S
    if not exact_time_limit_s:
        return AdaptraPlan(best.schedule, method, plan, best.iteration_time_ms, num_candidates)
    from adaptra.exact import solve_exact  # OR-Tools loads slowly: only when it is used

    exact = solve_exact(profile, time_limit_s=exact_time_limit_s, warm_start=best.schedule)
    proof = "optimal" if exact.optimal else f"bound {exact.lower_bound_ms:g} ms"
    return AdaptraPlan(
        exact.schedule,
        f"{method}+cp-sat {proof}",
        plan,
        exact.iteration_time_ms,
        num_candidates,
    )
