"""`run --backend megatron` and `profile --backend megatron`, run as a user runs them."""

import json
import math
from pathlib import Path

import pytest

from pipeline.profile import Profile
from tests.harness.test_cli import cli

pytest.importorskip("megatron.core", reason="the megatron backend needs megatron-core")
pytestmark = pytest.mark.multiprocess


def test_the_same_model_trains_alike_at_any_stage_count(tmp_path: Path, fig4_path: Path) -> None:
    """Through `run`: 1, 2 and 4 stages (1F1B) and the Fig. 4 order (x = [7, 5, 3, 1]) start
    from the same weights and train alike: the same losses to 1e-5 relative, the first one
    before any update. Digests may differ between stage counts (sums in another order: the
    parameters are bounded to 1e-5 of one process's in test_numerics.py); each is a sha256."""
    runs: dict[str, dict] = {}
    for name, stages, schedule in [
        ("S=1", 1, None), ("S=2", 2, None), ("S=4", 4, None), ("S=4 fig4", 4, fig4_path),
    ]:  # fmt: skip
        profile = tmp_path / f"{stages}.json"
        profile.write_text(json.dumps(Profile.uniform(stages, 12, 1, 1, 1).to_dict()))
        order = ["--schedule", str(schedule)] if schedule else ["--policy", "1f1b"]
        out = cli(
            "run", "--backend", "megatron", "--model", "tiny", "--profile", str(profile),
            *order, "--iterations", "3", "--warmup-iterations", "0", "--format", "json",
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        runs[name] = json.loads(out.stdout)
    for name, data in runs.items():
        assert data["losses"] == pytest.approx(runs["S=1"]["losses"], rel=1e-5), name
        assert len(data["params_sha256"]) == 64 and int(data["params_sha256"], 16) >= 0
    assert runs["S=1"]["losses"][-1] < runs["S=1"]["losses"][0]


def test_run_megatron_reports_one_falling_loss_per_iteration(tmp_path: Path) -> None:
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"stages": 2, "microbatches": 4, "t_f": 1, "t_b": 1, "t_w": 1}))
    out = cli(
        "run", "--backend", "megatron", "--model", "tiny", "--profile", str(profile),
        "--policy", "zb-h1", "--iterations", "3", "--format", "json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert (data["backend"], data["model"], data["policy"]) == ("megatron", "tiny", "zb-h1")
    assert len(data["losses"]) == len(data["iteration_times_ms"]) == 3
    assert all(math.isfinite(x) for x in data["losses"])
    assert data["losses"][-1] < data["losses"][0]


def test_profile_writes_a_file_schedule_and_simulate_accept(tmp_path: Path) -> None:
    path = tmp_path / "measured.json"
    out = cli(
        "profile", "--backend", "megatron", "--model", "tiny", "--stages", "2",
        "--iterations", "1", "--out", str(path), "--format", "json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    measured = Profile.from_file(path)  # the strict profile reader accepts it
    assert (measured.num_stages, measured.num_microbatches) == (2, 4)
    assert all(t > 0 for t in measured.t_f_ms + measured.t_b_ms + measured.t_w_ms)
    assert measured.message_bytes == 16 * 2 * 64 * 4  # [seq, batch, hidden] float32
    assert json.loads(out.stdout) == json.loads(path.read_text())
    planned = cli("schedule", "--profile", str(path), "--policy", "zb-h2", "--format", "json")
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["iteration_time_ms"] > 0
    simulated = cli(
        "simulate", "--profile", str(path), "--policy", "1f1b", "--comm", "direct",
        "--format", "json",
    )  # fmt: skip
    assert simulated.returncode == 0, simulated.stderr
    assert json.loads(simulated.stdout)["iteration_time_ms"] > 0
