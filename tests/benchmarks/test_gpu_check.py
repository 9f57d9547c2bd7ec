"""The GPU check's dry run: the prepared script runs to its end on a CPU, every part but the
CUDA copies, and its numerics hold (the part a lent GPU then runs for real)."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.runtime.megatron import get_preset
from pipeline.signals import Terminated

pytest.importorskip("megatron.core", reason="the GPU check runs the megatron backend")
pytestmark = pytest.mark.multiprocess

ROOT = Path(__file__).resolve().parents[2]


def _load_check():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks/gpu/check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


check = _load_check()


def _check_sh(
    args: list[str], env: dict[str, str], timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """benchmarks/gpu/check.sh with `args`, from the repository's root."""
    command = ["bash", "benchmarks/gpu/check.sh", *args]
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s
    )


def test_the_gpu_check_runs_to_its_end_on_a_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "CHECK_TIMEOUT_S": "300"}
    done = _check_sh(["--dry-run"], env, timeout_s=360)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["dry_run"] is True
    parts = results["parts"]
    assert list(parts) == [
        "environment",
        "copies",
        "stage_builds",
        "numerics",
        "profile_gpt2",
        "split_gpt2",
        "profile_7b",
        "split_7b",
    ]
    assert not [name for name, part in parts.items() if "error" in part]
    environment = parts["environment"]["result"]
    assert environment["gpus"] == [] and environment["device"] == "cpu"
    assert environment["megatron_core"] == "0.16.1" and environment["cpu_count"] >= 1
    assert environment["kernel"] == os.uname().release and environment["nvidia_smi"] is None
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
        (s, p) for s in (1, 2, 4) for p in ("1f1b", "zb-h2", "1f1b again")
    ]
    # The same run again in its pool, the same bits: checked on the lent GPU too.
    assert numerics["digest_repeats"] is True
    for s in (1, 2, 4):
        digests = {r["policy"]: r["params_sha256"] for r in runs if r["stages"] == s}
        assert digests["1f1b again"] == digests["1f1b"]
    assert all(r["max_relative_error"] <= 1e-5 and len(r["params_sha256"]) == 64 for r in runs)
    assert runs[0]["max_relative_error_vs_one_stage"] == 0.0  # the S = 1 run itself
    assert all(r["max_relative_error_vs_one_stage"] <= 1e-5 for r in runs)
    assert numerics["reference_losses"][-1] < numerics["reference_losses"][0]
    profiles = [parts["profile_gpt2"]["result"], parts["profile_7b"]["result"]]
    assert [p["model"] for p in profiles] == ["tiny", "7b-stand-in-6l"]
    for profile in profiles:
        for stage in profile["per_stage"]:
            assert stage["t_f_ms"] > 0 and stage["t_b_ms"] > 0 and stage["t_w_ms"] > 0
            assert stage["model_bf16_t_f_ms"] > 0
            assert stage["measured_over_model_tf32_f"] is None  # no tensor-core peak on a CPU
    for name in ("split_gpt2", "split_7b"):
        assert parts[name]["result"]["ratio"] > 0
    assert all(part["deadline_s"] == 2 * check.DEADLINES_S[name] for name, part in parts.items())
    assert parts["copies"]["result"] == {"skipped": "no GPU (dry run)"}
    summary = (tmp_path / "summary.md").read_text()
    assert "(dry run, CPU)" in summary and "| 4 | zb-h2 |" in summary
    assert "the same run twice, the same digest: True; ok: True" in summary
    assert "check exit status: 0" in done.stdout
    log = (tmp_path / "log.txt").read_text()  # the machine first, then the check's output
    assert log.startswith("== the machine") and f"cores: {os.cpu_count()}" in log
    assert "[numerics] done" in log and "check exit status: 0" in log


