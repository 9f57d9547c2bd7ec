"""Adaptra's detector-driven controller (adaptra.control) against its oracle, the baselines
and ground truth, in emulated runs (hook injection: the delays are real sleeps in the
workers; the controller sees only the messages' timestamps).

Run: python benchmarks/bench_detector.py [--scenarios 20] [--healthy 1000] [--dp-healthy 300]
     [--sections 1,2,3]

1. The scaled Table 3 trace (harness/presets/table3_trace_s4.txt) under 1F1B, ZB, Adaptra-CPU,
   Adaptra (detector) and Adaptra's oracle: wall time, samples/s, median iteration, restarts;
   what detecting costs (per change of the delays in force, the iterations until the
   controller's plan matched it) and the planning time per re-plan.
2. Dynamic stragglers: 30 +- 10 ms (normal) on link 1-2, redrawn every 50-400 ms: median
   iteration time per system, and how often Adaptra re-planned.
3. Accuracy over seeded scenarios (one or two slow links of 10-60 ms from a random
   iteration): detection rate, latency in iterations (median, max), the estimates' mean
   error; then false alarms in `--healthy` fault-free iterations. Then the same with PP 4 x
   DP 2, the slow links drawn from the PP and the DP ring links (`--dp-healthy` fault-free
   iterations).
4. A DP ring of few, large chunks: fault-free PP 4 x DP 2 with each stage's 16 MiB gradient
   in one, four or sixteen buckets: iterations with a link called slow, and rank swaps.
5. A fresh job's first iteration (`--fresh-runs` fault-free `run`s of Adaptra at PP 3 x DP
   2, 1 MiB messages, each a process of its own): the measured iteration 0s planned for a
   slow PP link (the warm-up's belief) and run over delegates, and the later iterations
   planned for one. Meant beside busy processes (benchmarks/under_load.py); with
   PYTHONPATH at another checkout, its runs are that code's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from adaptra.control import DetectingController
from adaptra.scheduler import plan_adaptra
from harness.loop import Recovery, RunResult
from harness.policies import system_controller
from harness.runner import RuntimeEngines, link_terms, run_configuration
from injectors.fault_files import load_faults, parse_yaml
from pipeline.engines import Controller, Plan
from pipeline.faults import NO_FAULTS, FaultView
from pipeline.profile import Profile
from pipeline.signals import run_script
from pipeline.topology import Link, Topology

PRESETS = Path(__file__).parents[1] / "harness" / "presets"
SYSTEMS = ("1f1b", "zb", "adaptra-cpu", "adaptra", "adaptra-oracle")


def _run(
    system: str,
    profile: Profile,
    faults: FaultView,
    num_iterations: int,
    engines: RuntimeEngines,
    placements: set[Topology] | None = None,
) -> tuple[RunResult, float, Controller]:
    """One run; `placements`, if given, gets every placement its plans ran (rank swaps)."""
    started = time.monotonic()
    controller = system_controller(
        system, profile, faults, link_terms=link_terms("emulated", "hook")
    )
    if placements is not None:
        planned = controller.plan

        def plan(iteration: int) -> Plan:
            made = planned(iteration)
            placements.add(made.topology or profile.topology)
            return made

        controller.plan = plan  # type: ignore[method-assign]
    result = run_configuration(
        controller,
        backend="emulated",
        num_iterations=num_iterations,
        faults=faults,
        recovery=Recovery(checkpoint_every=50),
        keep_timeline=False,
        engines=engines,
        delegated=system.startswith("adaptra"),
    )
    return result, time.monotonic() - started, controller


def _believed(result: RunResult) -> list[frozenset[str]]:
    return [frozenset(d.detected_ms) for d in result.decisions]


def _table3(engines: RuntimeEngines) -> None:
    faults = load_faults(PRESETS / "table3_trace_s4.txt")
    profile = Profile.uniform(4, 4, 1, 1, 1, message_bytes=1024, num_delegates=2)
    print("| system | restarts | iterations run | run wall s | samples/s | median iteration ms |")
    print("|---|---|---|---|---|---|")
    results = {}
    for system in SYSTEMS:
        result, wall_s, _ = _run(system, profile, faults, 120, engines)
        results[system] = result
        samples = 120 * profile.num_microbatches
        print(
            f"| {system} | {result.restarts} | {len(result.iteration_times_ms)} | {wall_s:.1f} "
            f"| {samples / wall_s:.1f} | {result.median_iteration_ms:.1f} |"
        )
    detector, oracle = results["adaptra"], results["adaptra-oracle"]
    if detector.restarts or oracle.restarts:
        print("(a restart: the per-iteration comparison below is of the runs' first pass)")
    truth, seen = _believed(oracle), _believed(detector)
    lags, lag = [], None
    for k in range(1, len(truth)):
        if truth[k] != truth[k - 1]:
            lag = 0
        if lag is not None:
            if k < len(seen) and seen[k] == truth[k]:
                lags.append(lag)
                lag = None
            else:
                lag += 1
    extra = sum(detector.iteration_times_ms) / sum(oracle.iteration_times_ms) - 1
    planning_ms = []
    for delays in ((0.0, 30.0, 0.0), (20.0, 0.0, 40.0), (0.0, 0.0, 60.0)):
        started = time.perf_counter()
        plan_adaptra(profile.with_delays(delays))
        planning_ms.append((time.perf_counter() - started) * 1000.0)
    print(f"planning one delay vector: {statistics.median(planning_ms):.1f} ms (median of 3)")
    print(
        f"\nchanges of the delays in force: {len(lags)}; iterations until the detector's "
        f"plan matched: median {statistics.median(lags) if lags else 0}, max "
        f"{max(lags, default=0)}; iteration time summed: detector {extra:+.1%} against the "
        "oracle"
    )


def _dynamic(engines: RuntimeEngines) -> None:
    faults = parse_yaml(
        '[{start_iteration: 0, links: ["1-2"], distribution: {normal: {mean_ms: 30, std_ms: 10},'
        " redraw_every_ms: [50, 400]}}]"
    )
    profile = Profile.uniform(4, 8, 10, 10, 10, message_bytes=1 << 16, num_delegates=4)
    print("\n| system | median iteration ms | mean iteration ms | re-plans |")
    print("|---|---|---|---|")
    for system in SYSTEMS:
        result, _, controller = _run(system, profile, faults, 40, engines)
        beliefs = [d.detected_ms for d in result.decisions]
        changes = sum(1 for a, b in itertools.pairwise(beliefs) if a != b)
        replans = {"adaptra-oracle": str(changes)}
        if isinstance(controller, DetectingController):
            replans[system] = str(controller.num_replans)
        print(
            f"| {system} | {result.median_iteration_ms:.1f} | "
            f"{statistics.fmean(result.iteration_times_ms):.1f} | {replans.get(system, '-')} |"
        )


def _healthy_links(
    topology: Topology, placements: Iterable[Topology], slow: Iterable[str]
) -> Callable[[Iterable[str]], list[str]]:
    """Which of the links a belief names are healthy: those that join no slow host pair
    (`slow`'s, under the default placement `topology`: a fault is on hosts) under any of
    the run's `placements` (a rank swap moves a slow DP pair onto a PP edge, where the
    detector sees its delay next, and may put another slow pair on a ring)."""
    slow_pairs = {
        frozenset(topology.hosts_of(concrete))
        for name in slow
        for concrete in topology.expand(Link.parse(name))
    }

    def joins_slow_pair(name: str) -> bool:
        return any(
            frozenset(placed.hosts_of(concrete)) in slow_pairs
            for placed in placements
            for concrete in placed.expand(Link.parse(name))
        )

    return lambda names: [name for name in names if not joins_slow_pair(name)]


def _accuracy(
    engines: RuntimeEngines,
    profile: Profile,
    links_to_draw: list[str],
    num_scenarios: int,
    num_healthy: int,
    seed: int,
) -> None:
    rng = random.Random(seed)
    found, latencies, errors = 0, [], []
    wrong_links = 0
    for _ in range(num_scenarios):
        links = rng.sample(links_to_draw, rng.choice([1, 2]))
        delays = {link: rng.choice([10, 20, 30, 40, 50, 60]) for link in links}
        onset = rng.randrange(3, 10)
        rows = ", ".join(
            f'{{start_iteration: {onset}, links: ["{link}"], delay_ms: {delay}}}'
            for link, delay in delays.items()
        )
        placements: set[Topology] = set()
        result, _, _ = _run(
            "adaptra", profile, parse_yaml(f"[{rows}]"), onset + 6, engines, placements
        )
        # the decision of measured iteration k is from what iteration k - 1 measured
        hit = next(
            (k for k in range(onset + 1, len(result.decisions))
             if set(result.decisions[k].detected_ms) == set(delays)),
            None,
        )  # fmt: skip
        healthy = _healthy_links(profile.topology, placements, delays)
        wrong = {
            k: healthy(d.detected_ms)
            for k, d in enumerate(result.decisions)
            if k > onset and healthy(d.detected_ms)
        }
        if wrong:
            wrong_links += 1
            print(f"{rows}: healthy links called slow (measured iteration: links) {wrong}")
        if hit is not None:
            found += 1
            latencies.append(hit - onset)
            errors += [abs(result.decisions[hit].detected_ms[k] - d) for k, d in delays.items()]
    print(
        f"\n{num_scenarios} scenarios (links from {', '.join(links_to_draw)}): detected {found} "
        f"({found / num_scenarios:.0%}); latency in iterations from the onset to the first "
        f"iteration that believed it: median "
        f"{statistics.median(latencies) if latencies else '-'}, max "
        f"{max(latencies, default='-')}; mean estimate error "
        f"{statistics.fmean(errors) if errors else float('nan'):.2f} ms; scenarios with a "
        f"healthy link called slow: {wrong_links}"
    )
    result, _, _ = _run("adaptra", profile, NO_FAULTS, num_healthy, engines)
    alarms = sum(1 for d in result.decisions if d.detected_ms)
    print(f"false alarms: {alarms} in {num_healthy} fault-free iterations")


def _few_chunks(engines: RuntimeEngines, num_iterations: int) -> None:
    """Fault-free runs of PP 4 x DP 2 with each stage's 16 MiB gradient (the README's example
    `dp2.json` until 2026-12-06, 10 ms ops, 1 MiB messages) in buckets of 16, 4 and 1 MiB: 2,
    8 and 32 chunks per ring link direction an iteration. Iterations with a link called
    slow, and swaps."""
    print(
        f"\n| DP bucket MiB | chunks per direction (MiB each) | of {num_iterations} iterations: "
        "a link called slow | rank swaps (of them undone) |"
    )
    print("|---|---|---|---|")
    for bucket_mib in (16, 4, 1):
        profile = Profile.uniform(
            4, 12, 10, 10, 10, message_bytes=1 << 20, num_replicas=2,
            allreduce_bytes=16 << 20, dp_bucket_bytes=bucket_mib << 20,
        )  # fmt: skip
        result, _, controller = _run("adaptra", profile, NO_FAULTS, num_iterations, engines)
        alarms = sum(1 for d in result.decisions if d.detected_ms)
        assert isinstance(controller, DetectingController)
        swaps, undone = controller.swaps.num_swaps, controller.swaps.num_undone
        chunks = 2 * (16 // bucket_mib)
        print(f"| {bucket_mib} | {chunks} ({bucket_mib / 2:g}) | {alarms} | {swaps} ({undone}) |")


def _fresh_jobs(num_runs: int) -> None:
    """Section 5: fault-free `run`s, each a process of its own (its pool, fork server and
    imports cold, as a user's run): the measured iteration 0s planned for a slow PP link
    (what the warm-up was believed to show) and run over delegates, and the later
    iterations planned for one."""
    profile = {
        "stages": 3, "microbatches": 6, "t_f": 10, "t_b": 10, "t_w": 10,
        "message_bytes": 1 << 20, "dp": 2, "allreduce_bytes": [2 << 20] * 3,
    }  # fmt: skip
    pp_links = {"0-1", "1-2"}
    first_slow = first_delegated = later_slow = num_later = 0
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "profile.json")
        path.write_text(json.dumps(profile))
        for _ in range(num_runs):
            ran = subprocess.run(
                [sys.executable, "-m", "harness", "run", "--backend", "emulated",
                 "--profile", str(path), "--system", "adaptra", "--iterations", "3",
                 "--format", "json"],
                capture_output=True, text=True, check=True, timeout=600,
            )  # fmt: skip
            records = json.loads(ran.stdout)["iterations"]
            slow = [bool(set(r["detected_ms"]) & pp_links) for r in records]
            first_slow += slow[0]
            first_delegated += "delegated" in records[0]["comm"].values()
            later_slow += sum(slow[1:])
            num_later += len(slow) - 1
    print(
        f"\n{num_runs} fresh runs: measured iteration 0 planned for a slow PP link in "
        f"{first_slow}, run over delegates in {first_delegated}; later iterations planned "
        f"for one: {later_slow} of {num_later}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scenarios", type=int, default=20)
    parser.add_argument("--healthy", type=int, default=1000)
    parser.add_argument("--dp-healthy", type=int, default=300)
    parser.add_argument("--few-chunks-iterations", type=int, default=40)
    parser.add_argument("--fresh-runs", type=int, default=20)
    parser.add_argument(
        "--sections", default="1,2,3,4,5", help="which of the sections above to run (default all)"
    )
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    with RuntimeEngines() as engines:
        if "1" in sections:
            _table3(engines)
        if "2" in sections:
            _dynamic(engines)
        if "3" in sections:
            pp = Profile.uniform(4, 8, 2, 2, 2, message_bytes=4096, num_delegates=4)
            _accuracy(engines, pp, ["0-1", "1-2", "2-3"], args.scenarios, args.healthy, seed=11)
            # PP 4 x DP 2, with the ring links (each stage's: 6 chunks of 125 kB each way)
            dp = Profile.uniform(
                4, 8, 2, 2, 2, message_bytes=4096, num_delegates=4, num_replicas=2,
                allreduce_bytes=750_000, dp_bucket_bytes=250_000,
            )  # fmt: skip
            links = ["0-1", "1-2", "2-3", *(f"dp{stage}:0-1" for stage in range(4))]
            _accuracy(engines, dp, links, args.scenarios, args.dp_healthy, seed=12)
        if "4" in sections:
            _few_chunks(engines, args.few_chunks_iterations)
    if "5" in sections:
        _fresh_jobs(args.fresh_runs)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    run_script(main)
