"""Why a blocking 8 MiB send is dear and heavy-tailed on loopback: the socket's send buffer.

Run (as root): python benchmarks/bench_send_buffer.py [--iterations 5] [--sizes-mib 4 8]

1F1B and ZB-H2 on S=4, N=12, F=B=W=10 ms, `direct`, each size in turn: every message's
blocking send (send start to send end), in this namespace (the host's sysctls: here
tcp_wmem's maximum is 4 MiB), then in a fresh network namespace (loopback only) for each
`--wmem` (default: the testbed's hosts' setting, injectors.testbed.HOST_TCP). Each arm is a
process of its own started in its namespace (`ip netns exec`): a pool started from a
process moved there (`setns`) sent at the cost of the namespace the process started in
(BENCHMARKS.md). Printed per arm: the median send, the mean, the p90, how many sends took
over 15 ms, and the largest. One pool per arm and size; each namespace is removed on exit,
on SIGTERM and on SIGHUP too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import statistics
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator

from baselines import one_f_one_b, zb_h2
from injectors.testbed import HOST_TCP
from pipeline.processes import process_tree
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerPool
from pipeline.signals import held_signals, run_script


@contextlib.contextmanager
def _namespace_with(tcp_wmem: str) -> Iterator[str]:
    """A fresh namespace for the block (loopback up, `tcp_wmem`); removed after. (With `ip`:
    made with pyroute2's `netns.create` instead, the second namespace of a run twice gave a
    worker's gloo no loopback address here; why was not looked into.)"""
    name = f"adb-sndbuf-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        sysctl = ["ip", "netns", "exec", name, "sysctl", "-q", "-w"]
        subprocess.run([*sysctl, f"net.ipv4.tcp_wmem={tcp_wmem}"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)


def _sends_ms(num_bytes: int, num_iterations: int) -> dict[str, list[float]]:
    profile = Profile.uniform(4, 12, 10, 10, 10, message_bytes=num_bytes)
    sends: dict[str, list[float]] = {}
    with WorkerPool(4, timeout_s=120) as pool:
        iteration = 0
        for name, build in (("1f1b", one_f_one_b), ("zb-h2", zb_h2)):
            schedule = build(profile)
            for k in range(num_iterations + 1):  # the first: a warm-up
                timeline = pool.run_iteration(IterationConfig(iteration, schedule, profile))
                iteration += 1
                if k:
                    sends.setdefault(name, []).extend(
                        m.send_end_ms - m.send_start_ms for m in timeline.messages
                    )
    return sends


def _row(arm: str, size_mib: float, policy: str, sends_ms: list[float]) -> str:
    ordered = sorted(sends_ms)
    p90 = ordered[int(0.9 * (len(ordered) - 1))]
    num_long = sum(s > 15.0 for s in ordered)
    return (
        f"| {arm} | {size_mib:g} | {policy} | {statistics.median(ordered):.2f} | "
        f"{statistics.fmean(ordered):.2f} | {p90:.2f} | {num_long} of {len(ordered)} | "
        f"{ordered[-1]:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=5, help="measured, per policy")
    parser.add_argument("--arm", help=argparse.SUPPRESS)  # one arm's rows, in this process
    parser.add_argument("--sizes-mib", type=float, nargs="+", default=[4.0, 8.0])
    parser.add_argument(
        "--wmem",
        nargs="+",
        default=[HOST_TCP["net.ipv4.tcp_wmem"]],
        help="tcp_wmem values (min default max, bytes) for the namespaces' arms",
    )
    args = parser.parse_args()
    if args.iterations < 1 or any(size <= 0 for size in args.sizes_mib):
        parser.error("--iterations must be >= 1 and every size > 0")
    if args.arm is not None:
        for policy, sends in _sends_ms(round(float(args.arm) * (1 << 20)), args.iterations).items():
            print(_row(_tcp_wmem(), float(args.arm), policy, sends), flush=True)
        return
    if os.geteuid() != 0:
        parser.error("needs root (a network namespace per arm)")
    print(f"load average {os.getloadavg()[0]:.2f}; this namespace's tcp_wmem: {_tcp_wmem()}\n")
    print("| tcp_wmem | MiB | policy | send median ms | mean | p90 | over 15 ms | largest |")
    print("|---|---|---|---|---|---|---|---|")
    for size_mib in args.sizes_mib:
        arm = [
            sys.executable,
            __file__,
            "--arm",
            str(size_mib),
            "--iterations",
            str(args.iterations),
        ]
        _run_arm(arm)
        for wmem in args.wmem:
            with _namespace_with(wmem) as name:
                _run_arm(["ip", "netns", "exec", name, *arm])
    print(f"\nload average {os.getloadavg()[0]:.2f} after")


def _run_arm(argv: list[str]) -> None:
    """An arm in a process of its own, stopped on the way out (a signal's too: SIGTERM, then
    SIGKILL after a grace: it closes its pool first). Its stderr is passed on as it comes,
    until this script is stopped (what came by then too): the arm's line on that SIGTERM is
    not the news."""
    with contextlib.ExitStack() as stack:
        relay: _Relay | None = None
        try:
            # A stop while the arm and the relay start (a thread's start waits for it to run:
            # long, on a loaded host) comes once the relay is there to pass on what came.
            with held_signals():
                arm = stack.enter_context(process_tree(argv, stderr=subprocess.PIPE))
                assert arm.stderr is not None
                relay = _Relay(os.dup(arm.stderr.fileno()))  # the relay's own, closed by it
            arm.wait()
        except BaseException:
            if relay is not None:
                relay.stop()
            raise
        relay.join(5.0)  # to the pipe's end (bounded: a stray holder of it aside)
        if arm.returncode != 0:
            raise subprocess.CalledProcessError(arm.returncode, argv)


class _Relay:
    """What a pipe gives, to this process's stderr, from a thread of its own, until `stop`:
    the pipe is read only under a lock, by the thread as data comes and by `stop`, which
    passes on what is there when it is called (a thread not yet scheduled since the data
    came lost it: the hang's diagnosis), and nothing after."""

    def __init__(self, fd: int) -> None:
        self._fd, self._lock, self._passing = fd, threading.Lock(), True
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _pass_what_is_there(self) -> bool:
        """Under the lock: what the pipe holds now, passed on; False at its end."""
        while select.select([self._fd], [], [], 0)[0]:
            chunk = os.read(self._fd, 65536)
            if not chunk:
                return False
            sys.stderr.buffer.write(chunk)
            sys.stderr.buffer.flush()
        return True

    def _run(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                select.select([self._fd], [], [])  # data, or the pipe's end
                with self._lock:
                    if not self._passing or not self._pass_what_is_there():
                        break
        with self._lock:
            self._passing = False
            os.close(self._fd)

    def stop(self) -> None:
        with self._lock:
            if self._passing:
                with contextlib.suppress(OSError):
                    self._pass_what_is_there()
                self._passing = False

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)


def _tcp_wmem() -> str:
    with open("/proc/sys/net/ipv4/tcp_wmem") as file:
        return " ".join(file.read().split())


if __name__ == "__main__":
    run_script(main)