def test_the_gpu_check_stops_at_once_without_megatron(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker" / "megatron"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('megatron blocked for the test')\n")
    out = tmp_path / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "PYTHON": sys.executable,
        "PYTHONPATH": str(blocker.parent),
    }
    done = _check_sh([], env, timeout_s=60)  # not a dry run: it would need a GPU next
    assert done.returncode == 2, done.stdout + done.stderr
    assert 'carry [".whl"]' in done.stderr and "megatron blocked for the test" in done.stderr
    log = (out / "log.txt").read_text()
    assert log.startswith("== the machine") and "kernel: " in log and "cores: " in log
    assert 'carry [".whl"]' in log
    assert not (out / "results.json").exists()


def _ok(partial: dict) -> dict:
    return {"value": 1}


def _raises(partial: dict) -> dict:
    partial["runs"] = []
    raise RuntimeError("a broken part")


def _hangs(partial: dict) -> dict:
    partial["done_so_far"] = 3
    time.sleep(30)
    return {}


def test_each_part_is_on_file_as_it_ends_and_a_failure_or_hang_loses_only_itself(
    tmp_path: Path,
) -> None:
    seen: list[tuple[list[str], str]] = []

    def look(partial: dict) -> dict:  # what OUT holds when the third part starts
        results = json.loads((tmp_path / "results.json").read_text())
        seen.append((list(results["parts"]), (tmp_path / "summary.md").read_text()))
        return {"value": 2}

    parts = [
        check.Part("environment", _ok, 5.0),
        check.Part("numerics", _raises, 5.0),
        check.Part("look", look, 5.0),
        check.Part("hang", _hangs, 0.3),
        check.Part("last", _ok, 5.0),
    ]
    results = {"started": "now", "dry_run": True, "priced_as": "-", "parts": {}}
    assert check.run_parts(parts, results, tmp_path) is False
    assert seen[0][0] == ["environment", "numerics"]
    assert "## numerics" in seen[0][1] and "failed: RuntimeError: a broken part" in seen[0][1]
    on_file = json.loads((tmp_path / "results.json").read_text())["parts"]
    assert list(on_file) == ["environment", "numerics", "look", "hang", "last"]
    assert on_file["environment"]["result"] == {"value": 1}
    assert on_file["numerics"]["error"] == "RuntimeError: a broken part"
    assert on_file["hang"]["error"] == "deadline: still running after 0.3 s"
    assert on_file["hang"]["partial"] == {"done_so_far": 3}
    assert on_file["hang"]["wall_s"] < 5 and on_file["last"]["result"] == {"value": 1}
    summary = (tmp_path / "summary.md").read_text()
    assert "## hang" in summary and "## last" in summary
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL  # put back
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_terminated_part_is_on_file_with_what_it_had_measured(tmp_path: Path) -> None:
    def terminated(partial: dict) -> dict:
        partial["runs"] = [
            {
                "stages": 1,
                "policy": "1f1b",
                "devices": "gloo",
                "max_relative_error": 0.0,
                "params_sha256": "ab" * 32,
            }
        ]
        raise Terminated(signal.SIGTERM)

    parts = [check.Part("environment", _ok, 5.0), check.Part("numerics", terminated, 5.0)]
    results = {"started": "now", "dry_run": True, "priced_as": "-", "parts": {}}
    with pytest.raises(Terminated):
        check.run_parts(parts, results, tmp_path)
    on_file = json.loads((tmp_path / "results.json").read_text())["parts"]
    assert on_file["numerics"]["error"] == "terminated (SIGTERM)"
    assert on_file["numerics"]["partial"]["runs"][0]["policy"] == "1f1b"
    summary = (tmp_path / "summary.md").read_text()
    assert "failed: terminated (SIGTERM)" in summary and "| 1 | 1f1b | gloo |" in summary


def _overlaps(timeline) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    ops = timeline.ops
    return [
        (f"{a.stage}{a.kind.value}{a.microbatch}", f"{b.stage}{b.kind.value}{b.microbatch}")
        for a in ops
        for b in ops
        if a.stage == 0 and b.stage == 1 and a.start_ms < b.end_ms and b.start_ms < a.end_ms
    ]


