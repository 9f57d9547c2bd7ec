"""Falcon's second step: which group is slow, from one iteration's measurements.

Falcon profiles each communication group once a change is seen and calls a group suspect
when it takes more than 1.1 x the median group. Here the groups are the DP ring links (the
DP group's traffic of one stage between two replicas): a link's time is the median, over
its messages of the iteration, of arrival - wire start less what the link model expects for
its bytes (the timeline's own stamps: pipeline.timeline's `dp_messages`, never `fault_ms`).
A link is suspect when its time exceeds 1.1 x the median link's and is at least `margin_ms`
above it (on a healthy host a chunk takes a fraction of a millisecond, so 1.1 x alone would
flag timer noise).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from pipeline.profile import Profile
from pipeline.timeline import MessageRecord

__all__ = ["SLOW_RATIO", "dp_link_times_ms", "suspect_dp_links"]

SLOW_RATIO = 1.1
"""Falcon's threshold: a group slower than this many times the median is suspect."""


def dp_link_times_ms(profile: Profile, dp_messages: Iterable[MessageRecord]) -> dict[str, float]:
    """Each DP link's time in one iteration's messages (see the module), by link name."""
    spent: dict[str, list[float]] = {}
    for m in dp_messages:
        took = m.arrival_ms - m.wire_start_ms - profile.dp_wire_ms(m.num_bytes)
        spent.setdefault(m.link, []).append(took)
    return {link: statistics.median(times) for link, times in spent.items()}


def suspect_dp_links(times_ms: dict[str, float], margin_ms: float = 1.0) -> set[str]:
    """The links slower than `SLOW_RATIO` x the median link and `margin_ms` above it."""
    if len(times_ms) < 2:
        return set()
    median = statistics.median(times_ms.values())
    return {
        link
        for link, took in times_ms.items()
        if took > SLOW_RATIO * median and took - median >= margin_ms
    }
