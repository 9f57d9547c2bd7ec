"""Falcon's change-point detector on iteration times."""

from __future__ import annotations

import random

import pytest

from baselines.falcon.changepoint import ChangePointConfig, ChangePointDetector


def _feed(times: list[float]) -> tuple[ChangePointDetector, list[int]]:
    detector = ChangePointDetector()
    return detector, [i for i, t in enumerate(times) if detector.update(t)]


@pytest.mark.parametrize("jump", [1.15, 1.5, 3.0])
def test_a_step_in_iteration_time_is_found_where_it_began_and_its_end_too(jump: float) -> None:
    rng = random.Random(1)
    times = (
        [100 * rng.gauss(1, 0.03) for _ in range(20)]
        + [100 * jump * rng.gauss(1, 0.03) for _ in range(15)]
        + [100 * rng.gauss(1, 0.03) for _ in range(10)]
    )
    detector, found = _feed(times)
    assert found[0] == 20  # from the first slow iteration on
    assert found[-1] in (35, 36)  # and the way back
    assert detector.baseline_ms == pytest.approx(100 * jump, rel=0.05)  # the segment before


def test_a_change_under_the_minimum_is_not_reported() -> None:
    rng = random.Random(2)
    times = [100 * rng.gauss(1, 0.01) for _ in range(20)] + [105 * rng.gauss(1, 0.01)] * 15
    assert _feed(times)[1] == []


def test_noise_alone_looks_like_no_change() -> None:
    """1,000 iterations of 3 % noise: no change of >= 10 %. (At 5 %, where 10 % is two
    standard deviations, this seed gives 16: why Falcon then profiles and validates.)"""
    rng = random.Random(3)
    _, found = _feed([100 * rng.gauss(1, 0.03) for _ in range(1000)])
    assert found == []


def test_a_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="hazard"):
        ChangePointConfig(hazard=0.0)


@pytest.mark.parametrize("first_ms", [270.0, 2000.0, 5000.0])
def test_a_slow_first_iteration_neither_hides_a_change_nor_sets_the_baseline(
    first_ms: float,
) -> None:
    """A fresh pool's first iteration may take many times the others' (first use of every
    path): the change at index 5 is still found there, against a baseline of the healthy
    iterations' median."""
    detector, found = _feed([first_ms, 270, 272, 268, 275, 1190, 1185, 1200, 1195])
    assert found == [5]
    assert detector.baseline_ms in (270, 272)  # the median of the healthy ones


@pytest.mark.parametrize("spike_iterations", [1, 2, 3])
def test_the_return_after_a_short_spike_is_a_change_too(spike_iterations: int) -> None:
    """A one-iteration segment's end was never reported: the detector stayed on the spike's
    side for good (and Falcon on 'slower', catching a later sub-threshold straggler)."""
    detector = ChangePointDetector()
    times = [54.0] * 5 + [200.0] * spike_iterations + [54.0] * 12
    reported = [k for k, ms in enumerate(times) if detector.update(ms)]
    assert reported == [5, 5 + spike_iterations]
    assert detector.change_index == 5 + spike_iterations and detector.baseline_ms == 200.0
