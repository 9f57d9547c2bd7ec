"""The GPU check: the megatron runtime on a lent GPU, measured against the CPU and the cost
model. Run it through check.sh (which installs the carried wheels first); `--dry-run` runs
every part on the CPU with small shapes and skips only what needs CUDA (the copy speeds).

Parts, each recorded in OUT/results.json as it ends (a failed part is recorded and the
others still run; the exit status is 1 if any failed) and summed up in OUT/summary.md:

- environment: torch, CUDA, the GPU, megatron-core, and the process group and devices the
  runtime chooses for 1, 2 and 4 workers on this host (pipeline.runtime.devices);
- stage_builds: every stage of the tiny GPT at S = 1, 2 and 4 built as a worker builds it
  on its GPU (`build_initial_stage`), each parameter found on the GPU and megatron's RNG
  tracker seeded; a dry run builds them the same way with the meta device in the GPU's
  place (`gpu_stand_in`: megatron's GPU path, short of kernels);
- numerics: the tiny GPT at S = 1, 2 and 4 (one GPU: S > 1 shares it over gloo through
  host copies) under 1f1b and zb-h2, 3 iterations, against one CPU process's losses of the
  same seed: float32 with TF32 off, within 1e-4 relative on a GPU (its kernels sum in
  another order than the CPU's; 1e-5 on the CPU, the numerics tests' bound), and each run's
  `params_sha256`;
- profiles: `measure_profile` (F, B, W per stage, TF32 on: the tensor cores a float32 run
  would use) of gpt2-124m at S = 2 and of one stage of the paper's 7B shape (hidden 5120,
  32 heads, seq 1024, micro-batch 1, `--layers-7b` layers with the embedding and the head,
  S = 1), and (B + W) / fused backward on the same shapes in one process;
- copies: pinned host <-> device copy speed, 64 KiB to 64 MiB (the delegated path's
  `copy_gbps`);
- cost model: its F, B, W for the same stages on the H200 (the H800's 989 TFLOP/s dense
  bf16, the same chip's compute; its 141 GB and 4.8 TB/s of memory and 450 GB/s of NVLink
  each way differ, none of which the F, B, W of a TP-1 stage use: memory bandwidth prices
  the optimizer step alone, NVLink TP's all-reduces), next to the measurements, as
  measured / predicted and scaled by the precision measured (TF32's dense peak, 494.7
  TFLOP/s, is half bf16's).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import functools
import json
import os
import platform
import signal
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

if "--dry-run" in sys.argv:  # before torch: every process of the check sees no GPU
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

import torch

from baselines import one_f_one_b, zb_h2
from pipeline.cost_model import H800_IB400, GPTModel, model_cost
from pipeline.errors import BackendError
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerPool
from pipeline.runtime.devices import choose_devices, describe_pool, num_visible_gpus
from pipeline.runtime.digest import params_sha256, whole_model_params
from pipeline.runtime.megatron import GPTPreset, MegatronCompute, get_preset
from pipeline.runtime.megatron.backend import build_initial_stage
from pipeline.runtime.megatron.model import microbatch_tokens
from pipeline.runtime.megatron.profiling import measure_profile
from pipeline.runtime.megatron.reference import (
    build_whole_model,
    single_process_megatron,
    train_reference,
)
from pipeline.runtime.megatron.shim import STAND_IN_DEVICE, gpu_stand_in, quiet_megatron
from pipeline.runtime.megatron.stage import StageRunner

SEED, LR, NUM_ITERATIONS, NUM_MICROBATCHES = 0, 0.5, 3, 8
H200 = dataclasses.replace(
    H800_IB400, name="h200", memory_gib=141.0, hbm_gbps=4800.0, nvlink_gbps=450.0
)
BF16_DENSE_TFLOPS, TF32_DENSE_TFLOPS = 989.0, 494.7
COPY_SIZES = tuple(64 * 1024 * 4**k for k in range(6))  # 64 KiB ... 64 MiB


@dataclasses.dataclass(frozen=True, slots=True)
class Shapes:
    """The models each part runs: the real ones, or small stand-ins for a dry run."""

    numerics: GPTPreset
    gpt2: GPTPreset
    gpt2_stages: int
    stage_7b: GPTPreset


def shapes(dry_run: bool, layers_7b: int) -> Shapes:
    tiny = get_preset("tiny")
    if dry_run:
        stand_in = dataclasses.replace(tiny, name=f"7b-stand-in-{layers_7b}l", num_layers=layers_7b)
        return Shapes(tiny, tiny, 2, stand_in)
    stage_7b = GPTPreset(
        name=f"gpt2-7b-stage-{layers_7b}l",
        num_layers=layers_7b,
        hidden_size=5120,
        num_attention_heads=32,
        vocab_size=50304,
        seq_length=1024,
        micro_batch_size=1,
    )
    return Shapes(tiny, get_preset("gpt2-124m"), 2, stage_7b)


def environment(shape: Shapes, device: str) -> dict[str, Any]:
    from importlib import metadata

    num_gpus = num_visible_gpus()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpus": [torch.cuda.get_device_name(i) for i in range(num_gpus)],
        "megatron_core": metadata.version("megatron-core"),
        "device": device,
        "pools": {
            str(n): describe_pool([choose_devices(r, n, num_gpus) for r in range(n)])
            for n in (1, 2, 4)
        },
    }


def stage_builds(shape: Shapes, device: str) -> dict[str, Any]:
    """Every stage of the numerics model at S = 1, 2, 4 built as a worker builds it on
    `device`, from an unseeded RNG tracker (a new worker's); a dry run (`device` "cpu")
    builds for the meta device in the GPU's place. An error names a stage whose parameters
    are not all on the device or not the stage's count, or that left the tracker unseeded."""
    from megatron.core.tensor_parallel import random as mcore_random

    preset = shape.numerics
    stand_in = device == "cpu"
    target = torch.device(STAND_IN_DEVICE if stand_in else device)
    builds = []
    with single_process_megatron(device), gpu_stand_in() if stand_in else contextlib.nullcontext():
        for num_stages in (1, 2, 4):
            for stage in range(num_stages):
                mcore_random.get_cuda_rng_tracker().reset()
                with quiet_megatron():
                    model = build_initial_stage(preset, stage, num_stages, seed=SEED, device=target)
                where = sorted({str(p.device) for p in model.parameters()})
                seeded = "model-parallel-rng" in mcore_random.get_cuda_rng_tracker().get_states()
                if where != [str(target)] or not seeded:
                    raise BackendError(
                        f"stage {stage} of {num_stages}: parameters on {where}, not all on "
                        f"{target}; RNG tracker seeded: {seeded}"
                    )
                count = sum(p.numel() for p in model.parameters())
                if count != preset.stage_num_params(stage, num_stages):
                    raise BackendError(
                        f"stage {stage} of {num_stages} has {count} parameters, not "
                        f"{preset.stage_num_params(stage, num_stages)}"
                    )
                builds.append({"stages": num_stages, "stage": stage, "params": count})
    return {"device": str(target), "stand_in_for_gpu": stand_in, "builds": builds}


def numerics(shape: Shapes, device: str) -> dict[str, Any]:
    preset = shape.numerics
    with single_process_megatron():  # the reference: one CPU process
        model = build_whole_model(preset, SEED)
        reference = [
            r.loss
            for r in train_reference(
                model,
                preset,
                num_microbatches=NUM_MICROBATCHES,
                num_replicas=1,
                num_iterations=NUM_ITERATIONS,
                seed=SEED,
                lr=LR,
            )
        ]
    tolerance = 1e-5 if device == "cpu" else 1e-4
    runs = []
    factory = functools.partial(MegatronCompute, preset, seed=SEED, lr=LR)
    for num_stages in (1, 2, 4):
        profile = Profile.uniform(num_stages, NUM_MICROBATCHES, 1, 1, 1)
        with WorkerPool(num_stages, compute_factory=factory, timeout_s=300) as pool:
            for policy, make in (("1f1b", one_f_one_b), ("zb-h2", zb_h2)):
                schedule, losses = make(profile), []
                for it in range(NUM_ITERATIONS):
                    last = it == NUM_ITERATIONS - 1
                    pool.run_iteration(IterationConfig(it, schedule, profile, collect_params=last))
                    loss = pool.last_results[num_stages - 1].step_output.loss
                    assert loss is not None
                    losses.append(loss)
                worst = max(abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True))
                runs.append(
                    {
                        "stages": num_stages,
                        "policy": policy,
                        "devices": describe_pool(pool.devices),
                        "losses": losses,
                        "max_relative_error": worst,
                        "params_sha256": params_sha256(whole_model_params(pool.last_results)),
                    }
                )
    return {
        "model": preset.name,
        "dtype": "float32 (TF32 off)",
        "tolerance_relative": tolerance,
        "reference_losses": reference,
        "runs": runs,
        "ok": all(r["max_relative_error"] <= tolerance for r in runs),
    }


