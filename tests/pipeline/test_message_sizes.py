"""Size classes: what the detector's floors and Falcon's groups compare. Each class spans
at most 5 % from its smallest size, the next starts where that is passed, and the classes
depend on the set of sizes only."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.message_sizes import SIZE_TOLERANCE, size_classes

SIZES = st.lists(st.integers(0, 10**9), max_size=30)


@given(SIZES)
def test_a_class_spans_at_most_the_tolerance_from_its_smallest_size(sizes: list[int]) -> None:
    classes = size_classes(sizes)
    assert set(classes) == set(sizes)
    for size, smallest in classes.items():
        assert classes[smallest] == smallest <= size <= smallest * (1 + SIZE_TOLERANCE)


@given(SIZES)
def test_the_next_class_starts_only_past_the_tolerance(sizes: list[int]) -> None:
    """No class could have taken the next one's smallest size: the classes are as few as the
    rule allows."""
    smallest = sorted(set(size_classes(sizes).values()))
    assert all(b > a * (1 + SIZE_TOLERANCE) for a, b in itertools.pairwise(smallest))


@given(SIZES, st.randoms(use_true_random=False))
def test_the_classes_depend_on_the_set_of_sizes_only(sizes: list[int], rng: random.Random) -> None:
    shuffled = sizes * 2
    rng.shuffle(shuffled)
    assert size_classes(shuffled) == size_classes(sizes)


def test_megatron_tiny_s_two_rings_are_one_class_and_40_mb_chunks_are_not_1_mb_ones() -> None:
    """Megatron tiny's gradients at 2 stages x DP 2 give chunks 0.6 % apart; the tests' rings
    of 40 MB and 1 MB chunks differ 40-fold."""
    assert size_classes([318_336, 316_544]) == {316_544: 316_544, 318_336: 316_544}
    assert size_classes([40_000_000, 1_000_000, 1_000_000]) == {
        1_000_000: 1_000_000,
        40_000_000: 40_000_000,
    }
    assert size_classes([100, 105, 106, 111]) == {100: 100, 105: 100, 106: 106, 111: 106}


def test_a_negative_tolerance_is_refused() -> None:
    with pytest.raises(ValueError, match="tolerance"):
        size_classes([1, 2], tolerance=-0.01)
