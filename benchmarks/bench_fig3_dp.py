"""Fig. 3 / 18 in the simulator: 7B at DP 2 x PP 4 under ZB, a slow DP link against the same
delay on a PP link, with the frozen cost model (nothing fitted to these numbers).

Runs harness/presets/fig3_dp_link.yaml (each stage's DP ring link in turn, each PP link in
turn, 10/20/30 ms per message) and prints our seconds per step next to the paper's, and how
many all-reduce messages each DP link carries each way (pipeline.allreduce).

Run: python benchmarks/bench_fig3_dp.py [--out DIR]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from harness.experiment import run_experiment
from harness.results import RUNS_COLUMNS, read_csv_rows
from harness.spec import load_spec
from pipeline.allreduce import buckets, messages_per_link_direction
from pipeline.cost_model import MODELS, model_cost
from pipeline.signals import run_script

PRESET = Path(__file__).resolve().parents[1] / "harness" / "presets" / "fig3_dp_link.yaml"
PAPER_S = {  # docs/paper.md, Fig. 3 / 18
    "fault-free": 0.49,
    "dp": {10: 1.87, 20: 2.79, 30: 3.94},
    "pp": {10: 0.64, 20: 0.86, 30: 1.10},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="keep the run directory here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fig3-") as scratch:  # removed: none left
        _compare(args.out or Path(scratch))


def _compare(out: Path) -> None:
    spec = load_spec(PRESET)
    runs = read_csv_rows(
        run_experiment(spec, out / spec.name, progress=lambda _: None) / "runs.csv", RUNS_COLUMNS
    )
    step_s = {r["scenario"]: float(r["median_wall_ms"]) / 1000 for r in runs}
    profile = model_cost(MODELS["gpt2-7b-dp2"]).profile
    print("| stage | gradient GB | buckets | messages per DP link direction |")
    print("|---|---|---|---|")
    for stage, grad in enumerate(profile.allreduce_bytes):
        num_buckets = len(buckets(grad, profile.dp_bucket_bytes))
        count = messages_per_link_direction(grad, profile.dp_bucket_bytes, profile.num_replicas)
        print(f"| {stage} | {grad / 1e9:.2f} | {num_buckets} | {count} |")
    print(f"\nfault-free: paper {PAPER_S['fault-free']:.2f} s, ours {step_s['fault-free']:.3f} s\n")
    dp_links = [f"dp{s}:0-1" for s in range(profile.num_stages)]
    pp_links = [f"{s}-{s + 1}" for s in range(profile.num_stages - 1)]
    header = ["delay", "paper DP", *dp_links, "paper PP", *pp_links]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for delay in (10, 20, 30):
        dp = [f"{step_s[f'{link}@{delay}ms']:.2f}" for link in dp_links]
        pp = [f"{step_s[f'{link}@{delay}ms']:.2f}" for link in pp_links]
        cells = [
            f"{delay} ms",
            f"{PAPER_S['dp'][delay]:.2f}",
            *dp,
            f"{PAPER_S['pp'][delay]:.2f}",
            *pp,
        ]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    run_script(main)
