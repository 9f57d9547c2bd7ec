"""The benchmark scripts end on SIGTERM and SIGHUP as on Ctrl-C: their pools, delegates and
folders unwind (`pipeline.signals.run_script`, every script's entry point)."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.harness.test_signals import _alive, _descendants

ROOT = Path(__file__).resolve().parents[2]
OWN_ENTRY_POINT = {"pipemorph_worker.py"}
"""A child of bench_scheduler_peers.py that imports nothing of this repository."""


def test_every_benchmark_script_runs_its_main_through_run_script() -> None:
    scripts = [*sorted((ROOT / "benchmarks").glob("*.py")), ROOT / "benchmarks/gpu/check.py"]
    entry = 'if __name__ == "__main__":\n    run_script(main)'
    others = [
        script.name
        for script in scripts
        if script.name not in OWN_ENTRY_POINT and entry not in script.read_text()
    ]
    assert others == []


def _signalled_once_running(
    argv: list[str], running: Callable[[set[int]], bool], signum: int, **popen: Any
) -> tuple[int, str]:
    """Benchmark script `argv` (under benchmarks/), sent `signum` once `running` holds of
    its descendants: its exit status and its stderr, once those descendants have ended too
    (bounded waits: hang guards, not timings)."""
    run = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / argv[0]), *argv[1:]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )
    try:
        deadline = time.monotonic() + 120  # start-up under load
        descendants: set[int] = set()
        while time.monotonic() < deadline and run.poll() is None:
            descendants = _descendants(run.pid)
            if running(descendants):
                break
            time.sleep(0.1)
        assert run.poll() is None and running(descendants)
        run.send_signal(signum)
        _, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:  # (its arms are in sessions of their own)
            for pid in [run.pid, *descendants]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            run.wait()
    deadline = time.monotonic() + 60  # they end once they find their pool closed
    while any(_alive(pid) for pid in descendants) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in descendants if _alive(pid)] == []
    return run.returncode, err


@pytest.mark.multiprocess
def test_a_benchmark_terminated_mid_run_closes_its_pools(short_tmp: Path) -> None:
    """bench_swap.py, SIGTERM once its first pool (4 emulated workers) runs: it unwinds as
    on Ctrl-C (no traceback, one line, exit status 143), and leaves no process (its workers
    and delegates end) and no pool folder (killed by the signal, it left its workers to
    crash on a broken gloo connection, with tracebacks, and its folder for `adaptra-bench
    cleanup`)."""
    status, err = _signalled_once_running(
        ["bench_swap.py", "--backend", "emulated", "--repeats", "1"],
        lambda pids: any(short_tmp.glob("adaptra-pool-*")) and len(pids) >= 4 + 2,
        signal.SIGTERM,
        env={**os.environ, "TMPDIR": str(short_tmp)},
    )
    assert (status, err.splitlines()[-1:]) == (143, ["terminated (SIGTERM)"]), err
    assert "Traceback" not in err
    assert list(short_tmp.glob("adaptra-pool-*")) == []


@pytest.mark.multiprocess
@pytest.mark.skipif(os.geteuid() != 0, reason="bench_send_buffer.py needs root")
def test_a_benchmark_interrupted_while_an_arm_runs_says_so_once() -> None:
    """bench_send_buffer.py runs each arm as a process of its own (a session of its own:
    the terminal's Ctrl-C reaches the script alone), which it stops on the way out. SIGINT
    while the first arm runs: one line, the script's (the arm, stopped by SIGTERM, said
    "terminated (SIGTERM)" too), exit status 130, and the arm has ended."""
    status, err = _signalled_once_running(
        ["bench_send_buffer.py", "--iterations", "100000", "--sizes-mib", "0.01"],
        lambda pids: len(pids) >= 1 + 4,  # the arm and its pool's 4 workers
        signal.SIGINT,
    )
    assert (status, err.splitlines()) == (130, ["interrupted (SIGINT)"]), err


@pytest.mark.parametrize("thread_start_s", [0.0, 1.0])
def test_an_arm_s_stderr_before_the_script_s_signal_is_passed_on(
    tmp_path: Path, thread_start_s: float
) -> None:
    """bench_send_buffer.py's `_run_arm` on an arm that wrote a warning, then hangs; SIGINT
    to the script: the warning was passed on as it came (the hang's diagnosis), the
    arm's own line on being stopped is not, the script's is. Also where the script's
    threads take `thread_start_s` to start (a loaded host: the SIGINT came while the arm's
    watch or its relay started, before anything could pass the warning on, and it was
    lost)."""
    ready = tmp_path / "ready"
    arm = (
        "import signal, sys, time\n"
        "def stopped(*_):\n"
        "    print('terminated (SIGTERM)', file=sys.stderr, flush=True)\n"
        "    sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, stopped)\n"
        "print('rank 2 has not answered', file=sys.stderr, flush=True)\n"
        f"open({str(ready)!r}, 'w').close()\n"
        "time.sleep(120)\n"
    )
    driver = (
        "import sys, threading, time\n"
        "real_start = threading.Thread.start\n"
        "def start(thread):\n"
        f"    time.sleep({thread_start_s})\n"
        "    real_start(thread)\n"
        "threading.Thread.start = start\n"
        "sys.path.insert(0, sys.argv[1]); from tests.benchmarks.scripts import "
        "load_script; from pipeline.signals import run_script; "
        "run = load_script('bench_send_buffer')._run_arm; "
        f"run_script(lambda: run([sys.executable, '-c', {arm!r}]))"
    )
    script = subprocess.Popen(
        [sys.executable, "-c", driver, str(ROOT)], stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60  # start-up under load: a hang bound
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists()
        script.send_signal(signal.SIGINT)
        _, err = script.communicate(timeout=60)
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()
    assert err.splitlines() == ["rank 2 has not answered", "interrupted (SIGINT)"], err
