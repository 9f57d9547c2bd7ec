"""The DP ring's step, emulated, against the calibrated simulator: by chunk size, by the rings
running at once, direct and over delegates.

Run: python benchmarks/bench_ring_fidelity.py [--calibration HOST.json] [--stages 2]
     [--iterations 4]

This host's costs are measured first (pipeline.runtime.calibrate with its delegates, ops of
2 ms, `--stages` stages; or read from --calibration, measured so). Then healthy rings on
`--stages` x 2 replicas, 1F1B, 2 ms ops, buckets of 2 chunks (8 buckets up to 1 MB chunks,
2 above), with the first stage's ring alone or every stage's at once, at chunk sizes on and
between the calibration's (`RING_CHUNK_SIZES`). Printed per point: the median emulated step
(the DP ring and the optimizer after the last op; `--iterations` after a warm-up, one pool
per comm mode), the calibrated simulator's, and the simulator's with the ring's lag at the
calibration's smallest chunk alone, at every size (what schema 4 had), each with its ratio
emulated / predicted. The load average is printed with the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics

from adaptra.transport import Delegates
from baselines import one_f_one_b
from pipeline.host_costs import CostCurve, HostCosts, RingLag
from pipeline.runtime import IterationConfig, WorkerPool
from pipeline.runtime.calibrate import measure_host_costs, ring_profile
from pipeline.signals import run_script
from pipeline.simulator import CommMode, simulate

CHUNK_BYTES = (125_000, 2_500_000, 8_000_000, 25_000_000, 40_000_000)
"""On the calibration's sizes (125 kB, 40 MB) and between them."""


def at_smallest_chunk(lag: RingLag) -> RingLag:
    """Each ring count's lag at its smallest measured chunk, at every size."""
    return RingLag.by_rings_alone(
        CostCurve(tuple((rings, curve.points[0][1]) for rings, curve in lag.by_rings))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calibration", help="this host's costs (adaptra-bench calibrate)")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=4)
    args = parser.parse_args()
    if args.calibration:
        host = HostCosts.from_file(args.calibration)
    else:
        host = measure_host_costs(
            num_stages=args.stages, op_ms=2.0, delegates=Delegates(), progress=print
        )
    old = dataclasses.replace(
        host,
        ring_lag_ms_by_rings=at_smallest_chunk(host.ring_lag_ms_by_rings),
        delegated_ring_lag_ms_by_rings=at_smallest_chunk(host.delegated_ring_lag_ms_by_rings),
    )
    print(
        f"\n| comm | rings | chunk MB | emulated step ms | calibrated sim ms (ratio) | "
        f"lag at {host.ring_lag_ms_by_rings.by_rings[0][1].points[0][0] / 1e6:g} MB alone: "
        "sim ms (ratio) |"
    )
    print("|---|---|---|---|---|---|")
    stages = args.stages
    for comm in (CommMode.DIRECT, CommMode.DELEGATED):
        delegated = comm is CommMode.DELEGATED
        iteration = 0
        with WorkerPool(
            stages, 2, delegates=Delegates() if delegated else None,
            num_delegates=3 if delegated else 0, timeout_s=120,
        ) as pool:  # fmt: skip
            for num_rings in sorted({1, stages}):
                for chunk in CHUNK_BYTES:
                    profile = ring_profile(stages, num_rings, chunk)
                    if delegated:  # the simulator's delegates: the pool's
                        profile = dataclasses.replace(profile, num_delegates=3)
                    schedule = one_f_one_b(profile)
                    steps = []
                    for k in range(args.iterations + 1):
                        config = IterationConfig(iteration, schedule, profile, comm=comm.value)
                        timeline = pool.run_iteration(config)
                        iteration += 1
                        if k:
                            steps.append(timeline.iterations[0].step_time_ms)
                    measured = statistics.median(steps)
                    cells = []
                    for costs in (host, old):
                        predicted = simulate(schedule, profile, comm, host=costs)
                        step_ms = predicted.iterations[0].step_time_ms
                        cells.append(f"{step_ms:.1f} ({measured / step_ms:.2f})")
                    print(
                        f"| {comm.value} | {num_rings} | {chunk / 1e6:g} | {measured:.1f} | "
                        + " | ".join(cells)
                        + " |",
                        flush=True,
                    )
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    run_script(main)
