"""How late the runtime stamps a message's arrival (receiver threads, pipeline/runtime/receiver.py).

Run: python benchmarks/bench_arrivals.py [--iterations 5] [--microbatches 32]

Two stages, 1 KiB messages, no injected delay. Stage 0 runs every F first (2 ms each) and so
sends all its activations early; stage 1 is busy with 20 ms F ops the whole time, so its
receiver thread stamps the activations of microbatches 1.. while the compute thread runs. The
lag is stamp - `send_end_ms` (the sender free again) on the host's one monotonic clock: for a
message this small the data is there within microseconds of the send returning, so the lag is
how late the stamp is (it can be a little negative: the sender notes its end after the data
has gone). The compute thread either sleeps (the emulated backend: the GIL released) or spins
in Python (the GIL held, but for the interpreter's switch interval when another thread asks):
at the workers' 0.5 ms switch interval (`SWITCH_INTERVAL_S`) and at Python's default 5 ms.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import torch

from pipeline.ops import Op, OpKind
from pipeline.profile import Profile
from pipeline.runtime import EmulatedCompute, IterationConfig, WorkerPool
from pipeline.runtime.devices import RankDevices
from pipeline.runtime.worker import SWITCH_INTERVAL_S
from pipeline.schedule import Schedule
from pipeline.signals import run_script


class SpinCompute(EmulatedCompute):
    """Stage 1's ops spin in Python for their time instead of sleeping (the GIL held)."""

    def __init__(self, switch_interval_s: float) -> None:
        super().__init__()
        self._switch_interval_s = switch_interval_s
        self._spins = False

    def setup(self, stage: int, num_stages: int, replica: int, devices: RankDevices) -> None:
        super().setup(stage, num_stages, replica, devices)
        self._spins = stage == 1
        sys.setswitchinterval(self._switch_interval_s)  # this worker process only

    def run(
        self, kind: OpKind, microbatch: int, inputs: torch.Tensor | None, profile: Profile
    ) -> torch.Tensor | None:
        if not self._spins:
            return super().run(kind, microbatch, inputs, profile)
        times_ms = {OpKind.F: profile.t_f_ms, OpKind.B: profile.t_b_ms, OpKind.W: profile.t_w_ms}
        deadline = time.monotonic() + times_ms.get(kind, profile.t_b_ms)[1] / 1000.0
        while time.monotonic() < deadline:
            pass
        no_time = (0.0, 0.0)
        return super().run(
            kind,
            microbatch,
            inputs,
            dataclasses.replace(profile, t_f_ms=no_time, t_b_ms=no_time, t_w_ms=no_time),
        )


def _schedule(num_microbatches: int) -> Schedule:
    forwards = [Op(OpKind.F, m) for m in range(num_microbatches)]
    backwards = [Op(OpKind.BW, m) for m in range(num_microbatches)]
    stage_1 = [op for m in range(num_microbatches) for op in (forwards[m], backwards[m])]
    return Schedule((tuple(forwards + backwards), tuple(stage_1)))


def _lags_ms(
    pool: WorkerPool, profile: Profile, iterations: int, counter: list[int]
) -> list[float]:
    """Stamp - send end of the activations stage 1 gets while it computes (after a warm-up)."""
    schedule = _schedule(profile.num_microbatches)
    lags = []
    for k in range(iterations + 1):
        timeline = pool.run_iteration(IterationConfig(counter[0], schedule, profile))
        counter[0] += 1
        if k == 0:
            continue
        for msg in timeline.messages:
            if msg.direction == "forward" and msg.microbatch > 0:
                assert msg.needed_ms > msg.arrival_ms  # it came while stage 1 computed
                lags.append(msg.arrival_ms - msg.send_end_ms)
    return lags


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--microbatches", type=int, default=32)
    args = parser.parse_args()
    profile = Profile(
        num_stages=2,
        num_microbatches=args.microbatches,
        t_f_ms=(2.0, 20.0),
        t_b_ms=(0.0, 0.0),
        t_w_ms=(0.0, 0.0),
        message_bytes=1024,
    )
    print(
        "| stage 1's compute thread | switch interval | messages | lag min ms | median | p90 |"
        " max |"
    )
    print("|---|---|---|---|---|---|---|")
    cases = [
        ("sleeps", EmulatedCompute, SWITCH_INTERVAL_S),
        ("spins in Python", lambda: SpinCompute(SWITCH_INTERVAL_S), SWITCH_INTERVAL_S),
        ("spins in Python", lambda: SpinCompute(0.005), 0.005),
    ]
    for name, factory, interval_s in cases:
        with WorkerPool(2, compute_factory=factory, timeout_s=60) as pool:
            lags = sorted(_lags_ms(pool, profile, args.iterations, [0]))
        p90 = lags[int(0.9 * (len(lags) - 1))]
        print(
            f"| {name} | {1000 * interval_s:g} ms | {len(lags)} | {lags[0]:.3f} | "
            f"{statistics.median(lags):.3f} | {p90:.3f} | {lags[-1]:.3f} |"
        )


if __name__ == "__main__":
    run_script(main)
