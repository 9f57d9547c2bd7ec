"""CI gate for the emulated runtime: its iteration time as a ratio to the simulator's.

Run: python benchmarks/gate_emulated.py [--max-ratio 1.15]

ZB-H2 on the Fig. 4 pipeline (S=4, N=12, 10 ms ops, 256 KiB messages, 20 ms on link 0-1),
`direct`, 3 measured iterations after a warm-up: the median must not exceed the simulator's
prediction by more than the ratio (BENCHMARKS.md measures 1.02-1.05 on a quiet machine), nor
undercut it (sleeps cannot be shorter than asked). Exits 1 with the figures otherwise.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from baselines import zb_h2
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerPool
from pipeline.simulator import CommMode, simulate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-ratio", type=float, default=1.15)
    args = parser.parse_args()
    profile = Profile.uniform(4, 12, 10, 10, 10, delay_ms=(20.0,), message_bytes=256 << 10)
    schedule = zb_h2(profile)
    predicted = compute_metrics(simulate(schedule, profile, CommMode.DIRECT)).iteration_time_ms
    with WorkerPool(4, timeout_s=60) as pool:
        times = [
            compute_metrics(
                pool.run_iteration(IterationConfig(i, schedule, profile)), i
            ).iteration_time_ms
            for i in range(4)
        ]
    measured = statistics.median(times[1:])
    ratio = measured / predicted
    verdict = "ok" if 1.0 <= ratio <= args.max_ratio else "FAILED"
    print(
        f"emulated/sim gate: {measured:.1f} ms / {predicted:.1f} ms = {ratio:.3f} "
        f"(allowed 1.000-{args.max_ratio:.3f}): {verdict}"
    )
    return 0 if verdict == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
