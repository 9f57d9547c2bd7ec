"""A run directory's figures and report.md, rebuilt from its CSVs (`adaptra-bench report`)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.paper import PAPER, PaperValue
from harness.plots import plot_iteration_time_vs_delay, plot_slowdown, plot_throughput_over_time
from harness.results import fault_free_wall_ms, read_csv_rows, write_atomic
from harness.runner import run_configuration
from harness.spec import ExperimentSpec, Target, controller_for
from pipeline.gantt import plot_gantt

__all__ = ["paper_comparison", "write_report"]


def paper_comparison(
    experiment: str, runs: Sequence[Mapping[str, Any]]
) -> list[tuple[Mapping[str, Any], PaperValue, float]]:
    """(row, the paper's value, ours in the same unit) for every row the paper reports."""
    reference = PAPER.get(experiment, {})
    base = fault_free_wall_ms(runs)
    out = []
    for row in runs:
        paper = reference.get((row["model"], row["system"], row["scenario"]))
        if paper is None:
            continue
        if paper.kind == "seconds":
            ours = float(row["median_wall_ms"]) / 1000.0
        elif paper.kind == "slowdown":
            if (row["model"], row["system"]) not in base:
                continue
            ours = float(row["median_wall_ms"]) / base[row["model"], row["system"]]
        else:
            ours = float(row["throughput_samples_per_s"])
        out.append((row, paper, ours))
    return out


def _gantt_charts(spec: ExperimentSpec, run_dir: Path) -> list[str]:
    """One Gantt chart per system: the first model under its worst static scenario."""
    target: Target = spec.targets()[0]
    scenarios = spec.scenarios(target)
    worst = max(scenarios, key=lambda s: (s.faults is None, s.delay_ms))
    if worst.faults is not None:
        return []
    names = []
    for system in spec.systems:
        controller = controller_for(system, target, worst)
        comm = controller.plan(0).comm
        run = run_configuration(controller, num_iterations=1, num_warmup_iterations=0)
        assert run.timeline is not None
        name = f"gantt_{system}.png"
        plot_gantt(
            run.timeline,
            run_dir / name,
            title=f"{target.label}: {system} ({comm.value}), {worst.name}",
        )
        names.append(name)
    return names


def write_report(spec: ExperimentSpec, run_dir: Path, runs: list[dict[str, Any]]) -> None:
    figures: list[tuple[str, str]] = []
    static = [r for r in runs if not r["scenario"].startswith("trace:")]
    if static:
        plot_iteration_time_vs_delay(static, run_dir / "iteration_time_vs_delay.png")
        figures.append(("time per step vs delay", "iteration_time_vs_delay.png"))
        if plot_slowdown(static, run_dir / "slowdown.png"):
            figures.append(("slowdown against each system's fault-free step", "slowdown.png"))
    traced = [
        r for r in read_csv_rows(run_dir / "iterations.csv") if r["scenario"].startswith("trace:")
    ]
    if traced:
        samples = spec.targets()[0].samples_per_iteration
        plot_throughput_over_time(traced, samples, run_dir / "throughput_over_time.png")
        figures.append(("throughput over the fault timeline", "throughput_over_time.png"))
    figures += [(f"Gantt chart, {name[6:-4]}", name) for name in _gantt_charts(spec, run_dir)]
    lines = [
        f"# {spec.name}",
        "",
        f"Backend `{spec.backend}`, {spec.num_iterations} measured iterations per configuration "
        f"after {spec.num_warmup_iterations} warm-up. A step is the pipeline iteration plus the "
        "DP all-reduce and the optimizer.",
        "",
        "| model | system | scenario | median step (ms) | median iteration (ms) | samples/s "
        "| bubble ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['model']} | {r['system']} | {r['scenario']} | {float(r['median_wall_ms']):.1f} | "
        f"{float(r['median_iteration_ms']):.1f} | {float(r['throughput_samples_per_s']):.2f} | "
        f"{float(r['bubble_ratio']):.3f} |"
        for r in runs
    ]
    compared = paper_comparison(spec.name, runs)
    if compared:
        errors = [abs(ours - paper.value) / paper.value for _, paper, ours in compared]
        lines += [
            "",
            "## Against the paper",
            "",
            f"Median relative error {100 * statistics.median(errors):.1f} % over "
            f"{len(errors)} values (max {100 * max(errors):.1f} %).",
            "",
            "| model | system | scenario | unit | paper | ours | error |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['model']} | {r['system']} | {r['scenario']} | {paper.kind} | "
            f"{paper.value:.2f} | {ours:.2f} | {100 * (ours - paper.value) / paper.value:+.1f} % |"
            for r, paper, ours in compared
        ]
    lines.append("")
    lines += [f"![{caption}]({name})\n" for caption, name in figures]
    write_atomic(run_dir / "report.md", "\n".join(lines))
