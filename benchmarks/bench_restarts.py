"""The scaled Table 3 trace (harness/presets/table3_trace_s4.txt) in sim and emulated: the
same restarts and lost iterations, and what each engine measured.

Run: python benchmarks/bench_restarts.py [--checkpoint-every 50]

4 stages, 4 microbatches, 1 ms ops, 1 KiB messages, 1F1B and ZB-H2, 120 iterations after one
warm-up; the trace's delays (20-60 ms) are real sleeps in the emulated run, and its NIC
failure at iteration 103 checkpoint-restarts both engines.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from baselines import one_f_one_b, zb_h2
from harness.loop import Recovery
from harness.runner import fixed_plan, run_configuration
from injectors.fault_files import load_faults
from pipeline.profile import Profile
from pipeline.signals import run_script

TRACE = Path(__file__).parents[1] / "harness" / "presets" / "table3_trace_s4.txt"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    args = parser.parse_args()
    faults = load_faults(TRACE)
    profile = Profile.uniform(4, 4, 1, 1, 1, message_bytes=1024)
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print(
        "| policy | engine | restarts | lost iterations | iterations run | sum of steps s "
        "| restart model s | restart wall s | run wall s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, build in (("1f1b", one_f_one_b), ("zb-h2", zb_h2)):
        for backend in ("sim", "emulated"):
            started = time.monotonic()
            result = run_configuration(
                fixed_plan(build(profile), profile),
                backend=backend,
                num_iterations=120,
                num_warmup_iterations=1,
                faults=faults,
                recovery=Recovery(checkpoint_every=args.checkpoint_every),
                keep_timeline=False,
            )
            wall_s = time.monotonic() - started
            print(
                f"| {name} | {backend} | {result.restarts} | {result.lost_iterations} | "
                f"{len(result.iteration_times_ms)} | {sum(result.wall_times_ms) / 1e3:.2f} | "
                f"{result.restart_model_ms / 1e3:.2f} | {result.restart_wall_ms / 1e3:.2f} | "
                f"{wall_s:.1f} |",
                flush=True,
            )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    run_script(main)
