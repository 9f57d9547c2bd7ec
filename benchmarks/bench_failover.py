"""NIC failover of the delegate transport (adaptra.transport): how long it takes, what it
costs an iteration, and what it saves a run.

Run (root: the namespace testbed): python benchmarks/bench_failover.py [--failures 10]
(`--sim-only FAILOVER_MS`: part 3 alone)

1. The testbed: Adaptra over delegates (S=4, N=8, 2 ms ops, 64 KiB messages, D=2); the NIC
   of stage 1's host in use goes down at a seeded random point of every other iteration
   (rnic0, then rnic1 once rnic0 is back, and so on), `--failures` times. Per failure: from
   the NIC going down (the start of the testbed's call that sets it down) to the first and
   the last of the moving senders noticing it (siblings told by their trainer not counted),
   from noticing to the new connection taking over (the senders' median), the first message
   of the host's link directions delivered after the failure (from when it could go: the
   failure, or its pick-up if later, to its arrival), and the time of its iteration and the
   next past the healthy median's. Then a few failures with the receivers' notices off: the
   senders on the far side notice by TCP's user timeout alone.
2. The scaled Table 3 trace (harness/presets/table3_trace_s4.txt, its NIC failure at
   iteration 103) in emulated runs of 1F1B, ZB, Adaptra-CPU and Adaptra (hook injection:
   the delays real sleeps, the failure the fault hook's): run wall time, samples/s,
   restarts and lost iterations.
3. The paper's whole trace at 140B on 128 GPUs in sim (harness/presets/table3_trace.yaml)
   with the failover time measured here (`failover_ms` of a calibration).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness.loop import Recovery, run_loop
from harness.network import TESTBED_LINK_TERMS, network_engine
from harness.policies import system_controller
from harness.runner import link_terms, run_configuration
from injectors.fault_files import load_faults, parse_yaml
from pipeline.host_costs import HostCosts
from pipeline.profile import Profile
from pipeline.signals import run_script
from pipeline.timeline import Timeline

PRESETS = Path(__file__).parents[1] / "harness" / "presets"
HOST = 1
"""The host whose NIC fails: stage 1's (links 0-1 and 1-2)."""


Figures = dict[str, float | str]


def _testbed(num_failures: int, notices: bool, seed: int) -> list[Figures]:
    """One testbed run with `num_failures` failures; a row of figures per failure."""
    profile = Profile.uniform(4, 8, 2, 2, 2, message_bytes=1 << 16, num_delegates=2)
    rng = random.Random(seed)
    healthy_ms = 60.0  # about one iteration here: the failures land anywhere inside it
    events = [
        {
            "start_iteration": 2 + 2 * k,
            "end_iteration": 4 + 2 * k,
            "at_ms": round(rng.uniform(0, healthy_ms), 1),
            "nic": f"host{HOST}:rnic{k % 2}",
            "down": True,
        }
        for k in range(num_failures)
    ]
    faults = parse_yaml(json.dumps(events))
    num_iterations = 2 + 2 * num_failures
    with network_engine(profile, delegated=True, notices=notices) as engine:
        result = run_loop(
            engine,
            system_controller("adaptra-oracle", profile, faults, link_terms=TESTBED_LINK_TERMS),
            num_iterations=num_iterations,
            num_warmup_iterations=1,
            faults=faults,
        )
        downs = [c for c in engine.nic_changes if not c.up]  # type: ignore[attr-defined]
    assert result.restarts == 0 and result.timeline is not None
    timeline = result.timeline
    times = result.iteration_times_ms
    # A failure's cost may spill into the next iteration (a far sender with nothing in
    # flight notices at its next send): healthy ones are neither of the two.
    hit = {down.iteration + k for down in downs for k in (0, 1)}
    median_ms = statistics.median(t for k, t in enumerate(times) if k + 1 not in hit)
    return [_figures(timeline, down.iteration, down.at_ms, times, median_ms) for down in downs]


def _figures(
    timeline: Timeline, iteration: int, at_ms: float, times: tuple[float, ...], median_ms: float
) -> Figures:
    start = next(r.start_ms for r in timeline.iterations if r.iteration == iteration)
    down_ms = start + at_ms
    moved = [f for f in timeline.failovers if f.iteration in (iteration, iteration + 1)]
    moved = [f for f in moved if f.noticed_ms >= down_ms - 1.0 and f.cause != "sibling"]
    host_links = {f"{HOST - 1}-{HOST}", f"{HOST}-{HOST + 1}"}
    after = [m for m in timeline.messages if m.link in host_links and m.arrival_ms > down_ms]
    first = min(after, key=lambda m: m.arrival_ms)  # the first in over the other NIC
    noticed = [f.noticed_ms - down_ms for f in moved]
    return {
        "first_noticed_ms": min(noticed),
        "last_noticed_ms": max(noticed),
        "took_over_ms": statistics.median(f.resumed_ms - f.noticed_ms for f in moved),
        # from when it could go (the failure, or its pick-up if later) to its arrival
        "first_delivery_ms": first.arrival_ms - max(down_ms, first.wire_start_ms),
        # its iteration and the next (measured iterations count from 0, run ones from 1)
        "extra_ms": sum(times[iteration - 1 : iteration + 1]) - 2 * median_ms,
        "causes": ",".join(sorted({f.cause for f in moved})),
    }


