"""Falcon's rebalance is the split that minimises the slowest replica's m_i t_i."""

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from baselines.falcon.rebalance import rebalance
from pipeline.errors import ConfigError


def _best_cost(total: int, times: list[float], minimum: int) -> float:
    """By brute force over every split."""
    best = float("inf")
    for split in itertools.product(range(minimum, total + 1), repeat=len(times)):
        if sum(split) == total:
            best = min(best, max(m * t for m, t in zip(split, times, strict=True)))
    return best


@given(
    times=st.lists(st.integers(1, 40).map(float), min_size=1, max_size=3),
    minimum=st.integers(1, 3),
    extra=st.integers(0, 9),
)
def test_the_split_is_optimal_and_covers_the_batch(
    times: list[float], minimum: int, extra: int
) -> None:
    total = minimum * len(times) + extra
    split = rebalance(total, times, minimum)
    assert sum(split) == total and min(split) >= minimum
    cost = max(m * t for m, t in zip(split, times, strict=True))
    assert cost == _best_cost(total, times, minimum)


def test_a_replica_twice_as_slow_gets_half_the_microbatches() -> None:
    assert rebalance(12, [10.0, 20.0]) == (8, 4)
    assert rebalance(16, [10.0, 10.0]) == (8, 8)  # healthy: the equal split
    assert rebalance(16, [10.0, 100.0], minimum=4) == (12, 4)  # never under the minimum


@pytest.mark.parametrize(
    ("total", "times", "minimum", "match"),
    [
        (5, [1.0, 1.0], 3, "cannot give 2 replica"),
        (4, [], 1, "cannot give 0 replica"),
        (4, [1.0, 0.0], 1, "must be > 0"),
    ],
)
def test_impossible_splits_are_refused(
    total: int, times: list[float], minimum: int, match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        rebalance(total, times, minimum)
