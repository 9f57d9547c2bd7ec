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

import torch

from pipeline.runtime.megatron.model import get_preset, microbatch_tokens
from pipeline.runtime.megatron.reference import build_whole_model, single_process_megatron
from pipeline.runtime.megatron.split_timing import BackwardTimes, time_backwards
from pipeline.runtime.megatron.stage import StageRunner
from pipeline.signals import run_script


def _measure(model_name: str, repeats: int) -> BackwardTimes:
    preset = get_preset(model_name)
    runner = StageRunner(build_whole_model(preset, seed=0))
    _, labels = microbatch_tokens(preset, 0, 0)
    x = torch.randn(preset.message_shape(), generator=torch.Generator().manual_seed(1))
    return time_backwards(runner, labels, x, repeats)


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
            times = _measure(name, args.repeats)
            print(
                f"| {name} | {preset.num_layers} | {preset.hidden_size} | "
                f"{preset.seq_length} x {preset.micro_batch_size} | {times.fused_ms:.2f} | "
                f"{times.b_ms:.2f} | {times.w_ms:.2f} | {times.split_over_fused:.3f} |"
            )


if __name__ == "__main__":
    run_script(main)
