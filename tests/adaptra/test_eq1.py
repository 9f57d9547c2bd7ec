"""Eq. (1) against what the generated schedules do (the reviewers' concrete test).

Eq. (1) is unproven for the schedules the heuristic produces, and it is wrong on about a
fifth of these profiles (BENCHMARKS.md); where it is wrong, `adaptra` must still be within
1 % of the proven optimum.
"""

import random

from adaptra.exact import solve_exact_deterministic
from adaptra.generator import generate_schedule
from adaptra.planning import algorithm2
from adaptra.scheduler import plan_adaptra
from adaptra.slackness import absorbed, eq1_absorbs, slackness
from pipeline.sampling import random_one_slow_link

NUM_PROFILES = 200


def test_where_eq1_is_wrong_adaptra_is_within_1_percent_of_the_optimum() -> None:
    rng = random.Random(0)
    num_wrong = 0
    for _ in range(NUM_PROFILES):
        profile, link = random_one_slow_link(rng)
        warmup = algorithm2(profile).warmup
        achieved = generate_schedule(profile, warmup).warmup_counts()
        predicted = eq1_absorbs(profile, link, slackness(achieved)[link])
        if predicted == absorbed(profile, warmup):
            continue
        num_wrong += 1
        planned = plan_adaptra(profile)
        optimum = solve_exact_deterministic(
            profile, deterministic_time_s=10, warm_start=planned.schedule
        )
        assert optimum.optimal
        assert planned.iteration_time_ms <= 1.01 * optimum.lower_bound_ms, profile
    # Eq. (1) is wrong often enough for this test to mean something.
    assert num_wrong >= NUM_PROFILES // 10
