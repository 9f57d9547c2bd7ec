"""Schedules: one ordered op list per stage, their validation and their JSON form.

`validate_schedule` is the one validator used by tests, the simulator and the runtime. Its
errors name the stage, the op and what it waits on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pipeline.errors import DeadlockError, MemoryLimitError, ScheduleError
from pipeline.ops import MEMORY_DELTA, Op, OpKind

__all__ = [
    "ReplicaSchedules",
    "Schedule",
    "check_memory",
    "peak_memory",
    "validate_schedule",
]


@dataclasses.dataclass(frozen=True, slots=True)
class Schedule:
    """The op order of every stage; immutable, so passes build new schedules."""

    stages: tuple[tuple[Op, ...], ...]

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def num_microbatches(self) -> int:
        """Number of microbatches, read off stage 0's forwards."""
        return sum(1 for op in self.stages[0] if op.kind is OpKind.F) if self.stages else 0

    @classmethod
    def from_text(cls, stages: Iterable[Iterable[str]]) -> Schedule:
        return cls(tuple(tuple(Op.parse(text) for text in ops) for ops in stages))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Schedule:
        """Read any object with a `stages` key holding op lists as text."""
        if not isinstance(data, Mapping) or "stages" not in data:
            raise ScheduleError("a schedule must be a JSON object with a 'stages' key")
        stages = data["stages"]
        if not isinstance(stages, list) or not all(isinstance(ops, list) for ops in stages):
            raise ScheduleError('\'stages\' must be a list of op lists, e.g. [["F0", "BW0"]]')
        return cls.from_text(stages)

    def to_dict(self) -> dict[str, Any]:
        return {"stages": self.to_text()}

    def to_text(self) -> list[list[str]]:
        return [[str(op) for op in ops] for ops in self.stages]

    def warmup_counts(self) -> tuple[int, ...]:
        """x_i: the number of leading F ops of each stage."""
        counts = []
        for ops in self.stages:
            count = 0
            for op in ops:
                if op.kind is not OpKind.F:
                    break
                count += 1
            counts.append(count)
        return tuple(counts)

    def render(self) -> str:
        """A grid, one line per stage, for error messages and text output."""
        return "\n".join(
            f"stage {i}: {' '.join(map(str, ops))}" for i, ops in enumerate(self.stages)
        )


@dataclasses.dataclass(frozen=True, slots=True)
class ReplicaSchedules:
    """The schedule of each DP replica where the global batch is split unevenly over them (a
    rebalance): replica r runs `schedules[r]`, on the global batch's microbatches
    `offset(r)` to `offset(r) + counts[r] - 1` (its op `F0` is microbatch `offset(r)`)."""

    schedules: tuple[Schedule, ...]

    def __post_init__(self) -> None:
        if not self.schedules:
            raise ScheduleError("replica schedules need at least one replica's")
        stages = {s.num_stages for s in self.schedules}
        if len(stages) > 1:
            raise ScheduleError(f"replica schedules with different stage counts {sorted(stages)}")

    @property
    def counts(self) -> tuple[int, ...]:
        """Each replica's microbatch count."""
        return tuple(s.num_microbatches for s in self.schedules)

    @property
    def num_microbatches(self) -> int:
        """The global batch's."""
        return sum(self.counts)

    def offset(self, replica: int) -> int:
        """The global index of replica `replica`'s first microbatch."""
        return sum(self.counts[:replica])

    def __str__(self) -> str:
        """E.g. "5+3": the microbatch counts, replica 0's first."""
        return "+".join(map(str, self.counts))


def _check_coverage(stage_idx: int, ops: Sequence[Op], num_microbatches: int) -> None:
    counts = {kind: [0] * num_microbatches for kind in OpKind}
    for op in ops:
        if not 0 <= op.microbatch < num_microbatches:
            raise ScheduleError(
                f"stage {stage_idx}: op {op} has microbatch {op.microbatch} outside "
                f"0..{num_microbatches - 1}"
            )
        per_microbatch = counts[op.kind]
        if per_microbatch[op.microbatch]:
            raise ScheduleError(f"stage {stage_idx}: op {op} appears more than once")
        per_microbatch[op.microbatch] = 1
    f, b, w, bw = (counts[k] for k in (OpKind.F, OpKind.B, OpKind.W, OpKind.BW))
    for m in range(num_microbatches):
        if not f[m]:
            raise ScheduleError(f"stage {stage_idx}: op F{m} is missing")
        if bw[m] and (b[m] or w[m]):
            raise ScheduleError(
                f"stage {stage_idx}: microbatch {m} has both BW{m} and a split B{m}/W{m}"
            )
        if not bw[m] and not (b[m] and w[m]):
            missing = f"W{m}" if b[m] else (f"B{m}" if w[m] else f"B{m} and W{m} (or BW{m})")
            raise ScheduleError(f"stage {stage_idx}: op {missing} is missing")


