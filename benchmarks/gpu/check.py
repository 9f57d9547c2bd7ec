"""The GPU check: the megatron runtime on a lent GPU, measured against the CPU and the cost
model. Run it through check.sh (which installs the carried wheels first); `--dry-run` runs
every part on the CPU with small shapes and skips only what needs CUDA (the copy speeds).

Parts, in the order they run, each under its own deadline (`DEADLINES_S`: SIGALRM ends a
part that runs past it, its worker pool unwound), each recorded in OUT/results.json as it
ends, with OUT/summary.md written again after each part: a part that fails, hangs or is cut
off by check.sh's limit loses only itself (its record says why, with what it had measured
so far); the others still run, and the exit status is 1 if any failed. A hang inside one
CUDA call of this process (the split parts) holds off SIGALRM and SIGTERM alike: check.sh's
SIGKILL ends it, and every part before it is on file.

- environment: torch, CUDA, the GPU, megatron-core, and the process group and devices the
  runtime chooses for 1, 2 and 4 workers on this host (pipeline.runtime.devices);
- copies: pinned host <-> device copy speed, 64 KiB to 64 MiB (the delegated path's
  `copy_gbps`), and one gpt2 stage-boundary message copied as the backend copies it
  (pageable, synchronous); second, as it needs no megatron;
- stage_builds: every stage of the tiny GPT at S = 1, 2 and 4 built as a worker builds it
  on its GPU (`build_initial_stage`), each parameter found on the GPU and megatron's RNG
  tracker seeded; a dry run builds them the same way with the meta device in the GPU's
  place (`gpu_stand_in`: megatron's GPU path, short of kernels);
- numerics: the tiny GPT at S = 1, 2 and 4 (one GPU: S > 1 shares it over gloo through
  host copies) under 1f1b and zb-h2, 3 iterations, against one CPU process's losses of the
  same seed: float32 with TF32 off, within 1e-4 relative on a GPU (its kernels sum in
  another order than the CPU's; 1e-5 on the CPU, the numerics tests' bound), each run's
  difference from the S = 1 1f1b run on the same device (the stages' split alone, no
  kernels of another device: shown, not gated), and each run's `params_sha256`; at each S
  the 1f1b run again in the same pool, whether it gives the first one's digest
  (`digest_repeats`: the design's "the same run gives the same digest", tested on a CPU only
  until a GPU runs this; reported beside `ok`, which is the losses' tolerance alone);
- profile_gpt2, profile_7b: `measure_profile` (F, B, W per stage, TF32 on: the tensor cores
  a float32 run would use) of gpt2-124m at S = 2, 8 microbatches, and of one stage of the
  paper's 7B shape (hidden 5120, 32 heads, seq 1024, micro-batch 1, `--layers-7b` layers,
  6 by default, with the embedding and the head, S = 1: `LAYERS_7B` says why). Both gpt2
  stages share the one GPU, whose time-slicing would put the other stage's kernels into
  an op's time: they run `serialised_two_stages`, taking turns. What the op times hold
  besides the stage's compute (summary.md says it under each table): gpt2's F and B the
  pageable host copies of the 3 MiB stage-boundary message, which `copies` measures
  apart and the summary takes off; the last stage's F megatron's three cross-entropy
  all-reduces over a one-rank gloo group (host round trips) and the loss's `.item()`,
  small next to the 7B head's F;
- split_gpt2, split_7b: (B + W) / fused backward on the same shapes, each the whole model
  as one stage in this process;
- the cost model (in profile_*): its F, B, W for the same stages on the GPU found
  (`hardware`, from `torch.cuda.get_device_name`): the H100 SXM (80 GiB, 3.35 TB/s) or
  the H200 (141 GiB, 4.8 TB/s), each the H800's 989 TFLOP/s dense bf16 (the same chip's
  compute) with 450 GB/s of NVLink each way. Memory and its bandwidth are all that differ,
  and the F, B, W of a TP-1 stage use neither (FLOPs over the peak at the model's MFU;
  memory bandwidth prices the optimizer step alone, memory the fit check, NVLink TP's
  all-reduces): the predictions, and so measured / predicted, are the same on either.
  Shown next to the measurements as measured / predicted, scaled by the precision
  measured (TF32's dense peak, 494.7 TFLOP/s, is half bf16's). Another GPU is priced as
  the H800, and the summary says so.
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
import subprocess
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
from pipeline.cost_model import H800_IB400, GPTModel, Hardware, model_cost
from pipeline.errors import BackendError
from pipeline.ops import Op, OpKind
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerPool
from pipeline.runtime.devices import choose_devices, describe_pool, num_visible_gpus
from pipeline.runtime.digest import params_sha256, whole_model_params
from pipeline.runtime.hooks import preload_in_workers
from pipeline.runtime.megatron import WORKER_IMPORTS, GPTPreset, MegatronCompute, get_preset
from pipeline.runtime.megatron.backend import build_initial_stage
from pipeline.runtime.megatron.model import microbatch_tokens
from pipeline.runtime.megatron.profiling import measure_profile
from pipeline.runtime.megatron.reference import (
    build_whole_model,
    single_process_megatron,
    train_reference,
)
from pipeline.runtime.megatron.shim import STAND_IN_DEVICE, gpu_stand_in, quiet_megatron
from pipeline.runtime.megatron.split_timing import time_backwards
from pipeline.runtime.megatron.stage import StageRunner
from pipeline.schedule import Schedule
from pipeline.signals import Terminated, run_script

SEED, LR, NUM_ITERATIONS, NUM_MICROBATCHES = 0, 0.5, 3, 8
AGAIN = "1f1b again"
POLICIES = (("1f1b", one_f_one_b), ("zb-h2", zb_h2), (AGAIN, one_f_one_b))
"""The numerics runs at each S, in order: the last is the first again (`_digest_repeats`)."""
H100 = dataclasses.replace(
    H800_IB400, name="h100", memory_gib=80.0, hbm_gbyte_s=3350.0, nvlink_gbyte_s=450.0
)
H200 = dataclasses.replace(
    H800_IB400, name="h200", memory_gib=141.0, hbm_gbyte_s=4800.0, nvlink_gbyte_s=450.0
)
LAYERS_7B = 6
"""The 7B stage's layers: a middle stage of the paper's gpt2-7b (22 layers at PP 4: 5 with
the embedding, 6, 6, 5 with the head), with the embedding and the head as well so that it
runs alone (S = 1): 2.15e9 parameters, float32 weights, gradients and two microbatches'
activations about 30 GB, inside an H100's 80 GiB. Time, by estimate on an H100 (16
cores): F about 2.7 ms a layer at TF32, so the ops are milliseconds; what counts is the
CPU build and initialisation of 2.15e9 parameters, about 25 s, twice (profile_7b's worker
and split_7b). The whole check: wheel install 5 s, imports and CUDA 10 s, environment and
copies 10 s, stage_builds 10 s, numerics 60 s, gpt2 profile and split 40 s, 7B profile
and split 90 s: about 4 minutes, half of check.sh's 480 s, which leaves one part's hang to
its deadline (`DEADLINES_S`) room."""
BF16_DENSE_TFLOPS, TF32_DENSE_TFLOPS = 989.0, 494.7
COPY_SIZES = tuple(64 * 1024 * 4**k for k in range(6))  # 64 KiB ... 64 MiB


@dataclasses.dataclass(frozen=True, slots=True)
class Shapes:
    """The models each part runs (the real ones, or small stand-ins for a dry run), and the
    hardware the cost model prices them on."""

    numerics: GPTPreset
    gpt2: GPTPreset
    gpt2_stages: int
    stage_7b: GPTPreset
    hardware: Hardware


def hardware(gpu_name: str | None) -> tuple[Hardware, str]:
    """The cost model's hardware for the GPU named `gpu_name` (None: no GPU, a dry run) and
    what it stands for: the H100 or H200 SXM by name, else the H800 the model assumes."""
    name = gpu_name or ""
    sxm = not any(word in name for word in ("PCIe", "NVL"))  # those have lower clocks
    if "H200" in name and sxm:
        return H200, f"{gpu_name}: priced as the H200 (SXM)"
    if "H100" in name and sxm:
        return H100, f"{gpu_name}: priced as the H100 (SXM)"
    if gpu_name is None:
        return H800_IB400, "no GPU (dry run): priced as the cost model's H800"
    return H800_IB400, f"{gpu_name}: not an H100 or H200 SXM, priced as the H800 anyway"


def shapes(dry_run: bool, layers_7b: int, hw: Hardware) -> Shapes:
    tiny = get_preset("tiny")
    if dry_run:
        stand_in = dataclasses.replace(tiny, name=f"7b-stand-in-{layers_7b}l", num_layers=layers_7b)
        return Shapes(tiny, tiny, 2, stand_in, hw)
    stage_7b = GPTPreset(
        name=f"gpt2-7b-stage-{layers_7b}l",
        num_layers=layers_7b,
        hidden_size=5120,
        num_attention_heads=32,
        vocab_size=50304,
        seq_length=1024,
        micro_batch_size=1,
    )
    return Shapes(tiny, get_preset("gpt2-124m"), 2, stage_7b, hw)


def environment(shape: Shapes, device: str) -> dict[str, Any]:
    """The software, the host (kernel, cores) and each visible GPU (name, driver, compute
    mode: an exclusive-process GPU refuses S > 1 on one GPU; memory free and in all), and
    the pools the runtime would make here. Nothing in it needs megatron-core (its version is
    None without it)."""
    from importlib import metadata

    num_gpus = num_visible_gpus()
    try:
        megatron_core: str | None = metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        megatron_core = None
    gpus = []
    for i in range(num_gpus):
        free, total = torch.cuda.mem_get_info(i)
        gpus.append(
            {
                "name": torch.cuda.get_device_name(i),
                "memory_gib": round(total / 2**30, 1),
                "free_gib": round(free / 2**30, 1),
            }
        )
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "megatron_core": megatron_core,
        "kernel": platform.release(),
        "cpu_count": os.cpu_count(),
        "gpus": gpus,
        "nvidia_smi": _nvidia_smi() if num_gpus else None,
        "device": device,
        "pools": {
            str(n): describe_pool([choose_devices(r, n, num_gpus) for r in range(n)])
            for n in (1, 2, 4)
        },
    }


def _nvidia_smi() -> str:
    """nvidia-smi's name, driver, compute mode and memory of each GPU, or why not."""
    query = "name,driver_version,compute_mode,memory.total,memory.used"
    try:
        done = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=15,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"nvidia-smi: {err}"
    return (done.stdout or done.stderr).strip()


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


