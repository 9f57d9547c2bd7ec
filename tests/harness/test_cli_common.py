"""The options the commands share (harness.cli_common): their numbers are refused at parsing."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import cli
from harness.cli_common import resolve
from pipeline.errors import AdaptraBenchError

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


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (  # was "t_f must be finite ...", no file named
            {"stages": [["F0", "BW0"]], "profile": {**PROFILE, "stages": 1, "t_f": -1}},
            "schedule s.json: profile: t_f must be finite and in 0..3600000 ms, got -1",
        ),
        (  # was "--profile is required: the schedule file s.json has no 'profile' key"
            {"stages": [["F0", "BW0"]], "profile": "p.json"},
            "schedule s.json: 'profile' must be an object (the profile file's form), got str "
            "'p.json'",
        ),
        (  # was "cannot read op 'Q0': ..."
            {"stages": [["F0", "Q0"]]},
            "schedule s.json: cannot read op 'Q0': expected a kind",
        ),
    ],
)
def test_a_schedule_file_s_errors_name_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: dict, said: str
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("s.json").write_text(json.dumps(content))
    with pytest.raises(AdaptraBenchError) as error:
        resolve(None, None, "s.json")
    assert str(error.value).startswith(said), str(error.value)


def test_a_schedule_file_s_profile_is_read_only_without_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--profile given: the schedule file's own `profile`, whatever it is, is not read."""
    monkeypatch.chdir(tmp_path)
    Path("p.json").write_text(json.dumps(PROFILE))
    Path("s.json").write_text(json.dumps({"stages": [["F0", "F1", "BW0", "BW1"]] * 2,
                                          "profile": "elsewhere"}))  # fmt: skip
    profile, planned = resolve("p.json", None, "s.json")
    assert (profile.num_stages, planned.method) == (2, "schedule file s.json")
