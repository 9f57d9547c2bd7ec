"""A cheap lower bound on the iteration time of any schedule (`ideal` mode), to stop a search
whose incumbent is already provably optimal.

Release times by rank, then one machine per stage. Whatever the schedule:
- the m-th forward to start on stage i starts no earlier than the m-th forward to end on
  stage i-1, plus link i-1's transfer, and no earlier than the (m-1)-th forward there plus
  tF_i (stage 0's m-th: m tF_0);
- the m-th backward on stage i starts after the m-th backward to end on stage i+1 plus the
  transfer (on the last stage: after its own m-th forward), and after its (m-1)-th backward
  plus tB_i;
- the m-th W on stage i starts after the m-th B there has ended and after its (m-1)-th W plus
  tW_i (a W needs its own B).
These are lower bounds on each rank's start, whatever the microbatch that takes it. A stage
runs one op at a time, so for any release time r among its 3N ops, it ends no earlier than
r plus the work of every op whose release is r or later (the preemptive single-machine
bound). The bound is the largest of these over stages and r.

It contains the older bound of this module (the first forward's arrival plus all the work;
the first gradient's return plus every B and W and the forwards that could not start
before it) and equals CP-SAT's proven optimum on every profile of S >= 6 of the quality
benchmark (151 of 151: both grids, the 50-seed (8, 32) sweep and the issue's profile; the
older bound 93). Each rank's release is a max-plus prefix scan (`one_at_a_time`), in numpy.
"""

from __future__ import annotations

import numpy as np

from pipeline.profile import Profile

__all__ = ["BOUND_TOLERANCE", "iteration_lower_bound_ms", "meets_bound", "release_times_ms"]

BOUND_TOLERANCE = 1e-9
"""How far above the bound, as a fraction of it (at least 1e-9 ms), an iteration time still meets
it: a schedule's time and the bound are sums of the same times in other orders, and their
rounding grows with the time (a 91 s iteration of 0.1 ms-decimal ops at its bound timed 1.2e-9
ms above it, and a search that took 1e-9 ms absolute for a tie ran 162 candidates, 3.7 s,
where its first start was optimal)."""


def meets_bound(time_ms: float, bound_ms: float) -> bool:
    """Whether `time_ms` is at `bound_ms` up to rounding (BOUND_TOLERANCE): proven optimal."""
    return time_ms <= bound_ms + BOUND_TOLERANCE * max(1.0, abs(bound_ms))


def release_times_ms(profile: Profile) -> tuple[tuple[np.ndarray, ...], ...]:
    """Per stage, per kind (F, B, W): the earliest start of its m-th op of that kind, m = 0..N-1
    (non-decreasing arrays)."""
    num_stages, num_microbatches = profile.num_stages, profile.num_microbatches
    t_f, t_b, t_w = profile.t_f_ms, profile.t_b_ms, profile.t_w_ms
    transfer = [profile.transfer_ms(i) for i in range(num_stages - 1)]
    ranks = np.arange(num_microbatches, dtype=np.float64)

    def one_at_a_time(earliest: np.ndarray, duration_ms: float) -> np.ndarray:
        """The m-th start when op m may start at earliest[m] and each takes duration_ms after
        the one before: max over k <= m of earliest[k] + (m - k) duration_ms."""
        return ranks * duration_ms + np.maximum.accumulate(earliest - ranks * duration_ms)

    forward = [one_at_a_time(np.zeros(num_microbatches), t_f[0])]
    for i in range(1, num_stages):
        forward.append(one_at_a_time(forward[-1] + t_f[i - 1] + transfer[i - 1], t_f[i]))
    backward = [one_at_a_time(forward[-1] + t_f[-1], t_b[-1])]
    for i in range(num_stages - 2, -1, -1):
        backward.append(one_at_a_time(backward[-1] + t_b[i + 1] + transfer[i], t_b[i]))
    backward.reverse()
    return tuple(
        (forward[i], backward[i], one_at_a_time(backward[i] + t_b[i], t_w[i]))
        for i in range(num_stages)
    )


def iteration_lower_bound_ms(profile: Profile) -> float:
    durations = (profile.t_f_ms, profile.t_b_ms, profile.t_w_ms)
    num_microbatches = profile.num_microbatches
    bound_ms = 0.0
    for stage_idx, kinds in enumerate(release_times_ms(profile)):
        releases = np.concatenate(kinds)
        work_after_ms = sum(
            durations[kind][stage_idx]
            * (num_microbatches - np.searchsorted(ranked, releases, side="left"))
            for kind, ranked in enumerate(kinds)
        )
        bound_ms = max(bound_ms, float(np.max(releases + work_after_ms)))
    return bound_ms
