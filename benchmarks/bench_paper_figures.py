"""The paper's experiments in the simulator with the frozen cost model, next to its numbers.

Runs every preset of harness/presets that the paper reports (Fig. 1, 3, 15, 16, 17, the Table 3
trace) and prints, per preset, the median and max relative error; Fig. 16's by system; the
orderings: every pair of systems in the same preset, model and scenario whose paper values
differ by at least 10 % (of the smaller), and how many of them ours put in the paper's order;
then the full comparison.

Run: python benchmarks/bench_paper_figures.py [--out DIR]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
from pathlib import Path

from harness.experiment import run_experiment
from harness.paper import PAPER
from harness.report import PaperComparison, paper_comparison, paper_table, prediction_errors
from harness.results import RUNS_COLUMNS, read_csv_rows
from harness.spec import load_spec
from pipeline.signals import run_script

PRESETS = Path(__file__).resolve().parents[1] / "harness" / "presets"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="keep the run directories here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="paper-figures-") as scratch:  # removed: none left
        _compare(args.out or Path(scratch))


ORDER_MARGIN = 0.10
"""Two paper values this far apart (relative to the smaller) make an ordering to keep."""


def _by_system(compared: PaperComparison) -> list[str]:
    """Median and max relative error per system, in the preset's order, then over all."""
    errors: dict[str, list[float]] = {}
    for row, paper, ours in compared:
        errors.setdefault(row["system"], []).extend(prediction_errors([(row, paper, ours)]))
    groups = [*errors.items(), ("all", [e for found in errors.values() for e in found])]
    return [
        f"| {system} | {len(found)} | {100 * statistics.median(found):.1f} % | "
        f"{100 * max(found):.1f} % |"
        for system, found in groups
    ]


def _orderings(compared: PaperComparison) -> tuple[int, int]:
    """(pairs of systems in the same model and scenario whose paper values differ by at least
    ORDER_MARGIN, how many of them ours put in the same order)."""
    groups: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for row, paper, ours in compared:
        groups.setdefault((row["model"], row["scenario"]), []).append((paper.value, ours))
    pairs = kept = 0
    for values in groups.values():
        for (paper_a, ours_a), (paper_b, ours_b) in itertools.combinations(values, 2):
            if abs(paper_a - paper_b) >= ORDER_MARGIN * min(paper_a, paper_b):
                pairs += 1
                kept += (paper_a < paper_b) == (ours_a < ours_b)
    return pairs, kept


def _compare(out: Path) -> None:
    summary, details, by_system = [], [], []
    pairs = kept = 0
    for path in sorted(PRESETS.glob("*.yaml")):
        spec = load_spec(path)
        if spec.name not in PAPER:
            continue
        run_dir = run_experiment(spec, out / spec.name, progress=lambda _: None)
        compared = paper_comparison(spec.name, read_csv_rows(run_dir / "runs.csv", RUNS_COLUMNS))
        errors = prediction_errors(compared)
        if spec.name == "fig16":
            by_system = _by_system(compared)
        found, same = _orderings(compared)
        pairs, kept = pairs + found, kept + same
        summary.append(
            f"| {spec.name} | {path.name} | {len(errors)} | "
            f"{100 * statistics.median(errors):.1f} % | {100 * max(errors):.1f} % |"
        )
        details += [f"\n{spec.name}", *paper_table(compared)]
    print("| preset | file | predicted values | median error | max error |")
    print("|---|---|---|---|---|")
    print("\n".join(summary))
    if by_system:
        print("\nfig16 by system")
        print("| system | values | median error | max error |")
        print("|---|---|---|---|")
        print("\n".join(by_system))
    print(
        f"\norderings: {pairs} pairs of systems (same preset, model and scenario) whose paper "
        f"values differ by at least {100 * ORDER_MARGIN:.0f} %; ours put {kept} in the "
        "paper's order"
    )
    print("\n".join(details))


if __name__ == "__main__":
    run_script(main)
