"""Falcon's first step: a change in iteration time, found by Bayesian online change-point
detection (Adams and MacKay, 2007) over the run's iteration times, kept only where the new
level differs from the old one by at least a minimum relative change.

The model: iteration times are normal within a segment, with unknown mean and variance
(a normal-gamma prior, so each run length's predictive is a Student t), and a segment ends
with a constant hazard per iteration. After each time the detector holds the posterior over
the current segment's length (its run length, in `max_run_length` bins: the last one's
length stands for every longer one too, its mass folded in, so that an update's cost stays
bounded). It reports a change when the most likely run length is shorter than the
iterations since the last change it reported (a new segment began; the last bin never is)
and that new segment's median so far differs from the previous segment's by at least
`min_relative_change` (medians: a run's first iteration may be far slower than the rest).

Why these values (`ChangePointConfig`): a hazard of 1/100 (a straggler per hundred
iterations is already a bad cluster); the prior is taken from the data (the median of
`num_calibration` iterations in a row and 1.4826 x their median absolute deviation, at least
1 % of the median; a calibration time more than 5 of those from the median is left out), so
the detector needs no units; 10 % minimum change, as Falcon's own threshold of
"slow" (1.1 x) and well above iteration-time noise here (BENCHMARKS.md).

The minimum change alone was not enough: at 3 % multiplicative noise a 10 % change is one
iteration 3.3 standard deviations out, which happens about once in 1,000 iterations, and the
most likely run length moves to such a one-iteration segment often enough (it is tested at
every iteration) that 19 of 400 healthy runs of 300 iterations reported a change (14 of 400
with lognormal noise), and a one-iteration segment faster than the prior re-centred it there,
so that the way back was reported too, 12-70 iterations later. So a new segment counts only
if its median is also `min_standard_errors` standard errors from the previous segment's: the
noise measured over the previous segment (its relative steps between successive times, their
root mean square over the square root of 2, a step more than `_STEP_TRIM` robust standard
deviations out left out: a segment may hold several levels the model did not split, and a
spread about its median counted those as noise and hid the way back from them; where it
has fewer than `noise_steps` steps, those of the times before it too, back to that many but
never before the calibration; the new segment's own steps too; fewer than
`min_noise_steps` in all: the prior's spread), the standard error of a median of n normal
times 1/sqrt(n) of it for one or two, sqrt(pi/(2n)) for more, both segments' added in
quadrature. The value, 6: a normal quantile of about 4.9 (a chance of 1e-6 per iteration,
both ways) widened for a noise estimated from tens of times (Student's t with about 30
degrees of freedom is near 6 there); with it 1 of 400 such healthy runs reports a change
(a run whose first 4 times agreed to 0.3 %: the prior's 1 % spread is the noise then), 0 of
400 with lognormal noise, and a step of +15 % at that noise is found a median 1 iteration
after it began (at most 7 in 200 runs), +20 % in its first (at most 3), +50 % always in
its first. Noise-free times (the simulator's) measure no noise (the prior's spread, in the
first iterations after the calibration, is its 1 % floor then: 6 standard errors at most
8.5 % for one time after one time): only the minimum change counts.

A previous segment of a few times alone measured no noise (the prior's spread stood for it,
taken from 3 calibration times: about 4.6 % in runs of 3 % noise), and its median's error,
of a few times, does not shrink as the new segment grows: after Falcon's return
(`start_segment`) a +15 % slowdown 2 iterations later, at 3 % noise, was never reported in
30 of 200 runs (4 later: 20; 6 later: 10; +20 % 2 later: 8). So the noise takes the steps
before such a segment too (above), and a segment the caller said went back to an earlier
level is compared with that level's times as well as its own (`start_segment`): 197 of the
same 200 runs report it, a median 1 iteration after it began (at most 23; 4 later: 199, 6
later: 200; +20 % 2 later: all, 0, at most 13), against 199 (at most 27) before the noise
test; the ones left returned high, within the minimum change of the slowdown (below). A
return only part of the way (a swap's time, 5-8 % over the healthy level, where Falcon's
test of "back" is 10 %) then measures against the healthy level, and a change counts only
if it is
`min_relative_change` from the segment's own median too: 2 and 5 of 200 such runs report a
change after it (before: 5 and 5), 1 of 200 returns to the healthy level itself (before: 0).

A step is noise only within a level: one into a segment reported (or started by the
caller), or into or out of a calibration outlier, is left out. With them in, one slow time
among the first 6 (100, 101, 130, 96, 105, 101 ms) or two one-iteration spikes gave a noise
of 12-33 %, and a +30 % slowdown right after was never reported; with the noise from the
previous segment alone, a segment of a few times kept one noisy step's estimate however
long the new one went on (a +15 % step after 7 healthy times at 3 % noise: missed in 90 of
400 runs of 60 iterations where the first 4 may be a warm-up's, 1.2-2 x, each with a chance
of 0.3; now in none, a median 3 iterations after it began; healthy runs report as before).

The calibration iterations: the first `num_calibration` if they agree (their spread at most
`max_relative_spread`, 5 % and half the minimum change, of their median), else the next
`num_calibration` if those agree, else the lowest `num_calibration` - 1 of those times that
agree, in any order (an iteration may be slower than the healthy level, not faster: times of
100, 180, 140 and 100 ms set it at 100, where the best 3 in a row set it at 140 and a
slowdown to 337 ms was found 6 iterations late), else the `num_calibration` in a row that
agree best; the prior's spread is at most `max_relative_spread` of the median. A fresh
pool's first iterations may be far slower than the rest (first use of every path): one slow
time among three made the prior wide enough, and two centred it on them, to hide a 2 x
slowdown for tens of iterations; a time before the calibration iterations is in no segment.
A reported change to a level faster than the prior's mean re-centres the prior there (same
relative spread) and takes the new segment's posterior afresh from its times: the
calibration iterations agreed on a slow level (two slow ones among three), and every new
segment's statistics started from it, so that the healthy level's variance was inflated and
a slowdown from it went unseen."""

