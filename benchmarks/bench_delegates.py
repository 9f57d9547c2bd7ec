"""The delegate transport in real runs (emulated compute, S=4, N=12, F=B=W=10 ms).

Run: python benchmarks/bench_delegates.py [--iterations 5] [--part overhead,slowdown,count]

- overhead: no straggler, every PP message direct or delegated (D=3), at 64 KiB, 1 MiB and
  8 MiB, ZB-H2; interleaved per iteration in one pool, medians; and where a delegated
  message's time goes: the trainer's copy out, the wait for a free delegate, the wire
  (delegate picking it up to its last byte in), the copy in.
- slowdown: the paper's Fig. 14/15 shape on this machine: 0, 30 and 60 ms on link 0-1, ZB
  over direct, Adaptra-CPU (ZB over delegates) and Adaptra over delegates, 1 MiB messages,
  emulated next to the (uncalibrated) simulator; slowdown against each system's own
  fault-free run (the paper at 60 ms: ZB 4.24x, Adaptra-CPU 2.15x, Adaptra 1.13x); and the
  simulator calibrated on this host first (with the delegated path's costs): the fidelity.
- count: ZB over delegates against D = 1..6 at 30 and 60 ms, the paper's rule's D marked.
The load average is printed with each table.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
from pathlib import Path

from adaptra.transport import Delegates
from harness.policies import system_controller
from harness.runner import link_terms, run_configuration
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerPool
from pipeline.runtime.calibrate import measure_host_costs
from pipeline.signals import run_script
from pipeline.timeline import Timeline
from pipeline.topology import Direction

SIZES = {"64 KiB": 64 << 10, "1 MiB": 1 << 20, "8 MiB": 8 << 20}
ALL = tuple((link, direction) for link in ("0-1", "1-2", "2-3") for direction in Direction)


def _profile(num_bytes: int, delay_ms: float = 0.0, num_delegates: int = 3) -> Profile:
    base = Profile.uniform(4, 12, 10, 10, 10, message_bytes=num_bytes, num_delegates=num_delegates)
    return base.with_delays([delay_ms, 0.0, 0.0])


def _iteration_ms(timeline: Timeline) -> float:
    record = timeline.iterations[0]
    return record.end_ms - record.start_ms


def _breakdown(timelines: list[Timeline]) -> tuple[float, float, float, float]:
    """Medians over every delegated message: copy out, wait for a delegate, wire, copy in."""
    messages = [m for t in timelines for m in t.messages]
    return (
        statistics.median(m.send_end_ms - m.send_start_ms for m in messages),
        statistics.median(m.wire_start_ms - m.send_end_ms for m in messages),
        statistics.median(m.arrival_ms - m.wire_start_ms for m in messages),
        statistics.median(m.copy_in_ms for m in messages),
    )


def _rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(x for x in status.splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def overhead(num_iterations: int) -> None:
    from baselines import zb_h2

    print(f"load average {os.getloadavg()[0]:.2f}")
    iteration = 0
    with WorkerPool(4, delegates=Delegates(), num_delegates=3, timeout_s=60) as pool:
        pids = [pid for ranks in pool.delegate_pids for pid in ranks]
        rss_mb = [_rss_mb(pid) for pid in pids]
        print(f"{len(pids)} delegate processes, resident memory {statistics.median(rss_mb):.1f} "
              f"MB each (median; {sum(rss_mb):.0f} MB in all)\n")  # fmt: skip
        print("| message | direct ms | delegated ms | delegated/direct | copy out ms | wait for a "
              "delegate ms | wire ms | copy in ms |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")
        for name, num_bytes in SIZES.items():
            profile = _profile(num_bytes)
            schedule = zb_h2(profile)
            delegated = tuple((link, way, "delegated") for link, way in ALL)
            times: dict[str, list[float]] = {"direct": [], "delegated": []}
            kept: list[Timeline] = []
            for k in range(num_iterations + 1):  # the first of each: a warm-up
                for comm, link_comms in (("direct", ()), ("delegated", delegated)):
                    config = IterationConfig(iteration, schedule, profile, link_comms=link_comms)
                    timeline = pool.run_iteration(config)
                    iteration += 1
                    if k:
                        times[comm].append(_iteration_ms(timeline))
                        if comm == "delegated":
                            kept.append(timeline)
            direct, over = statistics.median(times["direct"]), statistics.median(times["delegated"])
            steps = _breakdown(kept)
            print(f"| {name} | {direct:.1f} | {over:.1f} | {over / direct:.3f} | "
                  + " | ".join(f"{s:.3f}" for s in steps) + " |")  # fmt: skip


def slowdown(num_iterations: int) -> None:
    host = measure_host_costs(delegates=Delegates())
    print(f"host costs (with the delegated path's): {host.to_dict()}\n")
    print(f"load average {os.getloadavg()[0]:.2f}")
    print("| system | delay ms | emulated ms | sim ms | emulated/sim | slowdown (emulated) | "
          "slowdown (sim) | trainer's send on 0-1, median ms | calibrated sim ms | "
          "fidelity |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for system in ("zb", "adaptra-cpu", "adaptra"):
        base: dict[str, float] = {}
        for delay in (0.0, 30.0, 60.0):
            profile = _profile(1 << 20, delay)
            row = {}
            for backend in ("emulated", "sim"):
                result = run_configuration(
                    system_controller(system, profile, link_terms=link_terms(backend, "hook")),
                    backend=backend,
                    num_iterations=num_iterations,
                    delegated=system != "zb",
                )
                row[backend] = result.median_iteration_ms
                base.setdefault(backend, row[backend])
                if backend == "emulated":
                    assert result.timeline is not None
                    send_ms = statistics.median(
                        m.send_end_ms - m.send_start_ms
                        for m in result.timeline.messages
                        if m.link == "0-1"
                    )
            calibrated = run_configuration(
                system_controller(system, profile), num_iterations=1, host=host
            ).median_iteration_ms
            print(f"| {system} | {delay:g} | {row['emulated']:.1f} | {row['sim']:.1f} | "
                  f"{row['emulated'] / row['sim']:.3f} | {row['emulated'] / base['emulated']:.2f}x"
                  f" | {row['sim'] / base['sim']:.2f}x | {send_ms:.2f} | {calibrated:.1f} | "
                  f"{row['emulated'] / calibrated:.3f} |")  # fmt: skip


def count(num_iterations: int) -> None:
    print(f"load average {os.getloadavg()[0]:.2f}")
    print("| delay ms | D | emulated ms | sim ms | the paper's rule |")
    print("|---|---|---|---|---|")
    for delay in (30.0, 60.0):
        chosen = dataclasses.replace(
            _profile(1 << 20, delay), num_delegates=None
        ).delegates_needed()
        for num_delegates in range(1, 7):
            profile = _profile(1 << 20, delay, num_delegates)
            row = [
                run_configuration(
                    system_controller(
                        "adaptra-cpu", profile, link_terms=link_terms(backend, "hook")
                    ),
                    backend=backend,
                    num_iterations=num_iterations,
                    delegated=True,
                ).median_iteration_ms
                for backend in ("emulated", "sim")
            ]
            mark = "its choice" if num_delegates == chosen else ""
            print(f"| {delay:g} | {num_delegates} | {row[0]:.1f} | {row[1]:.1f} | {mark} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--part", default="overhead,slowdown,count")
    args = parser.parse_args()
    parts = {"overhead": overhead, "slowdown": slowdown, "count": count}
    for part in args.part.split(","):
        print(f"\n## {part}\n")
        parts[part](args.iterations)


if __name__ == "__main__":
    run_script(main)
