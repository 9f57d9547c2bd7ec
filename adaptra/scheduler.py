"""Adaptra's scheduler: plan warm-up counts, generate the schedule, search around it, and
solve exactly where that fits the time budget (`method` says which of these ran)."""

from __future__ import annotations

import dataclasses

from adaptra.bounds import iteration_lower_bound_ms, meets_bound
from adaptra.generator import Policy, generate_schedule
from adaptra.planning import WarmupPlan, algorithm1, algorithm2, authors_warmup, max_warmup
from adaptra.search import search_policy
from pipeline.errors import MemoryLimitError
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.schedule import Schedule
from pipeline.simulator import CommMode, simulate
from pipeline.zb_auto import zb_auto, zb_order
from pipeline.zero_bubble import zb_h1, zb_h2

__all__ = [
    "DEFAULT_MAX_CANDIDATES",
    "DEFAULT_SEARCH_OPS",
    "EXACT_AUTO_DETERMINISTIC_TIME_S",
    "EXACT_AUTO_MAX_OPS",
    "MAX_CANDIDATES_BEFORE_EXACT",
    "AdaptraPlan",
    "plan_adaptra",
    "plan_initial",
    "starts",
]

DEFAULT_SEARCH_OPS = 1_000_000
"""Ops the default search may time in all (a candidate costs 3 S N, about 1 us each in
`time_policy`): 1,302 candidates at S=8, N=32 (about 0.9 s when the search runs out of
budget), 1,736 at S=8, N=24. A search whose incumbent meets the lower bound
(`adaptra.bounds`, which equals the proven optimum on every S >= 6 profile of the quality
benchmark) stops there: the median (8, 32) call of the benchmarks is 1-2 ms, and only a
profile whose optimum the search has not reached spends the whole budget. The starts
(`starts`) and their exact warm-up twins are timed whatever the budget. With 128,000 ops the
max gap over the benchmarks' S >= 6 profiles was 0.571 %, with 512,000 0.571 %, with
1,000,000 0.379 % (BENCHMARKS.md)."""

DEFAULT_MAX_CANDIDATES = 2000
"""And at most this many candidates, whatever their size: the ops budget alone would let a
small problem time tens of thousands (41,666 at S=2, N=4), each a few us, where the search
has long run out of new policies."""

MAX_CANDIDATES_BEFORE_EXACT = 240
"""Where CP-SAT follows the search on a small problem (EXACT_AUTO_MAX_OPS ops at most), at
most this many candidates: the solver proves such a problem's optimum in tens of ms. Not on
a larger one with a time limit given: CP-SAT may not better its start within the limit, and
a plan with more time was worse than one without (1081 against 1069 ms at S=8, N=24)."""

EXACT_AUTO_MAX_OPS = 150
EXACT_AUTO_DETERMINISTIC_TIME_S = 1.0
"""Up to 150 ops (e.g. S=4, N=12) CP-SAT proves the optimum in tens of ms, so the default
call adds an exact solve there, warm-started from the heuristic, unless the heuristic
already meets the lower bound. It is `solve_exact_deterministic` within 1 s of CP-SAT's
deterministic time: one worker and no clock, so the same profile gives the same schedule
on any load (a 0.5 s wall-clock limit on 2 workers gave 445-463 ms from run to run on one
S=4 N=12 profile with mem_limit 3; this proves its 438 ms optimum in about 0.7 s of wall
time). Larger problems get none by default: there the
search's budget closes more than a solve of the same time (on the S=8 profiles of the
quality benchmark that the search with 128,000 ops left above the optimum, CP-SAT within 1 s
proved 14 of 27 optima and left the issue's profile at 3347 ms; the full budget reaches its
3328 ms optimum and all but 14 others)."""


@dataclasses.dataclass(frozen=True, slots=True)
class AdaptraPlan:
    schedule: Schedule
    method: str
    plan: WarmupPlan
    """What Algorithm 1 or 2 asked for (the search may have moved away from it)."""
    iteration_time_ms: float
    num_candidates: int
    optimal: bool = False
    """Proven optimal: at the lower bound (`adaptra.bounds`), or by CP-SAT (of the model
    with times rounded to 1 us, or a coarser unit, where `method` says so)."""


def plan_initial(profile: Profile) -> Schedule:
    """Algorithm 1 + the generator; with a memory limit, forwards stay within it."""
    plan = algorithm1(profile)
    return generate_schedule(profile, plan.warmup, cap_in_flight=profile.mem_limit is not None)


