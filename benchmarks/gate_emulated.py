"""CI gate for the emulated runtime: its iteration time against the calibrated simulator.

Run: python benchmarks/gate_emulated.py [--band 0.95 1.20]

First this host's runtime costs are measured (pipeline.runtime.calibrate: microbenchmarks,
not this schedule; no DP ring's, which this run has none of), with 2 ms ops: the band
allows a slower run than predicted more than a faster one, and calibrated with 10 ms ops
(the benchmark's choice, BENCHMARKS.md) the prediction followed the load the test suite
leaves behind: this gate read 1.022, 1.024, 0.980 and 0.966 on 2026-12-03, against 1.039,
1.039 and 1.050 with 2 ms ops. Then 1F1B on S=4, N=12, 10 ms ops, 1 MiB messages, no
delay (where the runtime's own costs weigh most), 5 measured iterations after a warm-up in
one pool. The fidelity (median emulated / calibrated simulated) must lie in the CI gate's
band (docs/design.md: the fidelity band). Exits 1 with the figures otherwise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from baselines import one_f_one_b
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerPool
from pipeline.runtime.calibrate import measure_host_costs
from pipeline.simulator import CommMode, simulate

GATE_CALIBRATION_OP_MS = 2.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--band", type=float, nargs=2, default=(0.95, 1.20))
    args = parser.parse_args()
    low, high = args.band
    host = measure_host_costs(op_ms=GATE_CALIBRATION_OP_MS, dp_ring=False)  # no DP here
    profile = Profile.uniform(4, 12, 10, 10, 10, message_bytes=1 << 20)
    schedule = one_f_one_b(profile)
    predicted = compute_metrics(
        simulate(schedule, profile, CommMode.DIRECT, host=host)
    ).iteration_time_ms
    with WorkerPool(4, timeout_s=60) as pool:
        times = [
            compute_metrics(
                pool.run_iteration(IterationConfig(i, schedule, profile)), i
            ).iteration_time_ms
            for i in range(6)
        ]
    measured = statistics.median(times[1:])
    ratio = measured / predicted
    verdict = "ok" if low <= ratio <= high else "FAILED"
    print(
        f"emulated/calibrated sim gate (1f1b, 1 MiB, no delay; load {os.getloadavg()[0]:.2f}): "
        f"{measured:.1f} ms / {predicted:.1f} ms = {ratio:.3f} "
        f"(allowed {low:.2f}-{high:.2f}): {verdict}"
    )
    return 0 if verdict == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