from __future__ import annotations

import bisect
import dataclasses
import math
import statistics

__all__ = ["DEFAULT_CHANGES", "ChangePointConfig", "ChangePointDetector"]

_STEP_TRIM = 3.0
"""A step between successive times further than this many of its robust standard deviations
from none is left out of the noise (a step from one level to another within a segment)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ChangePointConfig:
    hazard: float = 0.01
    """The prior chance, per iteration, that a new segment begins."""
    min_relative_change: float = 0.10
    """A new segment counts only if its mean differs from the previous one's by this much."""
    num_calibration: int = 3
    """Iterations in a row that set the prior before anything is reported (the module)."""
    max_relative_spread: float = 0.05
    """Calibration iterations agree when their spread is at most this fraction of their
    median; the prior's spread is at most that too (the module)."""
    max_run_length: int = 200
    """Run lengths the posterior tells apart; its last bin holds every run that long or
    longer (their mass folded into it), so an update costs the same however long the run."""
    min_standard_errors: float = 6.0
    """A new segment counts only if its median is also this many standard errors (of the
    difference of the two segments' medians, from the noise measured) away from the
    previous one's (the module): the check runs at every iteration, a 10 % change alone was
    a 3.3-sigma single iteration at 3 % noise, and the noise is itself estimated."""
    noise_steps: int = 30
    """Steps (pairs of successive times) the noise is measured from at least: the previous
    segment's, and where it has fewer, those of the times before it (since the calibration)
    too, back to this many (the module)."""
    min_noise_steps: int = 5
    """Steps since the calibration needed to measure the noise at all; with fewer, it is the
    prior's relative spread at the previous segment's level."""

    def __post_init__(self) -> None:
        if not 0 < self.hazard < 1 or self.min_relative_change < 0 or self.num_calibration < 2:
            raise ValueError("need 0 < hazard < 1, min_relative_change >= 0, calibration >= 2")
        if self.max_run_length < 2:
            raise ValueError("need max_run_length >= 2 (a new run and a longer one)")
        if not self.max_relative_spread > 0:
            raise ValueError("need max_relative_spread > 0")
        if self.min_standard_errors < 0 or not 2 <= self.min_noise_steps <= self.noise_steps:
            raise ValueError(
                "need min_standard_errors >= 0 and 2 <= min_noise_steps <= noise_steps"
            )


DEFAULT_CHANGES = ChangePointConfig()


