"""What a run's Nth configuration costs as N grows: a sim spec of 1F1B and ZB, 8 iterations
each, repeated to --configurations N, run in this process (`run_experiment`); the wall time
per configuration over the first and the last quarter of the run. Equal per-configuration
times: a run linear in its configurations.

Run: python benchmarks/bench_many_configurations.py [--configurations 400 1600]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from harness.experiment import run_experiment
from harness.spec import load_spec
from pipeline.signals import run_script

_SPEC = """name: many
model: p4
profile: {{stages: 4, microbatches: 8, t_f: 10, t_b: 10, t_w: 10, message_bytes: 1048576}}
systems: [1f1b, zb]
num_iterations: 8
num_warmup_iterations: 0
num_repeats: {num_repeats}
"""


def _one(num_configurations: int) -> tuple[float, float, float]:
    """(whole s, ms a configuration in the first quarter, in the last)."""
    with tempfile.TemporaryDirectory() as folder:
        spec_path = Path(folder) / "spec.yaml"
        spec_path.write_text(_SPEC.format(num_repeats=num_configurations // 2))
        ended: list[float] = []
        started = time.perf_counter()
        run_experiment(
            load_spec(spec_path), Path(folder) / "run", lambda _: ended.append(time.perf_counter())
        )
        whole_s = time.perf_counter() - started
    ends = ended[-num_configurations:]  # a line per configuration, after any before them
    quarter = num_configurations // 4
    first_ms = 1e3 * (ends[quarter - 1] - ends[0]) / (quarter - 1)
    last_ms = 1e3 * (ends[-1] - ends[-quarter]) / (quarter - 1)
    return whole_s, first_ms, last_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--configurations", type=int, nargs="+", default=[400, 1600])
    args = parser.parse_args()
    print("| configurations | whole run | first quarter, a configuration | last quarter |")
    print("|---|---|---|---|")
    for num_configurations in args.configurations:
        whole_s, first_ms, last_ms = _one(num_configurations)
        print(
            f"| {num_configurations} | {whole_s:.1f} s | {first_ms:.1f} ms | {last_ms:.1f} ms |",
            flush=True,
        )


if __name__ == "__main__":
    run_script(main)
