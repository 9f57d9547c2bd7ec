"""The infrastructure commands' helpers (launch, doctor, cleanup), called directly."""

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from harness.commands_infra import launch

ASSETS = Path(__file__).parents[1] / "assets"


class _Stop(Exception):
    """Raised by the stand-in for torchrun_commands: nothing is run."""


@pytest.mark.parametrize(
    ("options", "expected_port"),
    [(["--run", "--master-port", "29777"], 29777), (["--master-port", "29778"], 29778)],
)
def test_launch_uses_the_master_port_it_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: list[str], expected_port: int
) -> None:
    """`launch --run --master-port 29777` silently took a random free port instead."""
    import pipeline.runtime.torchrun as torchrun

    given: dict[str, Any] = {}

    def stand_in(**kwargs: Any) -> list[str]:
        given.update(kwargs)
        raise _Stop

    monkeypatch.setattr(torchrun, "torchrun_commands", stand_in)
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"stages": 2, "microbatches": 2, "t_f": 1, "t_b": 1, "t_w": 1}))
    args = ["--profile", str(profile), "--policy", "1f1b", "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(launch, [*args, *options])
    assert isinstance(result.exception, _Stop), result.output
    assert given["master_port"] == expected_port
    result = CliRunner().invoke(launch, [*args, "--run"])  # none given: a free one
    assert isinstance(result.exception, _Stop), result.output
    # None: torchrun's store binds port 0 itself. A port picked here and closed (it was)
    # could be taken by another process before torchrun bound it: "address already in use".
    assert given["master_port"] is None


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--timeout", "nan"], "'--timeout': nan is not a finite number"),
        (["--timeout", "inf"], "'--timeout': inf is not in the range 0<x<=86400"),
        (["--run", "--run-timeout-s", "nan"], "'--run-timeout-s': nan is not a finite number"),
        (["--run", "--run-timeout-s", "inf"], "'--run-timeout-s': inf is not in the range"),
        (["--iterations", "100001"], "100001 is not in the range 1<=x<=100000"),
        (["--warmup-iterations", str(10**20)], "is not in the range 0<=x<=100000"),
        (["--gpus-per-node", str(10**20)], "is not in the range 1<=x<=1024"),
    ],
)
def test_launch_refuses_non_finite_and_unbounded_numbers_as_usage_errors(
    tmp_path: Path, options: list[str], said: str
) -> None:
    """`launch --timeout nan` printed a torchrun command with `--timeout nan` (exit 0) and
    `--run --run-timeout-s nan`/`inf` ended in an internal ValueError/OverflowError (exit 3);
    --iterations, --warmup-iterations and --gpus-per-node had no upper bound. Each is now a
    usage error (exit 2) before anything is written, as `run` refuses them."""
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"stages": 2, "microbatches": 2, "t_f": 1, "t_b": 1, "t_w": 1}))
    args = ["--profile", str(profile), "--policy", "1f1b", "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(launch, [*args, *options])
    assert result.exit_code == 2, result.output
    assert said in result.output
    assert not (tmp_path / "out").exists()
