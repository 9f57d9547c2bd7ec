"""`profile` warns, and `calibrate` notes, when their stages outnumber the CPU cores; `profile`
warns when they outnumber the GPUs."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.commands_profile import (
    profile,
    shared_cores_note,
    shared_cores_warning,
    shared_gpus_warning,
)
from pipeline.profile import Profile


def test_more_stages_than_cores_is_a_warning_and_as_many_is_none() -> None:
    assert shared_cores_warning(2, 2) is None
    assert shared_cores_warning(1, 16) is None
    assert shared_cores_warning(4, 2) == (
        "warning: 4 stages on 2 CPU core(s): the workers share cores, so the times measured "
        "include waiting for one (not results; use --stages 2 or fewer, or a larger machine)"
    )


def test_calibrate_notes_shared_cores_without_calling_its_costs_no_results() -> None:
    """`calibrate`'s default (4 stages) on the 2 cores it is documented for warned "not
    results; use --stages 2 or fewer", against its own help: calibrate with as many stages
    as the runs to predict (whose costs include the same waiting)."""
    assert shared_cores_note(4, 4) is None
    assert shared_cores_note(4, 2) == (
        "note: 4 stages on 2 CPU core(s): the costs measured include waiting for a core, as "
        "those of the 4-stage runs they predict here"
    )


def test_more_stages_than_gpus_is_a_warning_and_a_gpu_each_is_none() -> None:
    assert shared_gpus_warning(4, 0) is None  # on the CPU: the cores' warning's
    assert shared_gpus_warning(2, 2) is None
    assert shared_gpus_warning(2, 1) == (
        "warning: 2 stages on 1 GPU(s): the stages that share a GPU time-slice it, so an "
        "op's time includes the kernels of the other stages' ops that run beside it (not "
        "results; use --stages 1 or fewer, or a GPU per stage)"
    )


def test_profile_on_a_shared_gpu_warns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`profile --stages 2` on a one-GPU machine measured both stages on the one GPU, each
    op beside the other stage's, and said nothing:
    its times held the other stage's kernels."""
    from pipeline.runtime import devices
    from pipeline.runtime.megatron import profiling

    monkeypatch.setattr(devices, "num_visible_gpus", lambda: 1)
    measured = Profile.uniform(2, 4, 1.0, 1.0, 1.0)
    monkeypatch.setattr(profiling, "measure_profile", lambda *args, **kwargs: measured)
    out = tmp_path / "p.json"
    result = CliRunner().invoke(profile, ["--stages", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "warning: 2 stages on 1 GPU(s)" in result.output
    assert out.is_file()


def test_calibrate_refuses_stages_whose_delegates_pass_the_host_s_process_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its DP ring phase starts 2 replicas of every stage with 3 delegates at both ends of
    each link direction: at 15 stages 30 workers and 516 delegates, more than the 512 `run`
    allows a host of up to 32 cores. It started them, after its other phases' minutes; now
    it refuses before measuring anything, and writes nothing. 14 stages still pass."""
    from harness import runner
    from harness.commands_profile import calibrate
    from pipeline.runtime import calibrate as calibration

    monkeypatch.setattr(runner, "max_processes", lambda: 512)

    def measured(*args: object, **kwargs: object) -> None:
        raise AssertionError("it measured")

    monkeypatch.setattr(calibration, "measure_host_costs", measured)
    out = tmp_path / "costs.json"
    refused = CliRunner().invoke(calibrate, ["--stages", "15", "--out", str(out)])
    assert refused.exit_code != 0 and not out.exists()
    assert str(refused.exception) == (
        "this run would start 30 worker(s) and 516 delegate process(es), more than the 512 "
        "one host takes here: use fewer --stages"
    )
    passed = CliRunner().invoke(calibrate, ["--stages", "14", "--out", str(out)])
    assert str(passed.exception) == "it measured"
