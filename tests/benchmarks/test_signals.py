"""The benchmark scripts end on SIGTERM and SIGHUP as on Ctrl-C: their pools, delegates and
folders unwind (`pipeline.signals.run_script`, every script's entry point)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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


@pytest.mark.multiprocess
def test_a_benchmark_terminated_mid_run_closes_its_pools(short_tmp: Path) -> None:
    """bench_swap.py, SIGTERM once its first pool (4 emulated workers) runs: it unwinds as
    on Ctrl-C (no traceback, one line, exit status 143), and leaves no process (its workers
    and delegates end) and no pool folder (killed by the signal, it left its workers to
    crash on a broken gloo connection, with tracebacks, and its folder for `adaptra-bench
    cleanup`)."""
    command = [sys.executable, str(ROOT / "benchmarks/bench_swap.py"), "--backend", "emulated"]
    run = subprocess.Popen(
        [*command, "--repeats", "1"],
        env={**os.environ, "TMPDIR": str(short_tmp)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120  # start-up under load
        workers: set[int] = set()
        while time.monotonic() < deadline and run.poll() is None:
            workers = _descendants(run.pid)
            if any(short_tmp.glob("adaptra-pool-*")) and len(workers) >= 4 + 2:
                break
            time.sleep(0.1)
        assert run.poll() is None and len(workers) >= 4 + 2
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=120)  # a hang bound, not a timing
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert (run.returncode, err.splitlines()[-1:]) == (143, ["terminated (SIGTERM)"]), err
    assert "Traceback" not in err
    deadline = time.monotonic() + 60  # they end once they find the pool closed: load slows it
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in workers if _alive(pid)] == []
    assert list(short_tmp.glob("adaptra-pool-*")) == []


@pytest.mark.multiprocess
@pytest.mark.skipif(os.geteuid() != 0, reason="bench_send_buffer.py needs root")
def test_a_benchmark_interrupted_while_an_arm_runs_says_so_once() -> None:
    """bench_send_buffer.py runs each arm as a process of its own (a session of its own:
    the terminal's Ctrl-C reaches the script alone), which it stops on the way out. SIGINT
    while the first arm runs: one line, the script's (the arm, stopped by SIGTERM, said
    "terminated (SIGTERM)" too), exit status 130, and the arm has ended."""
    command = [sys.executable, str(ROOT / "benchmarks/bench_send_buffer.py")]
    run = subprocess.Popen(
        [*command, "--iterations", "100000", "--sizes-mib", "0.01"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120  # start-up under load
        arm: set[int] = set()
        while time.monotonic() < deadline and run.poll() is None and len(arm) < 1 + 4:
            arm = _descendants(run.pid)  # the arm and its pool's 4 workers
            time.sleep(0.1)
        assert run.poll() is None and len(arm) >= 1 + 4
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=120)  # a hang bound, not a timing
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert (run.returncode, err.splitlines()) == (130, ["interrupted (SIGINT)"]), err
    deadline = time.monotonic() + 60  # the pool's workers end once they find it closed
    while any(_alive(pid) for pid in arm) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in arm if _alive(pid)] == []
