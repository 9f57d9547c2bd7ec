"""The runtime's workers inside the testbed: network-level faults act on real gloo traffic."""

import os
import statistics

import pytest

from baselines import one_f_one_b
from injectors.testbed import Testbed
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerPool
from pipeline.simulator import CommMode, simulate

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI has it)"),
]

MIB = 1 << 20


def test_a_bandwidth_cap_slows_the_run_as_bytes_over_rate_predict() -> None:
    """1 MiB messages over a 100 Mbit/s cap on the only link: 84 ms per message."""
    profile = Profile.uniform(2, 4, 5, 5, 5, message_bytes=MIB)
    schedule = one_f_one_b(profile)
    with Testbed(2) as bed:
        bed.cap_bandwidth(0, 1, plane=0, rate_mbit=100)
        bed.cap_bandwidth(1, 0, plane=0, rate_mbit=100)
        with WorkerPool(2, launch=bed.launcher(), timeout_s=30) as pool:
            assert len(set(pool.pids)) == 2
            times = [
                compute_metrics(
                    pool.run_iteration(IterationConfig(i, schedule, profile)), i
                ).iteration_time_ms
                for i in range(3)
            ]
    capped = Profile.uniform(2, 4, 5, 5, 5, message_bytes=MIB, link_bandwidth_gbps=0.1)
    predicted = compute_metrics(simulate(schedule, capped, CommMode.DIRECT)).iteration_time_ms
    measured = statistics.median(times[1:])  # after the warm-up iteration
    assert predicted > 400  # the cap dominates: the free-wire prediction is 75 ms
    assert abs(measured / predicted - 1) < 0.10, (measured, predicted)


def test_a_network_delay_slows_the_run_like_the_same_delay_in_the_fault_hook() -> None:
    """20 ms one way on the pair's plane, against a 20 ms sleep before every send on the same
    link (the paper's injection). 8 KiB messages fit TCP's initial window; 64 KiB ones also
    pay slow-start round trips after each idle gap and came out 13 % slower."""
    profile = Profile.uniform(2, 4, 5, 5, 5, message_bytes=8 << 10)
    schedule = one_f_one_b(profile)

    def median_ms(pool: WorkerPool, hook_profile: Profile, first: int) -> float:
        times = [
            compute_metrics(
                pool.run_iteration(IterationConfig(i, schedule, hook_profile)), i
            ).iteration_time_ms
            for i in range(first, first + 3)
        ]
        return statistics.median(times[1:])

    with Testbed(2) as bed:
        with WorkerPool(2, launch=bed.launcher(), timeout_s=30) as pool:
            by_hook = median_ms(pool, profile.with_delays([20.0]), 0)
        bed.add_delay(0, 1, plane=0, delay_ms=20)
        with WorkerPool(2, launch=bed.launcher(), timeout_s=30) as pool:
            by_network = median_ms(pool, profile, 0)
    assert by_hook > 2 * 75  # the delay dominates: 75 ms without it
    assert abs(by_network / by_hook - 1) < 0.10, (by_network, by_hook)


def test_run_injects_a_profile_delay_in_the_network_like_the_hook(tmp_path) -> None:
    """`run --inject network`: the profile's 20 ms on link 0-1 goes onto the testbed's wire."""
    import json
    import subprocess
    import sys

    from injectors.testbed import PREFIX

    profile = tmp_path / "p.json"
    profile.write_text(
        json.dumps(
            {
                "stages": 2,
                "microbatches": 4,
                "t_f": 5,
                "t_b": 5,
                "t_w": 5,
                "delay_ms": [20],
                "message_bytes": 8192,
            }
        )
    )

    def median_ms(injection: str) -> float:
        out = subprocess.run(
            [sys.executable, "-m", "harness", "run", "--backend", "emulated", "--profile",
             str(profile), "--policy", "1f1b", "--iterations", "5", "--format", "json",
             "--inject", injection],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return float(json.loads(out.stdout)["median_iteration_ms"])

    by_network, by_hook = median_ms("network"), median_ms("hook")
    assert by_hook > 150  # 1F1B crosses the slow link 4 times: 95 ms without it
    assert abs(by_network / by_hook - 1) < 0.10, (by_network, by_hook)
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert PREFIX not in left  # the testbed is gone
