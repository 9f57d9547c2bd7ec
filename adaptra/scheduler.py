"""Adaptra's scheduler: plan warm-up counts, generate the schedule, search around it."""

from __future__ import annotations

import dataclasses

from adaptra.generator import generate_schedule
from adaptra.planning import WarmupPlan, algorithm1, algorithm2, authors_warmup
from adaptra.search import search_warmup
from pipeline.profile import Profile
from pipeline.schedule import Schedule

__all__ = ["DEFAULT_SEARCH_OPS", "AdaptraPlan", "plan_adaptra", "plan_initial"]

DEFAULT_SEARCH_OPS = 2000
"""Ops the default search may generate and simulate in all (a candidate costs 3 S N): two
candidates at S=8, N=32 (about 3 ms each), which keeps the default call under 10 ms there;
thirteen at S=4, N=12."""


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


def plan_adaptra(profile: Profile, *, search_ops: int = DEFAULT_SEARCH_OPS) -> AdaptraPlan:
    """Alg. 1 with no delay; otherwise Alg. 2 + generator + search within `search_ops`."""
    delayed = any(profile.delay_ms)
    plan = algorithm2(profile) if delayed else algorithm1(profile)
    starts = [plan.warmup]
    if delayed:
        starts.append(tuple(min(x, plan.warmup[0]) for x in authors_warmup(profile)))
    x_cap = plan.warmup[0] if profile.mem_limit is not None else profile.num_microbatches
    ops_per_candidate = 3 * profile.num_stages * profile.num_microbatches
    best, num_candidates = search_warmup(
        profile, starts, x_cap=x_cap, max_candidates=search_ops // ops_per_candidate
    )
    method = ("alg2" if delayed else "alg1") + "+generator+search"
    return AdaptraPlan(best.schedule, method, plan, best.iteration_time_ms, num_candidates)