def numerics(shape: Shapes, device: str, partial: dict[str, Any]) -> dict[str, Any]:
    """The numerics runs; `partial` holds the reference losses and each run as it ends (what
    a failed or cut-off part leaves). Workers wait 60 s for a message on a GPU (the tiny
    model's ops take milliseconds there), 300 s on a CPU, where a loaded CI machine is slow."""
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
    runs: list[dict[str, Any]] = []
    partial.update(
        {"model": preset.name, "tolerance_relative": tolerance, "reference_losses": reference}
    )
    partial["runs"] = runs
    timeout_s = 300 if device == "cpu" else 60
    factory = functools.partial(MegatronCompute, preset, seed=SEED, lr=LR)
    for num_stages in (1, 2, 4):
        profile = Profile.uniform(num_stages, NUM_MICROBATCHES, 1, 1, 1)
        with WorkerPool(num_stages, compute_factory=factory, timeout_s=timeout_s) as pool:
            for policy, make in POLICIES:
                schedule, losses = make(profile), []
                for it in range(NUM_ITERATIONS):
                    last = it == NUM_ITERATIONS - 1
                    pool.run_iteration(IterationConfig(it, schedule, profile, collect_params=last))
                    loss = pool.last_results[num_stages - 1].step_output.loss
                    assert loss is not None
                    losses.append(loss)
                one_stage = runs[0]["losses"] if runs else losses  # S = 1, 1F1B, on this device
                runs.append(
                    {
                        "stages": num_stages,
                        "policy": policy,
                        "devices": describe_pool(pool.devices),
                        "losses": losses,
                        "max_relative_error": _worst_relative(losses, reference),
                        "max_relative_error_vs_one_stage": _worst_relative(losses, one_stage),
                        "params_sha256": params_sha256(whole_model_params(pool.last_results)),
                    }
                )
    repeats = _digest_repeats(runs)
    return {
        "model": preset.name,
        "dtype": "float32 (TF32 off)",
        "tolerance_relative": tolerance,
        "reference_losses": reference,
        "runs": runs,
        "digest_repeats": repeats,
        "ok": all(r["max_relative_error"] <= tolerance for r in runs),
    }


