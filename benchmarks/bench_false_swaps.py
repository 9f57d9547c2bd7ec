"""Adaptra's rank swaps in emulated runs on a loaded host: fault-free runs (every swap is a
false one) and runs with a real DP straggler on dp1:0-1 from measured iteration 2 (15 ms, and
10 +- 10 ms drawn per message).

PP 4 x DP 2, 8 microbatches of 5 ms ops, 1 MiB messages, 4 MiB of gradient a stage: one
bucket, two 2 MiB chunks per ring link direction and iteration (the README's dp2 example's
ring), 10 measured iterations after one warm-up, over delegates. Printed per run: the workers
its swaps moved in each measured iteration (2 a swap or an undo); then how many runs swapped.
Load it with benchmarks/under_load.py (the false swaps come with the load).

`--record FILE`: the runs make no swap, and what the detector read of the DP rings in each
iteration (the warm-up's first) is written to FILE as JSON, for replaying swap rules on it
(tests/assets/loaded_host_rings.json, tests/adaptra/control/test_swaps.py).

Run: python benchmarks/under_load.py --runs 1 --busy 2 -- \\
         .venv/bin/python benchmarks/bench_false_swaps.py [--runs 10] [--system adaptra]
         [--record FILE] [--iterations 10]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from adaptra.control import DelegatingController, DetectingController, LinkDetector
from adaptra.control.detector import Belief, Directions
from adaptra.control.swaps import DpSwaps
from harness.policies import system_controller
from harness.runner import RuntimeEngines, link_terms, run_configuration
from injectors.fault_files import parse_yaml
from pipeline.faults import NO_FAULTS
from pipeline.files import atomic_writer
from pipeline.profile import Profile
from pipeline.signals import run_script

PROFILE = Profile.uniform(
    4, 8, 5, 5, 5, message_bytes=1 << 20, num_replicas=2, allreduce_bytes=(4 << 20,) * 4
)
FAULTS = {
    "none": NO_FAULTS,
    "15 ms": parse_yaml('[{start_iteration: 2, links: ["dp1:0-1"], delay_ms: 15}]'),
    "10 +- 10 ms": parse_yaml(
        '[{start_iteration: 2, links: ["dp1:0-1"], delay_ms: 10, jitter_ms: 10}]'
    ),
}


class _NoSwaps(DpSwaps):
    def update(self, belief: Belief, measured_ms: float) -> None:
        """Recording: the placement stays (the times are of one placement)."""


class _RingRecorder:
    """A controller's detector that keeps, per iteration, what it is given of the DP rings."""

    def __init__(self, detector: LinkDetector) -> None:
        self._detector = detector
        self.keys: list[list[Any]] = []
        self.iterations: list[list[Any]] = []

    def believe(self, iteration: int, directions: Directions) -> Belief:
        rings = sorted((key, t) for key, t in directions.items() if key[0].startswith("dp"))
        keys = [[link, str(direction), replica] for (link, direction, replica), _ in rings]
        if self.keys and keys != self.keys:
            raise RuntimeError(f"the ring directions changed: {keys} after {self.keys}")
        (delegated,) = {t.delegated for _, t in rings}
        self.keys = keys
        row = [[round(t.median_ms, 2), round(t.lower_quartile_ms, 2)] for _, t in rings]
        self.iterations.append([delegated, *row])
        return self._detector.believe(iteration, directions)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._detector, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of each kind")
    parser.add_argument("--system", default="adaptra", choices=("adaptra", "adaptra-cpu"))
    parser.add_argument("--iterations", type=int, default=10, help="measured iterations a run")
    parser.add_argument("--record", type=Path, help="make no swap; write the rings' times here")
    args = parser.parse_args()
    if args.runs < 1 or args.iterations < 3:
        parser.error("--runs must be at least 1, --iterations at least 3")
    swapped = dict.fromkeys(FAULTS, 0)
    recorded: list[list[Any]] = []
    keys: list[list[Any]] = []
    with RuntimeEngines() as engines:
        for k in range(args.runs):
            for fault, faults in FAULTS.items():
                controller = system_controller(
                    args.system, PROFILE, link_terms=link_terms("emulated", "hook")
                )
                assert isinstance(controller, DetectingController | DelegatingController)
                if args.record:
                    recorder = _RingRecorder(controller.detector)
                    controller.detector = recorder  # type: ignore[assignment]
                    controller.swaps = _NoSwaps(PROFILE.topology)
                result = run_configuration(
                    controller,
                    backend="emulated",
                    num_iterations=args.iterations,
                    engines=engines,
                    delegated=True,
                    faults=faults,
                )
                moved = result.num_moved_workers
                swapped[fault] += any(moved)
                print(f"run {k + 1} {fault}: moved {' '.join(map(str, moved))}", flush=True)
                if args.record:
                    recorded.append([fault, recorder.iterations])
                    keys = keys or recorder.keys
    if args.record:
        with atomic_writer(args.record) as out:
            json.dump({"directions": keys, "runs": recorded}, out, separators=(",", ":"))
        print(f"recorded {len(recorded)} runs to {args.record}")
    for fault, num_runs in swapped.items():
        print(f"{fault}: {num_runs} of {args.runs} runs swapped")


if __name__ == "__main__":
    run_script(main)
