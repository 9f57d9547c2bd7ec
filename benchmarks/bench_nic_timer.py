"""How long a NIC's timer takes to take the NIC down on the namespace testbed: `set_link`
called from a fresh thread (as each timed NIC change runs, `threading.Timer`) in a process
that has imported torch (as the controller has). Medians and maxima over --repeats of the
time to the moment the NIC was set, and of the whole call. Needs root.

Run: python benchmarks/bench_nic_timer.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch  # noqa: F401  (imported, as in the controller: what a fork there copies)

from injectors.testbed import Testbed
from pipeline.signals import run_script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    to_set_ms: list[float] = []
    whole_ms: list[float] = []
    with Testbed(2) as bed:

        def down() -> None:
            started = time.monotonic()
            set_at = bed.set_link(1, 0, up=False)
            to_set_ms.append((set_at - started) * 1e3)
            whole_ms.append((time.monotonic() - started) * 1e3)

        for _ in range(args.repeats):
            timer = threading.Thread(target=down)
            timer.start()
            timer.join()
            bed.set_link(1, 0, up=True)
    print("| from a fresh thread | median | max |")
    print("|---|---|---|")
    for what, times in (("to the NIC set", to_set_ms), ("whole call", whole_ms)):
        print(f"| {what} | {statistics.median(times):.1f} ms | {max(times):.1f} ms |")


if __name__ == "__main__":
    run_script(main)
