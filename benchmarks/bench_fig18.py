"""Fig. 18 so far: ZB against Falcon with a slow DP ring link, in the simulator at 7B (DP 2 x
PP 4, the frozen cost model) and in emulated runs scaled to this machine.

A delay of 10, 20 or 30 ms per message on stage 1's ring link (dp1:0-1) from measured
iteration 3 on (a fault: Falcon needs a healthy baseline to see the change); printed: the
median step (pipeline plus all-reduce) over the last 10 iterations (of 30 in sim, 20
emulated), and when Falcon climbed. Adaptra-CPU and Adaptra do not move a slow DP link
yet (no column).

Run: python benchmarks/bench_fig18.py [--emulated-iterations 20]
"""

from __future__ import annotations

import argparse
import statistics

from baselines.falcon import FalconController
from harness.policies import SYSTEMS, system_controller
from harness.runner import run_configuration
from injectors.fault_files import parse_yaml
from pipeline.cost_model import MODELS, model_cost
from pipeline.profile import Profile

PAPER_S = {"zb": {10: 1.87, 20: 2.79, 30: 3.94}, "falcon": {10: 0.64, 20: 0.86, 30: 1.10}}
EMULATED = Profile.uniform(
    4, 8, 5, 5, 5, message_bytes=4096, num_replicas=2,
    allreduce_bytes=3_000_000, dp_bucket_bytes=125_000,
)  # fmt: skip
"""The tests' scaled setting: 48 chunks per DP link direction against 16 PP messages."""


def _steps(system: str, profile: Profile, delay_ms: int, backend: str, n: int) -> tuple:
    faults = parse_yaml(f'[{{start_iteration: 3, links: ["dp1:0-1"], delay_ms: {delay_ms}}}]')
    controller = system_controller(system, profile, faults)
    delegated = SYSTEMS[system][1] == "delegated"
    result = run_configuration(
        controller, backend=backend, num_iterations=n, faults=faults, delegated=delegated
    )
    steps = [t + s for t, s in zip(result.iteration_times_ms, result.step_times_ms, strict=True)]
    climbs = controller.climbs if isinstance(controller, FalconController) else []
    return statistics.median(steps[-10:]), climbs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--emulated-iterations", type=int, default=20)
    args = parser.parse_args()
    seven_b = model_cost(MODELS["gpt2-7b-dp2"]).profile
    print("| engine | delay | ZB s (paper) | Falcon s (paper) | Falcon's climbs |")
    print("|---|---|---|---|---|")
    for engine, profile, n in (
        ("sim 7B", seven_b, 30),
        ("emulated", EMULATED, args.emulated_iterations),
    ):
        backend = "sim" if engine.startswith("sim") else "emulated"
        for delay in (10, 20, 30):
            zb, _ = _steps("zb", profile, delay, backend, n)
            falcon, climbs = _steps("falcon", profile, delay, backend, n)
            paper = f" ({PAPER_S['zb'][delay]})", f" ({PAPER_S['falcon'][delay]})"
            if backend == "emulated":
                paper = ("", "")
            shown = ", ".join(f"{level.name.lower()} after iteration {k}" for k, level in climbs)
            print(
                f"| {engine} | {delay} ms | {zb / 1000:.3f}{paper[0]} | "
                f"{falcon / 1000:.3f}{paper[1]} | {shown or 'none'} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
