"""The runtime with real processes and real gloo traffic (emulated compute: sleeps)."""

import contextlib
import dataclasses
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from adaptra.generator import generate_schedule
from baselines import one_f_one_b, zb_h2
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerError, WorkerPool
from pipeline.simulator import CommMode, simulate

pytestmark = pytest.mark.multiprocess

MB = 1 << 20


def _loopback_tx_bytes() -> int | None:
    """Bytes sent on the loopback interface so far, from the kernel's counters."""
    try:
        for line in Path("/proc/net/dev").read_text().splitlines():
            name, _, counters = line.partition(":")
            if name.strip() == "lo":
                return int(counters.split()[8])
    except OSError:
        return None
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return (
        Path(f"/proc/{pid}/stat").exists()
        and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    )


def test_one_pool_runs_several_schedules_and_delays_without_restarting() -> None:
    profile = Profile.uniform(4, 12, 10, 10, 10, message_bytes=MB)
    schedules = [
        one_f_one_b(profile),
        zb_h2(profile),
        generate_schedule(profile, [9, 5, 3, 1], cap_in_flight=True),
    ]
    assert schedules[2].warmup_counts() == (9, 5, 3, 1)
    delays = [0.0, 15.0, 30.0]
    tx_before = _loopback_tx_bytes()
    with WorkerPool(4, timeout_s=60) as pool:
        pids = list(pool.pids)
        assert len(set(pids)) == 4 and os.getpid() not in pids
        # gloo connects each pair of ranks on first use: a warm-up iteration pays for that.
        pool.run_iteration(IterationConfig(0, schedules[0], profile))
        for iteration, (schedule, delay) in enumerate(zip(schedules, delays, strict=True), 1):
            delayed = profile.with_delays([delay, 0.0, 0.0])
            timeline = pool.run_iteration(IterationConfig(iteration, schedule, delayed))
            assert pool.pids == pids  # the same processes
            assert len(timeline.ops) == sum(len(ops) for ops in schedule.stages)
            assert len(timeline.messages) == 2 * 12 * 3
            assert {m.num_bytes for m in timeline.messages} == {MB}
            slow = [m for m in timeline.messages if m.link == "0-1"]
            # The fault hook sleeps before each send on the slow link: the send takes that long.
            assert all(m.send_end_ms - m.send_start_ms >= delay for m in slow)
            measured = compute_metrics(timeline, iteration).iteration_time_ms
            predicted = compute_metrics(simulate(schedule, delayed, CommMode.DIRECT))
            # Never faster than the model; slower only by the runtime's own costs and load (a
            # loose bound: BENCHMARKS.md measures the fidelity, within 5 % on a quiet machine).
            assert predicted.iteration_time_ms <= measured < 2 * predicted.iteration_time_ms
        assert pool.bytes_sent == 4 * 72 * MB
    tx_after = _loopback_tx_bytes()
    if tx_before is not None and tx_after is not None:
        assert tx_after - tx_before >= 4 * 72 * MB  # the bytes really crossed the wire
    assert not any(_alive(pid) for pid in pids)


def test_a_killed_worker_fails_the_run_clearly_and_leaves_no_process() -> None:
    profile = Profile.uniform(3, 6, 50, 50, 50)
    with WorkerPool(3, timeout_s=20) as pool:
        pids = list(pool.pids)
        victim = pids[1]
        threading.Timer(0.3, os.kill, (victim, signal.SIGKILL)).start()
        start = time.monotonic()
        with pytest.raises(WorkerError, match=r"rank 1 \(stage 1\) exited with code -9"):
            pool.run_iteration(IterationConfig(0, one_f_one_b(profile), profile))
        assert time.monotonic() - start < 20
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)


@dataclasses.dataclass(frozen=True)
class _DieSlowly:
    """A fault hook: the stage that sends the first gradient shuts its TCP connections down
    (its neighbour fails at once with "Connection closed by peer"), then exits 0.3 s later
    with status 7: the neighbour's error reaches the controller before the death does (after
    a SIGKILL it only sometimes does)."""

    def __call__(self, link: str, direction: str, *args: object) -> None:
        if direction != "backward":
            return
        for fd in os.listdir("/proc/self/fd"):
            try:
                sock = socket.socket(fileno=int(fd))
            except OSError:
                continue  # not a socket
            if sock.family in (socket.AF_INET, socket.AF_INET6):  # gloo's; not the pipe
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            sock.detach()
        time.sleep(0.3)
        os._exit(7)


def test_a_death_is_named_even_when_a_neighbour_s_error_comes_first() -> None:
    profile = Profile.uniform(2, 2, 1, 1, 1)
    with WorkerPool(2, timeout_s=20) as pool:
        pids = list(pool.pids)
        config = IterationConfig(0, one_f_one_b(profile), profile, fault_hook=_DieSlowly())
        # Status 7, or -6: gloo's own threads may abort the process on its shut sockets first.
        with pytest.raises(WorkerError, match=r"^rank 1 \(stage 1\) exited with code (7|-6) "):
            pool.run_iteration(config)
    assert not any(_alive(pid) for pid in pids)


def test_a_silent_peer_is_a_timeout_naming_the_op() -> None:
    """A stage whose schedule never sends what its neighbour waits for: gloo times out."""
    profile = Profile.uniform(2, 2, 1, 1, 1)
    with WorkerPool(2, timeout_s=3) as pool:
        pids = list(pool.pids)
        good = one_f_one_b(profile)
        pool.run_iteration(IterationConfig(0, good, profile))
        # Stage 1's list lacks F1/BW1, so stage 0 waits forever for BW1's gradient.
        from pipeline.schedule import Schedule

        broken = Schedule((good.stages[0], good.stages[1][:2]))
        with pytest.raises(WorkerError, match=r"rank 0 \(stage 0\), iteration 1: op BW1"):
            pool.run_iteration(IterationConfig(1, broken, profile))
    assert not any(_alive(pid) for pid in pids)


def test_pp_by_dp_runs_the_gradient_all_reduce() -> None:
    profile = Profile.uniform(2, 4, 2, 2, 2, message_bytes=1024)
    with WorkerPool(2, num_replicas=2, timeout_s=30) as pool:
        assert len(set(pool.pids)) == 4
        timeline = pool.run_iteration(
            IterationConfig(0, one_f_one_b(profile), profile, allreduce_bytes=4 << 20)
        )
    metrics = compute_metrics(timeline)
    assert len(timeline.ops) == 2 * (2 * 4 * 2)  # every rank: 2 replicas x 2 stages x (F, BW)
    assert {r.replica for r in timeline.ops} == {r.replica for r in timeline.messages} == {0, 1}
    assert len(timeline.messages) == 2 * (2 * 4)
    assert metrics.step_time_ms > 0
    assert timeline.iterations[0].end_ms >= max(r.end_ms for r in timeline.ops)


def test_a_closed_pool_says_so() -> None:
    profile = Profile.uniform(2, 2, 1, 1, 1)
    pool = WorkerPool(2)
    with pytest.raises(WorkerError, match="not running"):
        pool.run_iteration(IterationConfig(0, one_f_one_b(profile), profile))
