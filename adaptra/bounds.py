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
before it) and on the quality benchmark equals CP-SAT's proven optimum on every profile of
S >= 6 of both grids, the 50-seed (8, 32) sweep and the issue's profile (151 of 151;
the older bound 93).
"""

from __future__ import annotations

from pipeline.profile import Profile

__all__ = ["iteration_lower_bound_ms", "release_times_ms"]


def release_times_ms(profile: Profile) -> tuple[tuple[tuple[float, ...], ...], ...]:
    """Per stage, per kind (F, B, W): the earliest start of its m-th op of that kind."""
    num_stages, num_microbatches = profile.num_stages, profile.num_microbatches
    t_f, t_b, t_w = profile.t_f_ms, profile.t_b_ms, profile.t_w_ms
    transfer = [profile.transfer_ms(i) for i in range(num_stages - 1)]
    forward: list[list[float]] = []
    for i in range(num_stages):
        ranks: list[float] = []
        for m in range(num_microbatches):
            start = 0.0 if i == 0 else forward[i - 1][m] + t_f[i - 1] + transfer[i - 1]
            ranks.append(max(start, ranks[-1] + t_f[i]) if ranks else start)
        forward.append(ranks)
    backward: list[list[float]] = [[] for _ in range(num_stages)]
    for i in range(num_stages - 1, -1, -1):
        for m in range(num_microbatches):
            if i == num_stages - 1:
                start = forward[i][m] + t_f[i]
            else:
                start = backward[i + 1][m] + t_b[i + 1] + transfer[i]
            ranks = backward[i]
            ranks.append(max(start, ranks[-1] + t_b[i]) if ranks else start)
    weight: list[list[float]] = []
    for i in range(num_stages):
        ranks = []
        for b_start in backward[i]:
            start = b_start + t_b[i]
            ranks.append(max(start, ranks[-1] + t_w[i]) if ranks else start)
        weight.append(ranks)
    return tuple(
        (tuple(forward[i]), tuple(backward[i]), tuple(weight[i])) for i in range(num_stages)
    )


def iteration_lower_bound_ms(profile: Profile) -> float:
    durations = (profile.t_f_ms, profile.t_b_ms, profile.t_w_ms)
    bound_ms = 0.0
    for stage_idx, kinds in enumerate(release_times_ms(profile)):
        ops = sorted(
            (
                (release, durations[kind][stage_idx])
                for kind, ranks in enumerate(kinds)
                for release in ranks
            ),
            reverse=True,
        )
        work_after_ms = 0.0
        for release_ms, duration_ms in ops:
            work_after_ms += duration_ms
            bound_ms = max(bound_ms, release_ms + work_after_ms)
    return bound_ms
