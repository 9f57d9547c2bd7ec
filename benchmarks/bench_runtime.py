"""The emulated runtime against the simulator, and the runtime's own overhead.

Run: python benchmarks/bench_runtime.py [--iterations 5]

Fidelity: 1F1B and ZB-H2, S=4, N=12, F=B=W=10 ms, 1 MB messages, 0/20/40/60 ms on link 0-1,
`direct` in both: median of the measured iterations (after one warm-up) against the
simulator's prediction for the same schedule and profile (bandwidth unmodelled: infinite).
Overhead: the same pool with every op 0 ms and empty messages: per-op bookkeeping (the
iteration time divided by the ops of the busiest stage) and the fixed cost of an iteration.
One pool serves every configuration (workers are reconfigured, never restarted).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

from baselines import one_f_one_b, zb_h2
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerPool
from pipeline.simulator import CommMode, simulate


def _median_ms(pool: WorkerPool, schedule, profile, iterations: int, counter: list[int]) -> float:
    times = []
    for k in range(iterations + 1):
        timeline = pool.run_iteration(IterationConfig(counter[0], schedule, profile))
        if k > 0:  # the first one is a warm-up
            times.append(compute_metrics(timeline, counter[0]).iteration_time_ms)
        counter[0] += 1
    return statistics.median(times)


def _wire_ms(pool: WorkerPool, schedule, profile: Profile, counter: list[int]) -> float:
    """Median time a send blocks its sender with no injected delay (after a warm-up)."""
    durations = []
    for k in range(3):
        timeline = pool.run_iteration(IterationConfig(counter[0], schedule, profile))
        counter[0] += 1
        if k > 0:
            durations += [m.send_end_ms - m.send_start_ms for m in timeline.messages]
    return statistics.median(durations)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=5)
    args = parser.parse_args()
    counter = [0]
    with WorkerPool(4, timeout_s=60) as pool:
        base = Profile.uniform(4, 12, 10, 10, 10, message_bytes=1 << 20)
        wire_ms = _wire_ms(pool, zb_h2(base), base, counter)
        print(f"measured cost of one 1 MB send on loopback: {wire_ms:.3f} ms\n")
        print(
            "| policy | delay ms | emulated ms (median) | simulated, free wire | error |"
            " simulated, measured wire | error |"
        )
        print("|---|---|---|---|---|---|---|")
        for name, build in [("1f1b", one_f_one_b), ("zb-h2", zb_h2)]:
            for delay in (0.0, 20.0, 40.0, 60.0):
                profile = base.with_delays([delay])
                schedule = build(profile)
                measured = _median_ms(pool, schedule, profile, args.iterations, counter)
                cells = []
                for model in (profile, dataclasses.replace(profile, link_latency_ms=wire_ms)):
                    predicted = simulate(schedule, model, CommMode.DIRECT).iterations[0].end_ms
                    cells.append(f"{predicted:.1f} | {100 * (measured / predicted - 1):+.2f} %")
                print(f"| {name} | {delay:g} | {measured:.1f} | {' | '.join(cells)} |")
        zero = Profile.uniform(4, 12, 0, 0, 0)
        print("\n| policy | ops on busiest stage | iteration ms (median) | per op us |")
        print("|---|---|---|---|")
        for name, build in [("1f1b", one_f_one_b), ("zb-h2", zb_h2)]:
            schedule = build(zero)
            measured = _median_ms(pool, schedule, zero, args.iterations * 4, counter)
            num_ops = max(len(ops) for ops in schedule.stages)
            print(f"| {name} | {num_ops} | {measured:.2f} | {1000 * measured / num_ops:.0f} |")


if __name__ == "__main__":
    main()