def plan_adaptra(
    profile: Profile,
    *,
    search_ops: int = DEFAULT_SEARCH_OPS,
    max_candidates: int = DEFAULT_MAX_CANDIDATES,
    exact_time_limit_s: float | None = None,
) -> AdaptraPlan:
    """Alg. 1 with no delay, otherwise Alg. 2; then the search over per-stage warm-ups and
    in-flight caps within `search_ops` and `max_candidates` (MAX_CANDIDATES_BEFORE_EXACT
    where CP-SAT follows on a small problem), from the plan and the published rules
    (`starts`), and the generator; ZeroBubble's orders where faster
    (`_zero_bubble_orders`); then, unless a candidate meets the lower bound
    (`adaptra.bounds`: it is optimal), CP-SAT: on small problems (EXACT_AUTO_MAX_OPS) within
    a deterministic limit, EXACT_AUTO_DETERMINISTIC_TIME_S, so the result never depends on
    load; then, unless that proved it optimal, within `exact_time_limit_s` of wall-clock
    time from the best so far (None: not; 0: no CP-SAT at all). Never worse than any of
    those rules' schedules, nor than the plan without a time limit."""
    delayed = any(profile.delay_ms)
    plan = algorithm2(profile) if delayed else algorithm1(profile)
    x_cap = _warmup_cap(profile)
    num_ops = 3 * profile.num_stages * profile.num_microbatches
    lower_bound_ms = iteration_lower_bound_ms(profile)
    auto_exact = exact_time_limit_s is None and num_ops <= EXACT_AUTO_MAX_OPS
    max_candidates = min(search_ops // num_ops, max_candidates)
    if exact_time_limit_s != 0 and num_ops <= EXACT_AUTO_MAX_OPS:  # CP-SAT proves it next
        max_candidates = min(max_candidates, MAX_CANDIDATES_BEFORE_EXACT)
    found = search_policy(
        profile,
        starts(profile, plan),
        x_cap=x_cap,
        max_candidates=max_candidates,
        lower_bound_ms=lower_bound_ms,
    )
    schedule, time_ms = found.timing.schedule(), found.iteration_time_ms
    method = ("alg2" if delayed else "alg1") + "+generator+search"
    if not found.at_lower_bound:
        for name, zb in _zero_bubble_orders(profile):
            # The pipeline's time, as the search's (the iteration's end also has the DP step).
            zb_ms = compute_metrics(
                simulate(zb, profile, CommMode.IDEAL, validate=False)
            ).iteration_time_ms
            if zb_ms < time_ms - 1e-9:
                schedule, time_ms, method = zb, zb_ms, name
    if not (exact_time_limit_s or auto_exact) or meets_bound(time_ms, lower_bound_ms):
        at_bound = meets_bound(time_ms, lower_bound_ms)
        return AdaptraPlan(schedule, method, plan, time_ms, found.num_candidates, at_bound)
    from adaptra.exact import (  # OR-Tools loads slowly
        ExactModelError,
        rounded_to,
        solve_exact,
        solve_exact_deterministic,
    )

    exact = None
    try:
        if num_ops <= EXACT_AUTO_MAX_OPS:  # the default's solve, a time limit's from its result
            exact = solve_exact_deterministic(
                profile, deterministic_time_s=EXACT_AUTO_DETERMINISTIC_TIME_S, warm_start=schedule
            )
        if exact_time_limit_s and not (exact is not None and exact.optimal):
            start = schedule if exact is None else exact.schedule
            exact = solve_exact(profile, time_limit_s=exact_time_limit_s, warm_start=start)
    except ExactModelError:  # a transfer longer than its times may be: the search's plan
        return AdaptraPlan(schedule, method, plan, time_ms, found.num_candidates, False)
    assert exact is not None  # (a time limit, or a small problem)
    proof = "optimal" if exact.optimal else f"bound {exact.lower_bound_ms:g} ms"
    proof += rounded_to(exact)  # the proof is of the model with its times rounded
    return AdaptraPlan(
        exact.schedule,
        f"{method}+cp-sat {proof}",
        plan,
        exact.iteration_time_ms,
        found.num_candidates,
        exact.optimal,
    )


def _zero_bubble_orders(profile: Profile) -> list[tuple[str, Schedule]]:
    """ZeroBubble's orders, by name: its heuristic's at the profile's delays and at none (the
    `zb` policy's, replayed under the delays), and the handcrafted ZB-H1 and ZB-H2 where they
    fit the memory limit."""
    orders = [("zb-heuristic", zb_order(profile)), ("zb", zb_auto(profile))]
    for name, build in (("zb-h1", zb_h1), ("zb-h2", zb_h2)):
        try:
            orders.append((name, build(profile)))
        except MemoryLimitError:
            continue
    return orders


def _warmup_cap(profile: Profile) -> int:
    """The most warm-up forwards a stage may be given: N, or min(N, floor(mem_limit))
    (`max_warmup`) under a memory limit. Not the plan's x_0: the generator already refuses an
    F that would break the limit, so a lower cap only shrinks the search."""
    return profile.num_microbatches if profile.mem_limit is None else max_warmup(profile)


def starts(profile: Profile, plan: WarmupPlan) -> list[Policy]:
    """Where the search starts: the plan's warm-up counts; with delays, the authors' rule
    x_i = x_(i+1) + ceil(c_i / tF_i) + 2 (at most N, or min(N, floor(mem_limit)) under a
    memory limit: uncapped it can ask for forwards that do not exist); and the published
    greedy rule, warm-up 1 everywhere then B > F > W (the authors' later policy at the real
    per-link delays)."""
    x_cap = _warmup_cap(profile)
    policies = [Policy.uncapped(plan.warmup)]
    if any(profile.delay_ms):
        authors = tuple(min(x, x_cap) for x in authors_warmup(profile))
        policies.append(Policy.uncapped(authors))
    policies.append(Policy.uncapped((1,) * profile.num_stages))
    return policies
