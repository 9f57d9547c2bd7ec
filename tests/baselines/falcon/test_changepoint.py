"""Falcon's change-point detector on iteration times."""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterable

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
    """1,000 iterations of 3 % noise: no change of >= 10 % (the rate over many runs: below)."""
    rng = random.Random(3)
    _, found = _feed([100 * rng.gauss(1, 0.03) for _ in range(1000)])
    assert found == []


def _noisy(rng: random.Random, noise: str) -> float:
    """A 3 % multiplicative noise factor: normal, or lognormal (a longer tail up)."""
    return rng.gauss(1, 0.03) if noise == "normal" else rng.lognormvariate(-0.00045, 0.03)


@pytest.mark.parametrize("noise", ["normal", "lognormal"])
def test_healthy_runs_at_3_percent_noise_report_no_change(noise: str) -> None:
    """60 seeded healthy runs of 300 iterations: no change reported (the target: at most 1 %
    of runs; 1 in 400 normal and 0 in 400 lognormal ones). Each run tests for a change at
    every iteration, and a 10 % change alone is one iteration 3.3 standard deviations out:
    these seeds gave 3 (normal) and 2 (lognormal) before a change also had to be
    `min_standard_errors` of the measured noise out (19 and 14 in 400 runs)."""
    fired = []
    for seed in range(60):
        rng = random.Random(seed)
        detector = ChangePointDetector()
        if any(detector.update(100 * _noisy(rng, noise)) for _ in range(300)):
            fired.append(seed)
    assert fired == []


@pytest.mark.parametrize(
    ("jump", "median_delay", "max_delay"), [(1.15, 1, 5), (1.2, 0, 4), (1.5, 0, 0)]
)
def test_a_step_at_3_percent_noise_is_found_in_every_seed_within_its_delay(
    jump: float, median_delay: int, max_delay: int
) -> None:
    """50 seeded runs, 40 healthy iterations then 20 at `jump` x, 3 % normal noise: nothing
    reported before the step, the step found in every run, its delay (iterations after the
    first slow one) at most these (+15 %: 5 standard deviations in one iteration, under the
    6 a single time needs, so mostly in the second)."""
    delays = []
    for seed in range(50):
        rng = random.Random(10_000 + seed)
        times = [100 * rng.gauss(1, 0.03) for _ in range(40)]
        times += [100 * jump * rng.gauss(1, 0.03) for _ in range(20)]
        _, found = _feed(times)
        assert found and found[0] >= 40, (seed, found)
        delays.append(found[0] - 40)
    assert statistics.median(delays) <= median_delay and max(delays) <= max_delay, delays


def test_a_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="hazard"):
        ChangePointConfig(hazard=0.0)
    with pytest.raises(ValueError, match="min_standard_errors"):
        ChangePointConfig(min_standard_errors=-1.0)


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


@pytest.mark.parametrize(
    "calibration",
    [[190.0, 565.0, 185.0], [250.0, 565.0, 185.0], [400.0, 565.0, 185.0], [1900.0, 565.0, 185.0]],
)
def test_a_slow_calibration_iteration_does_not_put_off_a_slowdown(
    calibration: list[float],
) -> None:
    """The prior was the first 3 times' median and 1.4826 x MAD: a slow one among them
    widened it (2 slow ones centred it on them), and a step from 190 to 400 ms at index 6
    was found 9, 22 and 2 iterations late ([250, ...], [400, ...], [1900, ...]). Now the
    first 3 set it where they agree, else the next 3 where those do (its spread at most 5 %
    of the median): the step is found where it began."""
    times = [*calibration, 190.0, 190.0, 190.0] + [400.0] * 30
    detector, found = _feed(times)
    assert found == [6]
    assert (detector.change_index, detector.baseline_ms) == (6, 190.0)


def test_first_times_that_never_agree_in_a_row_calibrate_on_the_lowest_that_agree() -> None:
    """No 3 of the first times in a row agree: the prior came from the best 3 in a row (140
    ms, neither level; two of the three outliers) and the step at index 4 was reported 6
    iterations late. Now from the lowest two that agree (100 and 100): reported at once."""
    detector, found = _feed([100.0, 180.0, 140.0, 100.0] + [337.0] * 30)
    assert found == [4] and detector.change_index == 4


@pytest.mark.parametrize(
    ("times", "expected"),
    [
        # a calibration outlier (130): its two steps were counted as noise, never reported
        ([100.0, 101, 130, 96, 105, 101] + [131.0, 129.0] * 15, [(6, 6)]),
        # two spikes, each a segment reported: the steps into them were noise, never reported
        ([103.0, 163, 104, 161, 103, 101] + [132.0, 128, 134, 130] * 8, [(3, 3), (5, 4), (7, 6)]),
        # 7 healthy times, one noisy step among them: the noise from them alone, 30 late
        ([102.0, 106, 98, 94.5, 106, 107, 101, 101] + [116.0, 114.0] * 20, [(16, 8)]),
    ],
)
def test_the_noise_is_steps_within_levels_the_new_ones_too(
    times: list[float], expected: list[tuple[int, int]]
) -> None:
    """The noise a new segment must stand out of is measured from steps within a level: not
    into or out of a calibration outlier or a segment reported, and the new segment's own
    steps count too (a previous segment of a few times kept its noise estimate however long
    the new one went on)."""
    detector = ChangePointDetector()
    found = [(k, detector.change_index) for k, ms in enumerate(times) if detector.update(ms)]
    assert found == expected


