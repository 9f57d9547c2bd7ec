import pytest

from pipeline.errors import ScheduleError
from pipeline.ops import MEMORY_DELTA, Op, OpKind


@pytest.mark.parametrize(
    ("text", "op"),
    [
        ("F0", Op(OpKind.F, 0)),
        ("B3", Op(OpKind.B, 3)),
        ("W12", Op(OpKind.W, 12)),
        ("BW7", Op(OpKind.BW, 7)),
    ],
)
def test_text_round_trip(text: str, op: Op) -> None:
    assert Op.parse(text) == op
    assert str(op) == text


@pytest.mark.parametrize(
    "text", ["", "X1", "F", "F-1", "1F", "FW2", "F 2x", "b1", "F\u0663", "B\uff11", "W1\u0663"]
)
def test_bad_op_text_is_rejected_with_the_text(text: str) -> None:
    with pytest.raises(ScheduleError, match="cannot read op"):
        Op.parse(text)


def test_memory_accounting_is_zero_bubble_s() -> None:
    assert MEMORY_DELTA[OpKind.F] == 1.0
    assert MEMORY_DELTA[OpKind.B] + MEMORY_DELTA[OpKind.W] == MEMORY_DELTA[OpKind.BW] == -1.0


def test_an_op_of_thousands_of_digits_is_refused_as_too_large() -> None:
    """A schedule file's op "F111..." of 5,000 digits was an internal error (ValueError:
    past Python's limit on reading a whole number)."""
    with pytest.raises(ScheduleError, match=r"^cannot read op 'F1{39}'\.\.\.: .* \(5000 digits\)"):
        Op.parse("F" + "1" * 5000)
