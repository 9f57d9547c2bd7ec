"""How long a megatron pool takes from its creation to its first iteration's end, with
megatron-core imported once by the workers' fork server and with each worker importing it.

Run: python benchmarks/bench_megatron_start.py [--repeats 3] [--stages 4]

A megatron pool asks the workers' fork server to import megatron-core before it forks them
(`pipeline.runtime.hooks.preload_in_workers`); that only works where the server has not
started yet. Each repeat runs two fresh interpreters, alternately, each timing a megatron
pool (model tiny, S stages, 1F1B over 4 microbatches) from the fork server's start to the
pool's first iteration's end:
- preloaded: the pool is the process's first, so its server imports torch, the worker and
  megatron-core once, and forks the workers;
- each worker: the server was started just before without megatron-core (as for a process
  whose first pool was not a megatron one), so each worker imports it.
Then each times a second megatron pool, from its creation to its first iteration's end (a
run's second pool, or a test process's next one). Printed: the medians over the repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from pipeline.signals import run_script

ROOT = Path(__file__).resolve().parents[1]

_CHILD = """
import functools, json, multiprocessing.forkserver, sys, time
from baselines import one_f_one_b
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerPool
from pipeline.runtime.hooks import preload_in_workers, worker_context
from pipeline.runtime.megatron import WORKER_IMPORTS, MegatronCompute

preloaded, num_stages = sys.argv[1] == "preloaded", int(sys.argv[2])
profile = Profile.uniform(num_stages, 4, 1, 1, 1)
started = time.monotonic()
if preloaded:
    preload_in_workers(WORKER_IMPORTS)
else:
    worker_context()  # the server's imports without megatron-core
    multiprocessing.forkserver.ensure_running()
    preload_in_workers(WORKER_IMPORTS)  # too late: the server has started
times_s = []
for _ in range(2):  # the process's first megatron pool, then another
    with WorkerPool(num_stages, compute_factory=functools.partial(MegatronCompute, "tiny")) as pool:
        pool.run_iteration(IterationConfig(0, one_f_one_b(profile), profile))
        times_s.append(time.monotonic() - started)
    started = time.monotonic()
print(json.dumps(times_s))
"""

CASES = ("preloaded", "each worker")


def _first_iteration_s(case: str, num_stages: int) -> list[float]:
    """The first pool's time from the server's start, the second's from its creation."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, case.split()[0], str(num_stages)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return [float(t) for t in json.loads(done.stdout.splitlines()[-1])]


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="bench_megatron_start.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stages", type=int, default=4)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores")
    times: dict[str, list[list[float]]] = {case: [] for case in CASES}
    for _ in range(args.repeats):
        for case in CASES:
            times[case].append(_first_iteration_s(case, args.stages))
    print(f"| megatron pool, S = {args.stages} | first pool s | second pool s |")
    print("|---|---|---|")
    for case in CASES:
        first, second = (statistics.median(t[i] for t in times[case]) for i in (0, 1))
        print(f"| {case} | {first:.2f} | {second:.2f} |")


if __name__ == "__main__":
    run_script(main)