def _waits_on(
    stage_idx: int,
    op: Op,
    num_stages: int,
    forward_done: list[list[bool]],
    backward_done: list[list[bool]],
) -> str | None:
    """What `op` on `stage_idx` still waits on, or None if it may run."""
    m = op.microbatch
    if op.kind is OpKind.F:
        if stage_idx > 0 and not forward_done[stage_idx - 1][m]:
            return f"F{m} of stage {stage_idx - 1}"
        return None
    if op.kind is OpKind.W:
        return None if backward_done[stage_idx][m] else f"B{m} of stage {stage_idx}"
    if not forward_done[stage_idx][m]:
        return f"F{m} of stage {stage_idx}"
    if stage_idx < num_stages - 1 and not backward_done[stage_idx + 1][m]:
        return f"the backward of microbatch {m} on stage {stage_idx + 1}"
    return None


def _check_dependencies(schedule: Schedule, num_microbatches: int) -> None:
    """Run the orders with no timing; a stage that can never advance is a deadlock."""
    num_stages = schedule.num_stages
    forward_done = [[False] * num_microbatches for _ in range(num_stages)]
    backward_done = [[False] * num_microbatches for _ in range(num_stages)]  # B or BW
    position = [0] * num_stages
    pending = list(range(num_stages))
    while pending:
        stage_idx = pending.pop()
        ops = schedule.stages[stage_idx]
        start = pos = position[stage_idx]
        own_forward, own_backward = forward_done[stage_idx], backward_done[stage_idx]
        upstream = forward_done[stage_idx - 1] if stage_idx > 0 else None
        downstream = backward_done[stage_idx + 1] if stage_idx < num_stages - 1 else None
        while pos < len(ops):  # the fast path of _waits_on, inlined
            kind, m = ops[pos]
            if kind is OpKind.F:
                if upstream is not None and not upstream[m]:
                    break
                own_forward[m] = True
            elif kind is OpKind.W:
                if not own_backward[m]:
                    break
            else:
                if not own_forward[m] or (downstream is not None and not downstream[m]):
                    break
                own_backward[m] = True
            pos += 1
        position[stage_idx] = pos
        if pos > start:
            pending.extend(n for n in (stage_idx - 1, stage_idx + 1) if 0 <= n < num_stages)
    blocked = []
    for stage_idx, ops in enumerate(schedule.stages):
        if position[stage_idx] < len(ops):
            op = ops[position[stage_idx]]
            waits_on = _waits_on(stage_idx, op, num_stages, forward_done, backward_done)
            blocked.append(f"stage {stage_idx} op {op} waits on {waits_on}")
    if blocked:
        raise DeadlockError("deadlock: " + "; ".join(blocked))


def validate_schedule(schedule: Schedule, num_stages: int, num_microbatches: int) -> None:
    """Raise ScheduleError unless every op appears exactly once and all can run."""
    if schedule.num_stages != num_stages:
        raise ScheduleError(
            f"schedule has {schedule.num_stages} stage{'s' * (schedule.num_stages != 1)} but "
            f"the profile has {num_stages}"
        )
    for stage_idx, ops in enumerate(schedule.stages):
        _check_coverage(stage_idx, ops, num_microbatches)
    _check_dependencies(schedule, num_microbatches)


def peak_memory(ops: Iterable[Op]) -> float:
    """The highest running activation count along one stage's order (0 before any op)."""
    total = peak = 0.0
    for op in ops:
        total += MEMORY_DELTA[op.kind]
        peak = max(peak, total)
    return peak


def check_memory(schedule: Schedule, mem_limit: float | None, policy: str = "schedule") -> None:
    """Raise MemoryLimitError naming the first stage whose order exceeds `mem_limit`."""
    if mem_limit is None:
        return
    for stage_idx, ops in enumerate(schedule.stages):
        peak = peak_memory(ops)
        if peak > mem_limit:
            raise MemoryLimitError(
                f"{policy} needs {peak:g} microbatches of activation memory on stage "
                f"{stage_idx} but mem_limit is {mem_limit:g}; raise mem_limit or pick a "
                "policy with fewer in-flight microbatches"
            )
