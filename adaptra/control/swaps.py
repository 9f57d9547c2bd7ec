"""Adaptra and a slow DP ring link: it moves the link onto a PP edge, where its schedule and
delegates absorb it (the paper's section 5: a DP straggler costs every bucket of the
all-reduce, a PP one only what the schedule cannot hide).

A DP ring link the detector believes slow joins two hosts under the placement in force; the
next iteration runs a placement where those two hosts are PP neighbours instead
(`Topology.dp_pair_onto_pp`, the rank swap both Adaptra and Falcon use): the slow pair then
carries a PP link of the lower replica, which the detector sees slow from the iteration
after, and the controller plans for like any slow PP link. A swap moves model state, so it
waits for a DP link to be a straggler in `STRAGGLER_BELIEFS` (3) beliefs in a row, one of
its directions standing out in each of them (the slowest of those that were is moved; two
alike that took turns as the slowest kept a count of the slowest waiting; one iteration's
belief, e.g. as a fault starts or ends mid-iteration, or in the first iteration under a new
placement, does not move anything): a slow link standing out from the other links of its class
(`Belief.outlying`; one slow with every ring of a loaded host is none: one chunk of two late
by 24 ms or more, then an ordinary iteration that the detector's hysteresis held slow,
swapped a healthy ring). A slow link delays every message it carries, in every iteration;
a loaded host delays what a worker that was not scheduled receives, one direction of a ring
link of two replicas, then another worker's, the other direction. On the times recorded in
fault-free emulated runs beside two busy processes, two beliefs in a row, in any
directions, swapped healthy rings in 18 of 30 runs and 6 of 12 (two recordings); three with
a direction common to them in none of 30 and 1 of 12 (a receiver late three iterations in
a row), while 15 ms or 10 +- 10 ms on a ring link was swapped in every run. The price: a
fixed delay is swapped an iteration later; a jittered or redrawn one stands out in fewer
iterations in a row (and with jitter in one direction at a time), so in the simulator its
swap came a median 1-1.5 iterations later (4.5 at 6 +- 6 ms, which 4 of 20 draws ever
swapped), up to 20 in one of 20 draws of a redrawn 15 +- 15 ms, up to 7 % more time in all
(BENCHMARKS.md, "False DP swaps on a loaded host, the second rule"; tests/adaptra/control/
test_swaps.py replays the second recording). On a ring of three or more replicas each link
carries one direction, and only the third belief is asked. At most one swap per iteration;
the placement stays after the link recovers (swapping back costs another state transfer and
gains nothing while the pair is a PP edge). Each DP link is moved once, and none whose
hosts a swap has moved: a link still believed slow after its swap, or a slow one on a host
moved already, has a slowness that did not stay with the pair (a delay on the logical link;
a slow NIC, which every placement keeps on some ring), and another swap would only move it
around, a state transfer every other iteration for nothing. Such a link does not stand in
the way of the others: the slowest DP link still movable is moved (a slow NIC on host 5, 30
ms, kept dp1:0-1 believed slowest after its swap, and 15 ms on dp3:0-1 was never moved while
it lasted: Adaptra 409 ms a step to the end; now 361 ms from the second swap on).

So a later fault, on its own, on a host a swap moved is never moved (a fault on hosts 1-5
swapped and ended, then one on hosts 5-6: 293 ms steps to the end, against 143 ms swapped).
Rules that free such hosts once their slowness ends were tried, and each did worse where it
counts: freed after one belief calling nothing on them slow, a slow NIC whose delay is drawn
anew (15 +- 15 ms every 0.1-1 s) dips under the detector's recovery at times and was chased
around the rings, 7 swaps in 40 iterations; freed after 10 such beliefs in a row (1 swap
for NICs of 6-15 ms means), the paper trace of benchmarks/bench_falcon_trace.py went from
64.37 to 100.81 s for Adaptra-CPU (the swap a freed host allowed put a host pair that the
trace delays again and again on a DP ring); freed where the two beliefs after a swap show
no slow DP link on its hosts, the same trace took Adaptra 97.20 s (56.78 held). Nor does
refusing a swap that would put onto a ring a host pair ever believed slow help: the trace
delays PP links in every replica, so every pair a swap could bring onto a ring had been
slow once, and Adaptra made no swap at all (100.31 s; with hosts freed after 10 quiet
beliefs as well, Adaptra-CPU 121.77 s). The figures of these two paragraphs were measured
while a swap waited for two beliefs in a row (the trace with the rule kept: Adaptra 56.78 s
then, 58.63 s with three; Adaptra-CPU 64.37 s, 66.27 s).

A swap is checked by what it measured, as Falcon checks its own: where each of the
`JUDGED_ITERATIONS` whole iterations under the new placement (after the swap's own, whose
time has the state transfer in it) is more than `UNDO_MARGIN` slower, iteration and DP step
together, than the iteration just before it (the last that called the link slow; not the
first, which may carry the fault's onset: on the namespace testbed the pair's first use of
its delayed wire, a step of 221 ms against 129 after it, against which a swap that made
every step 178 ms was kept for good), the next iteration swaps back, and the link stays on
its ring (it was moved once); no other swap is made while one is judged. Times tell moments
apart, not placements: a slowness that grows while a swap is judged (10 ms ramping to 80),
or another fault starting then, makes a good swap look bad. So the undo is judged too, by
its first whole iteration against the swap's last, and one measured worse is itself undone:
the swap made again, for good (the cost: two iterations on the worse placement and two more
state transfers; Adaptra-CPU, 10 ms on a DP link growing to 80 while its swap was judged,
25 iterations in the simulator: 10.7 s, against 7.5 s without any undo and 31.5 s with an
undo not judged; measured while a swap took two beliefs in a row: 10.88 s with three, its
swaps an iteration later).

The paper's premise, that a DP straggler costs every bucket of the all-reduce and a PP one
only what the schedule cannot hide, fails where the gradient is small and the schedule
cannot hide a delay: Adaptra-CPU's fixed ZB order over 2 stages x 4 microbatches of 5 ms
ops, DP 2, 256 KiB of gradient, 30 ms on dp0:0-1 took 120 ms a step before its swap and 170
ms after it, to the end of the run (the simulator, as the emulated runtime: 127 and 181 ms).
Every judging iteration, not one: a NIC whose delay is drawn anew (15 +- 15 ms) moves a step
between 55 and 900 ms from one iteration to the next.
"""

