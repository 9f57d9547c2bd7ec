"""Median time of the default `adaptra` call (targets: (8,32) < 10 ms, (16,64) < 50 ms).

Run: python benchmarks/bench_scheduler_speed.py [--repeats 30]

Random op times randint(10, 20) ms per stage and op (seeded), 10 ms on every link. The time
covers everything the call does (planning, generation, search; no exact solve at these
sizes), as `generation_ms` in `adaptra-bench schedule` does.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from adaptra.scheduler import plan_adaptra
from pipeline.sampling import random_profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=30)
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


if __name__ == "__main__":
    main()
