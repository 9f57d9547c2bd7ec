"""The megatron backend's B/W split against a fused backward: is any work done twice?

Run: python benchmarks/bench_megatron_split.py [--repeats 10] [--models tiny small]

One process, one thread, the whole model as one stage fed a random stage input (so B has an
input gradient to return), one microbatch. Per repeat, interleaved: a forward with megatron's
own linear Function and its backward (fused), and a forward with the deferring linear, B, then
W, each backward from no gradients. Medians of the backward times only. The ratio
(B + W) / fused is a property of the split (about 1: nothing recomputed), not a speed claim:
2 CPU cores are no training machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from pipeline.runtime.megatron.model import get_preset, microbatch_tokens
from pipeline.runtime.megatron.reference import build_whole_model, single_process_megatron
from pipeline.runtime.megatron.stage import StageRunner
from pipeline.signals import run_script


def _measure(model_name: str, repeats: int) -> tuple[float, float, float]:
    preset = get_preset(model_name)
    runner = StageRunner(build_whole_model(preset, seed=0))
    _, labels = microbatch_tokens(preset, 0, 0)
    x = torch.randn(preset.message_shape(), generator=torch.Generator().manual_seed(1))
    fused, b_times, w_times = [], [], []
    for k in range(repeats + 2):  # two warm-ups
        _clear_grads(runner)  # each backward from no gradients (benchmarks/gpu/check.py)
        runner.forward(0, labels=labels, stage_input=x, deferred=False)
        start = time.perf_counter()
        runner.backward_fused(0, None)
        fused_s = time.perf_counter() - start
        _clear_grads(runner)
        runner.forward(0, labels=labels, stage_input=x)
        start = time.perf_counter()
        runner.backward_input(0, None)
        mid = time.perf_counter()
        runner.backward_weight(0)
        end = time.perf_counter()
        if k >= 2:
            fused.append(fused_s)
            b_times.append(mid - start)
            w_times.append(end - mid)
    return statistics.median(fused), statistics.median(b_times), statistics.median(w_times)


def _clear_grads(runner: StageRunner) -> None:
    """No gradients: a backward onto earlier ones adds to them, a pass over every gradient
    that one from none (autograd handing its results over) does not make."""
    for param in runner.params:
        param.grad = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--models", nargs="+", default=["tiny", "small"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        "| model | layers | hidden | seq x batch | fused (ms) | B (ms) | W (ms) | (B + W) / fused |"
    )
    print("|---|---|---|---|---|---|---|---|")
    with single_process_megatron():
        for name in args.models:
            preset = get_preset(name)
            fused, b, w = _measure(name, args.repeats)
            print(
                f"| {name} | {preset.num_layers} | {preset.hidden_size} | "
                f"{preset.seq_length} x {preset.micro_batch_size} | {fused * 1e3:.2f} | "
                f"{b * 1e3:.2f} | {w * 1e3:.2f} | {(b + w) / fused:.3f} |"
            )


if __name__ == "__main__":
    run_script(main)
