"""Accuracy of each injector (requested against measured) and the testbed's own cost.

Run (as root, for the testbed part): python benchmarks/bench_injectors.py

- Transport level, in a real emulated run (2 stages, gloo on loopback): the median time a
  send is held for a requested delay, and for a bandwidth cap on 1 Mbit messages (the fault
  model's rows, realised by the runtime's fault hook).
- Network level, in the testbed: TCP throughput through an htb cap of 50 Mbit/s to 5 Gbit/s on
  one pair, the uncapped pair and plane next to it, the round trip of a pair (the cost of
  veth + bridge + veth), and the userspace delay wire: one-way delay (half the round trip)
  for 0/5/20 ms and its throughput at 0 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics

from baselines import one_f_one_b
from injectors.fault_files import parse_yaml
from injectors.probe import measure
from injectors.testbed import Testbed
from injectors.wire import WireState
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerPool
from pipeline.signals import run_script


def _held_ms(pool: WorkerPool, profile: Profile, effect: str, it: int) -> float:
    """The median send on link 0-1 under one fault-model row's `effect` (YAML)."""
    faults = parse_yaml(f'[{{start_iteration: 0, links: ["0-1"], {effect}}}]').at(
        0, profile.topology, rates=profile.link_rates
    )
    timeline = pool.run_iteration(IterationConfig(it, one_f_one_b(profile), profile, faults=faults))
    return statistics.median(m.send_end_ms - m.send_start_ms for m in timeline.messages)


def transport_level() -> None:
    profile = Profile.uniform(2, 8, 2, 2, 2, message_bytes=125_000)  # 1 Mbit messages
    print("| transport-level fault | requested ms per message | measured (median) |")
    print("|---|---|---|")
    with WorkerPool(2, timeout_s=30) as pool:
        it = 0
        pool.run_iteration(IterationConfig(it, one_f_one_b(profile), profile))
        base = _held_ms(pool, profile, "delay_ms: 0", it := it + 1)
        print(f"| none | 0 | {base:.3f} |")
        for delay in (5.0, 20.0, 50.0):
            held = _held_ms(pool, profile, f"delay_ms: {delay}", it := it + 1)
            print(f"| delay {delay:g} ms | {delay:g} | {held:.3f} |")
        for rate in (100.0, 500.0):
            held = _held_ms(pool, profile, f"bandwidth_gbps: {rate / 1e3}", it := it + 1)
            print(f"| cap {rate:g} Mbit/s | {1e3 / rate:g} | {held:.3f} |")


def network_level() -> None:
    print("\n| testbed | requested | measured |")
    print("|---|---|---|")
    with Testbed(3) as bed:
        rtt = statistics.median(measure(bed, 0, 1, 0, "rtt") for _ in range(3))
        print(f"| round trip, host 0 to 1 | - | {rtt:.3f} ms |")
        print(f"| throughput, uncapped | - | {measure(bed, 0, 1, 0, '64'):.0f} Mbit/s |")
        for rate in (50, 100, 500, 1000, 5000):
            bed.cap_bandwidth(0, 1, plane=0, rate_mbit=rate)
            capped = measure(bed, 0, 1, 0, str(max(8, rate // 8)))
            print(f"| htb cap, host 0 to 1 | {rate} Mbit/s | {capped:.1f} Mbit/s |")
            other = measure(bed, 0, 2, 0, "32")
            print(f"| same plane, host 0 to 2 | uncapped | {other:.0f} Mbit/s |")
            bed.teardown()
            bed.build()
    for delay in (0.0, 5.0, 20.0):
        with Testbed(2) as bed:
            bed.set_wire(0, 1, plane=0, forward=WireState(delay_ms=delay))
            rtt = statistics.median(measure(bed, 0, 1, 0, "rtt") for _ in range(3))
            print(f"| delay wire, one way | {delay:g} ms | {rtt / 2:.3f} ms (half the RTT) |")
            if delay == 0.0:
                print(f"| delay wire throughput | - | {measure(bed, 0, 1, 0, '64'):.0f} Mbit/s |")


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    transport_level()
    if os.geteuid() == 0:
        network_level()
    else:
        print("\n(testbed part skipped: it needs root)")


if __name__ == "__main__":
    run_script(main)