from __future__ import annotations

import dataclasses

from adaptra.control.detector import Belief
from pipeline.timeline import Timeline
from pipeline.topology import Direction, Link, LinkKind, Topology

__all__ = ["JUDGED_ITERATIONS", "STRAGGLER_BELIEFS", "UNDO_MARGIN", "DpSwaps", "wall_ms"]

STRAGGLER_BELIEFS = 3
"""The beliefs in a row in which a DP link is a straggler, with one of its directions
standing out in each, before it (the slowest of such links) is swapped (the module)."""

UNDO_MARGIN = 0.10
"""How much slower (a fraction) an iteration under a swap may be than the one before it: more
than the iteration-to-iteration noise of a loaded host's runtime, far less than what a
harmful swap costs (+42 % in the module's example)."""
JUDGED_ITERATIONS = 3
"""The whole iterations under a swap that judge it."""


def wall_ms(timeline: Timeline, iteration: int) -> float:
    """An iteration's measured time with its DP step (what a swap is judged by): its record's
    span, which ends with the step (`IterationRecord`; the metrics' iteration plus step time,
    without going over its ops: that made an Adaptra run in the simulator 40 % slower)."""
    (record,) = (r for r in timeline.iterations if r.iteration == iteration)
    return record.end_ms - record.start_ms


@dataclasses.dataclass(frozen=True, slots=True)
class _Streak:
    """A DP straggler of the last beliefs in a row, and its directions (direction, replica)
    that stood out in each of them."""

    link: Link
    directions: frozenset[tuple[Direction, int]]
    num_beliefs: int = 1


@dataclasses.dataclass(frozen=True, slots=True)
class _Trial:
    """A swap being judged: the placement before it, the time of the iteration just before it
    (None: none since a restart), and those of the judging ones so far (its own, with the
    transfer, is not one)."""

    before: Topology
    before_ms: float | None
    after_ms: tuple[float, ...] = ()
    undoing: bool = False
    """An undo on trial: judged by one whole iteration (a wrong verdict only keeps the swap,
    the paper's way), and one measured worse is itself undone, for good."""


