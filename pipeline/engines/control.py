"""The controller interface: what each iteration runs, and what it is told afterwards.

The per-iteration loop (harness.loop) asks `plan(k)` before iteration k and hands the
iteration's measured timeline to `observe(k, timeline)` after it; after a
checkpoint-restart at iteration k it says `restarted(k, stragglers=...)` before planning
again: `stragglers` False after a link or NIC failure (only the failed hardware was
replaced: slow links and NICs are still there), True after a restart the controller asked
for (`Action.RESTART`: the slow hardware was left out too), as `FaultView.repaired`. A
controller that reads the fault model (an oracle) says so in its `name`; a detector-driven
one sees timelines only.
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

from pipeline.engines.base import Engine, Plan
from pipeline.errors import ConfigError
from pipeline.link_terms import LinkTerms
from pipeline.timeline import Timeline

__all__ = ["Controller", "Measuring", "check_link_terms"]


class Controller(Protocol):
    @property
    def name(self) -> str:
        """What results call it (their `controller` column): e.g. "fixed", "oracle"."""
        ...

    def plan(self, iteration: int) -> Plan: ...

    def observe(self, iteration: int, timeline: Timeline) -> None: ...

    def restarted(self, iteration: int, *, stragglers: bool, at_ms: float = math.inf) -> None:
        """The job restarts at `iteration` on repaired hardware: after a failure `at_ms`
        into it, or (`stragglers`) before it runs, as a plan asked (FaultView.repaired)."""
        ...


@runtime_checkable
class Measuring(Protocol):
    """A controller that reads message times against the profile's link model (a detector):
    it expects of each message the link-model terms it was built with."""

    @property
    def link_terms(self) -> LinkTerms: ...


def check_link_terms(engine: Engine, controller: Controller) -> None:
    """Refuse a measuring controller built for other link-model terms than `engine` imposes
    (it would call healthy links slow: pipeline.link_terms)."""
    if not isinstance(controller, Measuring):
        return
    imposed = engine.capabilities.link_terms
    if controller.link_terms != imposed:
        raise ConfigError(
            f"controller {controller.name} expects {controller.link_terms} of a message, the "
            f"{engine.name} engine imposes {imposed}: build it with that engine's link terms "
            "(harness.runner.link_terms)"
        )
