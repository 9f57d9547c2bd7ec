"""The emulated pool's two-round iteration start: what it costs between iterations, and that
a worker's set-up stays out of the iteration.

Run: python benchmarks/bench_iteration_start.py [--iterations 40]

Each iteration starts in two rounds (docs/design.md, "The iteration's start"): the config to
every worker, each setting it up (receives, the DP ring's buffers, the backend's
`begin_iteration`) and saying it is ready; then the start, the pool's start margin (20 ms)
after the last answer. Two settings on one emulated pool each: 1F1B on S = 2, D = 2, N = 4, 1
ms ops, 4 KiB messages, with no gradient and with a 160 MB one per stage (the DP ring's
buffers then take milliseconds to build). Printed per setting, medians over the measured
iterations (after one warm-up): the call's wall time less the iteration's own span (start to
the step's end: the time between iterations, margin included), and how late stage 0's first op
starts after the iteration's start (its set-up done before it: about 0 either way).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from baselines import one_f_one_b
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerPool
from pipeline.signals import run_script

GRADIENT_BYTES = 160_000_000


def _measure(gradient_bytes: int, num_iterations: int) -> tuple[float, float]:
    """(median ms between iterations, median ms stage 0's first op starts late)."""
    profile = Profile.uniform(
        2, 4, 1, 1, 1, message_bytes=4096, num_replicas=2,
        allreduce_bytes=gradient_bytes, dp_bucket_bytes=max(gradient_bytes, 1),
    )  # fmt: skip
    schedule = one_f_one_b(profile)
    between_ms, late_ms = [], []
    with WorkerPool(2, num_replicas=2, timeout_s=60) as pool:
        for i in range(num_iterations + 1):
            called = time.monotonic()
            timeline = pool.run_iteration(IterationConfig(i, schedule, profile))
            wall_ms = (time.monotonic() - called) * 1000
            record = timeline.iterations[-1]
            first_ms = min(op.start_ms for op in timeline.ops if op.stage == 0)
            if i > 0:  # the first: a warm-up
                between_ms.append(wall_ms - (record.end_ms - record.start_ms))
                late_ms.append(first_ms - record.start_ms)
    return statistics.median(between_ms), statistics.median(late_ms)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="bench_iteration_start.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--iterations", type=int, default=40, help="measured, per setting")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}")
    print("| gradient per stage | between iterations ms | stage 0 first op late ms |")
    print("|---|---|---|")
    for gradient_bytes in (0, GRADIENT_BYTES):
        between, late = _measure(gradient_bytes, args.iterations)
        print(f"| {gradient_bytes / 1e6:g} MB | {between:.1f} | {late:.2f} |")


if __name__ == "__main__":
    run_script(main)
