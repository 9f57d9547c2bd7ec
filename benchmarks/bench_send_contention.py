"""Is a blocking send's cost one number per size on this host? By traffic pattern and by the
sends beside it.

Run: python benchmarks/bench_send_contention.py [--size-mib 8] [--rounds 3] [--iterations 3]

In one pool of 4 workers (S=4, `direct`, 10 ms ops), the calibration's own traffic
(pipeline.runtime.calibrate: every stage the same warm-up, then a backward and a forward in
turn) and the fidelity benchmark's 1F1B and ZB-H2 (N=12, F=B=W=10 ms, no delay), in turn,
`--rounds` times, each `--iterations` measured iterations after a warm-up. For every
message: how long its blocking send held its sender, how many other sends overlapped it (0,
1, 2 or more), and how many of the other stages were inside an op for most of it (sleeping:
not copying). Printed per pattern: the mean send, then the mean by each of the two. If a
send cost one number per size, the patterns' means would agree; if it cost one number per
size and overlap, they would agree within each overlap count.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
from collections.abc import Callable, Iterable

from baselines import one_f_one_b, zb_h2
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerPool
from pipeline.runtime.calibrate import busy_both_ways, busy_profile
from pipeline.signals import run_script
from pipeline.timeline import Timeline
from pipeline.topology import Link

NUM_STAGES = 4


@dataclasses.dataclass(frozen=True, slots=True)
class SendSample:
    others_overlapping: int
    """Other sends overlapping this one (2: two or more)."""
    stages_in_ops: int
    """Other stages inside an op for most of this send."""
    send_ms: float


def send_samples(timeline: Timeline) -> list[SendSample]:
    """One per message of `timeline`."""
    messages = list(timeline.messages)
    ops_by_stage: dict[int, list[tuple[float, float]]] = {}
    for record in timeline.ops:
        ops_by_stage.setdefault(record.stage, []).append((record.start_ms, record.end_ms))
    samples = []
    for message in messages:
        start, end = message.send_start_ms, message.send_end_ms
        overlapping = sum(
            1
            for other in messages
            if other is not message and other.send_start_ms < end and other.send_end_ms > start
        )
        link = Link.parse(message.link)
        sender = link.sender(message.direction).stage
        in_ops = sum(
            _inside(ops, start, end) > 0.5 for stage, ops in ops_by_stage.items() if stage != sender
        )
        samples.append(SendSample(min(overlapping, 2), in_ops, end - start))
    return samples


def _inside(ops: Iterable[tuple[float, float]], start: float, end: float) -> float:
    """The share of [start, end] that falls inside `ops`."""
    covered = sum(max(0.0, min(end, b) - max(start, a)) for a, b in ops)
    return covered / max(end - start, 1e-9)


def _means(samples: list[SendSample], key: Callable[[SendSample], int]) -> str:
    by: dict[int, list[float]] = {}
    for sample in samples:
        by.setdefault(key(sample), []).append(sample.send_ms)
    return ", ".join(f"{k}: {statistics.fmean(v):.2f} ({len(v)})" for k, v in sorted(by.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=3)
    args = parser.parse_args()
    num_bytes = int(args.size_mib * (1 << 20))
    judged = Profile.uniform(NUM_STAGES, 12, 10, 10, 10, message_bytes=num_bytes)
    calibration = busy_profile(NUM_STAGES, num_bytes, 10.0)
    patterns = {
        "calibration": (busy_both_ways(NUM_STAGES, calibration.num_microbatches), calibration),
        "1f1b": (one_f_one_b(judged), judged),
        "zb-h2": (zb_h2(judged), judged),
    }
    samples: dict[str, list[SendSample]] = {name: [] for name in patterns}
    load_before = os.getloadavg()[0]
    iteration = 0
    with WorkerPool(NUM_STAGES, timeout_s=60) as pool:
        for _ in range(args.rounds):
            for name, (schedule, profile) in patterns.items():
                for k in range(args.iterations + 1):
                    config = IterationConfig(iteration, schedule, profile, comm="direct")
                    timeline = pool.run_iteration(config)
                    iteration += 1
                    if k:
                        samples[name] += send_samples(timeline)
    print(f"{args.size_mib:g} MiB sends, ms: mean (count)\n")
    print("| pattern | mean send | by other sends overlapping | by other stages inside an op |")
    print("|---|---|---|---|")
    for name, sends in samples.items():
        mean = statistics.fmean(sample.send_ms for sample in sends)
        overlap = _means(sends, lambda sample: sample.others_overlapping)
        in_ops = _means(sends, lambda sample: sample.stages_in_ops)
        print(f"| {name} | {mean:.2f} ({len(sends)}) | {overlap} | {in_ops} |")
    print(f"\nload average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    run_script(main)
