"""Falcon (arXiv 2410.12588) as a baseline controller: it finds a slow DP link from the
run's own measurements and climbs its mitigation ladder by the ski-rental rule.

Detection, from what a real system measures (never the fault model or `fault_ms`):
1. a change in iteration time (baselines.falcon.changepoint) to a level at least 10 % above
   the one before, and beyond the iteration-time noise measured there;
2. per-group profiling of that iteration: the DP ring links and each replica's PP links
   slower than 1.1 x the median link of their kind whose messages are as large
   (baselines.falcon.profiling);
3. validation: the same link the slowest suspect again in the next iteration (slowest by
   its excess over its group's median link: raw times of different kinds or sizes hold
   different host costs), while no new change has said otherwise (a noisy iteration only
   delays it). Then the straggler is known, and so is the baseline (the median iteration
   time of the segment before the change). Once a straggler is gone with iteration time
   back within 10 % of the baseline (its fault over, or a swap that absorbed it), that
   slowdown is over: the next straggler waits for the next change up, and the change-point
   detector starts its next segment there, at the level before the change the straggler was
   validated after (`ChangePointDetector.start_segment`), so that the slowdown's return is
   one (after a single fast iteration the detector saw no change, and a straggler back from
   it was never looked for again).
A delay there from the start is no change: a profile's static delay, or a fault timeline's
in force while the detector takes its prior from the first iterations, becomes the
baseline and is never seen (harness.policies.blind_detector_warning warns of it).

Mitigation, from the lowest level up: ignore -> rebalance microbatches across the DP groups
-> change the topology so that the slow DP link becomes a PP link (a rank swap:
`Topology.dp_pair_onto_pp`) -> checkpoint-restart. A level is there for the stragglers it
helps: a rebalance for a slow PP link (it slows its replica's pipeline, and a replica with
fewer microbatches finishes sooner; a slow DP link holds every replica in the ring alike),
where the replicas' per-microbatch times differ (a PP link slow in every replica leaves
nothing to move) and are all above 0 (a profile with no op times leaves a replica's pipeline
no span to weigh), the swap for a slow DP link (where there are two stages or more: one stage
has no PP edge to put the slow pair on). Ski rental: it stays on a level until the
time lost on it (the sum, over the iterations since it took that level, of iteration time
less the baseline) reaches the next level's cost, then climbs. An ignored straggler forgotten
with the time not back (its link no suspect in one iteration) and found again in the same
slowdown takes up the time it lost, and what was lost meanwhile. The rebalance gives each
replica its share of the global batch by min max_i m_i t_i (baselines.falcon.rebalance;
t_i: its per-microbatch time in the iteration that climbed, at least one microbatch per
stage each), each replica its own schedule of the policy for its count
(`Plan.replica_schedules`), until the link is no longer suspect (or, the split made while
it was slower than its copies in the other replicas, no longer is); then the equal split
again, whose first iteration judges the slowdown (the split's own, its healthy replica given
more microbatches, is over 1.1 x the baseline however healthy the links): back within 10 %,
it is over; the link suspect again, the split is made again from that iteration, the time
lost counting on; else the straggler is forgotten. A swap kept, the straggler is gone once
the time is back or the PP link the slow pair now carries is no longer suspect while
another link is (a fault that moved elsewhere is another straggler). A swap is judged on
the first iteration after its own: no faster than the median of those before it (a DP link's delay
can cost a step less than the same delay on a PP link, where the ring has few chunks and
the pipeline many messages), it is undone, and the time lost goes on counting toward the
restart (a link whose swap was undone is not swapped again, until Falcon's own restart).
The restart is a plan with `Action.RESTART`:
the harness restarts the job from its last checkpoint on hardware without the slow link
(harness.loop), and Falcon starts afresh. A restart after a link or NIC failure leaves the
slow links in place: Falcon keeps its placement, split, straggler and detector through it.

The costs it assumes (`FalconCosts.for_profile`, at each climb from the healthy iteration
time the change-point detector has then: `FalconController.costs`): the rebalance, one
healthy iteration (the data loaders re-partitioned and the schedules re-made; no state
moves); the swap, the two swapped workers' model state over the DP link (mixed-precision
Adam: 16 bytes per parameter, 8 x the 2-byte gradient the profile's `allreduce_bytes`
counts, both ways at once), plus one healthy iteration for the groups to re-form; the
restart, the work a restart loses on average (half a checkpoint interval of healthy iterations:
`checkpoint_every`, the harness's default 500) plus the cluster's restart time
(`restart_overhead_ms`, default 0: not modelled, as the harness's `Recovery.restart_ms`).

Falcon runs on ZeroBubble (`falcon` = ZB's schedule over the direct path, as in the paper's
comparison); the swap is a placement (every engine runs one: pipeline.topology).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import statistics
from collections.abc import Callable

from baselines.falcon.changepoint import DEFAULT_CHANGES, ChangePointConfig, ChangePointDetector
from baselines.falcon.profiling import (
    LinkTime,
    dp_link_times_ms,
    per_microbatch_ms,
    pp_link_times_ms,
    suspect_links,
    suspects,
)
from baselines.falcon.rebalance import rebalance
from pipeline.engines import Action, Plan
from pipeline.link_terms import LinkTerms
from pipeline.profile import Profile
from pipeline.schedule import ReplicaSchedules, Schedule
from pipeline.simulator import CommMode
from pipeline.timeline import PerSource, Timeline
from pipeline.topology import Link, LinkKind, Topology

__all__ = ["FalconController", "FalconCosts", "Level"]


class Level(enum.IntEnum):
    IGNORE = 0
    REBALANCE = 1
    SWAP = 2
    RESTART = 3


_LEVELS = {
    LinkKind.PP: (Level.IGNORE, Level.REBALANCE, Level.RESTART),
    LinkKind.DP: (Level.IGNORE, Level.SWAP, Level.RESTART),
}
"""The levels that help a slow link of each kind, in the order climbed (the module)."""


@dataclasses.dataclass(frozen=True, slots=True)
class FalconCosts:
    """What each level costs once, in ms."""

    rebalance_ms: float
    swap_ms: float
    restart_ms: float

    @classmethod
    def for_profile(
        cls,
        profile: Profile,
        healthy_iteration_ms: float,
        *,
        checkpoint_every: int = 500,
        restart_overhead_ms: float = 0.0,
    ) -> FalconCosts:
        """The module's assumptions for `profile` (the swap moves the largest stage's state)."""
        state_bytes = max((profile.state_bytes(s) for s in range(profile.num_stages)), default=0)
        transfer_ms = profile.dp_wire_ms(state_bytes) - profile.link_latency_ms
        lost_ms = checkpoint_every / 2 * healthy_iteration_ms
        return cls(
            rebalance_ms=healthy_iteration_ms,
            swap_ms=transfer_ms + healthy_iteration_ms,
            restart_ms=lost_ms + restart_overhead_ms,
        )

    def of(self, level: Level) -> float:
        return {
            Level.IGNORE: 0.0,
            Level.REBALANCE: self.rebalance_ms,
            Level.SWAP: self.swap_ms,
            Level.RESTART: self.restart_ms,
        }[level]


@dataclasses.dataclass(slots=True)
class _Straggler:
    """A validated slow link and what Falcon has done about it."""

    link: str
    baseline_ms: float
    slowdown_start: int
    """The index, in the change-point detector's times, where the change it was validated
    after began: `baseline_ms` is the median of the level that change left, the level a
    return within 10 % of it goes back to (`ChangePointDetector.start_segment`)."""
    level: Level = Level.IGNORE
    lost_ms: float = 0.0
    """Time lost on the current level so far."""
    measured_ms: float = 0.0
    """The link's time in the iteration that validated it (what Falcon believes)."""
    level_times_ms: list[float] = dataclasses.field(default_factory=list)
    """The iteration times since it took the current level."""
    unswapped: tuple[Topology, float] | None = None
    """After a swap: the placement before it and the median iteration time there."""
    carried: str = ""
    """After a swap: the PP link the slow pair carries now (`Topology.dp_pair_onto_pp`)."""
    undone: bool = False
    """The swap did not pay and was undone: the link is a DP link again."""
    split_dropped: bool = False
    """Rebalanced, the link was no suspect: the equal split runs again, and its iteration
    says whether the slowdown is over (the split's own iteration, its healthy replica given
    more microbatches, is no measure of that)."""
    split_for_replica: bool = False
    """The split was made while the link was slower than its copies in the other replicas
    (`_slower_than_other_replicas`): once it is not, the replicas are alike on it again."""

    @property
    def levels(self) -> tuple[Level, ...]:
        return _LEVELS[Link.parse(self.link).kind]


