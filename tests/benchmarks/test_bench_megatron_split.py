"""bench_megatron_split times each backward from no gradients, as the GPU check does."""

import pytest

from pipeline.runtime.megatron.reference import single_process_megatron
from tests.benchmarks.scripts import load_script, record_backwards

pytest.importorskip("megatron.core", reason="the megatron backend needs megatron-core")

bench = load_script("bench_megatron_split")


def test_every_backward_starts_from_no_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused backward ran onto the last repeat's W's gradients and W onto the fused
    backward's: each added to gradients there (a pass over every gradient), so BENCHMARKS.md's
    ratio compared two accumulating backwards, unlike benchmarks/gpu/check.py's split_ratio."""
    seen = record_backwards(monkeypatch, bench.StageRunner)
    with single_process_megatron():
        fused_s, b_s, w_s = bench._measure("tiny", 1)
    assert seen == [("fused", False), ("W", False)] * 3  # two warm-ups, one repeat
    assert fused_s > 0 and b_s > 0 and w_s > 0