def test_the_two_stage_profile_schedule_runs_one_stage_at_a_time() -> None:
    from pipeline.profile import Profile
    from pipeline.runtime.megatron.profiling import measuring_order
    from pipeline.schedule import validate_schedule
    from pipeline.simulator import simulate

    profile = Profile(
        num_stages=2,
        num_microbatches=4,
        t_f_ms=(1.0, 1.1),
        t_b_ms=(1.2, 1.3),
        t_w_ms=(0.9, 0.8),
    )
    schedule = check.serialised_two_stages(4)
    validate_schedule(schedule, 2, 4)
    # only stage 1's last W runs beside an op of stage 0: its last B (0.8 ms within 1.2 ms)
    assert _overlaps(simulate(schedule, profile)) == [("0B3", "1W3")]
    assert len(_overlaps(simulate(measuring_order(2, 4), profile))) > 8  # the default


def test_the_summary_sets_the_message_copies_apart_from_the_op_times() -> None:
    row = {
        "t_f_ms": 1.0,
        "t_b_ms": 2.0,
        "t_w_ms": 1.5,
        "model_bf16_t_f_ms": 0.5,
        "model_bf16_t_b_ms": 0.5,
        "model_bf16_t_w_ms": 0.5,
        "measured_over_model_tf32_f": 1.0,
        "measured_over_model_tf32_b": 2.0,
        "measured_over_model_tf32_w": 1.5,
    }
    profile = {
        "model": "gpt2-124m",
        "stages": 2,
        "schedule": "serialised_two_stages",
        "message_bytes": 3145728,
        "microbatches": 8,
        "layers": 12,
        "hidden": 768,
        "per_stage": [row, row],
    }
    message = {
        "model": "gpt2-124m",
        "bytes": 3145728,
        "h2d_pageable_ms": 0.25,
        "d2h_pageable_ms": 0.5,
    }
    results = {
        "started": "now",
        "dry_run": False,
        "gpu": "NVIDIA H100 80GB HBM3",
        "priced_as": check.hardware("NVIDIA H100 80GB HBM3")[1],
        "parts": {
            "copies": {
                "result": {"model_copy_gbps": 200.0, "sizes": [], "message": message},
                "wall_s": 1,
            },
            "profile_gpt2": {"result": profile, "wall_s": 1},
        },
    }
    text = check.summary(results)
    assert text.startswith("# GPU check, now on NVIDIA H100 80GB HBM3\n")
    assert "Cost model: NVIDIA H100 80GB HBM3: priced as the H100 (SXM)." in text
    assert "host to device 0.25 ms, device to host 0.5 ms" in text
    # stage 0: F less its output's copy out, B less its gradient's copy in; stage 1 the reverse
    assert "stage 0: F 0.5 ms, B 1.75 ms;" in text and "stage 1: F 0.75 ms, B 1.5 ms;" in text
    assert "Schedule: serialised_two_stages" in text
    del results["parts"]["copies"]
    assert "Not measured apart" in check.summary(results)


def test_the_cost_model_prices_the_gpu_found() -> None:
    h100, _ = check.hardware("NVIDIA H100 80GB HBM3")
    h200, _ = check.hardware("NVIDIA H200")
    assert (h100.name, h100.memory_gib, h100.hbm_gbyte_s) == ("h100", 80.0, 3350.0)
    assert (h200.name, h200.memory_gib, h200.hbm_gbyte_s) == ("h200", 141.0, 4800.0)
    assert h100.peak_tflops == h200.peak_tflops == 989.0
    assert check.hardware("NVIDIA H100 PCIe")[0].name == "h800-ib400"
    assert check.hardware(None) == (
        check.H800_IB400,
        "no GPU (dry run): priced as the cost model's H800",
    )
    # a TP-1 stage's F, B, W: the same on either (memory and its bandwidth differ)
    gpt2 = get_preset("gpt2-124m")
    on_h100, on_h200 = check.predicted(gpt2, 2, 8, h100), check.predicted(gpt2, 2, 8, h200)
    for times in ("t_f_ms", "t_b_ms", "t_w_ms"):
        assert getattr(on_h100, times) == getattr(on_h200, times)
    assert on_h100.optimizer_ms[0] > on_h200.optimizer_ms[0]  # the step: memory-bound
