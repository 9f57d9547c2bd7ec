"""Run a command several times with CPU-bound processes beside it: is it green under load?

    python benchmarks/under_load.py --runs 30 --busy 2 -- \
        .venv/bin/python -m pytest -q -p no:cacheprovider \
        "tests/pipeline/runtime/test_pool.py::test_a_killed_worker_fails_the_run_clearly_and_leaves_no_process"

Each busy process spins on one core for the whole loop; they are this script's own children
and are stopped (by their handles) when it ends, also on failure, Ctrl-C, SIGTERM or SIGHUP.
A Ctrl-C (or SIGTERM, SIGHUP) is passed on to the command, once, with time to end by itself
(pytest tears its fixtures down).
Prints one line per run and a summary; exits 1 if any run failed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import IO

from pipeline.signals import held_signals, run_script

_SPIN = "while True: pass"
_GRACE_S = 30.0
"""How long the command has to end once stopped (a test run's pools and namespaces close)."""


def _run(command: list[str], stdout: IO[bytes], stderr: IO[bytes]) -> int:
    """`command`'s exit status. It runs in a process group of its own, and this script
    passes its stop on to that group, once: a Ctrl-C (or any SIGINT) as SIGINT, which pytest
    answers with its teardown, SIGTERM and SIGHUP as SIGTERM; then `_GRACE_S` for it to end,
    then SIGKILL. A stop that comes while the command starts is held until it has a handle
    (it came before `Popen` returned, and the command, in a group of its own, went untold)."""
    process: subprocess.Popen[bytes] | None = None
    try:
        with held_signals():
            process = subprocess.Popen(command, stdout=stdout, stderr=stderr, process_group=0)
        return process.wait()
    except BaseException as err:
        if process is None:
            raise
        stop = signal.SIGINT if isinstance(err, KeyboardInterrupt) else signal.SIGTERM
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, stop)
        try:
            process.wait(_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        raise


def _read(file: IO[bytes]) -> str:
    file.seek(0)
    return file.read().decode(errors="replace")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="How often to run the command.")
    parser.add_argument("--busy", type=int, default=2, help="CPU-bound processes beside it.")
    parser.add_argument("--stop-on-failure", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.runs < 1 or args.busy < 0:
        parser.error("give --runs >= 1, --busy >= 0 and a command after --")
    busy: list[subprocess.Popen[bytes]] = []
    failures = num_run = 0
    try:
        for _ in range(args.busy):
            with held_signals():  # a busy process started is one stopped at the end
                busy.append(subprocess.Popen([sys.executable, "-c", _SPIN]))
        for run in range(1, args.runs + 1):
            num_run = run
            start = time.monotonic()
            # (into files, not pipes: the run ends with the command, not with the last of
            # its children to hold its output open)
            with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
                returncode = _run(command, stdout, stderr)
                out, err = (_read(f) for f in (stdout, stderr))
            last = (out.strip().splitlines() or ["(no output)"])[-1]
            print(
                f"run {run}/{args.runs}: exit {returncode} in "
                f"{time.monotonic() - start:.0f} s: {last}",
                flush=True,
            )
            if returncode != 0:
                failures += 1
                print(out[-4000:], err[-4000:], sep="\n", flush=True)
                if args.stop_on_failure:
                    break
    finally:
        for process in busy:
            process.kill()
            process.wait()
    print(f"{num_run - failures} passed, {failures} failed, {args.busy} busy process(es) beside")
    return 1 if failures else 0


if __name__ == "__main__":
    run_script(main)
