"""The emulated runtime against the calibrated simulator: the fidelity band.

Run: python benchmarks/bench_runtime.py [--iterations 5] [--calibration HOST.json | --op-ms MS]
     [--fresh-pools K] [--comm direct|delegated]

This host's costs are measured first (pipeline.runtime.calibrate; or read from
--calibration), then 1F1B and ZB-H2 on S=4, N=12, F=B=W=10 ms, with 64 KiB, 1 MiB and 8 MiB
messages and 0/20/40/60 ms on link 0-1, `direct` (or `--comm delegated`: over 3 delegates per
link direction and side, without the inside-the-runs table; --fresh-pools runs direct): the
median of the measured iterations (after one warm-up; one pool for every point) against the
simulator's prediction, free (no host costs) and calibrated. The fidelity is measured /
calibrated; its benchmark band on an idle machine is 0.97-1.03 (BENCHMARKS.md). The load
average is printed with the table.
"""

from __future__ import annotations

import argparse
import os
import statistics

from adaptra.transport import Delegates
from baselines import one_f_one_b, zb_h2
from pipeline.host_costs import DEFAULT_CALIBRATION_OP_MS, HostCosts
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerPool
from pipeline.runtime.calibrate import measure_host_costs, receive_lags_ms
from pipeline.signals import run_script
from pipeline.simulator import CommMode, simulate

SIZES = {"64 KiB": 64 << 10, "1 MiB": 1 << 20, "8 MiB": 8 << 20}


def _p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--calibration", help="A calibration file instead of measuring one.")
    parser.add_argument(
        "--op-ms",
        type=float,
        default=DEFAULT_CALIBRATION_OP_MS,
        help="The calibration's op length (when it is measured here).",
    )
    parser.add_argument(
        "--comm",
        choices=("direct", "delegated"),
        default="direct",
        help="How the PP messages go: delegated, over 3 delegates per link direction and side "
        "(the calibration then measures the delegated path too).",
    )
    parser.add_argument(
        "--fresh-pools",
        type=int,
        default=0,
        help="Then run each point with no delay in this many fresh pools: how far one point's "
        "median moves from one pool to the next (the band is only as tight as that).",
    )
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    delegated = args.comm == "delegated"
    host = (
        HostCosts.from_file(args.calibration)
        if args.calibration
        else measure_host_costs(
            op_ms=args.op_ms, delegates=Delegates() if delegated else None, dp_ring=False
        )
    )
    comm = CommMode(args.comm)
    print(f"host costs: {host.to_dict()}\n")
    print(
        "| policy | message | delay ms | emulated ms | free sim ms | emulated/free |"
        " calibrated sim ms | fidelity |"
    )
    print("|---|---|---|---|---|---|---|---|")
    fidelities = []
    inside_runs: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    iteration = 0
    with WorkerPool(
        4, delegates=Delegates() if delegated else None, num_delegates=3 if delegated else 0,
        timeout_s=60,
    ) as pool:  # fmt: skip
        for size_name, num_bytes in SIZES.items():
            for name, build in [("1f1b", one_f_one_b), ("zb-h2", zb_h2)]:
                for delay in (0.0, 20.0, 40.0, 60.0):
                    profile = _judged_profile(num_bytes, num_delegates=3 if delegated else None)
                    profile = profile.with_delays([delay])
                    schedule = build(profile)
                    times = []
                    for k in range(args.iterations + 1):
                        config = IterationConfig(iteration, schedule, profile, comm=args.comm)
                        timeline = pool.run_iteration(config)
                        if k:
                            times.append(compute_metrics(timeline, iteration).iteration_time_ms)
                            if not delay and not delegated:
                                seen = inside_runs.setdefault((name, size_name), ([], []))
                                seen[0].extend(
                                    m.send_end_ms - m.send_start_ms for m in timeline.messages
                                )
                                seen[1].extend(receive_lags_ms(timeline))
                        iteration += 1
                    measured = statistics.median(times)
                    free, calibrated = (
                        compute_metrics(
                            simulate(schedule, profile, comm, host=costs)
                        ).iteration_time_ms
                        for costs in (HostCosts(), host)
                    )
                    fidelities.append(measured / calibrated)
                    print(
                        f"| {name} | {size_name} | {delay:g} | {measured:.1f} | {free:.1f} | "
                        f"{measured / free:.3f} | {calibrated:.1f} | {measured / calibrated:.3f} |",
                        flush=True,
                    )
    if inside_runs:
        print("\nInside the runs with no delay, against the calibration (means; median, p90):\n")
        print(
            "| policy | message | send ms | calibrated send ms | receive lag ms | calibrated "
            "lag ms |"
        )
        print("|---|---|---|---|---|---|")
    for (name, size_name), (sends, lags) in inside_runs.items():
        num_bytes = SIZES[size_name]
        print(
            f"| {name} | {size_name} | {_spread(sends)} | {host.send_ms(num_bytes):.2f} | "
            f"{_spread(lags)} | {host.receive_lag_for_ms(num_bytes):.2f} |"
        )
    inside = sum(0.97 <= f <= 1.03 for f in fidelities)
    print(
        f"\n{inside} of {len(fidelities)} points in 0.97-1.03 (min {min(fidelities):.3f}, max "
        f"{max(fidelities):.3f}); load average {load_before:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after"
    )
    if args.fresh_pools:
        _fresh_pools(args.fresh_pools, args.iterations, host)


def _spread(values: list[float]) -> str:
    return (
        f"{statistics.fmean(values):.2f} ({statistics.median(values):.2f}, p90 {_p90(values):.2f})"
    )


def _judged_profile(num_bytes: int, num_delegates: int | None = None) -> Profile:
    """S=4, N=12, F=B=W=10 ms, no delay (a point adds its own); `num_delegates`: the pool's
    delegates per link direction, for the simulator to use as many (else the paper's rule
    for the delay)."""
    return Profile.uniform(4, 12, 10, 10, 10, message_bytes=num_bytes, num_delegates=num_delegates)


def _fresh_pools(num_pools: int, num_iterations: int, host: HostCosts) -> None:
    """Each point with no delay, once per fresh pool (the pools in turn, point by point)."""
    points = []
    for size_name, num_bytes in SIZES.items():
        for name, build in [("1f1b", one_f_one_b), ("zb-h2", zb_h2)]:
            profile = _judged_profile(num_bytes)
            points.append((size_name, name, profile, build(profile)))
    medians: list[list[float]] = [[] for _ in points]
    for _ in range(num_pools):
        with WorkerPool(4, timeout_s=60) as pool:
            for index, (_, _, profile, schedule) in enumerate(points):
                times = []
                for k in range(num_iterations + 1):
                    config = IterationConfig(index * 100 + k, schedule, profile)
                    timeline = pool.run_iteration(config)
                    if k:
                        times.append(compute_metrics(timeline, config.iteration).iteration_time_ms)
                medians[index].append(statistics.median(times))
    print(f"\nNo delay, {num_pools} fresh pools (each pool's median of {num_iterations}):\n")
    print("| policy | message | pool medians ms | max / min | calibrated sim ms | fidelity range |")
    print("|---|---|---|---|---|---|")
    for (size_name, name, profile, schedule), values in zip(points, medians, strict=True):
        predicted = compute_metrics(
            simulate(schedule, profile, CommMode.DIRECT, host=host)
        ).iteration_time_ms
        print(
            f"| {name} | {size_name} | {', '.join(f'{v:.1f}' for v in values)} | "
            f"{max(values) / min(values):.3f} | {predicted:.1f} | "
            f"{min(values) / predicted:.3f}-{max(values) / predicted:.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    run_script(main)
