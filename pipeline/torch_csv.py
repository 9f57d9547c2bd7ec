"""Schedules as torch.distributed.pipelining compute-only CSV, one stage per rank.

Row i lists rank i's actions as torch's `_Action` writes them, "<stage><kind><microbatch>"
("0F3"), and rank i runs stage i. Kinds: F -> F, B -> I, W -> W, BW -> B (full backward).
`_PipelineScheduleRuntime._load_csv` reads the text that `to_torch_csv` returns.
"""

from __future__ import annotations

import csv
import io
import re

from pipeline.checks import whole_number
from pipeline.errors import ConfigError, ScheduleError
from pipeline.ops import Op, OpKind
from pipeline.schedule import Schedule

__all__ = ["from_torch_csv", "to_torch_csv"]

_TO_TORCH: dict[OpKind, str] = {OpKind.F: "F", OpKind.B: "I", OpKind.W: "W", OpKind.BW: "B"}
_FROM_TORCH: dict[str, OpKind] = {letter: kind for kind, letter in _TO_TORCH.items()}

_ACTION = re.compile(r"([0-9]+)([FIWB])([0-9]+)")
# Actions torch knows but a compute-only schedule of this tool cannot hold.
_NON_COMPUTE = re.compile(
    r"([0-9]+(UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)[0-9]*|\(.*\)[A-Z_]+)"
)


def to_torch_csv(schedule: Schedule) -> str:
    """One line per stage, e.g. "0F0,0F1,0B0" then "1F0,1B0,1F1"; lines end in "\\n"."""
    return "".join(
        ",".join(f"{stage_idx}{_TO_TORCH[op.kind]}{op.microbatch}" for op in ops) + "\n"
        for stage_idx, ops in enumerate(schedule.stages)
    )


def _read_action(rank: int, position: int, cell: str) -> Op:
    where = f"torch CSV line {rank + 1} (rank {rank}), cell {position + 1} {cell!r}"
    text = cell.strip()
    match = _ACTION.fullmatch(text)
    if match is None:
        if _NON_COMPUTE.fullmatch(text):
            raise ScheduleError(
                f"{where}: only the compute actions F, I, W and B can be read; "
                "communication, FSDP and overlapped actions are not supported"
            )
        raise ScheduleError(f"{where}: expected <stage><F|I|W|B><microbatch>, e.g. '{rank}F3'")
    try:  # (thousands of digits were past Python's limit on reading a number)
        stage_idx, microbatch = whole_number(match.group(1)), whole_number(match.group(3))
    except ConfigError as err:
        raise ScheduleError(f"{where[:120]}...: {err}") from None
    if stage_idx != rank:
        raise ScheduleError(
            f"{where} names stage {stage_idx}, but rank {rank} must run stage {rank} only "
            "(one stage per rank)"
        )
    return Op(_FROM_TORCH[match.group(2)], microbatch)


def from_torch_csv(text: str) -> Schedule:
    """Read a compute-only CSV; empty cells (torch's idle steps) are skipped.

    Raises ScheduleError for a cell that is not a compute action or that names a stage other
    than its row's. It does not check the order: call `validate_schedule` for that.
    """
    if not isinstance(text, str):
        raise ScheduleError(f"torch CSV must be text, got {type(text).__name__}")
    stages: list[tuple[Op, ...]] = []
    try:
        for rank, row in enumerate(csv.reader(io.StringIO(text, newline=""))):
            stages.append(
                tuple(
                    _read_action(rank, position, cell)
                    for position, cell in enumerate(row)
                    if cell.strip()
                )
            )
    except csv.Error as exc:
        line = len(stages) + 1
        raise ScheduleError(f"torch CSV line {line}: cannot read the CSV: {exc}") from exc
    return Schedule(tuple(stages))
