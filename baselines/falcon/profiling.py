"""Falcon's second step: which group is slow, from one iteration's measurements.

Falcon profiles each communication group once a change is seen and calls a group suspect
when it takes more than 1.1 x the median group doing the same work. Here the groups are the
links: each DP ring link (the DP group's traffic of one stage between two replicas) and each
replica's PP link. A link's time is the median, over its messages of the iteration, of
arrival - wire start less what the link model expects for its bytes (the timeline's own
stamps: pipeline.timeline, never `fault_ms`). Links are compared only with links of their
kind whose messages are as large (`groups`: DP with DP, PP with PP, and median message
sizes in one class, within 5 %, `pipeline.message_sizes`: what a host adds to a message
grows with its size, and the stages' ring chunks differ with their gradients and buckets,
by 0.6 % between megatron tiny's two stages): a link is suspect when its time
exceeds 1.1 x its group's median link's and is at least `margin_ms` above it (on a healthy
host a message takes a fraction of a millisecond, so 1.1 x alone would flag timer noise).
Its excess over that median (`suspects`) is what ranks suspects of different groups: their
raw times hold different host costs. A replica's per-microbatch time (what a rebalance
weighs) is its pipeline's span over its microbatch count.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from pipeline.message_sizes import size_classes
from pipeline.profile import Profile
from pipeline.timeline import MessageRecord, Timeline
from pipeline.topology import Link, LinkKind

__all__ = [
    "SLOW_RATIO",
    "LinkTime",
    "dp_link_times_ms",
    "groups",
    "per_microbatch_ms",
    "pp_link_times_ms",
    "suspect_links",
    "suspects",
]

SLOW_RATIO = 1.1
"""Falcon's threshold: a group slower than this many times the median is suspect."""


class LinkTime(NamedTuple):
    """A link's profiled time in one iteration, and the size of message it is for."""

    ms: float
    num_bytes: int
    """Its messages' median size (the lower median)."""


def groups(times: Mapping[str, LinkTime]) -> dict[str, tuple[LinkKind, int]]:
    """Each link's group, the links it is compared with: its kind's whose messages' median
    size is in its size class among that kind's (`pipeline.message_sizes`; the group is
    named by the class's smallest size)."""
    kinds = {link: Link.parse(link).kind for link in times}
    size_class = {
        kind: size_classes(took.num_bytes for link, took in times.items() if kinds[link] is kind)
        for kind in set(kinds.values())
    }
    return {
        link: (kinds[link], size_class[kinds[link]][took.num_bytes]) for link, took in times.items()
    }


def _median_times(
    messages: Iterable[MessageRecord],
    name: Callable[[MessageRecord], str],
    expected_ms: Callable[[MessageRecord], float],
) -> dict[str, LinkTime]:
    spent: dict[str, list[float]] = {}
    sizes: dict[str, list[int]] = {}
    for m in messages:
        spent.setdefault(name(m), []).append(m.arrival_ms - m.wire_start_ms - expected_ms(m))
        sizes.setdefault(name(m), []).append(m.num_bytes)
    return {
        link: LinkTime(statistics.median(times), statistics.median_low(sizes[link]))
        for link, times in spent.items()
    }


def dp_link_times_ms(profile: Profile, dp_messages: Iterable[MessageRecord]) -> dict[str, LinkTime]:
    """Each DP link's time in one iteration's DP ring messages, by link name."""
    return _median_times(dp_messages, lambda m: m.link, lambda m: profile.dp_wire_ms(m.num_bytes))


def pp_link_times_ms(profile: Profile, messages: Iterable[MessageRecord]) -> dict[str, LinkTime]:
    """Each replica's PP links' times in one iteration's PP messages, by concrete link name
    ("pp1:2-3")."""
    wire_ms = profile.wire_ms()
    return _median_times(
        messages, lambda m: str(Link.pp(Link.parse(m.link).first, m.replica)), lambda m: wire_ms
    )


def suspects(times: Mapping[str, LinkTime], margin_ms: float = 1.0) -> dict[str, float]:
    """The suspect links among each group's (`groups`), each with its excess over its
    group's median link (ms)."""
    by_group: dict[tuple[LinkKind, int], dict[str, float]] = {}
    for link, of in groups(times).items():
        by_group.setdefault(of, {})[link] = times[link].ms
    found: dict[str, float] = {}
    for group in by_group.values():
        median = statistics.median(group.values())
        found |= {link: group[link] - median for link in suspect_links(group, margin_ms)}
    return found


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
