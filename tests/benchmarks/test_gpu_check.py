"""The GPU check's dry run: the prepared script runs to its end on a CPU, every part but the
CUDA copies, and its numerics hold (the part a lent GPU then runs for real)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.runtime.megatron import get_preset

pytest.importorskip("megatron.core", reason="the GPU check runs the megatron backend")
pytestmark = pytest.mark.multiprocess

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_check_runs_to_its_end_on_a_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "CHECK_TIMEOUT_S": "300"}
    done = subprocess.run(
        ["bash", "benchmarks/gpu/check.sh", "--dry-run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=360,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["dry_run"] is True
    parts = results["parts"]
    assert list(parts) == ["environment", "stage_builds", "numerics", "profiles", "copies"]
    assert not [name for name, part in parts.items() if "error" in part]
    environment = parts["environment"]["result"]
    assert environment["gpus"] == [] and environment["device"] == "cpu"
    assert environment["pools"]["2"] == "gloo: 2 worker(s) on the CPU"
    builds = parts["stage_builds"]["result"]  # the GPU build path, the meta device standing in
    assert builds["device"] == "meta" and builds["stand_in_for_gpu"] is True
    tiny = get_preset("tiny")
    assert [(b["stages"], b["stage"], b["params"]) for b in builds["builds"]] == [
        (s, k, tiny.stage_num_params(k, s)) for s in (1, 2, 4) for k in range(s)
    ]
    numerics = parts["numerics"]["result"]
    assert numerics["ok"] and numerics["tolerance_relative"] == 1e-5
    runs = numerics["runs"]
    assert [(r["stages"], r["policy"]) for r in runs] == [
        (s, p) for s in (1, 2, 4) for p in ("1f1b", "zb-h2")
    ]
    assert all(r["max_relative_error"] <= 1e-5 and len(r["params_sha256"]) == 64 for r in runs)
    assert numerics["reference_losses"][-1] < numerics["reference_losses"][0]
    profiles = parts["profiles"]["result"]
    assert set(profiles) == {"tiny", "7b-stand-in-2l"}
    for profile in profiles.values():
        for stage in profile["per_stage"]:
            assert stage["t_f_ms"] > 0 and stage["t_b_ms"] > 0 and stage["t_w_ms"] > 0
            assert stage["model_bf16_t_f_ms"] > 0
            assert stage["measured_over_model_tf32_f"] is None  # no tensor-core peak on a CPU
        assert profile["split"]["ratio"] > 0
    assert parts["copies"]["result"] == {"skipped": "no GPU (dry run)"}
    summary = (tmp_path / "summary.md").read_text()
    assert "(dry run, CPU)" in summary and "| 4 | zb-h2 |" in summary
    assert "check exit status: 0" in done.stdout
