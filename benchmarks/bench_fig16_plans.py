"""Fig. 16's Adaptra cells in the cost model: is the model's Adaptra fast because of our
planner, or because its warm-ups would not fit in memory?

Run: python benchmarks/bench_fig16_plans.py

For each model and Fig. 16 scenario (30 or 60 ms on the first or the last PP link), the
cost model's split-backward profile (pipeline.cost_model, frozen), delegated with the
paper's delegate count, simulated (`delegated`, pipeline only: no DP step) under three
schedules: our planner's (`plan_adaptra`), the authors' released warm-up rule
x_i = x_(i+1) + ceil(c_i / tF_i) + 2 through the same generator, and ZB's (what Adaptra-CPU
delegates). Beside them, memory: per stage, the microbatches that fit next to its weights
(`max_in_flight`) less our plan's peak activation memory (`pipeline.schedule.peak_memory`,
in microbatches), the smallest over the stages (N is 12 at 7B, 24 above; below 0, the plan
would not fit).
"""

from __future__ import annotations

import argparse

from adaptra.generator import generate_schedule
from adaptra.planning import authors_warmup
from adaptra.scheduler import plan_adaptra
from baselines import zb_auto
from harness.policies import with_delegate_count
from pipeline.cost_model import MODELS, model_cost
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.schedule import Schedule, peak_memory
from pipeline.signals import run_script
from pipeline.simulator import CommMode, simulate

FIG16_MODELS = ("gpt2-7b", "gpt2-14b", "gpt2-30b", "gpt2-60b")


def _pipeline_ms(schedule: Schedule, profile: Profile) -> float:
    return compute_metrics(simulate(schedule, profile, CommMode.DELEGATED)).iteration_time_ms


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    print(
        "| model | scenario | ours ms | authors' rule ms | ZB delegated ms | "
        "room left (microbatches) |"
    )
    print("|---|---|---|---|---|---|")
    for name in FIG16_MODELS:
        cost = model_cost(MODELS[name])
        num_stages = cost.profile.num_stages
        for link, where in ((0, "first"), (num_stages - 2, "last")):
            for delay_ms in (30.0, 60.0):
                delays = [0.0] * (num_stages - 1)
                delays[link] = delay_ms
                profile = with_delegate_count(cost.profile.with_delays(delays))
                ours = plan_adaptra(profile).schedule
                held = [peak_memory(ops) for ops in ours.stages]  # activations, in microbatches
                room = min(f - h for f, h in zip(cost.max_in_flight, held, strict=True))
                authors = generate_schedule(profile, authors_warmup(profile))
                print(
                    f"| {name} | {where} link, {delay_ms:g} ms | "
                    f"{_pipeline_ms(ours, profile):.0f} | "
                    f"{_pipeline_ms(authors, profile):.0f} | "
                    f"{_pipeline_ms(zb_auto(profile), profile):.0f} | "
                    f"{room:g} |"
                )


if __name__ == "__main__":
    run_script(main)
