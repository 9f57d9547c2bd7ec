"""A delegate process's start: from its launch to its first note (a receiver's PORT).

Run: python benchmarks/bench_delegate_start.py [--repeats 5] [--one-by-one 20] [--at-once 16]

Receiver delegates on loopback, started as a trainer starts them (`_Process`): one by one
(`--one-by-one` starts, each waited for: the median), and `--at-once` started together
until the last one's port (a rank swap at the Fig. 18 test's shape starts 16 on a worker:
the median of `--repeats`). Says whether delegate.py's bytecode cache is there (the
trainer's own import of it writes it, unless PYTHONDONTWRITEBYTECODE is set; a delegate
reads it where it imports delegate.py rather than running it as a script).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time

from adaptra.transport.delegate import PORT
from adaptra.transport.delegated import DELEGATE_FILE, _Process, _read_note
from pipeline.runtime.transport import LinkDirection
from pipeline.signals import run_script
from pipeline.topology import Direction

_DIRECTION = LinkDirection("0-1", Direction.FORWARD)


def _started(num: int) -> float:
    """ms from launching `num` receivers to the last one's PORT note."""
    processes: list[_Process] = []
    try:
        start = time.perf_counter()
        for index in range(num):
            processes.append(_Process("recv", index, _DIRECTION, 1, ["127.0.0.1", "", ""]))
        for process in processes:
            assert _read_note(process, time.monotonic() + 60)[0] == PORT
        return (time.perf_counter() - start) * 1000
    finally:
        for process in processes:
            process.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--one-by-one", type=int, default=20)
    parser.add_argument("--at-once", type=int, default=16)
    args = parser.parse_args()
    if min(args.repeats, args.one_by_one, args.at_once) < 1:
        parser.error("--repeats, --one-by-one and --at-once must be >= 1")
    cache = importlib.util.cache_from_source(str(DELEGATE_FILE))
    print(
        f"load average {os.getloadavg()[0]:.2f}; delegate.py's bytecode cache "
        f"{'there' if os.path.exists(cache) else 'absent'}; PYTHONDONTWRITEBYTECODE "
        f"{'set' if os.environ.get('PYTHONDONTWRITEBYTECODE') else 'unset'}"
    )
    one = statistics.median(_started(1) for _ in range(args.one_by_one))
    together = statistics.median(_started(args.at_once) for _ in range(args.repeats))
    print(f"one start: {one:.1f} ms (median of {args.one_by_one})")
    print(f"{args.at_once} at once: {together:.1f} ms (median of {args.repeats})")
    print(f"load average {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    run_script(main)
