"""The straggler detector: every link's extra delay, estimated from the run's own message
timestamps, and whether the link is slow: PP links (activations, gradients) and the DP
all-reduce's ring links (pipeline.allreduce).

It reads, for each message of an iteration, when it went on the wire (`wire_start_ms`: the
send's start over the direct path, the delegate's pick-up over delegates) and when its last
byte arrived (`arrival_ms`, stamped by the receiver), nothing else: never `fault_ms`, the
fault model, the spec or the profile's delays. What a message spends between the two is its
link's delay plus the host's own cost of carrying it (the wire, copies, the receiver's
wake-up). Per link direction and iteration the detector takes two order statistics of that
over the direction's messages, less what the profile's link model expects (latency, bytes
over bandwidth, a delegate's rate: no delay; of these only the terms the engine imposes on
its messages, `pipeline.link_terms`: all in the simulator, none in a runtime whose fault
hook injects, the bandwidths on the testbed), less the host's floor. What the host adds
depends on the message: its size (a DP ring's lag grows with its chunk, and the stages'
chunks differ with their gradients and buckets) and its path (a delegate's transfer costs
the host less than the direct path's send and receive). So the floor is kept per kind of
link (PP or DP), path (direct or over delegates) and size (the direction's median message
size, in its class of sizes within 5 %, `pipeline.message_sizes`: its median is the host's
time for a message that large): the least such median seen so far on a direction of the
class whose link was not slow. A DP ring's lag grows with the rings running at once too
(BENCHMARKS.md: an 8 MB step at S=4 28.4 ms alone, 68.3 ms with four), and an iteration
whose pipeline runs skewed (a PP fault's first, over direct) runs its stages' rings apart:
the least median is then under any ring's with them at once (healthy rings were 11 ms
above it once the fault had gone, called slow and swapped). So a DP class's floor rises
where it compares no longer: where two or more of the class's links are not believed slow
and every one of their directions' medians is the recovery threshold (4 ms) or more above
it, at the first look, it is the least of those medians from then on. A fault on a host or
a host pair is on one stage's ring (a NIC on at most two of its links, one worker per
host), so it never slows every link of such a class, while the rings at once move them
all. An iteration is looked at first against the floors the ones
before it left; a class none has set yet takes the direct path's floor of its kind and size
where it is a PP class over delegates, else the least of its directions' medians now. The
directions of the links neither believed slow nor slow at that look lower their classes'
floors, and the iteration is judged against those (a class still without one: the direct
path's floor over delegates, PP or DP, as for a 2-stage pipeline's one slow link; else the
least median now). So a PP link that turns slow in the first iteration over delegates is
slow against the direct path's floor and sets no delegated floor of its own (it did, when
every direction not believed slow lowered the floors first, and was never seen), while the
healthy links' delegated messages, cheaper to the host than direct ones, set that path's. A
DP class over delegates is not first looked at against the direct path's floor: a ring's
chunks cost the host far more while the PP messages go over delegates (the calibrated
ring's step 1.1-2.5x at 8-40 MB chunks: BENCHMARKS.md), and against it healthy rings of 40
MB chunks lagging 0.8 ms per MB more over delegates were 32 ms slow, and one was swapped;
so a ring alone in its size class that turns slow in the first iteration over delegates
sets its own floor, unseen (the known limits). The median less the floor is the direction's
extra delay, its estimate; the lower quartile less the floor is the evidence that the
direction is slow. A link's evidence is the largest of its directions' (over every
replica), its estimate the mean of the medians of its slow directions (those whose lower
quartile reaches 4 ms: all of a link slow as a whole, one of a link slow one way or in one
replica), from its latest iteration.

A fresh job's first iteration (`believe(cold=True)`: the run's first, the first after a
restart) is judged on a link's least lower quartile over its directions, not the largest: a
receiver still starting on a loaded host stamped most of one direction's messages 60-90 ms
late there (a review's emulated runs at load 8-20: 2 warm-ups of about 10, none of about 60
later iterations), which called a healthy link slow. A delay in the network slows every
direction of its link, a profile's static one included, and is still found in that
iteration.

Why two statistics: load only ever adds time (a receiver that is not scheduled stamps late;
nothing stamps early), while a slow link delays every message, or with a fault's jitter
most of them. The median estimates a jittered delay without bias, but load moves it: in 60
healthy iterations beside two, four and eight busy processes on 2 cores (one run each, two
with two), the worst direction's median was 0.3-1.0, 2.8 and 4.9 ms above the floor, its
lower quartile 0.2, 1.4 and 1.6 ms; in CI, beside two busy processes, a healthy direction's
median once reached the 8 ms onset. The lower quartile moves only when about three quarters
of a direction's messages are late, and for a slow link it is below the median by about
half a uniform jitter's amplitude (j/2 for a delay of d +- j). A link's estimate is not the
largest of its directions' medians: each is a noisy estimate of the one delay, and their
largest was high by 4.9, 9.5 and 13.5 ms for 30 +- 30 ms at 1, 2 and 4 replicas (2, 4 and 8
directions); their mean is not (to 0.3 ms: below), and where the link is slow one way or in
one replica only, the healthy directions' medians are left out of it.

Thresholds (`Thresholds`), and why:
- onset at 8 ms (of the lower quartile): the paper's stragglers are 10-60 ms; a healthy
  direction's lower quartile stays within 2 ms of the floor under the loads above, and its
  median within 2 ms on the testbed once its pair has taken the userspace wire (which keeps
  forwarding it), so 8 ms is clear of both;
- a direction slow from 4 ms (of its lower quartile), for the estimate: a healthy
  direction's lower quartile stays within 2 ms of the floor (above), a slow one's is about
  d - j/2 (a link called slow has one at 8 ms or more); one of 8 messages jittered 30 +- 30
  ms falls below 4 ms in about 2 % of its iterations, which leaves the estimate 0.3 ms high
  (the median of a direction is unbiased, the selection is not quite);
- recovery below 4 ms (of the estimate, the median: hysteresis): a slow link whose delay
  wavers near the onset does not flap, and a pair left on the wire (1-2 ms, more under
  load) still counts as recovered;
- a re-plan where a slow link's estimate moved by more than 3 ms or 10 % from what the plan
  assumed, in two iterations in a row (the same link's; the controller's margin): smaller
  moves change Adaptra's schedule little, while each re-plan costs a search, and one
  iteration's spike (a fresh connection's first messages) is not a change, nor are spikes
  on two links in turn;
- a straggler's evidence for a rank swap (`Belief.outlying`): the directions of a slow
  link whose lower quartile is 4 ms (`slow_direction_ms`) or more above the least of its
  class's other links' times in that iteration (every link alone in its class): load slows
  a class's rings together, a slow link or host pair its own ring. At two chunks per ring
  direction the lower quartile is the smaller plus a quarter of the gap: one chunk late by
  24 ms puts a healthy ring at the onset, and the hysteresis held it slow through the next,
  ordinary, iteration, where it no longer stands out. Asking for the onset in that
  iteration too kept a jittered slow ring (10 +- 10 ms: 9.2, 7.6, 4.3, 3.6 ms) from ever
  being swapped. The directions are kept apart because a loaded host's late stamps are a
  worker's, one direction of a ring link of two replicas (adaptra.control.swaps).

Known limit: links of a kind that are all slow from the first iteration on (every PP link
direction, or every stage's DP ring whose chunks are in one size class) leave their class
no healthy floor (then only the model's expectation is subtracted): the delay is in the
floor, and no such link is called slow. So do a DP class's links (two or more) that all
turn slow at once later, by 4 ms or more (a fault naming every one of them): its floor
rises to them. `unmeasurable_kinds` names the kinds a profile's
own delays leave so (a 2-stage pipeline with its one PP link delayed, for one). Over
delegates, a class with no healthy direction (a 2-stage pipeline's one slow PP link) is
measured against the direct path's floor: the difference of the host's costs on the two
paths is then in its estimate. Where a delegate costs the host more than the direct path,
by the onset (8 ms) or more for a PP message (the direct path cost 1.7-2.2x a delegate's
here: BENCHMARKS.md), the healthy PP links are slow against the direct path's floor in
their first iteration over delegates too, no delegated floor is ever set, and they stay
slow, the run on delegates (a 2-stage pipeline's one link after its repair, as before): a
link's delay and the paths' difference are one number until a healthy link's delegated
messages set the floor. A DP ring alone in its size class (at DP 2) that turns slow in the
first iteration over delegates sets that class's delegated floor and is not seen: its delay
and what the path adds to its chunks are one number there too. A ring of large chunks on a
loaded host: an 8 MiB chunk's time on 2 busy cores moves from iteration to iteration and
ring to ring by more than the onset (healthy rings of such chunks were called slow in 32-38
of 40 fault-free iterations, and swapped twice; of 2 MiB chunks in none:
benchmarks/bench_detector.py, section 4); the run warns of it
(`harness.policies.noisy_ring_warning`). Raising a DP link's onset by the host's measured
noise was tried, and missed faults the detector finds now: by the spread of its class's
medians in the iteration, a 10 ms fault on one of four rings of 8 MB chunks in the
simulator, whose healthy rings lag apart by their concurrency (4 ms); by how far the
class's medians moved from the iteration before, that one (the rings move together once a
PP fault ends) and a 20 ms fault on a ring alone in its size class (its onset is the whole
move).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from pipeline.allreduce import buckets, chunk_bytes
from pipeline.link_terms import LinkTerms
from pipeline.message_sizes import size_classes
from pipeline.profile import Profile
from pipeline.timeline import MessageRecord, PerSource, Timeline
from pipeline.topology import Direction, Link, link_name

__all__ = [
    "DEFAULT_THRESHOLDS",
    "Belief",
    "DirectionKey",
    "DirectionTimes",
    "LinkDetector",
    "Thresholds",
    "TimelineTimes",
    "unmeasurable_kinds",
]


def unmeasurable_kinds(profile: Profile) -> tuple[str, ...]:
    """The kinds of link ("PP", "DP") of which the profile's own delays slow, from the first
    iteration, every link whose messages are as large (within 5 %): the detector has no
    healthy floor for those (the module's known limit) and calls none of them slow (every PP
    link: they carry one message size; every DP ring link, or every one of the stages whose
    rings' median chunks are in one size class, `pipeline.message_sizes`)."""
    kinds = []
    pp_links = range(profile.num_stages - 1)
    if pp_links and all(i < len(profile.delay_ms) and profile.delay_ms[i] for i in pp_links):
        kinds.append("PP")
    delayed = {link for link, delay_ms in profile.dp_delay_ms if delay_ms}
    sizes = [_median_chunk_bytes(profile, stage) for stage in range(profile.num_stages)]
    size_class = size_classes(sizes)
    rings_by_size: dict[int, list[Link]] = {}
    for stage, size in enumerate(sizes):
        rings_by_size.setdefault(size_class[size], []).extend(profile.topology.dp_ring(stage))
    if any(ring and all(link in delayed for link in ring) for ring in rings_by_size.values()):
        kinds.append("DP")
    return tuple(kinds)


def _median_chunk_bytes(profile: Profile, stage: int) -> int:
    """The median size (the lower median) of the chunks each direction of `stage`'s ring
    carries in an iteration (pipeline.allreduce: every bucket's, 2 (D-1) of each)."""
    grad_bytes = profile.allreduce_bytes[stage] if stage < len(profile.allreduce_bytes) else 0
    sizes = [
        chunk_bytes(b, profile.num_replicas) for b in buckets(grad_bytes, profile.dp_bucket_bytes)
    ]
    return statistics.median_low(sizes) if sizes else 0


@dataclasses.dataclass(frozen=True, slots=True)
class Thresholds:
    """The detector's decisions (see the module for why these values)."""

    onset_ms: float = 8.0
    """A link whose messages' lower quartile of extra time reaches this is slow."""
    recovery_ms: float = 4.0
    """A slow link whose estimated extra delay (the median's) falls below this is healthy
    again."""
    slow_direction_ms: float = 4.0
    """A link direction (of one replica) whose messages' lower quartile of extra time
    reaches this is slow: its median counts in its link's estimate."""
    replan_ms: float = 3.0
    replan_fraction: float = 0.10
    """A slow link's estimate that moved by more than max(replan_ms, replan_fraction x the
    planned delay) asks for a new plan."""

    def __post_init__(self) -> None:
        if not 0 <= self.recovery_ms <= self.onset_ms:
            raise ValueError("need 0 <= recovery_ms <= onset_ms")
        if not 0 < self.slow_direction_ms <= self.onset_ms:
            raise ValueError("need 0 < slow_direction_ms <= onset_ms")
        if self.replan_ms < 0 or self.replan_fraction < 0:
            raise ValueError("re-plan margins must be >= 0")

    def moved(self, planned_ms: float, estimate_ms: float) -> bool:
        """Whether `estimate_ms` differs from `planned_ms` by more than the re-plan margin."""
        margin = max(self.replan_ms, self.replan_fraction * planned_ms)
        return abs(estimate_ms - planned_ms) > margin


DEFAULT_THRESHOLDS = Thresholds()


DirectionKey = tuple[str, Direction, int]
"""A link direction of one replica: (link name, direction, replica)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Belief:
    """What the detector believes after an iteration."""

    iteration: int
    extra_ms: Mapping[str, float]
    """Every link's estimated extra delay (links with messages in the iteration): PP links
    as pipeline.topology names them ("1-2"), DP ring links too ("dp0:0-1")."""
    slow: frozenset[str]
    """The links it calls slow."""
    outlying: frozenset[DirectionKey] = frozenset()
    """The directions (link, direction, replica) of slow links that stand out from the other
    links of their class in this iteration (`LinkDetector._standing_out`): what a rank swap
    takes as a straggler's evidence (adaptra.control.swaps). Load, which slows a class's
    rings together, is not that."""

    @property
    def outliers(self) -> frozenset[str]:
        """The slow links with a direction that stands out (`outlying`)."""
        return frozenset(link for link, _, _ in self.outlying)

    @property
    def detected_ms(self) -> dict[str, float]:
        """The slow links' estimates, by link name."""
        return {link: round(self.extra_ms[link], 3) for link in sorted(self.slow)}


class DirectionTimes(NamedTuple):
    """What one link direction's messages of an iteration spent between wire start and
    arrival beyond the link model's expectation: two order statistics, and what the host's
    cost of them goes with (the class whose floor they are compared with)."""

    median_ms: float
    lower_quartile_ms: float
    num_bytes: int
    """The messages' median size (the lower median): the host's time for a message this
    large is in `median_ms`."""
    delegated: bool
    """The messages went over delegates."""

    @classmethod
    def of(
        cls, spent_ms: Sequence[float], sizes: Sequence[int], *, delegated: bool
    ) -> DirectionTimes:
        """Of a direction's messages' times and sizes (at least one)."""
        size = statistics.median_low(sizes)
        if len(spent_ms) == 1:
            return cls(spent_ms[0], spent_ms[0], size, delegated)
        lower, _, _ = statistics.quantiles(spent_ms, n=4, method="inclusive")
        return cls(statistics.median(spent_ms), lower, size, delegated)


Directions = Mapping[DirectionKey, DirectionTimes]
"""Per link direction of an iteration: its `DirectionTimes`."""

FloorClass = tuple[bool, bool, int]
"""What a floor is kept per: (a PP link's, over delegates, the median message size's class:
its smallest size, `pipeline.message_sizes`)."""


class LinkDetector:
    """Feed it each iteration's messages in order (`observe`); it keeps its own state."""

    def __init__(
        self,
        profile: Profile,
        *,
        link_terms: LinkTerms,
        thresholds: Thresholds = DEFAULT_THRESHOLDS,
    ) -> None:
        """`profile`: the link model (latency, bandwidth, delegate rate) and the stage
        count; its delays are not read. `link_terms`: the terms of that model the engine
        whose timelines it reads imposes (`Capabilities.link_terms`): only these are
        expected of a message (a runtime whose fault hook injects imposes none: its
        messages take the host's time, which the floor absorbs)."""
        self.link_terms = link_terms
        self._healthy = link_terms.kept_in(profile).with_delays(())
        self._pp_expected_ms = {
            link_name(i): self._healthy.transfer_ms(i) for i in range(profile.num_stages - 1)
        }
        # over delegates a message goes at a delegate's own rate (profile.delegate_gbps)
        slower_ms = self._healthy.delegated_wire_ms() - self._healthy.wire_ms()
        self._delegated_expected_ms = {
            link: expected_ms + slower_ms for link, expected_ms in self._pp_expected_ms.items()
        }
        self.thresholds = thresholds
        self._floor_ms: dict[tuple[bool, bool, int], float] = {}
        """The least median seen so far on a direction not believed slow, per kind, path
        and exact message size (a class's floor: the least of its sizes')."""
        self._sizes: dict[bool, set[int]] = {}
        """The message sizes seen so far, by kind (whether a PP link's)."""
        self._slow: set[str] = set()
        self.belief = Belief(-1, {}, frozenset())
        """The latest belief (iteration -1: none yet)."""

    def observe(self, iteration: int, messages: Iterable[MessageRecord]) -> Belief:
        """The belief after iteration `iteration`, from its messages, PP and DP (other
        iterations' are ignored)."""
        ours = (m for m in messages if m.iteration == iteration)
        return self.believe(iteration, self.direction_times(ours))

    def direction_times(
        self, messages: Iterable[MessageRecord], *, delegated: bool = False
    ) -> dict[DirectionKey, DirectionTimes]:
        """Per (link, direction, replica): the `DirectionTimes` over `messages` of arrival -
        wire start less what the link model expects (`delegated`: for PP messages over
        delegates). A function of the messages' times alone (the same for a timeline moved
        in time: `Timeline.repeats`)."""
        pp_expected_ms = self._delegated_expected_ms if delegated else self._pp_expected_ms
        spent: dict[DirectionKey, list[float]] = {}
        sizes: dict[DirectionKey, list[int]] = {}
        for m in messages:
            key = (m.link, m.direction, m.replica)
            expected_ms = pp_expected_ms.get(m.link)
            if expected_ms is None:  # a DP link's: its chunks' sizes differ by bucket
                expected_ms = self._healthy.dp_wire_ms(m.num_bytes)
            spent.setdefault(key, []).append(m.arrival_ms - m.wire_start_ms - expected_ms)
            sizes.setdefault(key, []).append(m.num_bytes)
        return {
            key: DirectionTimes.of(times, sizes[key], delegated=delegated)
            for key, times in spent.items()
        }

    def believe(self, iteration: int, directions: Directions, *, cold: bool = False) -> Belief:
        """The belief after iteration `iteration`, from its `direction_times`: a first look
        against the floors the iterations before left; the directions of the links neither
        believed slow nor slow there lower their classes' floors; the iteration is judged
        against those (the module). `cold`: the first iteration of freshly started workers
        (the job's first, or the first after a restart), where a link turns slow only on
        every one of its directions' evidence (the module)."""
        for (link, _, _), times in directions.items():
            self._sizes.setdefault(link in self._pp_expected_ms, set()).add(times.num_bytes)
        first_floors_ms = self._floors_ms(directions, first=True)
        if self._raise_dp_floors(directions, first_floors_ms):
            first_floors_ms = self._floors_ms(directions, first=True)
        _, first_evidence = self._excess_ms(directions, first_floors_ms)
        onset, recovery = self.thresholds.onset_ms, self.thresholds.recovery_ms
        for (link, _, _), times in directions.items():
            if link not in self._slow and first_evidence[link] < onset:
                at = (link in self._pp_expected_ms, times.delegated, times.num_bytes)
                self._floor_ms[at] = min(self._floor_ms.get(at, math.inf), times.median_ms)
        floors_ms = self._floors_ms(directions, first=False)
        extra, evidence = self._excess_ms(directions, floors_ms, cold=cold)
        for link, extra_ms in extra.items():
            if evidence[link] >= onset:
                self._slow.add(link)
            elif extra_ms < recovery:
                self._slow.discard(link)
        slow = frozenset(self._slow & set(extra))
        outlying = frozenset(key for key in self._standing_out(directions) if key[0] in slow)
        self.belief = Belief(iteration, extra, slow, outlying)
        return self.belief

    def _standing_out(self, directions: Directions) -> frozenset[DirectionKey]:
        """The link directions whose lower quartile is `slow_direction_ms` or more above the
        least of the other links' times in their class now (a link's time: the median of
        its directions' medians; every direction of a link alone in its class stands out).
        Measured against the least median ever seen (the floor), the rings of a loaded host
        reach the onset together, iteration after iteration; a slow link or host pair slows
        its own ring, and a fault on most of a class's rings leaves one healthy (against the
        median of the others, 20 ms on three of four rings stood out nowhere: Fig. 18's 7B,
        2412 ms a step, unswapped, against 530). Not by the onset: in the simulator a 10 ms
        fault on one of four rings of 8 MB chunks, whose healthy rings lag apart by their
        concurrency, is 4.5 ms above them."""
        size_class = {is_pp: size_classes(sizes) for is_pp, sizes in self._sizes.items()}
        by_class: dict[FloorClass, dict[str, dict[DirectionKey, DirectionTimes]]] = {}
        for key, times in directions.items():
            is_pp = key[0] in self._pp_expected_ms
            of = (is_pp, times.delegated, size_class[is_pp][times.num_bytes])
            by_class.setdefault(of, {}).setdefault(key[0], {})[key] = times
        margin_ms = self.thresholds.slow_direction_ms
        out: set[DirectionKey] = set()
        for links in by_class.values():
            link_ms = {
                link: statistics.median(t.median_ms for t in of_link.values())
                for link, of_link in links.items()
            }
            for link, of_link in links.items():
                others_ms = [ms for other, ms in link_ms.items() if other != link]
                least_ms = min(others_ms, default=-math.inf)
                out.update(
                    key
                    for key, times in of_link.items()
                    if times.lower_quartile_ms - least_ms >= margin_ms
                )
        return frozenset(out)

    def _raise_dp_floors(
        self, directions: Directions, floors_ms: Mapping[DirectionKey, float]
    ) -> bool:
        """Raise each DP class's kept floor to the least median of its directions now where
        two or more of its links are not believed slow and every one of their directions'
        medians is `recovery_ms` or more above it (none healthy against it: the rings run
        more at once than where it was set, the module); whether one was."""
        recovery_ms = self.thresholds.recovery_ms
        size_class = size_classes(self._sizes.get(False, ()))
        by_class: dict[FloorClass, list[tuple[DirectionKey, DirectionTimes]]] = {}
        for key, times in directions.items():
            if key[0] not in self._pp_expected_ms and key[0] not in self._slow:
                of = (False, times.delegated, size_class[times.num_bytes])
                by_class.setdefault(of, []).append((key, times))
        raised = False
        for (_, delegated, size), members in by_class.items():
            kept = [
                at
                for at in self._floor_ms
                if not at[0] and at[1] == delegated and size_class[at[2]] == size
            ]
            if not kept or len({key[0] for key, _ in members}) < 2:
                continue
            if all(times.median_ms - floors_ms[key] >= recovery_ms for key, times in members):
                for at in kept:
                    del self._floor_ms[at]
                least = min((times for _, times in members), key=lambda times: times.median_ms)
                self._floor_ms[False, delegated, least.num_bytes] = least.median_ms
                raised = True
        return raised

    def _excess_ms(
        self, directions: Directions, floors_ms: Mapping[DirectionKey, float], *, cold: bool = False
    ) -> tuple[dict[str, float], dict[str, float]]:
        """Each link's estimate and evidence against `floors_ms`: its evidence is its
        directions' (every replica's) largest lower quartile (`cold`: their least); its
        estimate the mean of the medians of its directions whose lower quartile reaches
        `slow_direction_ms` (its slow ones), where none does the largest median (0 at
        least)."""
        medians: dict[str, list[tuple[float, float]]] = {}
        for (link, direction, replica), times in directions.items():
            floor_ms = floors_ms[link, direction, replica]
            medians.setdefault(link, []).append(
                (times.median_ms - floor_ms, times.lower_quartile_ms - floor_ms)
            )
        slow_ms = self.thresholds.slow_direction_ms
        extra: dict[str, float] = {}
        evidence: dict[str, float] = {}
        for link, of_link in medians.items():
            lowers_ms = [lower_ms for _, lower_ms in of_link]
            evidence[link] = max(0.0, min(lowers_ms) if cold else max(lowers_ms))
            slow = [median_ms for median_ms, lower_ms in of_link if lower_ms >= slow_ms]
            extra[link] = statistics.fmean(slow) if slow else max(0.0, *(m for m, _ in of_link))
        return extra, evidence

    def _floors_ms(self, directions: Directions, *, first: bool) -> dict[DirectionKey, float]:
        """Each direction's floor, its class's as kept so far; for a class none has set, the
        direct path's of its kind and size over delegates (at the `first` look a PP class's
        only), else the least median of its directions now (the module)."""
        size_class = {is_pp: size_classes(sizes) for is_pp, sizes in self._sizes.items()}
        kept_ms: dict[FloorClass, float] = {}
        for (is_pp, delegated, num_bytes), least_ms in self._floor_ms.items():
            of = (is_pp, delegated, size_class[is_pp][num_bytes])
            kept_ms[of] = min(kept_ms.get(of, math.inf), least_ms)
        classes: dict[DirectionKey, FloorClass] = {}
        least_now_ms: dict[FloorClass, float] = {}
        for key, times in directions.items():
            is_pp = key[0] in self._pp_expected_ms
            of = classes[key] = (is_pp, times.delegated, size_class[is_pp][times.num_bytes])
            least_now_ms[of] = min(least_now_ms.get(of, math.inf), times.median_ms)

        def floor_ms(of: FloorClass) -> float:
            is_pp, delegated, size = of
            direct = (is_pp, False, size)
            if of in kept_ms:
                return kept_ms[of]
            if delegated and direct in kept_ms and (is_pp or not first):
                return kept_ms[direct]
            return least_now_ms[of]

        return {key: floor_ms(of) for key, of in classes.items()}


class TimelineTimes:
    """A detector's `direction_times` of an iteration's timeline: of its PP and DP messages
    (or its DP ones only), computed once per timeline that moved copies repeat (a
    simulator's repeated iterations: `pipeline.timeline.PerSource`)."""

    def __init__(self, detector: LinkDetector, *, dp_only: bool = False) -> None:
        def times(source: Timeline, delegated: bool) -> dict[DirectionKey, DirectionTimes]:
            messages: Iterable[MessageRecord] = source.dp_messages
            if not dp_only:
                messages = itertools.chain(source.messages, messages)
            return detector.direction_times(messages, delegated=delegated)

        self._times = {
            delegated: PerSource(functools.partial(times, delegated=delegated))
            for delegated in (False, True)
        }

    def __call__(
        self, timeline: Timeline, *, delegated: bool = False
    ) -> dict[DirectionKey, DirectionTimes]:
        """`delegated`: the timeline's PP messages went over delegates."""
        return self._times[delegated](timeline)
