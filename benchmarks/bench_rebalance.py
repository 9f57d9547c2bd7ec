"""Falcon's rebalance: a slow PP link in one DP replica under ZB (no mitigation), Falcon
(which gives that replica fewer of the global batch's microbatches) and Adaptra, in the
simulator at 7B (DP 2 x PP 4, the frozen cost model) and in emulated runs (the Falcon tests'
setting: PP 4 x DP 2, 5 ms ops, 8 microbatches per replica).

A delay of 10, 20 or 30 ms per message on PP link 1-2 of replica 1 (pp1:1-2) from measured
iteration 3 on, 30 iterations (emulated: 20 ms, 16 iterations); printed: the median step
(pipeline plus all-reduce) over the last 10 (emulated: 6), the healthy one (the median of
the first 3), and the split Falcon ran last.

Run: python benchmarks/bench_rebalance.py [--sim-only]
(--sim-only: the simulator's 7B table alone, deterministic; the emulated runs are timing.)
"""

from __future__ import annotations

import argparse
import statistics

from harness.policies import system_controller
from harness.runner import RuntimeEngines, link_terms, run_configuration
from injectors.fault_files import parse_yaml
from pipeline.cost_model import MODELS, model_cost
from pipeline.profile import Profile
from pipeline.signals import run_script

SYSTEM_NAMES = ("zb", "falcon", "adaptra")
EMULATED = Profile.uniform(
    4, 8, 5, 5, 5, message_bytes=4096, num_replicas=2,
    allreduce_bytes=3_000_000, dp_bucket_bytes=125_000,
)  # fmt: skip


def _run(
    system: str,
    profile: Profile,
    delay_ms: int,
    num_iterations: int,
    last: int,
    engines: RuntimeEngines | None = None,
) -> tuple[float, float, str]:
    """The median step of the last `last` iterations, the median healthy step (iterations
    0-2), and the split of the last iteration."""
    faults = parse_yaml(f'[{{start_iteration: 3, links: ["pp1:1-2"], delay_ms: {delay_ms}}}]')
    backend = "sim" if engines is None else "emulated"
    run = run_configuration(
        system_controller(system, profile, faults, link_terms=link_terms(backend, "hook")),
        num_iterations=num_iterations,
        faults=faults,
        backend=backend,
        engines=engines,
        delegated=engines is not None and system == "adaptra",
    )
    steps = run.wall_times_ms
    healthy_ms = statistics.median(steps[:3])  # before the fault
    return statistics.median(steps[-last:]), healthy_ms, run.decisions[-1].microbatches or "equal"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--sim-only", action="store_true", help="the simulator's 7B table only (no emulated runs)"
    )
    args = parser.parse_args()
    seven_b = model_cost(MODELS["gpt2-7b-dp2"]).profile
    print("| sim 7B | healthy s | 10 ms s | 20 ms s | 30 ms s | Falcon's split (30 ms) |")
    print("|---|---|---|---|---|---|")
    for system in SYSTEM_NAMES:
        cells, healthy, split = [], 0.0, ""
        for delay_ms in (10, 20, 30):
            step, healthy, split = _run(system, seven_b, delay_ms, 30, 10)
            cells.append(f"{step / 1000:.3f}")
        print(f"| {system} | {healthy / 1000:.3f} | " + " | ".join(cells) + f" | {split} |")
    if args.sim_only:
        return
    print()
    print("| emulated, 20 ms | healthy ms | slow ms | split |")
    print("|---|---|---|---|")
    with RuntimeEngines() as engines:
        for system in SYSTEM_NAMES:
            step, healthy, split = _run(system, EMULATED, 20, 16, 6, engines)
            print(f"| {system} | {healthy:.0f} | {step:.0f} | {split} |", flush=True)


if __name__ == "__main__":
    run_script(main)
