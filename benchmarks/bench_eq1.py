"""Eq. (1) against what the generated schedules do, on random non-uniform profiles.

Run: python benchmarks/bench_eq1.py [--profiles 500]

For each profile (S in 2..4, N in 2S..3S, op times randint(5, 20) ms per stage and op, one
slow link with 1-40 ms): Algorithm 2's counts generate a schedule; Eq. (1) predicts from its
achieved slackness whether the slow link's delay is absorbed; "absorbed" is measured as
T(c) - T(0) <= c (adaptra.slackness.absorbed). Where the two disagree, the gap of `adaptra`
(default call, and heuristic alone) to the proven optimum is reported.
"""

from __future__ import annotations

import argparse
import random
import statistics

from adaptra.exact import solve_exact
from adaptra.generator import generate_schedule
from adaptra.planning import algorithm2
from adaptra.scheduler import plan_adaptra
from adaptra.slackness import absorbed, eq1_absorbs, slackness
from pipeline.sampling import random_one_slow_link
from pipeline.signals import run_script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profiles", type=int, default=500)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    counts = {(p, m): 0 for p in (True, False) for m in (True, False)}
    default_gaps, heuristic_gaps = [], []
    for _ in range(args.profiles):
        profile, link = random_one_slow_link(rng)
        warmup = algorithm2(profile).warmup
        achieved = generate_schedule(profile, warmup).warmup_counts()
        predicted = eq1_absorbs(profile, link, slackness(achieved)[link])
        measured = absorbed(profile, warmup)
        counts[(predicted, measured)] += 1
        if predicted != measured:
            default = plan_adaptra(profile)
            heuristic = plan_adaptra(profile, exact_time_limit_s=0)
            optimum = solve_exact(profile, time_limit_s=30, warm_start=default.schedule)
            default_gaps.append(default.iteration_time_ms / optimum.lower_bound_ms - 1)
            heuristic_gaps.append(heuristic.iteration_time_ms / optimum.lower_bound_ms - 1)
    wrong = counts[(True, False)] + counts[(False, True)]
    print(
        f"{args.profiles} profiles (seed {args.seed}): Eq. (1) wrong on {wrong} "
        f"({100 * wrong / args.profiles:.1f} %)"
    )
    print("| Eq. (1) predicts | measured absorbed | measured not absorbed |")
    print("|---|---|---|")
    for predicted in (True, False):
        print(
            f"| {'absorbed' if predicted else 'not absorbed'} | {counts[(predicted, True)]} | "
            f"{counts[(predicted, False)]} |"
        )
    for name, gaps in [("default adaptra", default_gaps), ("heuristic alone", heuristic_gaps)]:
        if gaps:
            print(
                f"{name} on the {len(gaps)} mismatches: mean gap "
                f"{100 * statistics.mean(gaps):.3f} %, max {100 * max(gaps):.3f} %, "
                f"over 1 %: {sum(g > 0.01 for g in gaps)}"
            )


if __name__ == "__main__":
    run_script(main)