def _summary(rows: list[Figures], key: str) -> str:
    values = [float(row[key]) for row in rows]
    return f"{statistics.median(values):.1f} / {max(values):.1f}"


def _table3_emulated() -> list[str]:
    faults = load_faults(PRESETS / "table3_trace_s4.txt")
    profile = Profile.uniform(4, 4, 1, 1, 1, message_bytes=1024, num_delegates=2)
    lines = [
        "| system | restarts | lost iterations | iterations run | run wall s | samples/s |",
        "|---|---|---|---|---|---|",
    ]
    for system in ("1f1b", "zb", "adaptra-cpu", "adaptra", "adaptra-oracle"):
        started = time.monotonic()
        result = run_configuration(
            system_controller(system, profile, faults, link_terms=link_terms("emulated", "hook")),
            backend="emulated",
            num_iterations=120,
            num_warmup_iterations=1,
            faults=faults,
            recovery=Recovery(checkpoint_every=50),
            keep_timeline=False,
            delegated=system.startswith("adaptra"),
        )
        wall_s = time.monotonic() - started
        samples = 120 * profile.num_microbatches
        lines.append(
            f"| {system} | {result.restarts} | {result.lost_iterations} | "
            f"{len(result.iteration_times_ms)} | {wall_s:.1f} | {samples / wall_s:.1f} |"
        )
    return lines


def _table3_sim(failover_ms: float) -> list[str]:
    from harness.experiment import run_experiment
    from harness.results import RUNS_COLUMNS, read_csv_rows
    from harness.spec import load_spec

    with tempfile.TemporaryDirectory() as folder:
        calibration = Path(folder) / "failover.json"
        costs = HostCosts(failover_ms=failover_ms, host=platform.node())  # measured here
        calibration.write_text(json.dumps(costs.to_dict()))
        spec = load_spec(PRESETS / "table3_trace.yaml")
        spec = dataclasses.replace(spec, calibration=str(calibration))
        run_dir = run_experiment(spec, Path(folder) / "t3", progress=lambda _: None)
        runs = read_csv_rows(run_dir / "runs.csv", RUNS_COLUMNS)
    lines = [
        "| system | restarts | lost iterations | wall min | samples/s |",
        "|---|---|---|---|---|",
    ]
    for row in runs:
        samples_per_s = float(row["throughput_samples_per_s"])
        wall_min = 1200 * spec.targets()[0].samples_per_iteration / samples_per_s / 60
        lines.append(
            f"| {row['system']} | {row['restarts']} | {row['lost_iterations']} | "
            f"{wall_min:.1f} | {samples_per_s:.2f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--failures", type=int, default=10)
    parser.add_argument("--timeout-failures", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--sim-only",
        type=float,
        metavar="FAILOVER_MS",
        help="run part 3 alone, with this failover time (no root needed)",
    )
    args = parser.parse_args()
    if args.sim_only is not None:
        print(f"Table 3 at 140B on 128 GPUs, sim, failover_ms = {args.sim_only:.2f}:")
        print("\n".join(_table3_sim(args.sim_only)))
        return
    if os.geteuid() != 0:
        sys.exit("the testbed needs root")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    rows = _testbed(args.failures, notices=True, seed=args.seed)
    slow = _testbed(args.timeout_failures, notices=False, seed=args.seed + 1)
    keys = ("first_noticed_ms", "last_noticed_ms", "took_over_ms", "first_delivery_ms")
    print(
        "\n| path | failures | first sender noticed ms | last sender noticed ms | "
        "took over ms | first delivery ms | extra ms (2 iterations) |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, found in (("netlink and notices", rows), ("netlink and TCP's timeout", slow)):
        cells = [_summary(found, key) for key in (*keys, "extra_ms")]
        print(f"| {name} | {len(found)} | {' | '.join(cells)} |")
    causes = "; ".join(str(row["causes"]) for row in rows + slow)
    print(f"(median / max per failure; causes: {causes})")
    took_over = statistics.median(float(row["took_over_ms"]) for row in rows)
    print("\nTable 3, scaled (4 stages, 120 iterations), emulated:")
    print("\n".join(_table3_emulated()))
    print(f"\nTable 3 at 140B on 128 GPUs, sim, failover_ms = {took_over:.2f}:")
    print("\n".join(_table3_sim(took_over)))
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    run_script(main)
