"""What the calibrated simulator misses of a real run: its sends' own times, replayed.

Run: python benchmarks/bench_send_replay.py [--iterations 5] [--calibration HOST.json]
     [--seed 0]

The fidelity benchmark's points (bench_runtime.py: S=4, N=12, F=B=W=10 ms, `direct`) with
no delay and with 20 ms on link 0-1: each measured iteration (after one warm-up, one pool)
is predicted by the calibrated simulator four times, the sends timed as

- `calibrated`: the calibration's cost for the message's size (what `simulate` does);
- `own mean`: the mean of this iteration's own sends, every send alike;
- `shuffled`: this iteration's own send times, dealt to its messages at random (seeded);
- `replayed`: each message its own measured send time.

A longer `direct` send holds its sender and moves its message's arrival, exactly as a fault
delay on its link does (pipeline.simulator), so each variant is the calibrated prediction
with a per-message fault of (measured send - delay - calibrated send). Between `calibrated`
and `own mean` is the calibration's mean against the run's; between `own mean` and
`shuffled`, the spread of the sends (a schedule whose stages wait on each other pays for a
long send more than a short one gives back); between `shuffled` and `replayed`, which sends
were long. What `replayed` still misses is the rest: receive lags (printed beside the
calibration's: a fault cannot replay them, as it holds the sender too), ops' overruns, the
calibration's op overhead. The median over the iterations of each, as measured / predicted.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics

from baselines import one_f_one_b, zb_h2
from pipeline.faults import MessageFault
from pipeline.host_costs import DEFAULT_CALIBRATION_OP_MS, HostCosts
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerPool
from pipeline.runtime.calibrate import measure_host_costs, receive_lags_ms
from pipeline.schedule import Schedule
from pipeline.signals import run_script
from pipeline.simulator import CommMode, simulate
from pipeline.timeline import MessageRecord, Timeline
from pipeline.topology import Direction, Link

SIZES = {"64 KiB": 64 << 10, "1 MiB": 1 << 20, "8 MiB": 8 << 20}
VARIANTS = ("calibrated", "own mean", "shuffled", "replayed")


@dataclasses.dataclass(frozen=True)
class _SendTimes:
    """A fault view that lengthens (or shortens) each PP message of replica 0 by its
    (link, direction, microbatch)'s entry, in ms."""

    extra_ms: dict[tuple[str, str, int], float]

    def message_fault(
        self,
        link: Link,
        direction: Direction,
        kind: str,
        microbatch: int,
        num_bytes: int = 0,
        offset_ms: float = 0.0,
        nic: int = 0,
    ) -> MessageFault:
        return MessageFault(
            self.extra_ms.get((f"{link.first}-{link.second}", direction, microbatch), 0.0)
        )

    def route_failed(self, link: Link, nic: int, offset_ms: float = 0.0) -> bool:
        return False

    def affects(self, link: Link) -> bool:
        return True

    def cache_key(self) -> None:
        return None


def _extra_ms(
    variant: str, messages: list[MessageRecord], calibrated_ms: float, rng: random.Random
) -> dict[tuple[str, str, int], float]:
    """Each message's send time in `variant` less the calibrated one (the delay taken out)."""
    sends = [m.send_end_ms - m.send_start_ms - m.fault_ms for m in messages]
    if variant == "calibrated":
        times = [calibrated_ms] * len(sends)
    elif variant == "own mean":
        times = [statistics.fmean(sends)] * len(sends)
    elif variant == "shuffled":
        times = rng.sample(sends, len(sends))
    else:
        times = sends
    return {
        (m.link, m.direction, m.microbatch): t - calibrated_ms
        for m, t in zip(messages, times, strict=True)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--calibration", help="A calibration file instead of measuring one.")
    parser.add_argument("--seed", type=int, default=0, help="The shuffles' seed.")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    host = (
        HostCosts.from_file(args.calibration)
        if args.calibration
        else measure_host_costs(op_ms=DEFAULT_CALIBRATION_OP_MS)
    )
    rng = random.Random(args.seed)
    print(f"host costs: {host.to_dict()}\n")
    print(
        "| policy | message | delay ms | emulated ms | "
        + " | ".join(f"{v} (ratio)" for v in VARIANTS)
        + " | send mean, sd ms | calibrated send ms | receive lag mean ms | calibrated lag ms |"
    )
    print("|---|---|---|---|" + "---|" * len(VARIANTS) + "---|---|---|---|")
    iteration = 0
    with WorkerPool(4, timeout_s=60) as pool:
        for size_name, num_bytes in SIZES.items():
            for name, build in [("1f1b", one_f_one_b), ("zb-h2", zb_h2)]:
                for delay_ms in (0.0, 20.0):
                    profile = Profile.uniform(
                        4, 12, 10, 10, 10, message_bytes=num_bytes
                    ).with_delays([delay_ms])
                    schedule = build(profile)
                    measured: list[float] = []
                    predicted: dict[str, list[float]] = {v: [] for v in VARIANTS}
                    sends: list[float] = []
                    lags: list[float] = []
                    for k in range(args.iterations + 1):
                        timeline = pool.run_iteration(IterationConfig(iteration, schedule, profile))
                        if k:
                            measured.append(compute_metrics(timeline, iteration).iteration_time_ms)
                            for variant in VARIANTS:
                                predicted[variant].append(
                                    _predict(timeline, schedule, profile, host, variant, rng)
                                )
                            sends += [
                                m.send_end_ms - m.send_start_ms - m.fault_ms
                                for m in timeline.messages
                            ]
                            lags += receive_lags_ms(timeline)
                        iteration += 1
                    emulated = statistics.median(measured)
                    cells = []
                    for variant in VARIANTS:
                        ratios = [a / b for a, b in zip(measured, predicted[variant], strict=True)]
                        cells.append(
                            f"{statistics.median(predicted[variant]):.1f} "
                            f"({statistics.median(ratios):.3f})"
                        )
                    print(
                        f"| {name} | {size_name} | {delay_ms:g} | {emulated:.1f} | "
                        + " | ".join(cells)
                        + f" | {statistics.fmean(sends):.2f}, {statistics.stdev(sends):.2f} | "
                        f"{host.send_ms(num_bytes):.2f} | {statistics.fmean(lags or [0.0]):.2f} | "
                        f"{host.receive_lag_for_ms(num_bytes):.2f} |",
                        flush=True,
                    )
    print(f"\nload average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")


def _predict(
    timeline: Timeline,
    schedule: Schedule,
    profile: Profile,
    host: HostCosts,
    variant: str,
    rng: random.Random,
) -> float:
    extra = _extra_ms(variant, list(timeline.messages), host.send_ms(profile.message_bytes), rng)
    predicted = simulate(schedule, profile, CommMode.DIRECT, host=host, faults=_SendTimes(extra))
    return compute_metrics(predicted).iteration_time_ms


if __name__ == "__main__":
    run_script(main)
