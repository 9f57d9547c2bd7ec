"""The megatron profile's measuring order (the measurement itself runs in
tests/harness/test_progress.py and the GPU check's tests)."""

from __future__ import annotations

import pytest

from pipeline.runtime.megatron.profiling import measuring_order
from pipeline.schedule import peak_memory, validate_schedule


@pytest.mark.parametrize("num_stages", [1, 2, 4, 8])
@pytest.mark.parametrize("num_microbatches", [8, 64, 512])
def test_the_measuring_order_holds_what_1f1b_holds_whatever_the_microbatches(
    num_stages: int, num_microbatches: int
) -> None:
    """Every F, then every B, then every W held all `num_microbatches` activations on each
    stage (31 MiB more a microbatch for `small` at S = 2: bench_profile_memory.py); ZB-H1's
    order holds S - s on stage s and half of each of its s deferred Ws."""
    schedule = measuring_order(num_stages, num_microbatches)
    validate_schedule(schedule, num_stages, num_microbatches)
    peaks = [peak_memory(ops) for ops in schedule.stages]
    assert peaks == [num_stages - s / 2 for s in range(num_stages)]
