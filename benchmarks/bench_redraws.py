"""What a redrawn normal delay costs the fault model far into an iteration: the first message
`--offsets-s` seconds into a fresh iteration of one link under a normal delay redrawn every
1 ms (the shortest interval a fault timeline takes): its wall time and the fault model's peak
Python memory (tracemalloc) while it is asked. Medians of --repeats, each in a fresh
iteration's `InForce` (a worker's).

Run: python benchmarks/bench_redraws.py [--repeats 3] [--offsets-s 1 60 3600]
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc

from injectors.fault_files import parse_yaml
from pipeline.link_rates import NO_RATES
from pipeline.signals import run_script
from pipeline.topology import Link, Topology

_FAULTS = (
    '[{start_iteration: 0, links: ["0-1"], distribution: {normal: {mean_ms: 20, std_ms: 4},'
    " redraw_every_ms: [1, 1]}}]"
)


def _one(offset_ms: float) -> tuple[float, float]:
    """(seconds, peak MiB) of the first message `offset_ms` into a fresh iteration."""
    in_force = parse_yaml(_FAULTS).at(0, Topology(4), rates=NO_RATES)
    tracemalloc.start()
    started = time.perf_counter()
    in_force.message_fault(Link.pp(0, 0), "forward", "F", 0, 0, offset_ms)
    took_s = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return took_s, peak / (1 << 20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--offsets-s", type=float, nargs="+", default=[1.0, 60.0, 3600.0])
    args = parser.parse_args()
    print("| offset into the iteration | time (median) | peak memory (median) |")
    print("|---|---|---|")
    for offset_s in args.offsets_s:
        runs = [_one(offset_s * 1000) for _ in range(args.repeats)]
        took_ms = 1000 * statistics.median(s for s, _ in runs)
        peak_mib = statistics.median(m for _, m in runs)
        print(f"| {offset_s:g} s | {took_ms:.2f} ms | {peak_mib:.2f} MiB |")


if __name__ == "__main__":
    run_script(main)