def _digest_repeats(runs: list[dict[str, Any]]) -> bool:
    """Whether each S's 1f1b run, run again in its pool, gave the same parameter digest."""
    digests = {(r["stages"], r["policy"]): r["params_sha256"] for r in runs}
    return all(digests[s, "1f1b"] == digests[s, AGAIN] for s, policy in digests if policy == AGAIN)


def _worst_relative(losses: list[float], against: list[float]) -> float:
    """The largest relative difference of `losses` from `against`, iteration by iteration."""
    return max(abs(a - b) / abs(b) for a, b in zip(losses, against, strict=True))


def split_ratio(preset: GPTPreset, device: str, repeats: int) -> dict[str, Any]:
    """The whole model as one stage (S = 1) fed a random stage input, one microbatch, in this
    process: fused backward against B then W (`time_backwards`: medians of `repeats`, each
    backward from no gradients)."""
    with single_process_megatron(device):
        model = build_whole_model(preset, SEED)
        if device != "cpu":
            torch.backends.cuda.matmul.allow_tf32 = True
            model.to(device)
            with quiet_megatron():
                from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
            model_parallel_cuda_manual_seed(SEED)
        _, labels = microbatch_tokens(preset, SEED, 0)
        x = torch.randn(preset.message_shape(), generator=torch.Generator().manual_seed(1))
        times = time_backwards(StageRunner(model), labels.to(device), x.to(device), repeats)
    return {
        "model": preset.name,
        "fused_ms": times.fused_ms,
        "b_ms": times.b_ms,
        "w_ms": times.w_ms,
        "ratio": times.split_over_fused,
    }


