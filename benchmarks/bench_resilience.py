"""Resilience curves: iteration time against the delay on one link, per system (sim).

Run: python benchmarks/bench_resilience.py [--out DIR] (default: the repository's
results/resilience, wherever it is run from)

docs/design.md's systems: `1f1b` (1F1B over direct), `zb` (the fault-free ZB order over direct),
`adaptra-cpu` (that ZB order over delegated), `adaptra` (Adaptra's order, planned for the
delay, over delegated; at 0 ms, over direct, since no straggler is seen). Uniform 10 ms ops,
delegates enough and copies free (the `delegated` mode's ideal limit), delay on link 0-1.
Writes resilience.csv and one PNG per pipeline shape.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from adaptra.scheduler import plan_adaptra
from baselines import one_f_one_b, zb_auto
from harness.plots import plot_lines
from pipeline.profile import Profile
from pipeline.signals import run_script
from pipeline.simulator import CommMode, simulate

DELAYS_MS = tuple(range(0, 61, 10))
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "resilience"


def _systems(profile: Profile) -> dict[str, float]:
    zb_order = zb_auto(profile)
    adaptra_comm = CommMode.DELEGATED if any(profile.delay_ms) else CommMode.DIRECT
    runs = {
        "1f1b": (one_f_one_b(profile), CommMode.DIRECT),
        "zb": (zb_order, CommMode.DIRECT),
        "adaptra-cpu": (zb_order, CommMode.DELEGATED),
        "adaptra": (plan_adaptra(profile).schedule, adaptra_comm),
    }
    return {
        name: simulate(schedule, profile, comm).iterations[0].end_ms
        for name, (schedule, comm) in runs.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="Folder for resilience.csv and the PNGs (default: the repository's "
        "results/resilience).",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    all_rows: list[dict[str, object]] = []
    print("| S | N | delay ms | 1f1b | zb | adaptra-cpu | adaptra |")
    print("|---|---|---|---|---|---|---|")
    for num_stages, num_microbatches in [(4, 12), (8, 24)]:
        rows = []
        for delay in DELAYS_MS:
            profile = Profile.uniform(
                num_stages, num_microbatches, 10, 10, 10, delay_ms=(float(delay),)
            )
            times = _systems(profile)
            print(
                f"| {num_stages} | {num_microbatches} | {delay} | "
                + " | ".join(f"{times[s]:g}" for s in ("1f1b", "zb", "adaptra-cpu", "adaptra"))
                + " |"
            )
            rows += [
                {
                    "stages": num_stages,
                    "microbatches": num_microbatches,
                    "delay_ms": delay,
                    "system": name,
                    "iteration_time_ms": value,
                }
                for name, value in times.items()
            ]
        plot_lines(
            rows,
            args.out / f"resilience_S{num_stages}_N{num_microbatches}.png",
            x="delay_ms",
            y="iteration_time_ms",
            hue="system",
            xlabel="delay per message on link 0-1 (ms)",
            ylabel="iteration time (ms)",
            title=f"S={num_stages}, N={num_microbatches}, 10 ms ops",
        )
        all_rows += rows
    with (args.out / "resilience.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(all_rows[0]))
        writer.writeheader()
        writer.writerows(all_rows)


if __name__ == "__main__":
    run_script(main)
