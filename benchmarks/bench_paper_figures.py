"""The paper's experiments in the simulator with the frozen cost model, next to its numbers.

Runs every preset of harness/presets that the paper reports (Fig. 1, 15, 16, 17, the Table 3
trace) and prints, per preset, the median and max relative error and the full comparison.

Run: python benchmarks/bench_paper_figures.py [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from harness.experiment import run_experiment
from harness.paper import PAPER
from harness.report import paper_comparison
from harness.results import RUNS_COLUMNS, read_csv_rows
from harness.spec import load_spec

PRESETS = Path(__file__).resolve().parents[1] / "harness" / "presets"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="keep the run directories here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="paper-figures-") as scratch:  # removed: none left
        _compare(args.out or Path(scratch))


def _compare(out: Path) -> None:
    summary, details = [], []
    for path in sorted(PRESETS.glob("*.yaml")):
        spec = load_spec(path)
        if spec.name not in PAPER:
            continue
        run_dir = run_experiment(spec, out / spec.name, progress=lambda _: None)
        compared = paper_comparison(spec.name, read_csv_rows(run_dir / "runs.csv", RUNS_COLUMNS))
        errors = [abs(ours - paper.value) / paper.value for _, paper, ours in compared]
        summary.append(
            f"| {spec.name} | {path.name} | {len(errors)} | "
            f"{100 * statistics.median(errors):.1f} % | {100 * max(errors):.1f} % |"
        )
        details += [f"\n{spec.name}", "| model | system | scenario | unit | paper | ours | error |"]
        details.append("|---|---|---|---|---|---|---|")
        details += [
            f"| {r['model']} | {r['system']} | {r['scenario']} | {p.kind} | {p.value:.2f} | "
            f"{ours:.2f} | {100 * (ours - p.value) / p.value:+.1f} % |"
            for r, p, ours in compared
        ]
    print("| preset | file | values | median error | max error |")
    print("|---|---|---|---|---|")
    print("\n".join(summary))
    print("\n".join(details))


if __name__ == "__main__":
    main()