@pytest.mark.parametrize("first_ms", [250.0, 565.0])
def test_two_slow_first_iterations_that_agree_are_a_level_left_behind(first_ms: float) -> None:
    """Two slow first iterations agree on their level (the prior's): the return to 190 ms is
    a change to faster, where the prior moves, and the step to 400 ms right after it is
    found at once (with the prior left on the slow level, the healthy segment's variance was
    inflated by its distance to it: found 6 and 15 iterations late)."""
    detector = ChangePointDetector()
    times = [first_ms, first_ms] + [190.0] * 4 + [400.0] * 30
    reported = [(k, detector.segment_ms) for k, ms in enumerate(times) if detector.update(ms)]
    assert reported == [(3, 190.0), (6, 400.0)]
    assert (detector.change_index, detector.baseline_ms) == (6, 190.0)


@pytest.mark.parametrize("first_ms", [[2000.0], [565.0, 400.0], [565.0, 565.0]])
def test_slow_first_iterations_then_noise_alone_look_like_no_slowdown(
    first_ms: list[float],
) -> None:
    """A run's slow first iterations, then 500 of 3 % noise: no change to a slower level
    (two that agree are a level of their own: the only change is the one back from it)."""
    rng = random.Random(3)
    detector = ChangePointDetector()
    times = first_ms + [190 * rng.gauss(1, 0.03) for _ in range(500)]
    reported = [k for k, ms in enumerate(times) if detector.update(ms)]
    left_behind = first_ms == [565.0, 565.0]
    assert reported == ([3] if left_behind else [])
    assert detector.segment_ms == pytest.approx(190.0, rel=0.01)
    assert detector.baseline_ms == (565.0 if left_behind else pytest.approx(190.0, rel=0.05))


