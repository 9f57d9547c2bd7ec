"""The paper's experiments as presets, in the simulator with the frozen cost model."""

import fnmatch
import itertools
import statistics
import tomllib
from pathlib import Path

import pytest

from harness.experiment import fault_free_step_ms, run_experiment
from harness.report import paper_comparison
from harness.results import ITERATIONS_COLUMNS, RUNS_COLUMNS, read_csv_rows
from harness.spec import load_spec

PRESETS = Path(__file__).parents[2] / "harness" / "presets"


@pytest.mark.parametrize(
    ("model", "system", "paper_s"),
    [("gpt2-14b", "1f1b", 0.86), ("gpt2-14b", "zb", 0.79), ("gpt2-7b-dp2", "zb", 0.49)],
)
def test_frozen_calibration_reproduces_its_fault_free_targets(
    model: str, system: str, paper_s: float
) -> None:
    assert fault_free_step_ms(model, system) / 1000 == pytest.approx(paper_s, rel=0.01)


def test_frozen_calibration_reproduces_the_delegation_overhead() -> None:
    """host_delegate_gbps is fitted on the mean of the paper's +10.6 % (30B) and +16.4 %
    (60B) for delegating every PP message with no straggler (one delegate per direction)."""
    overheads = [
        fault_free_step_ms(m, "adaptra-cpu") / fault_free_step_ms(m, "zb") - 1
        for m in ("gpt2-30b", "gpt2-60b")
    ]
    assert statistics.mean(overheads) == pytest.approx(0.135, abs=0.002)
    assert overheads[0] < overheads[1]  # 60B's bigger messages share the same hosts


