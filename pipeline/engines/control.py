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

from typing import Protocol

from pipeline.engines.base import Plan
from pipeline.timeline import Timeline

__all__ = ["Controller"]


class Controller(Protocol):
    @property
    def name(self) -> str:
        """What results call it (their `controller` column): e.g. "fixed", "oracle"."""
        ...

    def plan(self, iteration: int) -> Plan: ...

    def observe(self, iteration: int, timeline: Timeline) -> None: ...

    def restarted(self, iteration: int, *, stragglers: bool) -> None: ...
