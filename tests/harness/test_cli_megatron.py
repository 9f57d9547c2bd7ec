"""`run --backend megatron` and `profile --backend megatron`, run as a user runs them."""

import json
import math
from pathlib import Path

import pytest

from pipeline.profile import Profile
from tests.harness.test_cli import cli

pytest.importorskip("megatron.core", reason="the megatron backend needs megatron-core")
pytestmark = pytest.mark.multiprocess


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
