"""What TCP adds to a delay on the testbed's wire: the machine's TCP defaults against the
testbed's own (injectors.testbed: Reno, initial windows of 128 segments, 8 MiB buffers,
MTU and GSO size 9,000), as the detector estimates a link's delay from the messages'
timestamps.

Run (as root): python benchmarks/bench_testbed_tcp.py [--iterations 8]

Two scenarios per message size (4 KiB, 64 KiB, 1 MiB), S=4, N=8, 2 ms ops, Adaptra's
controller over the delegates, 30 ms on link 1-2 on the testbed's wire:
- `steady`: the delay from the first iteration on (the profile's `delay_ms`);
- `onset`: from measured iteration 2 to 5 (a fault), on connections that were made before
  the path became long.
Printed: the detector's estimate of link 1-2 per iteration in which it was slow (ms) and
their median and max. The true delay is 30 ms; what is above it is TCP's (and the wire's).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterator
from contextlib import contextmanager

import injectors.testbed as testbed
from harness.network import TESTBED_LINK_TERMS
from harness.policies import system_controller
from harness.runner import run_configuration
from injectors.fault_files import parse_yaml
from pipeline.faults import NO_FAULTS
from pipeline.profile import Profile
from pipeline.signals import run_script

SIZES = {"4 KiB": 4096, "64 KiB": 65536, "1 MiB": 1 << 20}
ONSET_ITERATIONS = (2, 6)
"""`onset`'s fault: from this measured iteration to before that one"""
MIN_ITERATIONS = ONSET_ITERATIONS[0] + 2
"""With fewer, `onset` has no estimate of its delay: an iteration's estimate is the plan made
before it, from the iterations before (the first slow one's holds none)"""


@contextmanager
def machine_defaults() -> Iterator[None]:
    """Testbeds built inside take the machine's TCP and an MTU (and GSO size) of 1,500."""
    saved = testbed.HOST_TCP, testbed.ROUTE_METRICS, testbed.MTU
    testbed.HOST_TCP, testbed.ROUTE_METRICS, testbed.MTU = {}, {}, 1500
    try:
        yield
    finally:
        testbed.HOST_TCP, testbed.ROUTE_METRICS, testbed.MTU = saved


def estimates(message_bytes: int, scenario: str, num_iterations: int) -> list[float]:
    profile = Profile.uniform(4, 8, 2, 2, 2, message_bytes=message_bytes, num_delegates=3)
    faults = NO_FAULTS
    if scenario == "steady":
        profile = profile.with_delays((0.0, 30.0, 0.0))
    else:
        start, end = ONSET_ITERATIONS
        faults = parse_yaml(
            f'[{{start_iteration: {start}, end_iteration: {end}, links: ["1-2"], delay_ms: 30}}]'
        )
    result = run_configuration(
        system_controller("adaptra", profile, faults, link_terms=TESTBED_LINK_TERMS),
        backend="emulated",
        num_iterations=num_iterations,
        faults=faults,
        injection="network",
        delegated=True,
    )
    return [d.detected_ms["1-2"] for d in result.decisions if "1-2" in d.detected_ms]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=8)
    args = parser.parse_args()
    if args.iterations < MIN_ITERATIONS:
        parser.error(
            f"--iterations must be at least {MIN_ITERATIONS}: the onset scenario's fault starts "
            f"at measured iteration {ONSET_ITERATIONS[0]} and is estimated from the next, got "
            f"{args.iterations}"
        )
    print(
        "| TCP | message | scenario | estimates of 30 ms, per slow iteration (ms) | median | max |"
    )
    print("|---|---|---|---|---|---|")
    for tcp in ("machine defaults", "testbed"):
        for size_name, size in SIZES.items():
            for scenario in ("steady", "onset"):
                if tcp == "testbed":
                    found = estimates(size, scenario, args.iterations)
                else:
                    with machine_defaults():
                        found = estimates(size, scenario, args.iterations)
                shown = ", ".join(f"{e:.1f}" for e in found)
                print(
                    f"| {tcp} | {size_name} | {scenario} | {shown} | "
                    f"{statistics.median(found):.1f} | {max(found):.1f} |",
                    flush=True,
                )


if __name__ == "__main__":
    run_script(main)
