"""Falcon's second step: which group is slow, from one iteration's measurements.

Falcon profiles each communication group once a change is seen and calls a group suspect
when it takes more than 1.1 x the median group. Here the groups are the links: each DP ring
link (the DP group's traffic of one stage between two replicas) and each replica's PP link.
A link's time is the median, over its messages of the iteration, of arrival - wire start
less what the link model expects for its bytes (the timeline's own stamps: pipeline.timeline,
never `fault_ms`). A link is suspect when its time exceeds 1.1 x the median link's of its
kind (DP links with DP links, PP links with PP links: their messages differ) and is at least
`margin_ms` above it (on a healthy host a message takes a fraction of a millisecond, so
1.1 x alone would flag timer noise). A replica's per-microbatch time (what a rebalance
weighs) is its pipeline's span over its microbatch count.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable

from pipeline.profile import Profile
from pipeline.timeline import MessageRecord, Timeline
from pipeline.topology import Link

__all__ = [
    "SLOW_RATIO",
    "dp_link_times_ms",
    "per_microbatch_ms",
    "pp_link_times_ms",
    "suspect_links",
]

SLOW_RATIO = 1.1
"""Falcon's threshold: a group slower than this many times the median is suspect."""


def _median_times(
    messages: Iterable[MessageRecord],
    name: Callable[[MessageRecord], str],
    expected_ms: Callable[[MessageRecord], float],
) -> dict[str, float]:
    spent: dict[str, list[float]] = {}
    for m in messages:
        spent.setdefault(name(m), []).append(m.arrival_ms - m.wire_start_ms - expected_ms(m))
    return {link: statistics.median(times) for link, times in spent.items()}


def dp_link_times_ms(profile: Profile, dp_messages: Iterable[MessageRecord]) -> dict[str, float]:
    """Each DP link's time in one iteration's DP ring messages, by link name."""
    return _median_times(dp_messages, lambda m: m.link, lambda m: profile.dp_wire_ms(m.num_bytes))


def pp_link_times_ms(profile: Profile, messages: Iterable[MessageRecord]) -> dict[str, float]:
    """Each replica's PP links' times in one iteration's PP messages, by concrete link name
    ("pp1:2-3")."""
    wire_ms = profile.wire_ms()
    return _median_times(
        messages, lambda m: str(Link.pp(Link.parse(m.link).first, m.replica)), lambda m: wire_ms
    )


def suspect_links(times_ms: dict[str, float], margin_ms: float = 1.0) -> set[str]:
    """The links slower than `SLOW_RATIO` x the median link and `margin_ms` above it (where
    more than half the links are slow, the median is one of them: none is suspect)."""
    if len(times_ms) < 2:
        return set()
    median = statistics.median(times_ms.values())
    return {
        link
        for link, took in times_ms.items()
        if took > SLOW_RATIO * median and took - median >= margin_ms
    }


def per_microbatch_ms(timeline: Timeline, counts: tuple[int, ...]) -> tuple[float, ...]:
    """Each replica's time per microbatch in the timeline's (last) iteration: from the
    iteration's start to its last op's end, over `counts[replica]`."""
    (record,) = timeline.iterations[-1:]
    ends = [record.start_ms] * len(counts)
    for op in timeline.ops:
        if op.iteration == record.iteration:
            ends[op.replica] = max(ends[op.replica], op.end_ms)
    return tuple((end - record.start_ms) / count for end, count in zip(ends, counts, strict=True))
