"""The straggler detector: every link's extra delay, estimated from the run's own message
timestamps, and whether the link is slow: PP links (activations, gradients) and the DP
all-reduce's ring links (pipeline.allreduce).

It reads, for each message of an iteration, when it went on the wire (`wire_start_ms`: the
send's start over the direct path, the delegate's pick-up over delegates) and when its last
byte arrived (`arrival_ms`, stamped by the receiver), nothing else: never `fault_ms`, the
fault model, the spec or the profile's delays. What a message spends between the two is its
link's delay plus the host's own cost of carrying it (the wire, copies, the receiver's
wake-up). Per link direction and iteration the detector takes the median of that over the
direction's messages (robust to a few late stamps under load), less what the profile's
link model expects (latency, bytes over bandwidth: no delay), less the host's floor: the
least such median seen so far on any link direction of the same kind (PP or DP: their
messages differ in size, and so in what the host adds). What is left is the direction's
extra delay; a link's is the larger of its two directions' (over every replica), and its
estimate is that of its latest iteration.

Thresholds (`Thresholds`), and why:
- onset at 8 ms: the paper's stragglers are 10-60 ms; a healthy direction's median stays
  within about a millisecond of the floor on a loaded machine, and within 2 ms on the
  testbed once its pair has taken the userspace wire (which keeps forwarding it), so 8 ms
  is clear of both;
- recovery below 4 ms (hysteresis): a slow link whose delay wavers near the onset does not
  flap, and a pair left on the wire (1-2 ms, more under load) still counts as recovered;
- a re-plan where a slow link's estimate moved by more than 3 ms or 10 % from what the plan
  assumed, in two iterations in a row (the controller's margin): smaller moves change
  Adaptra's schedule little, while each re-plan costs a search, and one iteration's spike
  (a fresh connection's first messages) is not a change.

Known limit: links of a kind that are all slow from the first iteration on (every PP link
direction, or every stage's DP ring) leave that kind no healthy floor (then only the
model's expectation is subtracted).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import statistics
from collections.abc import Iterable, Mapping

from pipeline.profile import Profile
from pipeline.timeline import MessageRecord, PerSource, Timeline
from pipeline.topology import link_name

__all__ = ["DEFAULT_THRESHOLDS", "Belief", "LinkDetector", "Thresholds", "TimelineMedians"]


@dataclasses.dataclass(frozen=True, slots=True)
class Thresholds:
    """The detector's decisions (see the module for why these values)."""

    onset_ms: float = 8.0
    """A link whose extra delay reaches this is slow."""
    recovery_ms: float = 4.0
    """A slow link whose extra delay falls below this is healthy again."""
    replan_ms: float = 3.0
    replan_fraction: float = 0.10
    """A slow link's estimate that moved by more than max(replan_ms, replan_fraction x the
    planned delay) asks for a new plan."""

    def __post_init__(self) -> None:
        if not 0 <= self.recovery_ms <= self.onset_ms:
            raise ValueError("need 0 <= recovery_ms <= onset_ms")
        if self.replan_ms < 0 or self.replan_fraction < 0:
            raise ValueError("re-plan margins must be >= 0")

    def moved(self, planned_ms: float, estimate_ms: float) -> bool:
        """Whether `estimate_ms` differs from `planned_ms` by more than the re-plan margin."""
        margin = max(self.replan_ms, self.replan_fraction * planned_ms)
        return abs(estimate_ms - planned_ms) > margin


DEFAULT_THRESHOLDS = Thresholds()


@dataclasses.dataclass(frozen=True, slots=True)
class Belief:
    """What the detector believes after an iteration."""

    iteration: int
    extra_ms: Mapping[str, float]
    """Every link's estimated extra delay (links with messages in the iteration): PP links
    as pipeline.topology names them ("1-2"), DP ring links too ("dp0:0-1")."""
    slow: frozenset[str]
    """The links it calls slow."""

    @property
    def detected_ms(self) -> dict[str, float]:
        """The slow links' estimates, by link name."""
        return {link: round(self.extra_ms[link], 3) for link in sorted(self.slow)}


