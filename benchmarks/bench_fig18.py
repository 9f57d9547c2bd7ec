"""Fig. 18: a slow DP ring link under ZB (no mitigation), Falcon, Adaptra-CPU and Adaptra, in
the simulator at 7B (DP 2 x PP 4, the frozen cost model) and in emulated runs scaled to this
machine, next to the calibrated simulator's prediction of those runs.

7B: a delay of 10, 20 or 30 ms per message on stage 1's ring link (dp1:0-1) from measured
iteration 3 on, 30 iterations; printed: the median step (pipeline plus all-reduce) over the
last 10. Emulated: the Fig. 18 test's setting (tests/harness/test_fig18.py: PP 4 x DP 2, 2 ms
ops, 24 chunks per DP link direction), `--repeats` runs per system (the systems in turn) with
the delay at 10, 20, then 30 ms for 9, 6 and 6 iterations; printed: the median over the runs
of each phase's median of its last 5 steps (pipeline and DP ring), the calibrated
simulator's for the same run, and their ratio, and the longest step (the swap's); then the
same for the pipeline alone. Last, the healthy DP ring's step at PP 1, 2
and 4 x DP 2, emulated and predicted.

Run: python benchmarks/bench_fig18.py [--calibration HOST.json] [--repeats 3] [--sim-only]
(HOST.json from `adaptra-bench calibrate --op-ms 2 --out HOST.json`: ops as long as these
runs' ops; --sim-only: the 7B table alone, deterministic, which needs no calibration.)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from harness.policies import SYSTEMS, system_controller
from harness.runner import RuntimeEngines, link_terms, run_configuration
from injectors.fault_files import parse_yaml
from pipeline.cost_model import MODELS, model_cost
from pipeline.host_costs import FREE, HostCosts
from pipeline.profile import Profile
from pipeline.signals import run_script

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' setting, shared
from tests.harness.test_fig18 import PROFILE, phased_faults

PHASES = ((10, 2, 11), (20, 11, 17), (30, 17, 23))
"""(delay ms, first, end) measured iterations on dp1:0-1. The 10 ms phase is the longest: the
swap comes in its first four iterations, and its last five steps then come after it, once
the delegates and Adaptra's plan have settled; in the later phases the last five follow the
first, in which Adaptra sees the new delay."""
FAULTS = phased_faults(PHASES)

SYSTEM_NAMES = ("zb", "falcon", "adaptra-cpu", "adaptra")
PAPER_S = {
    "zb": (1.87, 2.79, 3.94),
    "falcon": (0.64, 0.86, 1.10),
    "adaptra-cpu": (0.54, 0.63, 0.71),
    "adaptra": (0.53, 0.55, 0.56),
}


def phase_medians(times_ms: tuple[float, ...]) -> list[float]:
    """The median of each phase's last five iterations (a late swap's one long iteration
    among them moves no median)."""
    return [statistics.median(times_ms[end - 5 : end]) for _, _, end in PHASES]


def _seven_b(system: str, delay_ms: int) -> float:
    profile = model_cost(MODELS["gpt2-7b-dp2"]).profile
    faults = parse_yaml(f'[{{start_iteration: 3, links: ["dp1:0-1"], delay_ms: {delay_ms}}}]')
    run = run_configuration(system_controller(system, profile, faults), num_iterations=30,
                            faults=faults)  # fmt: skip
    return statistics.median(run.wall_times_ms[-10:])


def _phases(system: str, backend: str, host: HostCosts, engines: RuntimeEngines) -> tuple:
    """Each phase's median step (pipeline and ring) and pipeline time over its last 5
    iterations, and the longest step."""
    run = run_configuration(
        system_controller(system, PROFILE, FAULTS, link_terms=link_terms(backend, "hook")),
        backend=backend,
        num_iterations=PHASES[-1][2],
        faults=FAULTS,
        **(
            {"host": host}
            if backend == "sim"
            else {"engines": engines, "delegated": SYSTEMS[system][1] == "delegated"}
        ),
    )
    steps = run.wall_times_ms
    return phase_medians(steps), phase_medians(run.iteration_times_ms), max(steps)


def _healthy_steps(host: HostCosts, engines: RuntimeEngines) -> None:
    """The healthy step (the DP ring's, 48 chunks of 62.5 kB per link direction) at PP 1, 2
    and 4 x DP 2: emulated (median of 8) against the calibrated simulator."""
    print("| PP x DP | emulated step ms | calibrated sim step ms |")
    print("|---|---|---|")
    for stages in (1, 2, 4):
        profile = Profile.uniform(
            stages, 8, 2, 2, 2, message_bytes=4096, num_replicas=2,
            allreduce_bytes=3_000_000, dp_bucket_bytes=125_000,
        )  # fmt: skip
        steps = {}
        for backend in ("emulated", "sim"):
            run = run_configuration(
                system_controller("1f1b", profile, link_terms=link_terms(backend, "hook")),
                backend=backend, num_iterations=8,
                **({"host": host} if backend == "sim" else {"engines": engines}),
            )  # fmt: skip
            steps[backend] = statistics.median(run.step_times_ms)
        print(f"| {stages} x 2 | {steps['emulated']:.1f} | {steps['sim']:.1f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calibration", help="this host's costs (adaptra-bench calibrate)")
    parser.add_argument("--repeats", type=int, default=1, help="emulated runs per system")
    parser.add_argument(
        "--sim-only", action="store_true", help="the simulator's 7B table only (no emulated runs)"
    )
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    host = HostCosts.from_file(args.calibration) if args.calibration else FREE
    print("| sim 7B | 10 ms s (paper) | 20 ms s (paper) | 30 ms s (paper) |")
    print("|---|---|---|---|")
    for system in SYSTEM_NAMES:
        cells = [
            f"{_seven_b(system, d) / 1000:.3f} ({p})"
            for d, p in zip((10, 20, 30), PAPER_S[system], strict=True)
        ]
        print(f"| {system} | " + " | ".join(cells) + " |", flush=True)
    if args.sim_only:
        return
    print()
    with RuntimeEngines() as engines:
        runs: dict[str, list[tuple]] = {system: [] for system in SYSTEM_NAMES}
        for _ in range(args.repeats):
            for system in SYSTEM_NAMES:
                runs[system].append(_phases(system, "emulated", host, engines))
        predicted = {system: _phases(system, "sim", host, engines) for system in SYSTEM_NAMES}
        for part, what in enumerate(("step (pipeline and ring)", "pipeline")):
            print(f"| emulated {what} | 10 ms: ms (sim, ratio) | 20 ms | 30 ms |"
                  + (" longest step ms |" if part == 0 else ""))  # fmt: skip
            print("|---|---|---|---|" + ("---|" if part == 0 else ""))
            for system in SYSTEM_NAMES:
                phases = zip(*(r[part] for r in runs[system]), strict=True)
                measured = [statistics.median(p) for p in phases]
                cells = [
                    f"{m:.0f} ({p:.0f}, {m / p:.2f})"
                    for m, p in zip(measured, predicted[system][part], strict=True)
                ]
                longest = f" {max(r[2] for r in runs[system]):.0f} |" if part == 0 else ""
                print(f"| {system} | " + " | ".join(cells) + " |" + longest, flush=True)
            print()
        _healthy_steps(host, engines)


if __name__ == "__main__":
    run_script(main)
