"""Theorem 1 / Fig. 8: the delay cost of one slow link against its slackness.

Run: python benchmarks/bench_theorem1.py

S=2, N=30, t=10 ms per op, x = [1 + Delta, 1] with the in-flight cap. Below the threshold
(Delta - 1) t the cost T(c) - T(0) equals c (asserted in tests/adaptra/test_scheduler.py).
Beyond it, the slope of T against c is measured here, once with the order regenerated for
each delay and once with the fault-free order held fixed, next to the paper's 2N/(Delta+1).
"""

from __future__ import annotations

import argparse

from adaptra.generator import generate_schedule
from pipeline.profile import Profile
from pipeline.signals import run_script
from pipeline.simulator import simulate

NUM_MICROBATCHES, OP_MS = 30, 10.0


def _iteration_ms(delta: int, delay_ms: float, regenerate: bool) -> float:
    base = Profile.uniform(2, NUM_MICROBATCHES, OP_MS, OP_MS, OP_MS)
    profile = base.with_delays([delay_ms])
    schedule = generate_schedule(
        profile if regenerate else base, [1 + delta, 1], cap_in_flight=True
    )
    return simulate(schedule, profile).iterations[0].end_ms


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    print(
        "| Delta | threshold (Delta-1)t | last c with cost = c | slope, regenerated |"
        " slope, fixed order | 2N/(Delta+1) |"
    )
    print("|---|---|---|---|---|---|")
    for delta in range(2, 7):
        fault_free = _iteration_ms(delta, 0.0, True)
        # the first c whose cost is not c, less one: every c up to it costs exactly c
        last_exact = (
            next(c for c in range(1, 200) if _iteration_ms(delta, float(c), True) - fault_free != c)
            - 1
        )
        low, high = (delta - 1) * OP_MS + 20, (delta - 1) * OP_MS + 60
        slopes = [
            (_iteration_ms(delta, high, regen) - _iteration_ms(delta, low, regen)) / (high - low)
            for regen in (True, False)
        ]
        print(
            f"| {delta} | {(delta - 1) * OP_MS:g} ms | {last_exact} ms | {slopes[0]:.2f} | "
            f"{slopes[1]:.2f} | {2 * NUM_MICROBATCHES / (delta + 1):.2f} |"
        )


if __name__ == "__main__":
    run_script(main)