class FalconController:
    name = "falcon"

    def __init__(
        self,
        schedule: Schedule,
        profile: Profile,
        costs: FalconCosts | None = None,
        changes: ChangePointConfig = DEFAULT_CHANGES,
        *,
        link_terms: LinkTerms,
        planner: Callable[[Profile], Schedule] | None = None,
        checkpoint_every: int = 500,
        restart_overhead_ms: float = 0.0,
    ) -> None:
        """`schedule`: ZB's for `profile`; `costs`: None for `FalconCosts.for_profile` at
        the healthy time the first iterations have given (`costs`), with the run's
        `checkpoint_every` and `restart_overhead_ms` (what a restart costs it);
        `link_terms`: the link-model terms the engine imposes (`Capabilities.link_terms`:
        what its profiling expects of a message); `planner`: the same policy for another
        microbatch count (a rebalanced replica's; None: no rebalance level)."""
        self.schedule, self.profile = schedule, profile
        self._planner = planner
        self.link_terms = link_terms
        self._model = link_terms.kept_in(profile.with_delays(()))
        self._costs = costs
        self._checkpoint_every, self._restart_overhead_ms = checkpoint_every, restart_overhead_ms
        self._changes = ChangePointDetector(changes)
        self._link_times = PerSource(
            lambda t: {
                **dp_link_times_ms(self._model, t.dp_messages),
                **pp_link_times_ms(self._model, t.messages),
            }
        )
        """Each link's profiled time in an iteration's timeline (its own, one iteration)."""
        self.topology: Topology = profile.topology
        self.split: ReplicaSchedules | None = None
        """The replicas' schedules of a rebalance (None: every replica runs `schedule`)."""
        self._schedules: dict[int, Schedule] = {profile.num_microbatches: schedule}
        self._suspect: str | None = None
        """The slowest suspect link of the last iteration, to be validated."""
        self._slower = False
        """The change-point detector's latest change was to slower iterations."""
        self.straggler: _Straggler | None = None
        self._forgotten: _Straggler | None = None
        """An ignored straggler forgotten within its slowdown (the link no suspect in one
        iteration, the time not back), the time lost since counted on: the same link found
        again in the same slowdown takes it up (`_detect`)."""
        self.climbs: list[tuple[int, Level]] = []
        """(iteration, level) of every climb, in order."""
        self.undone: list[int] = []
        """The iterations in which a swap was judged not to pay (and undone)."""
        self._unpaid: set[str] = set()
        """The DP links whose swap was undone: never swapped again (until Falcon's own
        restart), so that a straggler forgotten and found again on the same link does not
        buy the swap already measured not to pay, and undo it, again and again."""
        self._restart = False
        """The next plan asks for a restart."""

    def plan(self, iteration: int) -> Plan:
        believed: tuple[tuple[str, float], ...] = ()
        if self.straggler is not None:
            believed = ((self.straggler.link, round(self.straggler.measured_ms, 3)),)
        return Plan(
            self.schedule,
            self.profile,
            CommMode.DIRECT,
            topology=self.topology,
            action=Action.RESTART if self._restart else Action.RUN,
            replica_schedules=self.split,
            policy="zb",
            believed_ms=believed,
        )

    def observe(self, iteration: int, timeline: Timeline) -> None:
        (record,) = timeline.iterations[-1:]
        iteration_ms = record.end_ms - record.start_ms
        changes = self._changes
        if changes.update(iteration_ms):  # also while a straggler is handled: its end is one
            assert changes.baseline_ms is not None
            self._slower = changes.segment_ms > changes.baseline_ms
        times = self._link_times(timeline)
        suspected = suspects(times)
        straggler = self.straggler
        if straggler is None:
            forgotten = self._forgotten
            if forgotten is not None:
                forgotten.lost_ms += max(0.0, iteration_ms - forgotten.baseline_ms)
            self._detect(suspected, times)
            return
        back = iteration_ms < straggler.baseline_ms * (1 + self._changes.config.min_relative_change)
        swapped = straggler.level is Level.SWAP and not straggler.undone
        split = straggler.level is Level.REBALANCE and not straggler.split_dropped
        gone = {
            Level.IGNORE: back or straggler.link not in suspected,
            # the split's iterations are not the healthy level's: judged once it is dropped
            Level.REBALANCE: not split and (back or straggler.link not in suspected),
            # swapped, the slow pair carries a PP link: its DP time says nothing, that PP
            # link's does (no longer slow while another link is, the slowdown is that one's)
            Level.SWAP: back or (bool(suspected) and straggler.carried not in suspected)
            if swapped
            else back or straggler.link not in suspected,
        }.get(straggler.level, False)
        if gone:  # it went away (or a swap absorbed it); a placement stays
            self.straggler = None
            if straggler.level is Level.IGNORE and not back:  # (`_detect` may take it up)
                straggler.lost_ms += max(0.0, iteration_ms - straggler.baseline_ms)
                self._forgotten = straggler
            if back:  # the slowdown is over: a new straggler waits for a change up
                self._slower, self._suspect = False, None
                self._forgotten = None
                # the level the slowdown left (so that the slowdown's return is a change)
                self._changes.start_segment(straggler.slowdown_start)
            return
        if straggler.level is Level.REBALANCE:
            # The equal split again, to judge by: the link no suspect, or (a link slow in
            # every replica, e.g. a profile's delay) no slower than its other replicas' again.
            alike = straggler.split_for_replica and not _slower_than_other_replicas(
                straggler.link, times, self.profile.num_replicas
            )
            if split and (straggler.link not in suspected or alike):
                self.split, straggler.split_dropped = None, True
            elif not split:  # the link still slow on the equal split: rebalanced again
                self.split = self._rebalanced(timeline)
                straggler.split_dropped = self.split is None
                straggler.split_for_replica = _slower_than_other_replicas(
                    straggler.link, times, self.profile.num_replicas
                )
        straggler.lost_ms += max(0.0, iteration_ms - straggler.baseline_ms)
        straggler.level_times_ms.append(iteration_ms)
        if swapped and len(straggler.level_times_ms) == 2:
            self._judge_swap(iteration)
        self._climb(iteration, timeline)

    @property
    def costs(self) -> FalconCosts | None:
        """What each level costs: those given, else `FalconCosts.for_profile` at the healthy
        iteration time the change-point detector has now (`healthy_ms`: its calibration's
        level, or a faster one found since; a fresh detector's after Falcon's own restart),
        with the run's `checkpoint_every` and `restart_overhead_ms` (None while it
        calibrates)."""
        healthy_ms = self._changes.healthy_ms
        if self._costs is not None or healthy_ms is None:
            return self._costs
        return FalconCosts.for_profile(
            self.profile,
            healthy_ms,
            checkpoint_every=self._checkpoint_every,
            restart_overhead_ms=self._restart_overhead_ms,
        )

    def restarted(self, iteration: int, *, stragglers: bool, at_ms: float = math.inf) -> None:
        """After its own restart (`stragglers`: the slow hardware left out): the default
        placement and split, nothing known to be slow, a fresh change-point detector. After a
        failure's (only the failed hardware replaced): the slow links are still there, so it
        keeps what it knows and did (the placement, which the restarted workers take on in
        their first iteration, the split, the straggler and its level, the detector)."""
        self._restart = False
        if not stragglers:
            return
        self.topology, self.split = self.profile.topology, None
        self.straggler, self._suspect, self._slower = None, None, False
        self._forgotten = None
        self._unpaid.clear()
        self._changes = ChangePointDetector(self._changes.config)

    def _detect(self, excess_ms: dict[str, float], times: dict[str, LinkTime]) -> None:
        """Between a change up and the next change (or the end of the slowdown: `observe`):
        the slowest suspect link (`excess_ms`: each suspect's excess over its group's
        median), the same in two iterations in a row, is the straggler (a noisy iteration
        only delays it)."""
        changes = self._changes
        if not self._slower or not excess_ms:
            self._suspect = None
            return
        slowest = max(sorted(excess_ms), key=excess_ms.__getitem__)  # ties: the first by name
        if slowest != self._suspect:
            self._suspect = slowest
            return
        assert changes.baseline_ms is not None
        self.straggler = _Straggler(
            slowest, changes.baseline_ms, changes.change_index, measured_ms=times[slowest].ms
        )
        forgotten, self._forgotten = self._forgotten, None
        if (
            forgotten is not None
            and forgotten.link == slowest
            and forgotten.slowdown_start == changes.change_index
        ):  # the same slowdown's: its time lost was lost to this link too (ski rental)
            self.straggler.lost_ms = forgotten.lost_ms
        self._suspect = None

    def _climb(self, iteration: int, timeline: Timeline) -> None:
        straggler = self.straggler
        assert straggler is not None
        costs = self.costs
        assert costs is not None  # (a straggler follows a change: the calibration is done)
        for level in straggler.levels:
            if level <= straggler.level:
                continue
            if straggler.lost_ms < costs.of(level):
                return
            if level is Level.REBALANCE:
                split = self._rebalanced(timeline)
                if split is None:  # the replicas are alike: nothing to move, the next level
                    continue
                self.split = split
                straggler.split_for_replica = _slower_than_other_replicas(
                    straggler.link, self._link_times(timeline), self.profile.num_replicas
                )
            if level is Level.SWAP:
                if self.topology.num_stages < 2:  # no PP edge to put the pair on: the next level
                    continue
                if straggler.link in self._unpaid:  # measured not to pay: the next level
                    continue
                before = statistics.median(straggler.level_times_ms)
                straggler.unswapped = (self.topology, before)
                slow = Link.parse(straggler.link)
                self.topology = self.topology.dp_pair_onto_pp(slow)
                straggler.carried = str(_carried(slow, self.topology.num_stages))
            straggler.level, straggler.lost_ms = level, 0.0
            straggler.level_times_ms = []
            self.climbs.append((iteration, level))
            if level is Level.RESTART:
                self._restart = True
            return

    def _judge_swap(self, iteration: int) -> None:
        """The first iteration after the swap's own (which carries the swap): no faster than
        the iterations before it, the swap is undone (the next iteration runs the placement
        before it again), and the time lost goes on counting toward the restart."""
        straggler = self.straggler
        assert straggler is not None and straggler.unswapped is not None
        placement, before_ms = straggler.unswapped
        if straggler.level_times_ms[-1] >= before_ms:
            self.topology, straggler.undone = placement, True
            self.undone.append(iteration)
            self._unpaid.add(straggler.link)

    def _rebalanced(self, timeline: Timeline) -> ReplicaSchedules | None:
        """The split by the replicas' per-microbatch times in `timeline` (None: the equal
        split is the best; a replica took no time per microbatch, as under a profile with no
        op times, which leaves the split nothing to weigh; or there is no planner to make the
        replicas' schedules)."""
        profile = self.profile
        if self._planner is None:
            return None
        counts = (profile.num_microbatches,) * profile.num_replicas
        if self.split is not None:
            counts = self.split.counts
        times_ms = per_microbatch_ms(timeline, counts)
        if not all(t > 0 for t in times_ms):
            return None
        split = rebalance(
            profile.num_replicas * profile.num_microbatches, times_ms, minimum=profile.num_stages
        )
        if len(set(split)) == 1:
            return None
        return ReplicaSchedules(tuple(self._schedule_for(count) for count in split))

    def _schedule_for(self, num_microbatches: int) -> Schedule:
        if num_microbatches not in self._schedules:
            assert self._planner is not None
            delegates = self.profile.num_delegates  # at most one per microbatch (Profile)
            if delegates is not None:
                delegates = min(delegates, num_microbatches)
            profile = dataclasses.replace(
                self.profile, num_microbatches=num_microbatches, num_delegates=delegates
            )
            self._schedules[num_microbatches] = self._planner(profile)
        return self._schedules[num_microbatches]


def _slower_than_other_replicas(link: str, times: dict[str, LinkTime], num_replicas: int) -> bool:
    """Whether PP link `link` (one replica's) is suspect among its copies in every replica
    (`suspect_links`): where it is not, a rebalance has nothing of its own to move away from."""
    parsed = Link.parse(link)
    if parsed.kind is not LinkKind.PP:
        return False
    copies = {
        name: times[name].ms
        for name in (str(Link.pp(parsed.first, replica)) for replica in range(num_replicas))
        if name in times
    }
    return link in suspect_links(copies)


def _carried(link: Link, num_stages: int) -> Link:
    """The PP link that DP ring link `link`'s pair carries after `Topology.dp_pair_onto_pp`:
    its lower replica's, between its stage and the next one (the previous one for the last
    stage)."""
    stage = link.dp_stage
    neighbour = stage + 1 if stage + 1 < num_stages else stage - 1
    return Link.pp(min(stage, neighbour), link.first)
