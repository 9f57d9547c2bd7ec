"""Search over Algorithm 3's per-stage knobs, judged by exact timing, within a candidate budget.

The generator turns a policy (warm-up counts x_i and in-flight caps k_i) into a schedule;
small changes to it sometimes buy what Eq. (1)'s per-link rule cannot see. The search starts
from the given policies and, for each, from its "exact warm-up" twin: the forwards that policy
actually ran before its first B (`B > F > W` keeps starting forwards while gradients are on
their way) as the warm-up, capped after it at the planned x_i, so that a stage holds back
forwards once the gradients arrive. From the best start it climbs (first improvement) over
one stage's x_i, one link's slackness (x_0..x_i together), one stage's cap (see
`policy_neighbours`); from the local optimum it kicks (an iterated local search): two random
one-step moves from the best policy so far, a climb from there, kept if it is faster. On the
quality benchmark's worst profiles the climb's local optimum is where a larger budget alone
buys nothing; the kicks are what a larger budget pays for (climbing from the other starts
instead paid nothing there). It stops after `max_candidates` timings (or as many kicks), or
as soon as a start, twin or step meets `lower_bound_ms` (proven optimal). Candidates are
timed by `time_policy`, which builds no schedule; the budget counts candidates, not
milliseconds, and the kicks' moves come from a fixed seed, so the same profile always gives
the same policy.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator, Sequence

from adaptra.bounds import meets_bound
from adaptra.generator import Policy
from adaptra.policy_timing import PolicyTiming, time_policy
from pipeline.profile import Profile

__all__ = ["SearchResult", "policy_neighbours", "search_policy"]

_TOLERANCE_MS = 1e-9
_KICK_MOVES = 2
"""Random one-step moves per kick: 2 paid most on the quality benchmark (1 and 3 less)."""
_KICK_SEED = 0
"""Every call kicks alike: the same profile always gives the same policy."""


@dataclasses.dataclass(frozen=True, slots=True)
class SearchResult:
    policy: Policy
    timing: PolicyTiming
    """Its iteration time and schedule (`timing.schedule()`)."""
    num_candidates: int
    """Policies timed, starts included."""
    at_lower_bound: bool
    """The iteration time meets the lower bound: no schedule is faster."""

    @property
    def iteration_time_ms(self) -> float:
        return self.timing.iteration_time_ms


def policy_neighbours(policy: Policy, x_cap: int, num_microbatches: int) -> Iterator[Policy]:
    """One-step changes of `policy`, within 1 <= x_i <= x_cap and 1 <= k_i < N (None: no cap).

    In the order they pay most often on the quality benchmark: one stage's x_i down, one
    link's slackness down (x_0..x_i together), the same two up, then one stage's cap.
    """
    for step in (-1, 1):
        yield from _warmup_steps(policy, step, x_cap)
        yield from _slackness_steps(policy, step, x_cap)
    warmup, caps = policy.warmup, policy.in_flight_caps
    for stage_idx, cap in enumerate(caps):
        options = (warmup[stage_idx] - 1, warmup[stage_idx]) if cap is None else (cap - 1, cap + 1)
        for option in options:
            new_cap = None if option >= num_microbatches else option
            if new_cap != cap and (new_cap is None or new_cap >= 1):
                yield Policy(warmup, (*caps[:stage_idx], new_cap, *caps[stage_idx + 1 :]))


def _warmup_steps(policy: Policy, step: int, x_cap: int) -> Iterator[Policy]:
    warmup = policy.warmup
    for stage_idx, x in enumerate(warmup):
        if 1 <= x + step <= x_cap:
            changed = (*warmup[:stage_idx], x + step, *warmup[stage_idx + 1 :])
            yield Policy(changed, policy.in_flight_caps)


def _slackness_steps(policy: Policy, step: int, x_cap: int) -> Iterator[Policy]:
    warmup = policy.warmup
    for link_idx in range(1, len(warmup) - 1):  # link 0's is x_0's own step
        # Changing Delta_i shifts x_0..x_i together.
        shifted = tuple(x + step if j <= link_idx else x for j, x in enumerate(warmup))
        in_range = all(1 <= x <= x_cap for x in shifted[: link_idx + 1])
        if in_range and shifted[link_idx] >= shifted[link_idx + 1] >= 1:
            yield Policy(shifted, policy.in_flight_caps)


def search_policy(
    profile: Profile,
    starts: Sequence[Policy],
    *,
    x_cap: int,
    max_candidates: int,
    lower_bound_ms: float = 0.0,
) -> SearchResult:
    """The best policy found from `starts` (and their exact warm-up twins) by hill climbing.

    Every start and twin is timed, whatever the budget, unless one meets the lower bound; the
    result is never worse than the best start.
    """
    timed: dict[Policy, PolicyTiming] = {}

    def time_of(policy: Policy) -> float:
        if policy not in timed:
            timed[policy] = time_policy(profile, policy)
        return timed[policy].iteration_time_ms

    def result(best: Policy) -> SearchResult:
        timing = timed[best]
        at_bound = meets_bound(timing.iteration_time_ms, lower_bound_ms)
        return SearchResult(best, timing, len(timed), at_bound)

    seeds: list[Policy] = []
    for start in starts:
        if meets_bound(time_of(start), lower_bound_ms):
            return result(start)
        twin = Policy(
            tuple(min(x, x_cap) for x in timed[start].warmup_counts),
            tuple(None if x >= profile.num_microbatches else x for x in start.warmup),
        )
        if meets_bound(time_of(twin), lower_bound_ms):
            return result(twin)
        seeds += [twin, start]

    def neighbours(policy: Policy) -> Iterator[Policy]:
        return policy_neighbours(policy, x_cap, profile.num_microbatches)

    def spent() -> bool:
        return len(timed) >= max_candidates

    # Twins first: on a tie they are the better place to climb from.
    incumbent = _climb(min(seeds, key=time_of), neighbours, time_of, spent, lower_bound_ms)
    kicks = random.Random(_KICK_SEED)
    for _ in range(max_candidates):  # (bounds the kicks that find only timed policies)
        if spent() or meets_bound(time_of(incumbent), lower_bound_ms):
            break
        kicked = incumbent
        for _ in range(_KICK_MOVES):
            kicked = kicks.choice(list(neighbours(kicked)) or [kicked])
        found = _climb(kicked, neighbours, time_of, spent, lower_bound_ms)
        if time_of(found) < time_of(incumbent) - _TOLERANCE_MS:
            incumbent = found
    return result(incumbent)


def _climb(
    policy: Policy,
    neighbours: Callable[[Policy], Iterator[Policy]],
    time_of: Callable[[Policy], float],
    spent: Callable[[], bool],
    lower_bound_ms: float,
) -> Policy:
    """First improvement from `policy` until a local optimum, the bound or the budget."""
    improved = True
    while improved and not spent() and not meets_bound(time_of(policy), lower_bound_ms):
        improved = False
        for neighbour in neighbours(policy):
            if spent():
                break
            if time_of(neighbour) < time_of(policy) - _TOLERANCE_MS:
                policy, improved = neighbour, True
                break
    return policy