def _sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize()


def split_ratio(preset: GPTPreset, device: str, repeats: int) -> dict[str, float]:
    """The whole model as one stage fed a random stage input, one microbatch: fused backward
    against B then W (medians of `repeats`, after two warm-ups)."""
    with single_process_megatron(device):
        model = build_whole_model(preset, SEED)
        if device != "cpu":
            torch.backends.cuda.matmul.allow_tf32 = True
            model.to(device)
            with quiet_megatron():
                from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
            model_parallel_cuda_manual_seed(SEED)
        runner = StageRunner(model)
        _, labels = microbatch_tokens(preset, SEED, 0)
        labels = labels.to(device)
        x = torch.randn(preset.message_shape(), generator=torch.Generator().manual_seed(1))
        x = x.to(device)
        fused, b_ms, w_ms = [], [], []
        for k in range(repeats + 2):
            runner.forward(0, labels=labels, stage_input=x, deferred=False)
            _sync(device)
            t0 = time.perf_counter()
            runner.backward_fused(0, None)
            _sync(device)
            t1 = time.perf_counter()
            runner.forward(0, labels=labels, stage_input=x)
            _sync(device)
            t2 = time.perf_counter()
            runner.backward_input(0, None)
            _sync(device)
            t3 = time.perf_counter()
            runner.backward_weight(0)
            _sync(device)
            t4 = time.perf_counter()
            if k >= 2:
                fused.append((t1 - t0) * 1e3)
                b_ms.append((t3 - t2) * 1e3)
                w_ms.append((t4 - t3) * 1e3)
            for param in runner.params:
                param.grad = None
    fused_ms, b, w = statistics.median(fused), statistics.median(b_ms), statistics.median(w_ms)
    return {"fused_ms": fused_ms, "b_ms": b, "w_ms": w, "ratio": (b + w) / fused_ms}