class LinkDetector:
    """Feed it each iteration's messages in order (`observe`); it keeps its own state."""

    def __init__(self, profile: Profile, thresholds: Thresholds = DEFAULT_THRESHOLDS) -> None:
        """`profile`: the link model (latency, bandwidth) and the stage count; its delays
        are not read."""
        self._healthy = profile.with_delays(())
        self._pp_expected_ms = {
            link_name(i): self._healthy.transfer_ms(i) for i in range(profile.num_stages - 1)
        }
        # over delegates a message goes at a delegate's own rate (profile.delegate_gbps)
        slower_ms = self._healthy.delegated_wire_ms() - self._healthy.wire_ms()
        self._delegated_expected_ms = {
            link: expected_ms + slower_ms for link, expected_ms in self._pp_expected_ms.items()
        }
        self.thresholds = thresholds
        self._floor_ms = {True: math.inf, False: math.inf}
        """The least median seen so far, by whether its link is a PP link."""
        self._slow: set[str] = set()
        self.belief = Belief(-1, {}, frozenset())
        """The latest belief (iteration -1: none yet)."""

    def observe(self, iteration: int, messages: Iterable[MessageRecord]) -> Belief:
        """The belief after iteration `iteration`, from its messages, PP and DP (other
        iterations' are ignored)."""
        ours = (m for m in messages if m.iteration == iteration)
        return self.believe(iteration, self.direction_medians(ours))

    def direction_medians(
        self, messages: Iterable[MessageRecord], *, delegated: bool = False
    ) -> dict[tuple[str, str, int], float]:
        """Per (link, direction, replica): the median over `messages` of arrival - wire start
        less what the link model expects (`delegated`: for PP messages over delegates). A
        function of the messages' times alone (the same for a timeline moved in time:
        `Timeline.repeats`)."""
        pp_expected_ms = self._delegated_expected_ms if delegated else self._pp_expected_ms
        spent: dict[tuple[str, str, int], list[float]] = {}
        for m in messages:
            key = (m.link, m.direction, m.replica)
            expected_ms = pp_expected_ms.get(m.link)
            if expected_ms is None:  # a DP link's: its chunks' sizes differ by bucket
                expected_ms = self._healthy.dp_wire_ms(m.num_bytes)
            spent.setdefault(key, []).append(m.arrival_ms - m.wire_start_ms - expected_ms)
        return {key: statistics.median(times) for key, times in spent.items()}

    def believe(self, iteration: int, medians: Mapping[tuple[str, str, int], float]) -> Belief:
        """The belief after iteration `iteration`, from its `direction_medians`."""
        is_pp = {link: link in self._pp_expected_ms for link, _, _ in medians}
        for (link, _, _), median in medians.items():
            kind = is_pp[link]
            self._floor_ms[kind] = min(self._floor_ms[kind], median)
        extra: dict[str, float] = {}
        for (link, _, _), median in medians.items():
            floor_ms = self._floor_ms[is_pp[link]]
            extra[link] = max(extra.get(link, 0.0), median - floor_ms)
        onset, recovery = self.thresholds.onset_ms, self.thresholds.recovery_ms
        for link, extra_ms in extra.items():
            if extra_ms >= onset:
                self._slow.add(link)
            elif extra_ms < recovery:
                self._slow.discard(link)
        self.belief = Belief(iteration, extra, frozenset(self._slow & set(extra)))
        return self.belief


class TimelineMedians:
    """A detector's `direction_medians` of an iteration's timeline: of its PP and DP messages
    (or its DP ones only), computed once per timeline that moved copies repeat (a
    simulator's repeated iterations: `pipeline.timeline.PerSource`)."""

    def __init__(self, detector: LinkDetector, *, dp_only: bool = False) -> None:
        def medians(source: Timeline, delegated: bool) -> dict[tuple[str, str, int], float]:
            messages: Iterable[MessageRecord] = source.dp_messages
            if not dp_only:
                messages = itertools.chain(source.messages, messages)
            return detector.direction_medians(messages, delegated=delegated)

        self._medians = {
            delegated: PerSource(functools.partial(medians, delegated=delegated))
            for delegated in (False, True)
        }

    def __call__(
        self, timeline: Timeline, *, delegated: bool = False
    ) -> dict[tuple[str, str, int], float]:
        """`delegated`: the timeline's PP messages went over delegates."""
        return self._medians[delegated](timeline)