def predicted(preset: GPTPreset, num_stages: int, num_microbatches: int, hw: Hardware) -> Profile:
    """The cost model's split-backward profile of `preset` at `num_stages` on `hw`."""
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
    return model_cost(model, hw).profile


def serialised_two_stages(num_microbatches: int) -> Schedule:
    """A 2-stage schedule whose stages' ops never run at once, but for the last W: stage 0
    runs F m, B m, W m for each microbatch; stage 1 runs F 0, B 0, then F m, W m-1, B m,
    and W M-1 last, so that its W m-1 fills the time stage 0 spends on W m-1 and F m. Only
    stage 1's last W overlaps an op of stage 0 (its last B, and its last W where stage 1's
    W outlasts that B): one in `num_microbatches` of each of those ops, which the medians
    pass over while that is under half. On one GPU two processes' kernels are time-sliced,
    so an op timed while the other stage computes would count the other's kernels too (the
    default, ZB-H1's order, overlaps most ops)."""
    first = tuple(Op(k, m) for m in range(num_microbatches) for k in (OpKind.F, OpKind.B, OpKind.W))
    last = [Op(OpKind.F, 0), Op(OpKind.B, 0)]
    for m in range(1, num_microbatches):
        last += [Op(OpKind.F, m), Op(OpKind.W, m - 1), Op(OpKind.B, m)]
    last.append(Op(OpKind.W, num_microbatches - 1))
    return Schedule((first, tuple(last)))


def profile(
    preset: GPTPreset, num_stages: int, num_microbatches: int, device: str, hw: Hardware
) -> dict[str, Any]:
    """`measure_profile` of `preset` at `num_stages` next to the cost model's profile."""
    if num_stages > 2:
        raise BackendError(f"no serialised schedule for {num_stages} stages on one GPU")
    schedule = serialised_two_stages(num_microbatches) if num_stages == 2 else None
    measured = measure_profile(
        preset,
        num_stages,
        num_microbatches,
        num_iterations=3,
        schedule=schedule,
        allow_tf32=True,
    )
    model = predicted(preset, num_stages, num_microbatches, hw)
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
    return {
        "model": preset.name,
        "stages": num_stages,
        "schedule": "serialised_two_stages" if schedule else "one stage",
        "message_bytes": preset.message_bytes() if num_stages > 1 else 0,
        "microbatches": num_microbatches,
        "layers": preset.num_layers,
        "hidden": preset.hidden_size,
        "per_stage": stages,
    }


