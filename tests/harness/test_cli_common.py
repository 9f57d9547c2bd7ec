"""The options the commands share (harness.cli_common): their numbers are refused at parsing."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import cli

PROFILE = {"stages": 2, "microbatches": 2, "t_f": 1, "t_b": 1, "t_w": 1}


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["run", "--policy", "1f1b", "--timeout", "nan"], "'--timeout': nan is not a finite"),
        (["run", "--policy", "milp", "--time-limit", "nan"], "'--time-limit': nan is not a"),
        (["simulate", "--policy", "milp", "--time-limit", "nan"], "'--time-limit': nan is not"),
        (["schedule", "--policy", "milp", "--time-limit", "inf"], "inf is not in the range"),
        (["profile", "--stages", "2", "--out", "p.json", "--iterations", "100001"], "100001 is"),
        (["profile", "--stages", "2", "--out", "p.json", "--microbatches", "4097"], "4097 is"),
        (["calibrate", "--out", "c.json", "--op-ms", "nan"], "'--op-ms': nan is not a finite"),
    ],
)
def test_a_non_finite_or_unbounded_number_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], said: str
) -> None:
    """`run --timeout nan` was refused later, by the experiment (exit 1), and `--time-limit
    nan` by the planner (exit 1), while `inf` was a usage error (exit 2); `profile
    --iterations 100000000000` started measuring. All are usage errors now (exit 2)."""
    monkeypatch.chdir(tmp_path)
    Path("p.json").write_text(json.dumps(PROFILE))
    if argv[0] in ("run", "simulate", "schedule"):
        argv = [argv[0], "--profile", "p.json", *argv[1:]]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 2, result.output
    assert said in result.output