class DpSwaps:
    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        """The placement the next iteration runs."""
        self.num_swaps = 0
        self._streaks: dict[Link, _Streak] = {}
        """Each movable DP straggler's streak of the last beliefs (under the placement in
        force)."""
        self._moved: set[Link] = set()
        """The DP links swapped onto PP edges so far (never again)."""
        self._moved_hosts: set[int] = set()
        """The hosts of the pairs those swaps moved."""
        self._trial: _Trial | None = None
        self._last_ms: float | None = None
        """The time of the last iteration under the placement in force (None: none yet, the
        one that moved the workers there left out)."""
        self._moving = False
        """The next iteration runs a new placement (its time is not a placement's)."""
        self.num_undone = 0
        """Swaps undone for what they measured and left undone (each undo, and each swap made
        again, also counts in `num_swaps`)."""

    def update(self, belief: Belief, measured_ms: float) -> None:
        """After an iteration: `belief`, the detector's; `measured_ms`, its time with its DP
        step (`wall_ms`). Sets the placement the next iteration runs."""
        moved, self._moving = self._moving, False  # its time has the state transfer in it
        if not moved:
            self._last_ms = measured_ms
        if self._trial is not None:
            if not moved:
                self._judge(measured_ms)
            self._streaks = {}
            return
        movable = [
            link
            for link in map(Link.parse, belief.outliers)
            if link.kind is LinkKind.DP
            and link not in self._moved
            # (a slowness on a moved host is not its pair's)
            and not set(self.topology.hosts_of(link)) & self._moved_hosts
        ]
        if self.topology.num_stages < 2:
            movable = []
        streaks: dict[Link, _Streak] = {}
        for link in movable:
            directions = frozenset((d, r) for name, d, r in belief.outlying if name == str(link))
            streak = self._streaks.get(link)
            if streak is not None and streak.directions & directions:
                streaks[link] = _Streak(
                    link, streak.directions & directions, streak.num_beliefs + 1
                )
            else:
                streaks[link] = _Streak(link, directions)
        self._streaks = streaks
        ready = [
            link for link, streak in streaks.items() if streak.num_beliefs >= STRAGGLER_BELIEFS
        ]
        if not ready:
            return
        slowest = max(ready, key=lambda link: (belief.extra_ms[str(link)], link))
        self._trial = _Trial(self.topology, self._last_ms)
        self._last_ms, self._moving = None, True
        self._moved.add(slowest)
        self._moved_hosts |= set(self.topology.hosts_of(slowest))
        self.topology = self.topology.dp_pair_onto_pp(slowest)
        self.num_swaps += 1
        self._streaks = {}

    def _judge(self, measured_ms: float) -> None:
        """Take `measured_ms` into the swap on trial; once it has its judging iterations,
        undo it (the next iteration runs the placement before it) where each was slower by
        more than the margin than the one before it."""
        trial = self._trial
        assert trial is not None
        after_ms = (*trial.after_ms, measured_ms)
        if len(after_ms) < (1 if trial.undoing else JUDGED_ITERATIONS):
            self._trial = dataclasses.replace(trial, after_ms=after_ms)
            return
        self._trial = None
        if trial.before_ms is None or min(after_ms) <= trial.before_ms * (1 + UNDO_MARGIN):
            return  # (none before it: a swap in a restart's first iterations, kept)
        undone = self.topology
        self.topology, self._last_ms, self._moving = trial.before, None, True
        self.num_swaps += 1
        if trial.undoing:  # the swap was better after all (its slowness grew meanwhile)
            self.num_undone -= 1
            return
        self.num_undone += 1
        self._trial = _Trial(undone, after_ms[-1], undoing=True)

    def restarted(self) -> None:
        """The job restarted: its iterations' times are no swap's to judge, nor is a belief
        before it the first of those in a row that a swap waits for."""
        self._trial, self._last_ms, self._moving, self._streaks = None, None, False, {}

    @property
    def swapped(self) -> Topology | None:
        """The placement, once it is not the default one (None before any swap)."""
        return self.topology if self.num_swaps else None