def test_a_long_run_stays_in_the_last_bin_and_takes_no_medians(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The posterior was cut at `max_run_length` bins, dropping the longest run (nearly all
    its mass) each update: the most likely run length fell below the iterations since the
    segment began, and every update took two medians of the whole history (quadratic). The
    tail now folds into the last bin, which holds the run for good."""
    rng = random.Random(3)
    detector = ChangePointDetector()
    cap = detector.config.max_run_length
    for _ in range(2 * cap):
        detector.update(100 * rng.gauss(1, 0.03))
    medians: list[int] = []
    real_median = statistics.median

    def counted_median(data: Iterable[float]) -> float:
        values = list(data)
        medians.append(len(values))
        return real_median(values)

    monkeypatch.setattr(statistics, "median", counted_median)
    most_likely = []
    for _ in range(cap):
        assert not detector.update(100 * rng.gauss(1, 0.03))
        most_likely.append(detector.most_likely_run_length)
    assert most_likely == [cap - 1] * cap
    assert medians == []


def test_a_change_after_the_last_bin_is_found_where_it_began() -> None:
    """Past `max_run_length` iterations the capped run still gives way to a new segment."""
    rng = random.Random(4)
    times = [100 * rng.gauss(1, 0.03) for _ in range(500)]
    times += [150 * rng.gauss(1, 0.03) for _ in range(30)]
    times += [100 * rng.gauss(1, 0.03) for _ in range(30)]
    detector, found = _feed(times)
    assert found == [500, 530]
    assert detector.baseline_ms == pytest.approx(150, rel=0.03)
    assert detector.segment_ms == pytest.approx(100, rel=0.03)


def test_a_config_with_no_room_for_a_run_is_refused() -> None:
    with pytest.raises(ValueError, match="max_run_length"):
        ChangePointConfig(max_run_length=1)


def _with_segment_started_at(
    times: list[float], start: int, level_start: int = 4
) -> tuple[ChangePointDetector, list[int]]:
    """`times` fed in order, the caller starting a segment at index `start` (after its
    update), back at the level the segment from `level_start` left; the indices whose update
    reported a change."""
    detector, found = ChangePointDetector(), []
    for k, ms in enumerate(times):
        if detector.update(ms):
            found.append(k)
        if k == start:
            detector.start_segment(level_start)
    return detector, found


@pytest.mark.parametrize(("back_ms", "reported_at"), [(260.0, 8), (270.0, 9)])
def test_a_return_after_a_segment_the_caller_started_is_a_change_at_once(
    back_ms: float, reported_at: int
) -> None:
    """A slowdown, one iteration back near the healthy level (a one-iteration dip is no
    change to the model: Falcon says it, its straggler gone with the time back), then the
    slowdown again. From the caller's new segment the return is reported in its first
    iteration (its second where the dip was 4 % over the healthy level), against the level
    the dip went back to: the healthy times and the dip, their median 260 ms (from the one
    time's posterior alone: 8 iterations later; without the caller, never)."""
    times = [260.0] * 4 + [300.0] * 3 + [back_ms] + [300.0] * 12
    detector, found = _with_segment_started_at(times, 7)
    assert found == [4, reported_at]
    assert detector.change_index == 8 and detector.baseline_ms == 260.0
    assert _feed(times)[1] == [4]


def test_a_segment_the_caller_started_at_a_steady_level_reports_nothing() -> None:
    """After the caller's segment the level stays (a swap's time, 5 % over the healthy one):
    no change; the baseline is the slowdown's median."""
    times = [260.0] * 4 + [300.0] * 3 + [273.0] * 20
    detector, found = _with_segment_started_at(times, 7)
    assert found == [4]
    assert detector.change_index == 7 and detector.baseline_ms == 300.0


def test_a_segment_is_started_only_after_the_calibration_and_its_own_first_time() -> None:
    detector = ChangePointDetector()
    for ms in (260.0, 260.0):
        detector.update(ms)
        detector.start_segment(0)  # still calibrating: nothing
    assert detector.update(260.0) is False and detector.change_index == 0
    with pytest.raises(ValueError, match="no level left at 4"):  # the change's own first
        _with_segment_started_at([260.0] * 4 + [300.0] * 6, 4)
    for level_start in (0, 3):  # the calibration's segment left no level; 3 begins none
        with pytest.raises(ValueError, match=f"no level left at {level_start}"):
            _with_segment_started_at([260.0] * 4 + [300.0] * 6, 6, level_start)


def test_a_slowdown_soon_after_the_callers_return_is_found_in_every_seed() -> None:
    """40 seeded runs at 3 % normal noise: 100 ms, +30 % in iterations 40-49, back at 50 (the
    caller starts its segment there, as Falcon does), +15 % from 52 on. The segment between
    holds 2 times: its noise was the prior's spread (from 3 calibration times, ~4.6 % here)
    and its median's error kept 6 standard errors near 20 % of the level however long the
    slowdown went on: 11 of these runs never reported it (30 of 200 over 70 iterations). Now
    the noise comes from the steps before it too, and the segment is compared with the level
    it went back to (the healthy times and its own): every run reports it, 28 within one
    iteration of its start, none later than 17 (18 with the noise from the
    previous segment alone)."""
    delays = []
    for seed in range(40):
        rng = random.Random(seed)
        detector, found, starts = ChangePointDetector(), [], []
        for k in range(80):
            level_ms = 130.0 if 40 <= k < 50 else 115.0 if k >= 52 else 100.0
            if detector.update(level_ms * rng.gauss(1, 0.03)):
                found.append(k)
                starts.append(detector.change_index)
            if k == 50:  # back at the level the slowdown's change left
                detector.start_segment(next(start for start in starts if start >= 40))
        delays.append(next((k - 52 for k in found if k >= 52), None))
    assert [seed for seed, delay in enumerate(delays) if delay is None] == []
    found_delays = [delay for delay in delays if delay is not None]
    assert sum(delay <= 1 for delay in found_delays) == 28 and max(found_delays) == 17


def test_a_return_after_changes_within_the_slowdown_goes_back_to_the_level_before_it() -> None:
    """Falcon's call pattern over a trace-like run (135 ms; a slowdown whose levels change
    within it, 2785 -> 585 ms; back; a straggler at 1800 then 515 ms; back; then 2480 ms):
    the caller says where each slowdown began, and its segments go back to the 135 ms level
    before it. Left to take the segment before the one left, the first return took the
    2785-2305 ms times (three changes were reported within the slowdown) for the level, the
    second those and nine 135s, and the 2480 ms slowdown (18 x) was never reported."""
    slowdown = [2785.0] * 3 + [2565.0] * 3 + [2305.0, 660.0] + [600.0] * 3 + [585.0] * 7
    times = [135.0] * 10 + slowdown + [135.0] * 9 + [1800.0] * 3 + [515.0] * 4 + [135.0] * 3
    times += [2480.0] * 8
    returns = {10 + len(slowdown), 10 + len(slowdown) + 16}  # the first 135 after each
    detector, found, since_return = ChangePointDetector(), [], []
    for k, ms in enumerate(times):
        if detector.update(ms):
            found.append(k)
            since_return.append(detector.change_index)
        if k in returns:  # where the first change up since the last return began
            detector.start_segment(since_return[0])
            level = detector._segments[-1].before
            assert level == [135.0] * len(level) and len(level) >= 10
            since_return = []
    assert found[0] == 10 and found[-1] == len(times) - 8  # the 2480 ms run, at its first
    assert detector.baseline_ms == 135.0


def test_the_healthy_time_is_the_calibration_s_or_a_faster_level_found_since() -> None:
    """(Falcon prices its ladder from it.) A slow level after the calibration leaves it; a
    level found faster than the calibration's (a slow start) is it."""
    assert ChangePointDetector().healthy_ms is None
    detector, found = _feed([100.0] * 4 + [300.0] * 6)
    assert found == [4] and detector.healthy_ms == 100.0 and detector.baseline_ms == 100.0
    detector, found = _feed([180.0] * 3 + [100.0] * 10 + [300.0] * 6)
    assert found == [3, 13] and detector.healthy_ms == 100.0
