"""What `profile --backend megatron` holds per worker as --microbatches grows: the peak
resident memory (VmHWM) of each stage's worker process while `measure_profile` runs, for the
default measuring order and for every F, then every B, then every W (the order before
ZB-H1's became the default), alternated in one run. Medians over --repeats of the largest
worker's peak.

Run: python benchmarks/bench_profile_memory.py [--model small] [--stages 2]
         [--microbatches 4 16 64] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
from pathlib import Path

from pipeline.ops import Op, OpKind
from pipeline.runtime.megatron.profiling import measure_profile
from pipeline.schedule import Schedule
from pipeline.signals import run_script


def every_f_then_b_then_w(num_stages: int, num_microbatches: int) -> Schedule:
    order = tuple(
        Op(kind, m) for kind in (OpKind.F, OpKind.B, OpKind.W) for m in range(num_microbatches)
    )
    return Schedule((order,) * num_stages)


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                found.append(child)
                todo.append(child)
    return found


def _vm_hwm_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class PeakSampler:
    """Every 50 ms, each descendant process's VmHWM (a peak, so a sample before it ends is
    enough); `largest_mib`: the largest seen beside this process's own."""

    def __init__(self) -> None:
        self.peaks_mib: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            for pid in _descendants(os.getpid()):
                mib = _vm_hwm_mib(pid)
                if mib is not None:
                    self.peaks_mib[pid] = max(mib, self.peaks_mib.get(pid, 0.0))


def _one(model: str, num_stages: int, num_microbatches: int, old_order: bool) -> float:
    schedule = every_f_then_b_then_w(num_stages, num_microbatches) if old_order else None
    with PeakSampler() as sampler:
        measure_profile(model, num_stages, num_microbatches, num_iterations=1, schedule=schedule)
    # the largest process that ran: a stage's worker (the fork server holds no model)
    return max(sampler.peaks_mib.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="small")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--microbatches", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print(f"{args.model}, {args.stages} stages: the largest worker's peak resident memory")
    print("| microbatches | default order (ZB-H1) | every F, then every B, then every W |")
    print("|---|---|---|")
    for num_microbatches in args.microbatches:
        runs: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.repeats):
            for old_order in (True, False):
                runs[old_order].append(_one(args.model, args.stages, num_microbatches, old_order))
        new_mib, old_mib = (statistics.median(runs[o]) for o in (False, True))
        print(f"| {num_microbatches} | {new_mib:.0f} MiB | {old_mib:.0f} MiB |", flush=True)


if __name__ == "__main__":
    run_script(main)
