"""Pipeline ops (F, B, W, fused BW) and their text form ("F3", "B3", "W3", "BW3")."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import NamedTuple

from pipeline.checks import whole_number
from pipeline.errors import ConfigError, ScheduleError

__all__ = ["MEMORY_DELTA", "Op", "OpKind"]


class OpKind(StrEnum):
    """F: forward; B: backward-input; W: backward-weight; BW: B and W fused in one op."""

    F = "F"
    B = "B"
    W = "W"
    BW = "BW"


# ZeroBubble's activation accounting, in microbatches: F holds one, B and W each free half.
MEMORY_DELTA: dict[OpKind, float] = {OpKind.F: 1.0, OpKind.B: -0.5, OpKind.W: -0.5, OpKind.BW: -1.0}

_OP_TEXT = re.compile(r"(BW|F|B|W)([0-9]+)")
"""An op's text, matched whole, in ASCII digits (a regex's digit class takes others too: F
and an Arabic-Indic 3 would read as F3, and print back as other text), as a link's name
(pipeline.topology) and a torch CSV action (pipeline.torch_csv)."""


class Op(NamedTuple):
    """One op of one stage: a kind and a microbatch index (from 0)."""

    kind: OpKind
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind.value}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> Op:
        match = _OP_TEXT.fullmatch(text.strip()) if isinstance(text, str) else None
        if match is None:
            raise ScheduleError(
                f"cannot read op {text!r}: expected a kind F, B, W or BW followed by a "
                "microbatch index, e.g. 'F3' or 'BW0'"
            )
        try:  # (thousands of digits were past Python's limit on reading a number)
            microbatch = whole_number(match.group(2))
        except ConfigError as err:
            raise ScheduleError(f"cannot read op {text[:40]!r}...: {err}") from None
        return cls(OpKind(match.group(1)), microbatch)