@dataclasses.dataclass(slots=True)
class _Stats:
    """A run length's normal-gamma posterior."""

    count: float
    mean: float
    alpha: float
    beta: float

    def log_predictive(self, x: float, kappa0: float) -> float:
        """Student t log density of `x` under this posterior."""
        kappa = kappa0 + self.count
        scale2 = self.beta * (kappa + 1) / (self.alpha * kappa)
        nu = 2 * self.alpha
        z = (x - self.mean) ** 2 / (nu * scale2)
        return (
            math.lgamma((nu + 1) / 2)
            - math.lgamma(nu / 2)
            - 0.5 * math.log(nu * math.pi * scale2)
            - (nu + 1) / 2 * math.log1p(z)
        )

    def updated(self, x: float, kappa0: float) -> _Stats:
        kappa = kappa0 + self.count
        mean = (kappa * self.mean + x) / (kappa + 1)
        beta = self.beta + kappa * (x - self.mean) ** 2 / (2 * (kappa + 1))
        return _Stats(self.count + 1, mean, self.alpha + 0.5, beta)


@dataclasses.dataclass(slots=True)
class _Segment:
    """A segment of the times: from a change reported, the calibration or the caller's."""

    start: int
    """The index of its first time."""
    before: list[float] = dataclasses.field(default_factory=list)
    """Times at its level from before it began: where the caller said it went back to an
    earlier level (`ChangePointDetector.start_segment`), that level's (at most
    `max_run_length`, the latest); a new segment is compared with them and its own (and so
    is a segment that leaves it: `ChangePointDetector.level_left`)."""
    by_caller: bool = False
    """The caller said its level."""