def copies(device: str, message: GPTPreset, hw: Hardware, repeats: int = 20) -> dict[str, Any]:
    """Pinned host <-> device copies, each timed by CUDA events; medians in Gbit/s. And the
    copies the megatron backend makes of one stage-boundary message of `message` (float32,
    pageable host memory, `.to()` and synchronised, as `MegatronCompute.run` does inside an
    F or B op's record): their median ms each way, to set apart from the profiled op times."""
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
    return {
        "model_copy_gbps": hw.copy_gbps,
        "sizes": rows,
        "message": message_copies(message, device, repeats),
    }


def message_copies(message: GPTPreset, device: str, repeats: int) -> dict[str, Any]:
    """One stage-boundary message of `message` copied as the backend copies it."""
    pageable = torch.randn(message.message_shape())
    on_gpu = pageable.to(device)
    ms: dict[str, list[float]] = {"h2d": [], "d2h": []}
    for k in range(repeats + 3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        pageable.to(device)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        on_gpu.to("cpu")
        t2 = time.perf_counter()
        if k >= 3:
            ms["h2d"].append((t1 - t0) * 1e3)
            ms["d2h"].append((t2 - t1) * 1e3)
    return {
        "model": message.name,
        "bytes": message.message_bytes(),
        "h2d_pageable_ms": statistics.median(ms["h2d"]),
        "d2h_pageable_ms": statistics.median(ms["d2h"]),
    }


class _PartDeadline(BaseException):
    """A part ran past its own deadline (SIGALRM); a BaseException, so that nothing inside
    the part takes it for one of its own errors, and the pools unwind as on Ctrl-C."""


def _deadline(signum: int, frame: FrameType | None) -> None:
    raise _PartDeadline


@dataclasses.dataclass(frozen=True, slots=True)
class Part:
    """One part of the check: `run` gets a dict to fill as it goes (kept as the record's
    "partial" if the part fails or is cut off) and returns the part's result."""

    name: str
    run: Callable[[dict[str, Any]], Any]
    deadline_s: float


def run_parts(parts: list[Part], results: dict[str, Any], out: Path) -> bool:
    """Run `parts` in order, each under its own deadline; after each, its record goes into
    `results["parts"]` and OUT/results.json and OUT/summary.md are written again, so a part
    that fails, hangs past its deadline or is terminated loses only itself. Whether every
    part succeeded. A termination is recorded (as the part's error, with its partial
    results) and raised again."""
    ok = True
    for part in parts:
        partial: dict[str, Any] = {}
        start = time.monotonic()
        print(f"[{part.name}] ... (deadline {part.deadline_s:g} s)", flush=True)
        record: dict[str, Any]
        previous = signal.signal(signal.SIGALRM, _deadline)
        try:
            signal.setitimer(signal.ITIMER_REAL, part.deadline_s)
            try:
                record = {"result": part.run(partial)}
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _PartDeadline:
            ok = False
            record = {"error": f"deadline: still running after {part.deadline_s:g} s"}
        except (Terminated, KeyboardInterrupt) as err:  # check.sh's time limit, Ctrl-C
            stopped = f"terminated ({err})" if isinstance(err, Terminated) else "interrupted"
            record = {"error": stopped}
            _finish(part, record, partial, start, results, out)
            raise
        except Exception as err:
            ok = False
            record = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
        finally:
            signal.signal(signal.SIGALRM, previous)
        _finish(part, record, partial, start, results, out)
    return ok


def _finish(
    part: Part,
    record: dict[str, Any],
    partial: dict[str, Any],
    start: float,
    results: dict[str, Any],
    out: Path,
) -> None:
    if "error" in record and partial:
        record["partial"] = partial
    record["wall_s"] = round(time.monotonic() - start, 1)
    record["deadline_s"] = part.deadline_s
    results["parts"][part.name] = record
    status = f"failed: {record['error']}" if "error" in record else "done"
    print(f"[{part.name}] {status} ({record['wall_s']} s)", flush=True)
    save(results, out)


def save(results: dict[str, Any], out: Path) -> None:
    """OUT/results.json and OUT/summary.md as `results` stands now."""
    _write(out / "results.json", json.dumps(results, indent=1))
    _write(out / "summary.md", summary(results))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true", help="CPU only, small shapes")
    parser.add_argument(
        "--layers-7b", type=int, default=LAYERS_7B, help="layers of the 7B stage (LAYERS_7B: 6)"
    )
    args = parser.parse_args()
    if args.layers_7b < 1:
        parser.error("--layers-7b must be >= 1")
    device = "cpu" if args.dry_run else "cuda:0"
    if not args.dry_run and num_visible_gpus() == 0:
        print("error: no GPU visible (use --dry-run on a CPU)", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    gpu_name = None if args.dry_run else _gpu_name()
    hw, priced_as = hardware(gpu_name)
    shape = shapes(args.dry_run, args.layers_7b, hw)
    results: dict[str, Any] = {
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "dry_run": args.dry_run,
        "gpu": gpu_name,
        "cost_model_hardware": dataclasses.asdict(hw),
        "priced_as": priced_as,
        "parts": {},
    }
    preload_in_workers(WORKER_IMPORTS)  # every pool is megatron's, as a megatron run's are
    ok = run_parts(check_parts(shape, device), results, args.out)
    numbers = results["parts"].get("numerics", {}).get("result", {})
    return 0 if ok and numbers.get("ok", False) else 1


DEADLINES_S = {
    "environment": 30.0,
    "copies": 30.0,
    "stage_builds": 60.0,
    "numerics": 150.0,
    "profile_gpt2": 90.0,
    "split_gpt2": 60.0,
    "profile_7b": 150.0,
    "split_7b": 120.0,
}
"""Each part's deadline on a GPU: about 2-3 x its estimate there (module docstring); a dry
run, on a CPU that CI may load, gets twice as long."""


def _gpu_name() -> str:
    """GPU 0's name, or why there is none: a failing CUDA start is the parts' to record."""
    try:
        return torch.cuda.get_device_name(0)
    except Exception as err:  # the environment part then fails with the whole story
        return f"unknown GPU ({type(err).__name__}: {err})"


def check_parts(shape: Shapes, device: str) -> list[Part]:
    """The parts in the order they run: the cheap ones and the one that needs no megatron
    (copies) first, so that a hang later loses nothing they measured."""
    runs: dict[str, Callable[[dict[str, Any]], Any]] = {
        "environment": lambda partial: environment(shape, device),
        "copies": lambda partial: copies(device, shape.gpt2, shape.hardware),
        "stage_builds": lambda partial: stage_builds(shape, device),
        "numerics": lambda partial: numerics(shape, device, partial),
        "profile_gpt2": lambda partial: profile(
            shape.gpt2, shape.gpt2_stages, 8, device, shape.hardware
        ),
        "split_gpt2": lambda partial: split_ratio(shape.gpt2, device, repeats=5),
        "profile_7b": lambda partial: profile(shape.stage_7b, 1, 2, device, shape.hardware),
        "split_7b": lambda partial: split_ratio(shape.stage_7b, device, repeats=5),
    }
    scale = 2.0 if device == "cpu" else 1.0
    return [Part(name, run, DEADLINES_S[name] * scale) for name, run in runs.items()]


def _write(path: Path, text: str) -> None:
    """Whole or absent: a check cut off at its limit leaves the last complete file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(path)


def summary(results: dict[str, Any]) -> str:
    """The results so far as markdown tables (what benchmarks/gpu/RESULTS.md quotes); a
    failed part shows its error and what it had measured (its "partial")."""
    title = f"# GPU check, {results['started']}"
    lines = [title + (" (dry run, CPU)" if results["dry_run"] else f" on {results['gpu']}")]
    lines.append(f"\nCost model: {results['priced_as']}.")
    for name, record in results["parts"].items():
        lines.append(f"\n## {name} ({record['wall_s']} s)\n")
        if "error" in record:
            lines.append(f"failed: {record['error']}")
            if record.get("partial"):
                lines.append("\nwhat it had measured:\n")
                lines += _render(name, record["partial"], results)
            continue
        lines += _render(name, record["result"], results)
    return "\n".join(lines)


def _render(name: str, result: dict[str, Any], results: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    if name == "numerics":
        if "ok" in result:
            lines.append(
                f"{result['dtype']}, tolerance {result['tolerance_relative']:g} relative; "
                f"the same run twice, the same digest: {result['digest_repeats']}; "
                f"ok: {result['ok']}\n"
            )
        lines += [
            "| S | policy | devices | max relative error | against S = 1 here | params_sha256 |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['stages']} | {r['policy']} | {r['devices']} | "
            f"{r['max_relative_error']:.2e} | "
            f"{r.get('max_relative_error_vs_one_stage', float('nan')):.2e} | "
            f"{r['params_sha256'][:16]} |"
            for r in result.get("runs", [])
        ]
    elif name.startswith("profile_"):
        lines += [
            f"{result['model']}: S = {result['stages']}, {result['microbatches']} microbatches, "
            f"{result['layers']} layers, hidden {result['hidden']}\n",
            "| stage | tF, tB, tW ms | cost model bf16 ms | measured / model at TF32 |",
            "|---|---|---|---|",
        ]
        for s, row in enumerate(result["per_stage"]):
            lines.append(
                f"| {s} | {_three(row, 't_{}_ms')} | {_three(row, 'model_bf16_t_{}_ms')} | "
                f"{_three(row, 'measured_over_model_tf32_{}')} |"
            )
        lines += _profile_notes(result, results)
    elif name.startswith("split_"):
        lines.append(
            f"{result['model']}, the whole model as one stage (S = 1): fused backward "
            f"{result['fused_ms']:.4g} ms, B {result['b_ms']:.4g} ms, W {result['w_ms']:.4g} ms, "
            f"(B + W) / fused {result['ratio']:.3f}"
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
    return lines


def _profile_notes(result: dict[str, Any], results: dict[str, Any]) -> list[str]:
    """What a profile's op times hold besides the stage's compute."""
    num_stages = result["stages"]
    notes = [
        f"\nSchedule: {result['schedule']}"
        + (
            " (the stages take turns on the one GPU: no two ops timed at once but the last W)."
            if num_stages > 1
            else "."
        ),
        "The last stage's F also holds megatron's three all-reduces of the cross entropy over "
        "its one-rank gloo group (host round trips, absent over NCCL) and the loss's "
        "synchronising `.item()`.",
    ]
    if num_stages == 1:
        return notes
    copies = results["parts"].get("copies", {}).get("result", {}).get("message")
    notes.append(
        f"Each F and B also holds the pageable host copies of the {result['message_bytes']}-byte "
        "stage-boundary message (gloo sends host memory): a stage's F copies its input in "
        "(host to device) unless first and its output out unless last; its B the gradient "
        "in unless last and out unless first."
    )
    if copies is None or copies["bytes"] != result["message_bytes"]:
        return [*notes, "Not measured apart (no copies part for this message size)."]
    h2d, d2h = copies["h2d_pageable_ms"], copies["d2h_pageable_ms"]
    notes.append(
        f"The copies part measured them apart: host to device {h2d:.4g} ms, device to host "
        f"{d2h:.4g} ms. tF, tB less them:"
    )
    for s, row in enumerate(result["per_stage"]):
        first, last = s == 0, s == num_stages - 1
        f_copy = (0 if first else h2d) + (0 if last else d2h)
        b_copy = (0 if last else h2d) + (0 if first else d2h)
        notes.append(
            f"stage {s}: F {row['t_f_ms'] - f_copy:.4g} ms, B {row['t_b_ms'] - b_copy:.4g} ms;"
        )
    return notes


def _three(row: dict[str, Any], key: str) -> str:
    values = [row[key.format(kind)] for kind in "fbw"]
    return ", ".join("n/a" if v is None else f"{v:.4g}" for v in values)


if __name__ == "__main__":
    run_script(main)  # SIGTERM, SIGHUP (check.sh's time limit): the pools unwind, as on Ctrl-C