def predicted(preset: GPTPreset, num_stages: int, num_microbatches: int) -> Profile:
    """The cost model's split-backward profile of `preset` at `num_stages` on the H200."""
    model = GPTModel(
        name=preset.name,
        num_layers=preset.num_layers,
        hidden=preset.hidden_size,
        num_heads=preset.num_attention_heads,
        seq_len=preset.seq_length,
        microbatch_size=preset.micro_batch_size,
        vocab_size=preset.vocab_size,
        pp=num_stages,
        num_microbatches=num_microbatches,
    )
    return model_cost(model, H200).profile


def profiles(shape: Shapes, device: str) -> dict[str, Any]:
    out = {}
    for preset, num_stages, num_microbatches in (
        (shape.gpt2, shape.gpt2_stages, 4),
        (shape.stage_7b, 1, 2),
    ):
        measured = measure_profile(
            preset, num_stages, num_microbatches, num_iterations=3, allow_tf32=True
        )
        model = predicted(preset, num_stages, num_microbatches)
        # A CPU has no tensor-core peak to scale by: no ratio in a dry run.
        scale = BF16_DENSE_TFLOPS / TF32_DENSE_TFLOPS if device != "cpu" else None
        stages = []
        for s in range(num_stages):
            row: dict[str, float | None] = {}
            for kind, got, want in (
                ("f", measured.t_f_ms[s], model.t_f_ms[s]),
                ("b", measured.t_b_ms[s], model.t_b_ms[s]),
                ("w", measured.t_w_ms[s], model.t_w_ms[s]),
            ):
                row[f"t_{kind}_ms"] = got
                row[f"model_bf16_t_{kind}_ms"] = want
                row[f"measured_over_model_tf32_{kind}"] = (
                    None if scale is None else got / (want * scale)
                )
            stages.append(row)
        out[preset.name] = {
            "stages": num_stages,
            "microbatches": num_microbatches,
            "layers": preset.num_layers,
            "hidden": preset.hidden_size,
            "per_stage": stages,
            "split": split_ratio(preset, device, repeats=5),
        }
    return out


def copies(device: str, repeats: int = 20) -> dict[str, Any]:
    """Pinned host <-> device copies, each timed by CUDA events; medians in Gbit/s."""
    if device == "cpu":
        return {"skipped": "no GPU (dry run)"}
    rows = []
    for size in COPY_SIZES:
        host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        gpu = torch.empty(size, dtype=torch.uint8, device=device)
        speeds: dict[str, float] = {}
        for name, dst, src in (("h2d", gpu, host), ("d2h", host, gpu)):
            times = []
            for k in range(repeats + 3):
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                dst.copy_(src, non_blocking=True)
                end.record()
                end.synchronize()
                if k >= 3:
                    times.append(start.elapsed_time(end))  # ms
            speeds[f"{name}_gbit_s"] = size * 8 / (statistics.median(times) * 1e6)
        rows.append({"bytes": size, **speeds})
    return {"model_copy_gbps": H200.copy_gbps, "sizes": rows}


