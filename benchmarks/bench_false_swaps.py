"""Adaptra's rank swaps in emulated runs on a loaded host: fault-free runs (every swap is a
false one) and runs with a real DP straggler (15 ms on dp1:0-1 from measured iteration 2).

PP 4 x DP 2, 8 microbatches of 5 ms ops, 1 MiB messages, 4 MiB of gradient a stage: one
bucket, two 2 MiB chunks per ring link direction and iteration (the README's dp2 example's
ring), 10 measured iterations after one warm-up, over delegates. Printed per run: the workers
its swaps moved in each measured iteration (2 a swap or an undo); then how many runs swapped.
Load it with benchmarks/under_load.py (the false swaps come with the load):

Run: python benchmarks/under_load.py --runs 1 --busy 2 -- \\
         .venv/bin/python benchmarks/bench_false_swaps.py [--runs 10] [--system adaptra]
"""

from __future__ import annotations

import argparse

from harness.policies import system_controller
from harness.runner import RuntimeEngines, link_terms, run_configuration
from injectors.fault_files import parse_yaml
from pipeline.faults import NO_FAULTS
from pipeline.profile import Profile
from pipeline.signals import run_script

PROFILE = Profile.uniform(
    4, 8, 5, 5, 5, message_bytes=1 << 20, num_replicas=2, allreduce_bytes=(4 << 20,) * 4
)
STRAGGLER = parse_yaml('[{start_iteration: 2, links: ["dp1:0-1"], delay_ms: 15}]')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of each kind")
    parser.add_argument("--system", default="adaptra", choices=("adaptra", "adaptra-cpu"))
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    swapped = {"fault-free": 0, "straggler": 0}
    with RuntimeEngines() as engines:
        for k in range(args.runs):
            for kind, faults in (("fault-free", NO_FAULTS), ("straggler", STRAGGLER)):
                controller = system_controller(
                    args.system, PROFILE, link_terms=link_terms("emulated", "hook")
                )
                result = run_configuration(
                    controller,
                    backend="emulated",
                    num_iterations=10,
                    engines=engines,
                    delegated=True,
                    faults=faults,
                )
                moved = result.num_moved_workers
                swapped[kind] += any(moved)
                print(f"run {k + 1} {kind}: moved {' '.join(map(str, moved))}", flush=True)
    for kind, num_runs in swapped.items():
        print(f"{kind}: {num_runs} of {args.runs} runs swapped")


if __name__ == "__main__":
    run_script(main)
