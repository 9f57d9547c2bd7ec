"""When Adaptra swaps a slow DP ring link in the simulator, over the draws of jittered and
redrawn delays: per fault, the first measured iteration a swap moved workers in (one per
seed; `-` none), their median, and the run's total time summed over the seeds.

PP 4 x DP 2, 2 ms ops, 8 MB of gradient a stage in 2 MB buckets (tests/adaptra/control/
test_swaps.py's setting), 30 measured iterations, the fault from measured iteration 3: on
dp1:0-1 10 +- 10 ms and 6 +- 6 ms per message, a normal 15 +- 15 ms redrawn every 0.1-1 s;
on host 5's rnic0 the redrawn one and 10 +- 10 ms. Deterministic (seeded draws).

Run: python benchmarks/bench_swap_timing.py [--seeds 20]
"""

from __future__ import annotations

import argparse
import statistics

from harness.policies import system_controller
from harness.runner import run_configuration
from injectors.fault_files import parse_yaml
from pipeline.profile import Profile
from pipeline.signals import run_script

PROFILE = Profile.uniform(
    4, 8, 2, 2, 2, message_bytes=4096, num_delegates=3, num_replicas=2,
    allreduce_bytes=(8_000_000,) * 4, dp_bucket_bytes=2_000_000, dp_bandwidth_gbps=100,
)  # fmt: skip
_REDRAWN = "distribution: {normal: {mean_ms: 15, std_ms: 15}, redraw_every_ms: [100, 1000]}"
FAULTS = {
    "dp1:0-1 10 +- 10 ms": 'links: ["dp1:0-1"], delay_ms: 10, jitter_ms: 10',
    "dp1:0-1 6 +- 6 ms": 'links: ["dp1:0-1"], delay_ms: 6, jitter_ms: 6',
    "dp1:0-1 15 +- 15 ms redrawn": f'links: ["dp1:0-1"], {_REDRAWN}',
    "host5:rnic0 15 +- 15 ms redrawn": f'nic: "host5:rnic0", {_REDRAWN}',
    "host5:rnic0 10 +- 10 ms": 'nic: "host5:rnic0", delay_ms: 10, jitter_ms: 10',
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20, help="draws of each fault")
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    print("| fault | first swap (measured iteration) per seed | median | total s |")
    print("|---|---|---|---|")
    for name, fields in FAULTS.items():
        firsts: list[int | None] = []
        total_ms = 0.0
        for seed in range(args.seeds):
            faults = parse_yaml(f"[{{start_iteration: 3, {fields}}}]", seed=seed)
            run = run_configuration(
                system_controller("adaptra", PROFILE, faults), num_iterations=30, faults=faults
            )
            moved = [k for k, workers in enumerate(run.num_moved_workers) if workers]
            firsts.append(moved[0] if moved else None)
            total_ms += sum(run.wall_times_ms)
        swapped = [k for k in firsts if k is not None]
        median = f"{statistics.median(swapped):g}" if swapped else "-"
        shown = " ".join("-" if k is None else str(k) for k in firsts)
        print(f"| {name} | {shown} | {median} | {total_ms / 1000:.1f} |", flush=True)


if __name__ == "__main__":
    run_script(main)