class _Terminated(BaseException):
    pass


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise _Terminated(signal.Signals(signum).name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true", help="CPU only, small shapes")
    parser.add_argument("--layers-7b", type=int, default=2, help="layers of the 7B stage")
    args = parser.parse_args()
    if args.layers_7b < 1:
        parser.error("--layers-7b must be >= 1")
    device = "cpu" if args.dry_run else "cuda:0"
    if not args.dry_run and num_visible_gpus() == 0:
        print("error: no GPU visible (use --dry-run on a CPU)", file=sys.stderr)
        return 1
    for signum in (signal.SIGTERM, signal.SIGHUP):  # unwind the pools, as Ctrl-C does
        signal.signal(signum, _terminate)
    args.out.mkdir(parents=True, exist_ok=True)
    shape = shapes(args.dry_run, args.layers_7b)
    results: dict[str, Any] = {
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "dry_run": args.dry_run,
        "parts": {},
    }
    parts: list[tuple[str, Callable[[], Any]]] = [
        ("environment", lambda: environment(shape, device)),
        ("stage_builds", lambda: stage_builds(shape, device)),
        ("numerics", lambda: numerics(shape, device)),
        ("profiles", lambda: profiles(shape, device)),
        ("copies", lambda: copies(device)),
    ]
    failed = False
    for name, part in parts:
        start = time.monotonic()
        print(f"[{name}] ...", flush=True)
        try:
            record = {"result": part()}
        except Exception as err:
            failed = True
            record = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
        record["wall_s"] = round(time.monotonic() - start, 1)
        results["parts"][name] = record
        print(f"[{name}] {'failed: ' + record['error'] if 'error' in record else 'done'} "
              f"({record['wall_s']} s)", flush=True)  # fmt: skip
        _write(args.out / "results.json", json.dumps(results, indent=1))
    numbers = results["parts"].get("numerics", {}).get("result", {})
    failed = failed or not numbers.get("ok", False)
    _write(args.out / "summary.md", summary(results))
    return 1 if failed else 0


def _write(path: Path, text: str) -> None:
    """Whole or absent: a check cut off at its limit leaves the last complete file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(path)


def summary(results: dict[str, Any]) -> str:
    """The results as markdown tables (what benchmarks/gpu/RESULTS.md quotes)."""
    title = f"# GPU check, {results['started']}"
    lines = [title + (" (dry run, CPU)" if results["dry_run"] else "")]
    for name, record in results["parts"].items():
        lines.append(f"\n## {name} ({record['wall_s']} s)\n")
        if "error" in record:
            lines.append(f"failed: {record['error']}")
            continue
        result = record["result"]
        if name == "numerics":
            lines += [
                f"{result['dtype']}, tolerance {result['tolerance_relative']:g} relative; "
                f"ok: {result['ok']}\n",
                "| S | policy | devices | max relative error | params_sha256 |",
                "|---|---|---|---|---|",
            ]
            lines += [
                f"| {r['stages']} | {r['policy']} | {r['devices']} | "
                f"{r['max_relative_error']:.2e} | {r['params_sha256'][:16]} |"
                for r in result["runs"]
            ]
        elif name == "profiles":
            lines += [
                "| model | stage | tF, tB, tW ms | cost model bf16 ms | measured / model at "
                "TF32 | (B + W) / fused |",
                "|---|---|---|---|---|---|",
            ]
            for model, p in result.items():
                for s, row in enumerate(p["per_stage"]):
                    lines.append(
                        f"| {model} | {s} | {_three(row, 't_{}_ms')} | "
                        f"{_three(row, 'model_bf16_t_{}_ms')} | "
                        f"{_three(row, 'measured_over_model_tf32_{}')} | "
                        f"{p['split']['ratio']:.3f} |"
                    )
        elif name == "copies" and "sizes" in result:
            lines += [
                f"cost model copy_gbps: {result['model_copy_gbps']}\n",
                "| bytes | host to device Gbit/s | device to host Gbit/s |",
                "|---|---|---|",
            ]
            lines += [
                f"| {r['bytes']} | {r['h2d_gbit_s']:.1f} | {r['d2h_gbit_s']:.1f} |"
                for r in result["sizes"]
            ]
        else:
            lines.append("```\n" + json.dumps(result, indent=1) + "\n```")
    return "\n".join(lines)


def _three(row: dict[str, Any], key: str) -> str:
    values = [row[key.format(kind)] for kind in "fbw"]
    return ", ".join("n/a" if v is None else f"{v:.4g}" for v in values)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except _Terminated as err:
        print(f"terminated ({err})", file=sys.stderr)
        sys.exit(143)