class ChangePointDetector:
    """Feed it iteration times in order (`update`); it says where a change began."""

    def __init__(self, config: ChangePointConfig = DEFAULT_CHANGES) -> None:
        self.config = config
        self._times: list[float] = []
        self._prior: _Stats | None = None
        self._kappa0 = 1.0
        self._log_probs: list[float] = []
        self._stats: list[_Stats] = []
        self._segments = [_Segment(0)]
        """Every segment since the calibration's, in order (the current one, the last change
        reported or the caller's, last): `start_segment` may go back to the level any of them
        left."""
        self._first = 0
        """The index of the first calibration time (an earlier one is in no segment)."""
        self._unstepped = 0
        """Times of the current segment the model never took (calibration outliers): its run
        length is that much shorter than the times since the segment's start."""
        self._not_noise: set[int] = set()
        """Indices whose step from the time before is no noise: a segment's first time, and a
        calibration outlier's and the one after it."""
        self.baseline_ms: float | None = None
        """The median iteration time of the segment before the latest change (before any:
        of the first iterations)."""
        self.healthy_ms: float | None = None
        """The healthy iteration time: the calibration's level, or the fastest level a
        change reported since went to where that is faster (None while calibrating)."""

    @property
    def _segment_start(self) -> int:
        """The index of the first time of the current segment."""
        return self._segments[-1].start

    @property
    def segment_ms(self) -> float:
        """The current segment's median iteration time so far."""
        return statistics.median(self._times[self._segment_start :])

    def update(self, iteration_ms: float) -> bool:
        """Take the next iteration time; True if it completes the detection of a change (a new
        segment, `min_relative_change` away from the one before, began at `change_index`)."""
        self._times.append(iteration_ms)
        config = self.config
        if self._prior is None:
            self._calibrate()
            return False
        self._step(iteration_ms)
        most_likely = self.most_likely_run_length
        since = len(self._times) - self._segment_start - self._unstepped
        if most_likely >= min(since, config.max_run_length - 1) or most_likely == 0:
            return False  # no new segment (yet): the last bin is every run that long or longer
        start = len(self._times) - most_likely
        new, own = self._times[start:], self._times[self._segment_start : start]
        old = self._segments[-1].before + own
        new_ms, old_ms = statistics.median(new), statistics.median(old)
        if abs(new_ms - old_ms) < config.min_relative_change * old_ms:
            return False
        own_ms = statistics.median(own)  # (the caller's level may be off: a partial return)
        if abs(new_ms - own_ms) < config.min_relative_change * own_ms:
            return False
        standard_error = self._noise_ms(start, old_ms) * math.hypot(
            _median_error(len(new)), _median_error(len(old))
        )
        if abs(new_ms - old_ms) < config.min_standard_errors * standard_error:
            return False  # within the noise: one noisy time, or a few, past the minimum
        self._segments.append(_Segment(start))
        self._not_noise.add(start)
        self._unstepped = 0
        self.baseline_ms = old_ms
        assert self._prior is not None
        if new_ms < self._prior.mean:
            self._recentre(new_ms)
        assert self.healthy_ms is not None
        self.healthy_ms = min(self.healthy_ms, new_ms)
        return True

    def start_segment(self, level_start: int) -> None:
        """Begin a new segment with the latest time, at the level that the segment beginning
        at index `level_start` left (the times of the segment before it: its own up to
        `level_start` and those it was compared with, the `baseline_ms` that segment's change
        reported): for a caller that knows the level went back there before the model can
        say so (Falcon: a straggler gone with the time back within 10 % of its baseline, the
        level before the change it validated, which began at `level_start`). The caller says
        which level: changes reported within the slowdown (its levels changing, a swap's
        effect) leave segments between, any of which the segment before the current one
        may be. The baseline is the current segment's median; the prior is re-centred on the
        latest time (as for a level found faster than it), and the new segment's posterior
        is taken from the level's times and the latest, so that a return to the current
        level is a change at once (from one time's posterior it took 9 iterations here:
        every run's prior is centred on the healthy level). A change from the new segment is
        measured against the level's times and its own (the module: a median of a few times
        alone kept 6 standard errors near 20 % of the level), and it is
        `min_relative_change` from its own too. Where the change `update` reported with the
        latest time was that return itself, that segment is the new one (its baseline as
        `update` set it). ValueError where `level_start` is no segment's start after the
        calibration's, or not before the latest time's segment."""
        start = len(self._times) - 1
        segments = self._segments
        current = segments[-1]
        if self._prior is None or start < current.start:
            return  # still calibrating
        if current.by_caller and start == current.start:
            return  # begun there already by the caller
        starts = [segment.start for segment in segments]
        at = bisect.bisect_left(starts, level_start)
        if not 0 < at < len(segments) or starts[at] != level_start or level_start >= start:
            raise ValueError(
                f"no level left at {level_start}: the segments after the calibration's begin "
                f"at {starts[1:]} and the latest time is {start}"
            )
        level = segments[at - 1]  # the segment the one at `level_start` left
        before = level.before + self._times[level.start : level_start]
        before = before[-self.config.max_run_length :]
        if start > current.start:  # the current segment is the one left
            self.baseline_ms = statistics.median(
                current.before + self._times[current.start : start]
            )
            segments.append(_Segment(start, before, by_caller=True))
        else:  # the change just reported, to the latest time, was the return (its baseline set)
            segments[-1] = _Segment(start, before, by_caller=True)
        self._not_noise.add(start)
        self._unstepped = 0
        self._recentre(self._times[-1])
        posterior = self._stats[0]
        for x in [*before, self._times[-1]]:
            posterior = posterior.updated(x, self._kappa0)
        self._stats[1] = posterior  # the run of the latest time: the level's

    def _recentre(self, mean: float) -> None:
        """The prior centred on `mean` (its relative spread kept), the current segment's
        posterior taken afresh from its times."""
        assert self._prior is not None
        relative = math.sqrt(self._prior.beta) / max(abs(self._prior.mean), 1e-9)
        spread = max(relative * abs(mean), 1e-9)
        self._prior = _Stats(0.0, mean, 1.0, spread**2)
        self._log_probs, self._stats = [0.0], [self._prior]
        for x in self._times[self._segment_start :]:
            self._step(x)

    def _calibrate(self) -> None:
        """The prior from `num_calibration` times in a row (the module)."""
        config = self.config
        count = config.num_calibration
        if len(self._times) < count:
            return
        windows = [
            self._times[start : start + count] for start in range(len(self._times) - count + 1)
        ]
        scales = [_relative_scale(window) for window in windows]
        agree = scales[-1] <= config.max_relative_spread
        if not agree and len(self._times) < count + 1:
            return  # one more time: the next ones may agree
        if agree:
            best, window, scale = len(windows) - 1, windows[-1], scales[-1]
        else:
            best, window, scale = _lowest_agreeing(self._times, config)
        mean = statistics.median(window)
        spread = min(max(scale, 0.01), config.max_relative_spread) * abs(mean)
        spread = max(spread, 1e-9)
        self._prior = _Stats(0.0, mean, 1.0, spread**2)
        self.baseline_ms = self.healthy_ms = mean
        self._segments, self._first = [_Segment(best)], best
        self._log_probs, self._stats = [0.0], [self._prior]
        for index, x in enumerate(self._times[best:], start=best):
            if abs(x - mean) <= 5 * spread:  # an outlier is in no segment's statistics
                self._step(x)
            else:
                self._unstepped += 1
                self._not_noise.update((index, index + 1))

    def _noise_ms(self, start: int, old_ms: float) -> float:
        """The iteration-time noise (a standard deviation) at the previous segment's level
        `old_ms`, for a new segment from index `start`: from the relative steps of the
        previous segment's times, and of those before it back to `noise_steps` steps (not
        before the calibration), where there are at least `min_noise_steps` (the module);
        else the prior's relative spread. A step into a segment or into or out of a
        calibration outlier is no noise (`_not_noise`)."""
        config = self.config
        times = self._times
        steps: list[float] = []
        for index in range(start - 1, self._first, -1):
            if index <= self._segment_start and len(steps) >= config.noise_steps:
                break
            if index not in self._not_noise:
                steps.append(
                    abs(times[index] - times[index - 1]) / max(abs(times[index - 1]), 1e-9)
                )
        steps += [
            abs(times[index] - times[index - 1]) / max(abs(times[index - 1]), 1e-9)
            for index in range(start + 1, len(times))
        ]
        if len(steps) < config.min_noise_steps:
            assert self._prior is not None
            return math.sqrt(self._prior.beta) / max(abs(self._prior.mean), 1e-9) * abs(old_ms)
        rough = 1.4826 * statistics.median(steps)  # a step's standard deviation, robustly
        kept = [d * d for d in steps if d <= _STEP_TRIM * rough]  # a level's edge is no noise
        return math.sqrt(sum(kept) / len(kept) / 2) * abs(old_ms)

    @property
    def most_likely_run_length(self) -> int:
        """The current segment's most likely length, in iterations the model took (0 before
        the prior is set; `max_run_length` - 1 stands for that many or more)."""
        if not self._log_probs:
            return 0
        return max(range(len(self._log_probs)), key=self._log_probs.__getitem__)

    @property
    def change_index(self) -> int:
        """The index (in the times fed) of the first time of the current segment."""
        return self._segment_start

    def _step(self, x: float) -> None:
        """The run-length posterior after `x` (growth and change, then normalise)."""
        assert self._prior is not None
        hazard = self.config.hazard
        log_h, log_1h = math.log(hazard), math.log1p(-hazard)
        predictive = [lp + s.log_predictive(x, self._kappa0) for lp, s in zip(
            self._log_probs, self._stats, strict=True)]  # fmt: skip
        grown = [p + log_1h for p in predictive]
        changed = _log_sum_exp(predictive) + log_h
        log_probs = [changed, *grown]
        stats = [self._prior, *(s.updated(x, self._kappa0) for s in self._stats)]
        cap = self.config.max_run_length
        if len(log_probs) > cap:  # the tail folded into the last bin, its mass kept
            log_probs = [*log_probs[: cap - 1], _log_sum_exp(log_probs[cap - 1 :])]
            stats = [*stats[: cap - 1], stats[-1]]
        total = _log_sum_exp(log_probs)
        self._log_probs = [p - total for p in log_probs]
        self._stats = stats


