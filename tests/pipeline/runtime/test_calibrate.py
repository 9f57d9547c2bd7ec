"""The calibration's cost curves from its measured samples (the measurements themselves run
in tests/harness/test_cli.py: `calibrate`)."""

import itertools
import statistics

from hypothesis import given
from hypothesis import strategies as st

from pipeline.host_costs import NO_COST
from pipeline.runtime.calibrate import _curve


def test_a_tail_at_one_size_is_pooled_with_the_next() -> None:
    """64 KiB caught a 5 ms stall in one of its 4 samples, so its mean is above 256 KiB's:
    the two are pooled by their counts, and the curve does not fall."""
    samples = {0: [0.1, 0.1], 1 << 16: [0.2, 0.2, 0.2, 5.2], 1 << 18: [0.3] * 4, 1 << 20: [1.0]}
    curve = _curve(samples)
    pooled = (4 * 1.45 + 4 * 0.3) / 8
    assert curve.points == ((0, 0.1), (1 << 16, pooled), (1 << 18, pooled), (1 << 20, 1.0))
    assert _curve({0: [], 1: []}) == NO_COST
    assert _curve({0: [-0.5], 8: [-0.1]}).points == ((0, 0.0), (8, 0.0))  # costs, never < 0


@given(
    st.dictionaries(
        st.integers(0, 1 << 24),
        st.lists(st.floats(0, 50), min_size=1, max_size=5),
        min_size=1,
        max_size=6,
    )
)
def test_the_curve_never_falls_and_keeps_the_overall_mean(samples: dict) -> None:
    curve = _curve(samples)
    costs = [ms for _, ms in curve.points]
    assert [size for size, _ in curve.points] == sorted(samples)
    assert all(a <= b + 1e-9 for a, b in itertools.pairwise(costs))
    # pooling moves cost between sizes, weighted by their counts: the total stays
    weighted = sum(curve.ms(size) * len(values) for size, values in samples.items())
    total = sum(len(values) for values in samples.values())
    mean = statistics.fmean(v for values in samples.values() for v in values)
    assert abs(weighted / total - mean) <= 1e-6 * max(1.0, mean)