def test_every_preset_file_ships_in_the_wheel() -> None:
    """The wheel took presets/*.yaml only: table3_trace.yaml's trace (table3_trace.txt)
    was left out, and the installed preset could not load."""
    pyproject = tomllib.loads((PRESETS.parents[1] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["harness"]
    files = sorted(f"presets/{p.name}" for p in PRESETS.iterdir() if p.is_file())
    assert "presets/table3_trace.txt" in files
    left_out = [f for f in files if not any(fnmatch.fnmatch(f, p) for p in patterns)]
    assert left_out == []


@pytest.mark.parametrize("preset", sorted(p.name for p in PRESETS.glob("*.yaml")))
def test_every_preset_is_valid(preset: str) -> None:
    spec = load_spec(PRESETS / preset)
    for target in spec.targets():
        assert spec.scenarios(target)


def _run(preset: str, tmp_path: Path) -> list[dict[str, str]]:
    spec = load_spec(PRESETS / preset)
    run_dir = run_experiment(spec, tmp_path / spec.name, progress=lambda _: None)
    assert (run_dir / "report.md").exists()
    return read_csv_rows(run_dir / "runs.csv", RUNS_COLUMNS)


def _by_cell(runs: list[dict[str, str]]) -> dict[tuple[str, str], dict[str, float]]:
    cells: dict[tuple[str, str], dict[str, float]] = {}
    for r in runs:
        if r["scenario"] != "fault-free":
            cells.setdefault((r["model"], r["scenario"]), {})[r["system"]] = float(
                r["median_wall_ms"]
            )
    return cells


def test_fig16_adaptra_beats_every_system_in_every_cell(tmp_path: Path) -> None:
    runs = _run("fig16_models.yaml", tmp_path)
    cells = _by_cell(runs)
    assert len(cells) == 4 * 4  # 4 models x {first, last} link x {30, 60} ms
    for cell, step_ms in cells.items():
        assert step_ms["adaptra"] < step_ms["adaptra-cpu"], cell
        assert step_ms["adaptra"] < min(step_ms["1f1b"], step_ms["zb"]), cell
    compared = paper_comparison("fig16", runs)
    assert len(compared) == 64
    report = (tmp_path / "fig16" / "report.md").read_text()  # the preset's: compared
    assert "## Against the paper\n\nMedian relative error 6.1 % over 64 predicted values" in report
    errors: dict[str, list[float]] = {}
    for row, paper, ours in compared:
        errors.setdefault(row["system"], []).append(abs(ours - paper.value) / paper.value)
    assert statistics.median(itertools.chain(*errors.values())) < 0.065  # measured 6.1 %
    medians = {system: statistics.median(e) for system, e in errors.items()}
    # measured 2.6 / 6.8 / 6.8 / 11.3 % (BENCHMARKS.md: what is still off at 30B and 60B)
    assert medians["1f1b"] < 0.03 and medians["zb"] < 0.075
    assert medians["adaptra-cpu"] < 0.075 and medians["adaptra"] < 0.12
    assert max(max(e) for s, e in errors.items() if s in ("1f1b", "zb")) < 0.17
    # Every order of two systems the paper shows 10 % apart is ours too.
    cell: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}
    for row, paper, ours in compared:
        cell.setdefault((row["model"], row["scenario"]), {})[row["system"]] = (paper.value, ours)
    pairs = [
        (a, b)
        for systems in cell.values()
        for a, b in itertools.combinations(systems.values(), 2)
        if abs(a[0] - b[0]) >= 0.1 * min(a[0], b[0])
    ]
    assert len(pairs) > 80
    assert all((a[0] < b[0]) == (a[1] < b[1]) for a, b in pairs)


def test_fig17_several_slow_links(tmp_path: Path) -> None:
    cells = _by_cell(_run("fig17_several_links.yaml", tmp_path))
    assert len(cells) == 4
    for cell, step_ms in cells.items():
        assert step_ms["adaptra"] < step_ms["adaptra-cpu"] < min(step_ms["1f1b"], step_ms["zb"]), (
            cell
        )


def test_table3_trace_adaptra_keeps_throughput(tmp_path: Path) -> None:
    spec = load_spec(PRESETS / "table3_trace.yaml")
    run_dir = run_experiment(spec, tmp_path / "t3", progress=lambda _: None)
    runs = {r["system"]: r for r in read_csv_rows(run_dir / "runs.csv", RUNS_COLUMNS)}
    assert {r["scenario"] for r in runs.values()} == {"trace:table3_trace"}
    assert all(int(r["iterations"]) == 1200 for r in runs.values())
    throughput = {s: float(r["throughput_samples_per_s"]) for s, r in runs.items()}
    assert throughput["adaptra"] > 1.2 * max(throughput["1f1b"], throughput["zb"])
    # The NIC failure at 1030 restarts the baselines from 1000. Adaptra's oracle keeps the
    # delegates while a failure is in force, and they fail over to the host's other NIC (its
    # PP links and stage 4's DP ring alike). The detector-driven Adaptra is back on the direct
    # path by then (the last straggler ended at 960) and restarts as the baselines do.
    restarts = {s: (int(r["restarts"]), int(r["lost_iterations"])) for s, r in runs.items()}
    assert restarts == {
        "1f1b": (1, 30),
        "zb": (1, 30),
        "adaptra": (1, 30),
        "adaptra-oracle": (0, 0),
    }
    assert throughput["adaptra-oracle"] > throughput["adaptra"]
    iterations = read_csv_rows(run_dir / "iterations.csv", ITERATIONS_COLUMNS)
    adaptra = {int(r["iteration"]): r for r in iterations if r["system"] == "adaptra"}
    # Delegates only once the first straggler (iteration 15) is seen. A healthy step is ZB's
    # within 2 %: Adaptra's direct path is the runtime's (a send holds its sender while on
    # the wire), ZB's the paper's GPU path (nccl-sleep: NCCL sends beside the compute).
    assert adaptra[0]["comm"] == "direct" and adaptra[20]["comm"] == "delegated"
    # runs.csv says what each ran over, in the order first used.
    comms = {s: r["comm"] for s, r in runs.items()}
    assert comms == {
        "1f1b": "nccl-sleep",
        "zb": "nccl-sleep",
        "adaptra": "direct+delegated",
        "adaptra-oracle": "direct+delegated",
    }
    healthy_zb = next(r for r in iterations if r["system"] == "zb" and r["iteration"] == "5")
    zb_ms, adaptra_ms = (float(r["iteration_time_ms"]) for r in (healthy_zb, adaptra[5]))
    assert zb_ms <= adaptra_ms <= 1.02 * zb_ms
    png = run_dir / "throughput_over_time.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The plot draws iterations: the restarts, whose time is no iteration's, are named under it.
    model = runs["zb"]["model"]
    caption = (
        "throughput over the fault timeline; checkpoint restarts, not drawn (their time is in "
        f"the table's samples/s): {model} 1f1b: 1 restart, {model} zb: 1 restart, {model} "
        "adaptra: 1 restart"
    )  # shown under the image too: a Markdown viewer hides alt text (a user review)
    report = (run_dir / "report.md").read_text()
    assert f"![{caption}](throughput_over_time.png)\n\n*{caption}*\n" in report
