"""Adaptra's controller from measurements: it plans from what the detector estimates, never
from the fault model.

It starts with Algorithm 1's plan over `direct` (no straggler known). After each iteration
it hands the iteration's messages, PP and DP, to the detector (adaptra.control.detector);
when a PP link is found slow, the next iteration runs over the delegates with Adaptra's plan
(Algorithm 2, the generator, the search) for the estimated delays, through as many of the
delegates started as the longest estimate needs (adaptra.plans); it plans again when the
slow set changes or a link's estimate stays past the re-plan margin two iterations in a row, and
goes back to the initial plan and `direct` once every PP link has recovered. A slow DP ring
link is moved onto a PP edge by a rank swap (adaptra.control.swaps), where the PP machinery
above absorbs it. Every belief is in `Plan.believed_ms`, so in every iteration's record.
`DelegatingController` is Adaptra-CPU: ZB's schedule over the delegates throughout (no
schedule adaptation), with the same swap for a slow DP link. A route that failed over (the
timeline's failovers: the transport's own records) keeps the run on the delegates until a
restart. Plans are cached per delay vector (adaptra.plans), so a return to a delay seen
before costs nothing.

The run's profile is passed through to every plan untouched (it says what the engine
injects, e.g. its static delays); the controller itself reads only its op times and link
model (`Profile.with_delays(())`), of which its detector expects only the terms the engine
imposes on messages (`link_terms`: pipeline.link_terms; harness.loop refuses a run whose
engine declares others).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from adaptra.control.detector import (
    DEFAULT_THRESHOLDS,
    Belief,
    LinkDetector,
    Thresholds,
    TimelineTimes,
)
from adaptra.control.swaps import DpSwaps, wall_ms
from adaptra.plans import AdaptraPlans, adaptra_schedule
from pipeline.engines import Plan
from pipeline.link_terms import LinkTerms
from pipeline.profile import Profile
from pipeline.schedule import Schedule
from pipeline.simulator import CommMode
from pipeline.timeline import Timeline
from pipeline.topology import link_name

__all__ = ["DelegatingController", "DetectingController"]


class DetectingController:
    name = "detector"

    def __init__(
        self,
        profile: Profile,
        *,
        link_terms: LinkTerms,
        planner: Callable[[Profile], Schedule] = adaptra_schedule,
        profile_for: Callable[[Schedule], Profile] | None = None,
        thresholds: Thresholds = DEFAULT_THRESHOLDS,
    ) -> None:
        """`profile`: the run's (passed through to the plans); `link_terms`: the link-model
        terms the engine imposes (`Capabilities.link_terms`: what its detector expects of a
        message); `planner`: Adaptra's schedule for a profile whose delays are the estimated
        ones; `profile_for`: the op times a schedule runs under (a cost model's fused or
        split times)."""
        self.profile = profile
        self.link_terms = link_terms
        self.detector = LinkDetector(
            profile.with_delays(()), link_terms=link_terms, thresholds=thresholds
        )
        self.thresholds = thresholds
        self._plans = AdaptraPlans(profile, planner, profile_for)
        self._links = [link_name(i) for i in range(profile.num_stages - 1)]
        self._planned: tuple[float, ...] = (0.0,) * len(self._links)
        self._detected: dict[str, float] = {}
        self._moved_before: frozenset[str] = frozenset()
        """The slow links whose estimates had moved past the margin in the previous belief."""
        self._failed_over = False
        self._delegating = False
        """The last plan's PP messages go over delegates."""
        self._times = TimelineTimes(self.detector)
        self._cold = True
        """The next iteration is the first of freshly started workers (`LinkDetector.believe`)."""
        self.swaps = DpSwaps(profile.topology)
        self.num_replans = 0
        """How often the planned delays changed (onsets, changes and recoveries)."""

    def plan(self, iteration: int) -> Plan:
        delays = self._planned
        comm = CommMode.DELEGATED if any(delays) or self._failed_over else CommMode.DIRECT
        self._delegating = comm is CommMode.DELEGATED
        plan = self._plans.plan(delays, comm, tuple(sorted(self._detected.items())))
        return dataclasses.replace(plan, topology=self.swaps.swapped)

    def observe(self, iteration: int, timeline: Timeline) -> None:
        """`timeline`: the iteration's alone (an engine's `Outcome.timeline`)."""
        directions = self._times(timeline, delegated=self._delegating)
        belief = self.detector.believe(iteration, directions, cold=self._cold)
        self._cold = False
        self._failed_over = self._failed_over or bool(timeline.failovers)
        self._update(belief)
        self.swaps.update(belief, wall_ms(timeline, iteration))

    def _update(self, belief: Belief) -> None:
        estimates = tuple(
            belief.extra_ms[link] if link in belief.slow else 0.0 for link in self._links
        )
        planned_slow = {link for link, d in zip(self._links, self._planned, strict=True) if d}
        moved = frozenset(
            link
            for link, p, e in zip(self._links, self._planned, estimates, strict=True)
            if p and e and self.thresholds.moved(p, e)
        )
        if planned_slow != belief.slow & set(self._links) or moved & self._moved_before:
            self._planned = tuple(round(e, 1) for e in estimates)
            self.num_replans += 1
            moved = frozenset()
        self._moved_before = moved
        self._detected = belief.detected_ms

    def restarted(self, iteration: int, *, stragglers: bool, at_ms: float = math.inf) -> None:
        """The job came back on repaired hardware, in fresh workers: no route has failed
        over any more."""
        self._failed_over = False
        self._cold = True
        self.swaps.restarted()


class DelegatingController:
    """Adaptra-CPU: one schedule (ZB's) over the delegates in every iteration, and the rank
    swap that moves a slow DP ring link onto a PP edge (its detector reads the DP ring's
    messages only: a slow PP link changes nothing here)."""

    name = "delegation"

    def __init__(
        self,
        plan: Plan,
        profile: Profile,
        *,
        link_terms: LinkTerms,
        thresholds: Thresholds = DEFAULT_THRESHOLDS,
    ) -> None:
        """`plan`: what every iteration runs (its topology aside); `profile`: the run's;
        `link_terms`: the engine's (as `DetectingController`'s)."""
        self._plan = plan
        self.link_terms = link_terms
        self.detector = LinkDetector(
            profile.with_delays(()), link_terms=link_terms, thresholds=thresholds
        )
        self._times = TimelineTimes(self.detector, dp_only=True)
        self._cold = True
        self.swaps = DpSwaps(profile.topology)
        self._detected: tuple[tuple[str, float], ...] = ()

    def plan(self, iteration: int) -> Plan:
        return dataclasses.replace(
            self._plan, topology=self.swaps.swapped, believed_ms=self._detected
        )

    def observe(self, iteration: int, timeline: Timeline) -> None:
        delegated = self._plan.comm is CommMode.DELEGATED
        directions = self._times(timeline, delegated=delegated)
        belief = self.detector.believe(iteration, directions, cold=self._cold)
        self._cold = False
        self._detected = tuple(sorted(belief.detected_ms.items()))
        self.swaps.update(belief, wall_ms(timeline, iteration))

    def restarted(self, iteration: int, *, stragglers: bool, at_ms: float = math.inf) -> None:
        self._cold = True
        self.swaps.restarted()
