"""How fast a failed run is reported and its workers gone, and how a clean run ends.

Run: python benchmarks/bench_shutdown.py [--repeats 5]

Emulated workers (sleeps), 4 stages, 16 microbatches, 20 ms ops, 1F1B: an iteration lasts
about 1.9 s, so a kill lands mid-iteration.

- kill: a pool warmed up by one iteration; 0.3 s into the next, rank 1 is SIGKILLed. From
  the kill: the failure seen (the pool's `_fail` first called), WorkerCrash raised, every
  worker pid gone from /proc.
- link down: as kill, but link 1-2 is down in the second iteration (rank 1's first send
  raises LinkFailure, and nobody dies): from the failure seen to raised and to all gone.
- clean close: a pool that ran one iteration, closed: the close's time, the exit codes.
- cli: `adaptra-bench run --backend emulated` (`python -m harness`, its own interpreter):
  40 iterations, a worker SIGKILLed once the workers have run 1.5 s: from the kill to the
  error line on stderr, to the command's exit, and to its output's end (every process
  holding its stderr gone: the fork server is last); then 3 clean iterations: from the result
  line to the exit and to the output's end.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, NoReturn

from baselines import one_f_one_b
from injectors.fault_files import parse_yaml
from pipeline.faults import NO_FAULTS, IterationFaults
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerCrash, WorkerError, WorkerPool
from pipeline.signals import run_script
from pipeline.topology import Topology

ROOT = Path(__file__).parents[1]
PROFILE = Profile.uniform(4, 16, 20, 20, 20, message_bytes=1024)
KILL_AFTER_S = 0.3


class _StampedPool(WorkerPool):
    """A pool that notes when its wait first saw a failure."""

    detected_at: float | None = None

    def _fail(self, error: WorkerError, what: str, reporter: int | None = None) -> NoReturn:
        if self.detected_at is None:
            self.detected_at = time.monotonic()
        super()._fail(error, what, reporter)


def _alive(pid: int) -> bool:
    """Whether `pid` is a process (a zombie counts as gone: it has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _watch_gone(pids: list[int], stamp: list[float]) -> threading.Thread:
    """A thread that appends the monotonic time once none of `pids` is alive."""

    def watch() -> None:
        while any(_alive(pid) for pid in pids):
            time.sleep(0.001)
        stamp.append(time.monotonic())

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _failed_once(
    faults: IterationFaults, kill_rank: int | None
) -> tuple[tuple[float, ...], list[int | None]]:
    """A pool warmed up by one iteration; the next one fails (`faults`, or rank `kill_rank`
    SIGKILLed KILL_AFTER_S into it): (the failure seen, raised, every worker gone) in s after
    the kill (after `_fail` was first called where nothing is killed), and the exit codes."""
    schedule = one_f_one_b(PROFILE)
    pool = _StampedPool(4, timeout_s=60)
    gone: list[float] = []
    killed_at: list[float] = []
    with pool:
        pool.run_iteration(IterationConfig(0, schedule, PROFILE))
        pids = list(pool.pids)

        def kill() -> None:
            killed_at.append(time.monotonic())
            _watch_gone(pids, gone)
            if kill_rank is not None:
                os.kill(pids[kill_rank], signal.SIGKILL)

        timer = threading.Timer(KILL_AFTER_S if kill_rank is not None else 0.0, kill)
        timer.start()
        try:
            pool.run_iteration(IterationConfig(1, schedule, PROFILE, faults=faults))
        except WorkerError as err:
            raised_at = time.monotonic()
            if kill_rank is not None and (not isinstance(err, WorkerCrash) or err.rank != 1):
                raise RuntimeError(f"not rank {kill_rank}'s death: {err}") from err
        else:
            raise RuntimeError("the iteration did not fail")
        finally:
            timer.join()
    deadline = time.monotonic() + 30
    while not gone and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.detected_at is not None and gone
    origin = killed_at[0] if kill_rank is not None else pool.detected_at
    times = (pool.detected_at - origin, raised_at - origin, gone[0] - origin)
    return times, list(pool.exit_codes)


def clean_once() -> tuple[float, list[int | None]]:
    """Run one iteration, close: the close's time (s) and the workers' exit codes."""
    pool = WorkerPool(4, timeout_s=60)
    pool.start()
    try:
        pool.run_iteration(IterationConfig(0, one_f_one_b(PROFILE), PROFILE))
    finally:
        started = time.monotonic()
        pool.close()
        close_s = time.monotonic() - started
    return close_s, list(pool.exit_codes)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _lines(stream: IO[str], into: list[tuple[float, str]]) -> threading.Thread:
    """A thread that reads `stream` to its end, each line with the time it came."""

    def read() -> None:
        for line in stream:
            into.append((time.monotonic(), line.rstrip("\n")))
        into.append((time.monotonic(), ""))  # the end: every holder closed it

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


@dataclasses.dataclass(frozen=True)
class _CliRun:
    line_s: float
    exit_s: float
    eof_s: float
    status: int
    stderr: list[str]


def cli_once(profile_path: str, kill: bool) -> _CliRun:
    """The CLI, a worker killed once they have run 1.5 s (`kill`), or a clean run: when
    its last line came, when it exited, when its output ended (the fork server, the last to
    hold it, gone), in s after the kill (or after the clean run's result line)."""
    iterations = "40" if kill else "3"
    command = [sys.executable, "-m", "harness", "run", "--backend", "emulated"]
    command += ["--profile", profile_path, "--policy", "1f1b", "--iterations", iterations]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out: list[tuple[float, str]] = []
    err: list[tuple[float, str]] = []
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as cli:
        assert cli.stdout is not None and cli.stderr is not None
        readers = [_lines(cli.stdout, out), _lines(cli.stderr, err)]
        start = 0.0
        if kill:
            # The workers are the fork server's children (the CLI's grandchildren).
            deadline = time.monotonic() + 120
            workers: list[int] = []
            while len(workers) < PROFILE.num_stages and time.monotonic() < deadline:
                time.sleep(0.01)
                workers = [w for child in _children(cli.pid) for w in _children(child)]
            time.sleep(1.5)
            start = time.monotonic()
            os.kill(sorted(workers)[1], signal.SIGKILL)
        cli.wait(120)
        exited = time.monotonic()
        for reader in readers:
            reader.join(120)
    lines = err if kill else out
    if not kill:
        start = lines[-2][0]  # the result line
    return _CliRun(
        lines[-2][0] - start,
        exited - start,
        max(out[-1][0], err[-1][0]) - start,
        cli.returncode,
        [text for _, text in err[:-1]],
    )


def _summary(values: list[float]) -> str:
    ms = [v * 1e3 for v in values]
    return f"median {statistics.median(ms):.0f} ms (min {min(ms):.0f}, max {max(ms):.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    down = parse_yaml('[{start_iteration: 1, links: ["1-2"], down: true}]').at(
        1, Topology(4), rates=PROFILE.link_rates
    )
    for name, faults, kill_rank in (("kill", NO_FAULTS, 1), ("link down", down, None)):
        runs = [_failed_once(faults, kill_rank) for _ in range(args.repeats)]
        start = "kill" if kill_rank is not None else "failure seen"
        for k, what in enumerate(("failure seen", "raised", "all workers gone")):
            if k or kill_rank is not None:
                print(f"{name}: {start} -> {what}: {_summary([row[k] for row, _ in runs])}")
        counts = collections.Counter(str(codes) for _, codes in runs)
        print(f"  exit codes by rank (runs): {dict(sorted(counts.items()))}")
    cleans = [clean_once() for _ in range(args.repeats)]
    codes = sorted({code for _, row in cleans for code in row}, key=str)
    print(f"clean close: {_summary([c for c, _ in cleans])}; exit codes seen: {codes}")
    with tempfile.TemporaryDirectory() as tmp:
        profile_path = str(Path(tmp) / "profile.json")
        Path(profile_path).write_text(json.dumps(PROFILE.to_dict()))
        for kill in (True, False):
            cli_runs = [cli_once(profile_path, kill) for _ in range(args.repeats)]
            name = "cli, a worker killed: kill" if kill else "cli, clean: result line"
            if kill:
                print(f"{name} -> last line: {_summary([r.line_s for r in cli_runs])}")
            print(f"{name} -> exit: {_summary([r.exit_s for r in cli_runs])}")
            print(f"{name} -> output's end: {_summary([r.eof_s for r in cli_runs])}")
            statuses = sorted({r.status for r in cli_runs})
            print(f"  exit statuses {statuses}; stderr (last run): {cli_runs[-1].stderr}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    run_script(main)
