"""Median time of the default `adaptra` call (targets: (8,32) < 10 ms, (16,64) < 50 ms).

Run: python benchmarks/bench_scheduler_speed.py [--repeats 30]

Random op times randint(10, 20) ms per stage and op (seeded), 10 ms on every link. The time
covers everything the call does (planning, generation, search; no exact solve at these
sizes), as `generation_ms` in `adaptra-bench schedule` does. The search stops early when it
meets the lower bound, as it does on these profiles; a second table times the default call on
the quality benchmark's larger profiles (bench_scheduler_quality.py, no exact solve there
either) and six profiles made the same way at (16, 64), where some searches spend their
whole budget: the median over profiles of each profile's best of `--grid-repeats` calls, and
the slowest.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from bench_scheduler_quality import paper_grid, straggler_grid

from adaptra.scheduler import plan_adaptra
from pipeline.profile import Profile
from pipeline.sampling import random_profile
from pipeline.signals import run_script


def best_of_ms(profile: Profile, repeats: int) -> tuple[float, int]:
    """The fastest of `repeats` default calls (ms) and its candidate count."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        planned = plan_adaptra(profile)
        samples.append((time.perf_counter() - start) * 1000.0)
    return min(samples), planned.num_candidates


def grid_table(repeats: int) -> None:
    best = f"best of {repeats}"
    print(f"\n| grid group | n | median ms ({best}) | max ms ({best}) | max candidates |")
    print("|---|---|---|---|---|")
    groups: dict[str, list[tuple[float, int]]] = {}
    for group, profile in paper_grid(5) + straggler_grid(5):
        if 3 * profile.num_stages * profile.num_microbatches > 150:  # no exact solve
            key = f"{group.split()[0]} S={profile.num_stages} N={profile.num_microbatches}"
            groups.setdefault(key, []).append(best_of_ms(profile, repeats))
    for low in (10, 20, 30):  # paper-style profiles at (16, 64): the grid has none
        for seed in range(2):
            rng = random.Random(f"speed-16-{low}-{seed}")
            delay = float(rng.randint(1, 20))
            profile = random_profile(
                rng, 16, 64, low_ms=low, high_ms=2 * low, delay_ms=(delay,) * 15
            )
            groups.setdefault("paper-style S=16 N=64", []).append(best_of_ms(profile, repeats))
    for key, runs in groups.items():
        times_ms = [t for t, _ in runs]
        print(
            f"| {key} | {len(runs)} | {statistics.median(times_ms):.1f} | {max(times_ms):.1f} | "
            f"{max(c for _, c in runs)} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--grid-repeats", type=int, default=5)
    args = parser.parse_args()
    print("| S | N | ops | median ms | p90 ms | candidates | method |")
    print("|---|---|---|---|---|---|---|")
    for num_stages, num_microbatches in [(4, 12), (8, 32), (16, 64)]:
        profile = random_profile(
            random.Random(0),
            num_stages,
            num_microbatches,
            low_ms=10,
            high_ms=20,
            delay_ms=(10.0,) * (num_stages - 1),
        )
        samples = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            planned = plan_adaptra(profile)
            samples.append((time.perf_counter() - start) * 1000.0)
        samples.sort()
        print(
            f"| {num_stages} | {num_microbatches} | {3 * num_stages * num_microbatches} | "
            f"{statistics.median(samples):.1f} | {samples[int(0.9 * len(samples))]:.1f} | "
            f"{planned.num_candidates} | {planned.method} |"
        )
    grid_table(args.grid_repeats)


if __name__ == "__main__":
    run_script(main)
