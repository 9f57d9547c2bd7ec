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
