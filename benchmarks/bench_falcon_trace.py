"""Falcon's ski-rental decisions over the scaled-down paper trace with DP events added, next to
ZB, Adaptra-CPU and Adaptra (the simulator).

The trace: harness/presets/table3_trace_s4.txt (the paper's Table 3 / Fig. 21 trace scaled
to 4 stages and 120 iterations: PP link delays), up to its NIC failure at iteration 103, on
PP 4 x DP 2 (the Falcon tests' setting: 5 ms ops, 8 microbatches, 48 chunks of 62.5 kB per
DP link direction), plus three DP ring link events: 30 ms on dp1:0-1 in iterations 14-19
(short), 40 ms on dp2:0-1 in 45-79 (long) and 10 ms on dp0:0-1 in 85-88 (short). Falcon's
costs are its own (`FalconCosts.for_profile`: the swap's state over the DP link plus a
healthy iteration; the restart's half a checkpoint interval of 500). Printed: each system's
total time over the 100 iterations and its median step, the DP links it believed slow, and
what it did: Falcon's climbs, the swaps Adaptra-CPU and Adaptra made.

Run: python benchmarks/bench_falcon_trace.py
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from adaptra.control import DelegatingController, DetectingController
from baselines.falcon import FalconController
from harness.loop import RunResult
from harness.policies import system_controller
from harness.runner import run_configuration
from injectors.fault_files import load_faults, parse_yaml
from injectors.fault_model import FaultModel
from pipeline.profile import Profile
from pipeline.signals import run_script
from pipeline.topology import is_dp_link

PROFILE = Profile.uniform(
    4, 8, 5, 5, 5, message_bytes=4096, num_replicas=2,
    allreduce_bytes=3_000_000, dp_bucket_bytes=125_000,
)  # fmt: skip
NUM_ITERATIONS = 100
TRACE = Path(__file__).resolve().parents[1] / "harness" / "presets" / "table3_trace_s4.txt"
DP_EVENTS = parse_yaml(
    '[{start_iteration: 14, end_iteration: 20, links: ["dp1:0-1"], delay_ms: 30},'
    ' {start_iteration: 45, end_iteration: 80, links: ["dp2:0-1"], delay_ms: 40},'
    ' {start_iteration: 85, end_iteration: 89, links: ["dp0:0-1"], delay_ms: 10}]'
)


def _dp_beliefs(result: RunResult) -> str:
    """The DP ring links the controller believed slow, as runs of measured iterations (after
    a restart the lost iterations run again: "again")."""
    runs: list[tuple[str, int, int, int]] = []
    rerun, last = 0, -1
    for k, decision in zip(result.iterations, result.decisions, strict=True):
        rerun, last = rerun + (k <= last), k
        for name in sorted(n for n in decision.detected_ms if is_dp_link(n)):
            match = next(
                (i for i, r in enumerate(runs) if r[:1] == (name,) and r[2:] == (k - 1, rerun)),
                None,
            )
            if match is None:
                runs.append((name, k, k, rerun))
            else:
                runs[match] = (name, runs[match][1], k, rerun)
    shown = [f"{name} {a}-{b}" + (" again" if again else "") for name, a, b, again in runs]
    return ", ".join(shown) or "none"


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    trace = load_faults(TRACE)
    events = [e for e in trace.events if e.start_iteration < NUM_ITERATIONS]
    faults = FaultModel(
        tuple(sorted([*events, *DP_EVENTS.events], key=lambda e: e.start_iteration))
    )
    print("| system | total s | median step ms | DP links believed (measured iterations) "
          "| actions |")  # fmt: skip
    print("|---|---|---|---|---|")
    for system in ("zb", "falcon", "adaptra-cpu", "adaptra"):
        controller = system_controller(system, PROFILE, faults)
        result = run_configuration(controller, num_iterations=NUM_ITERATIONS, faults=faults)
        if isinstance(controller, FalconController):
            # A climb seen in the run's iteration k (the warm-up is 0) acts from measured k.
            done = [(k, lv.name.lower()) for k, lv in controller.climbs]
            done += [(k, "swap undone") for k in controller.undone]
            actions = ", ".join(f"{what} at {k}" for k, what in sorted(done))
        elif isinstance(controller, DetectingController | DelegatingController):
            actions = f"{controller.swaps.num_swaps} swap(s)"
        else:
            actions = "none"
        print(
            f"| {system} | {result.total_ms / 1000:.2f} | "
            f"{statistics.median(result.wall_times_ms):.0f} | {_dp_beliefs(result)} | "
            f"{actions or 'none'} |",
            flush=True,
        )


if __name__ == "__main__":
    run_script(main)
