"""The timeline: every op, every message and every iteration boundary of a run.

The same records come out of the simulator and the runtimes, so one metrics function, one
trace exporter and one Gantt chart serve them all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

from pipeline.errors import ConfigError
from pipeline.ops import OpKind

__all__ = [
    "SCHEMA_VERSION",
    "IterationRecord",
    "MessageRecord",
    "OpRecord",
    "Timeline",
]

SCHEMA_VERSION = 1


class OpRecord(NamedTuple):
    iteration: int
    stage: int
    kind: OpKind
    microbatch: int
    start_ms: float
    end_ms: float
    replica: int = 0
    """The DP replica whose copy of the stage ran it (0 without DP)."""


class MessageRecord(NamedTuple):
    """One message on a PP link: `send_end_ms` is when the sending stage is free again."""

    iteration: int
    link: str
    direction: str  # "forward" (activation) or "backward" (gradient)
    microbatch: int
    num_bytes: int
    send_start_ms: float
    send_end_ms: float
    arrival_ms: float
    replica: int = 0


class IterationRecord(NamedTuple):
    """t = `start_ms` is when stage 0 may start its first op; `end_ms` ends the step too."""

    iteration: int
    start_ms: float
    end_ms: float
    step_time_ms: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class Timeline:
    num_stages: int
    ops: tuple[OpRecord, ...]
    messages: tuple[MessageRecord, ...]
    iterations: tuple[IterationRecord, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "num_stages": self.num_stages,
            "ops": [[*r[:2], r.kind.value, *r[3:]] for r in self.ops],
            "messages": [list(r) for r in self.messages],
            "iterations": [list(r) for r in self.iterations],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Timeline:
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ConfigError(
                f"timeline schema version {version!r} is not supported (expected {SCHEMA_VERSION})"
            )
        return cls(
            num_stages=data["num_stages"],
            ops=tuple(OpRecord(r[0], r[1], OpKind(r[2]), *r[3:]) for r in data["ops"]),
            messages=tuple(MessageRecord(*r) for r in data["messages"]),
            iterations=tuple(IterationRecord(*r) for r in data["iterations"]),
        )

    @classmethod
    def concat(cls, parts: list[Timeline]) -> Timeline:
        """Join per-iteration timelines of one run into one."""
        if not parts:
            raise ValueError("cannot concatenate zero timelines")
        return cls(
            num_stages=parts[0].num_stages,
            ops=tuple(r for part in parts for r in part.ops),
            messages=tuple(r for part in parts for r in part.messages),
            iterations=tuple(r for part in parts for r in part.iterations),
        )
