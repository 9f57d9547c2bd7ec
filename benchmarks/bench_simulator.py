"""Median in-process time to simulate one iteration (targets: S=8,N=32 < 5 ms; S=32,N=256 < 100 ms).

Run: python benchmarks/bench_simulator.py [--repeats 50]
Times include validating the schedule (as `simulate` does by default) and, separately,
the simulation alone. Op times are random per stage (seeded) so nothing is uniform by luck.
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import time

from baselines import one_f_one_b, zb_h2
from pipeline.profile import Profile
from pipeline.schedule import validate_schedule
from pipeline.signals import run_script
from pipeline.simulator import CommMode, simulate


def _profile(num_stages: int, num_microbatches: int, seed: int = 0) -> Profile:
    rng = random.Random(seed)

    def times() -> tuple[float, ...]:
        return tuple(float(rng.randint(10, 20)) for _ in range(num_stages))

    return Profile(
        num_stages=num_stages,
        num_microbatches=num_microbatches,
        t_f_ms=times(),
        t_b_ms=times(),
        t_w_ms=times(),
        delay_ms=tuple(float(rng.choice([0, 0, 20])) for _ in range(num_stages - 1)),
        message_bytes=1 << 20,
        link_bandwidth_gbps=100.0,
        num_delegates=2,
    )


def _median_ms(func, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        func()
        samples.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    print(
        "| S | N | policy | comm | ops | simulate, with validation (ms) | simulation only (ms) |"
        " validation only (ms) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for num_stages, num_microbatches in [(8, 32), (32, 256)]:
        profile = _profile(num_stages, num_microbatches)
        for name, build in [("1f1b", one_f_one_b), ("zb-h2", zb_h2)]:
            schedule = build(profile)
            num_ops = sum(len(ops) for ops in schedule.stages)
            for comm in CommMode:
                full = _median_ms(
                    functools.partial(simulate, schedule, profile, comm), args.repeats
                )
                bare = _median_ms(
                    functools.partial(simulate, schedule, profile, comm, validate=False),
                    args.repeats,
                )
                check = _median_ms(
                    functools.partial(validate_schedule, schedule, num_stages, num_microbatches),
                    args.repeats,
                )
                print(
                    f"| {num_stages} | {num_microbatches} | {name} | {comm.value} | {num_ops} "
                    f"| {full:.2f} | {bare:.2f} | {check:.2f} |"
                )


if __name__ == "__main__":
    run_script(main)