def _lowest_agreeing(
    times: list[float], config: ChangePointConfig
) -> tuple[int, list[float], float]:
    """The calibration where no `num_calibration` times in a row agree: the lowest
    `num_calibration` - 1 of `times` that agree, in any order (an iteration may be slower
    than the healthy level, never faster: the module), else the `num_calibration` in a row
    that agree best. The index of the first, the times and their relative scale."""
    count = config.num_calibration
    ranked = sorted(range(len(times)), key=times.__getitem__)
    for low in range(len(ranked) - count + 2):
        group = sorted(ranked[low : low + count - 1])
        chosen = [times[k] for k in group]
        scale = _relative_scale(chosen)
        if scale <= config.max_relative_spread:
            return group[0], chosen, scale
    windows = [times[k : k + count] for k in range(len(times) - count + 1)]
    scales = [_relative_scale(window) for window in windows]
    best = min(range(len(windows)), key=scales.__getitem__)
    return best, windows[best], scales[best]


def _relative_scale(times: list[float]) -> float:
    """1.4826 x the median absolute deviation of `times`, over their median."""
    mean = statistics.median(times)
    return 1.4826 * statistics.median(abs(x - mean) for x in times) / max(abs(mean), 1e-9)


def _median_error(count: int) -> float:
    """The standard error of the median of `count` normal times, in standard deviations:
    1/sqrt(count) for one or two (the median is their mean), else about sqrt(pi/(2 count))."""
    return 1 / math.sqrt(count) if count <= 2 else math.sqrt(math.pi / (2 * count))


def _log_sum_exp(values: list[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))
