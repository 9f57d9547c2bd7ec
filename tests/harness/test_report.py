"""report.md says what a reader needs first: the headline, how each system ran, what the
columns mean, and which seed and revision made it; its Gantt charts share one time axis."""

import dataclasses
import json
import os
import shlex
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pytest

import harness.paper
import harness.plots
import harness.report
import pipeline.cost_model as cost_model
from baselines import one_f_one_b
from harness.cli import main
from harness.experiment import run_experiment
from harness.paper import PRESETS_DIR
from harness.results import RUNS_COLUMNS, read_csv_rows, run_dir_held
from harness.saved import read_ring_spans
from harness.spec import ExperimentSpec, default_experiment, load_spec, resume_command
from pipeline.errors import ConfigError
from pipeline.gantt import RingSpan, drawn_end_ms, plot_gantt, ring_spans
from pipeline.profile import Profile
from pipeline.simulator import simulate
from pipeline.timeline import Timeline
from tests.harness.specs import nic_down_spec


class GanttCall(NamedTuple):
    """A report's `plot_gantt` call."""

    timeline: Timeline
    path: Path
    title: str
    end_ms: float | None
    rings: Sequence[RingSpan] | None


def _charts(patch: pytest.MonkeyPatch, draw: bool = True) -> list[GanttCall]:
    """Every chart a report draws from now on, drawn too unless not `draw`."""
    calls: list[GanttCall] = []

    def drawing(
        timeline: Timeline,
        path: Path,
        title: str = "",
        end_ms: float | None = None,
        rings: Sequence[RingSpan] | None = None,
    ) -> None:
        calls.append(GanttCall(timeline, path, title, end_ms, rings))
        if draw:
            plot_gantt(timeline, path, title, end_ms, rings)

    patch.setattr(harness.report, "plot_gantt", drawing)
    return calls


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[GanttCall]]]:
    """The default experiment's run directory, and every chart its report drew: the patch is
    undone before the tests run (left in place while they ran, another test's report on the
    same worker, a zb-h1 one, drew into these calls too: a flaky "gantt_zb-h1.png")."""
    with pytest.MonkeyPatch.context() as patch:
        calls = _charts(patch)
        run_dir = run_experiment(default_experiment(), tmp_path_factory.mktemp("r") / "r")
    yield run_dir, calls


def test_the_default_experiment_s_report_leads_with_its_headline(
    default_run: tuple[Path, list[Any]],
) -> None:
    run_dir, _ = default_run
    report = (run_dir / "report.md").read_text()
    assert "seed 0; git revision `" in report
    assert "fig4-uniform-10ms zb 2.69x (0-1@40ms)" in report  # 1050 / 390 ms
    assert "fig4-uniform-10ms 0-1@40ms 2.30x over 1f1b" in report  # 990 / 430 ms
    assert "| fig4-uniform-10ms | adaptra | delegated | detector | 0-1@40ms | 430.0 |" in report
    assert "| fig4-uniform-10ms | 1f1b | direct | fixed | fault-free | 450.0 |" in report
    assert "Bubble ratio: 1 - (time the stages spent in ops)" in report
    assert "incomplete" not in report


def test_the_gantt_charts_of_the_worst_scenario_share_the_longest_one_s_time_axis(
    default_run: tuple[Path, list[GanttCall]],
) -> None:
    run_dir, calls = default_run
    drawn = {
        path.name: (drawn_end_ms(timeline), title, end_ms)
        for timeline, path, title, end_ms, _ in calls
    }
    systems = default_experiment().systems
    assert sorted(drawn) == sorted(f"gantt_{s}.png" for s in systems)
    assert all((run_dir / name).read_bytes()[:4] == b"\x89PNG" for name in drawn)
    # each iteration from its own start: ZB's 1050 ms the longest, Adaptra's 430 ms
    assert drawn["gantt_zb.png"][0] == 1050.0 and drawn["gantt_adaptra.png"][0] == 430.0
    assert {end_ms for _, _, end_ms in drawn.values()} == {1050.0}
    for system in systems:
        title = drawn[f"gantt_{system}.png"][1]
        assert title.startswith(f"fig4-uniform-10ms: {system} (") and ", 0-1@40ms," in title


def _row(system: str, scenario: str, ms: float, repeat: int, model: str = "m") -> dict[str, Any]:
    return {
        "model": model, "system": system, "scenario": scenario, "repeat": str(repeat),
        "median_wall_ms": str(ms), "throughput_samples_per_s": str(8000.0 / ms),
    }  # fmt: skip


def test_the_headline_takes_each_system_s_median_over_its_repeats() -> None:
    """Adaptra's repeats under the delay took 150, 150 and 400 ms, 1F1B's 300 each: the
    median says 2.00x over 1F1B and a worst slowdown of 1.50x (the last repeat alone said
    0.75x; the largest, 4.00x)."""
    runs = [_row(s, "fault-free", 100.0, k) for s in ("1f1b", "adaptra") for k in range(3)]
    runs += [_row("adaptra", "0-1@10ms", ms, k) for k, ms in enumerate((150.0, 150.0, 400.0))]
    runs += [_row("1f1b", "0-1@10ms", 300.0, k) for k in range(3)]
    lines = harness.report._headline(runs)
    assert lines[0] == (
        "Worst slowdown against the same system's fault-free step: "
        "m adaptra 1.50x (0-1@10ms); m 1f1b 3.00x (0-1@10ms)."
    )
    assert lines[1] == "Adaptra's speed-up over the best baseline: m 0-1@10ms 2.00x over 1f1b."


def test_over_a_fault_timeline_the_speed_up_is_in_samples_per_second() -> None:
    """The review's run: the same median step (a few slow iterations do not move it), but
    ZB slow in three iterations where Adaptra re-planned after one: samples/s say 1.31x, the
    median step said 1.00x."""
    runs = [
        {**_row("zb", "trace:f", 355.0, 0), "throughput_samples_per_s": "34.49"},
        {**_row("adaptra", "trace:f", 355.0, 0), "throughput_samples_per_s": "45.16"},
    ]
    assert harness.report._headline(runs) == [
        "Adaptra's speed-up over the best baseline: m trace:f 1.31x over zb (samples/s over "
        "the timeline).",
        "",
    ]


def test_a_fault_timeline_s_speed_up_says_what_the_best_baseline_s_restarts_cost() -> None:
    """In sim a restart costs the collective's modelled 10-min timeout: a 12-iteration run's
    108x was almost all of it, and the headline did not say so (the report review)."""
    runs = [
        {**_row("zb", "trace:f", 355.0, 0), "throughput_samples_per_s": "0.08",
         "restarts": "1", "lost_iterations": "3", "restart_model_ms": "600150.5"},
        {**_row("falcon", "trace:f", 355.0, 0), "throughput_samples_per_s": "0.07",
         "restarts": "2", "restart_model_ms": "1200301"},
        {**_row("adaptra", "trace:f", 355.0, 0), "throughput_samples_per_s": "8.0",
         "restarts": "0", "restart_model_ms": "0"},
    ]  # fmt: skip
    assert harness.report._headline(runs) == [
        "Adaptra's speed-up over the best baseline: m trace:f 100.00x over zb (samples/s over "
        "the timeline; zb restarted 1 time, ran 3 lost iterations again and lost 600 s more: "
        "restart_model_ms).",
        "",
    ]


def test_a_restarts_cost_of_a_thousand_seconds_or_more_has_no_exponent() -> None:
    """Two of sim's restarts (each the collective's 10-min timeout) cost 1,200 s: the headline
    said "1.2e+03 s"."""
    runs = [
        {**_row("zb", "trace:f", 355.0, 0), "throughput_samples_per_s": "0.08",
         "restarts": "2", "lost_iterations": "1", "restart_model_ms": "1200301"},
        {**_row("adaptra", "trace:f", 355.0, 0), "throughput_samples_per_s": "8.0",
         "restarts": "0", "restart_model_ms": "0"},
    ]  # fmt: skip
    assert harness.report._headline(runs)[0] == (
        "Adaptra's speed-up over the best baseline: m trace:f 100.00x over zb (samples/s over "
        "the timeline; zb restarted 2 times, ran 1 lost iteration again and lost 1,200 s more: "
        "restart_model_ms)."
    )
    runs[0]["restart_model_ms"] = "10.8"  # an emulated run's: the failed iteration's time
    assert "again and lost 0.0108 s more" in harness.report._headline(runs)[0]


def test_a_restart_in_a_minority_of_repeats_is_not_said_as_0_times() -> None:
    """The headline's restarts are the repeats' median, as its samples/s: one repeat of three
    restarting read "zb restarted 0 times"."""
    runs = [
        {**_row(system, "trace:f", 355.0, k), "throughput_samples_per_s": rate,
         "restarts": str(int(k == 2 and system == "zb")),
         "restart_model_ms": "600150" if k == 2 and system == "zb" else "0"}
        for k in range(3)
        for system, rate in (("zb", "0.08"), ("adaptra", "8.0"))
    ]  # fmt: skip
    assert harness.report._headline(runs)[0] == (
        "Adaptra's speed-up over the best baseline: m trace:f 100.00x over zb (samples/s over "
        "the timeline)."
    )
    runs[2]["restarts"], runs[2]["restart_model_ms"] = "1", "600150"  # 2 of 3: said
    assert (
        "zb restarted 1 time, ran 0 lost iterations again and lost 600 s more"
        in (harness.report._headline(runs)[0])
    )


def test_the_restarts_said_are_one_repeat_s_not_a_median_of_each_count() -> None:
    """Two repeats, one restarting once (3 lost iterations), one twice (4): the headline said
    "restarted 1.5 times, ran 3.5 lost iterations again", counts no repeat had. It says the
    median repeat's by samples/s, the slower of the middle two: the one restarting twice."""
    runs = [
        {**_row("zb", "trace:f", 355.0, 0), "throughput_samples_per_s": "0.08",
         "restarts": "1", "lost_iterations": "3", "restart_model_ms": "600000"},
        {**_row("zb", "trace:f", 355.0, 1), "throughput_samples_per_s": "0.04",
         "restarts": "2", "lost_iterations": "4", "restart_model_ms": "1200000"},
        {**_row("adaptra", "trace:f", 355.0, 0), "throughput_samples_per_s": "6.0"},
        {**_row("adaptra", "trace:f", 355.0, 1), "throughput_samples_per_s": "6.0"},
    ]  # fmt: skip
    assert (
        "zb restarted 2 times, ran 4 lost iterations again and lost 1,200 s more"
        in harness.report._headline(runs)[0]
    )


def test_throughput_over_time_counts_each_model_s_own_samples() -> None:
    rows = [
        {"model": model, "system": "1f1b", "iteration": "0", "iteration_time_ms": "900",
         "step_time_ms": "100", "repeat": "0"}
        for model in ("small", "large")
    ]  # fmt: skip
    samples = harness.plots.throughput_rows(rows, {"small": 12, "large": 24})
    assert [(r["line"], r["samples/s"]) for r in samples] == [
        ("small, 1f1b", 12.0),
        ("large, 1f1b", 24.0),
    ]


def test_throughput_over_time_draws_the_median_repeat_and_the_run_that_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line per system in the order they come, its points in iteration order; an iteration
    lost to a restart and run again is drawn as run again (1f1b's iteration 1: 500 ms, then
    250), and over repeats at the median (zb's iteration 0: 1000, 1000 and 250 ms; the mean
    would draw 20 samples/s)."""
    figures: list[Any] = []
    monkeypatch.setattr(harness.plots, "save_figure", lambda fig, *_, **__: figures.append(fig))
    rows = [
        {"model": "m", "system": system, "iteration": str(k), "iteration_time_ms": str(ms),
         "step_time_ms": "0", "repeat": str(repeat)}
        for system, repeat, k, ms in (("zb", 0, 0, 1000), ("zb", 0, 1, 1000),
                                      ("zb", 1, 0, 1000), ("zb", 1, 1, 1000),
                                      ("zb", 2, 0, 250), ("zb", 2, 1, 1000),
                                      ("1f1b", 0, 0, 1000), ("1f1b", 0, 1, 500),
                                      ("1f1b", 0, 1, 250))
    ]  # fmt: skip
    harness.plots.plot_throughput_over_time(rows, {"m": 10}, tmp_path / "t.png")
    (ax,) = figures[0].axes
    lines = [
        (line.get_label(), list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines
    ]
    assert lines == [("zb", [0, 1], [10.0, 10.0]), ("1f1b", [0, 1], [10.0, 40.0])]
    assert ax.get_legend().get_title().get_text() == "system"
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_ylim()[0]) == ("iteration", "samples/s", 0)


def test_throughput_over_time_leaves_room_above_its_highest_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A system at a steady 12 samples/s through a run that its fault timeline never slowed
    (Adaptra-CPU failing over a NIC) drew its line on the axes' top edge, hidden by it (the
    axis ended 1 % above it): the top is 8 % above the highest point, as the delay plot's."""
    figures: list[Any] = []
    monkeypatch.setattr(harness.plots, "save_figure", lambda fig, *_, **__: figures.append(fig))
    rows = [
        {"model": "m", "system": system, "iteration": str(k), "iteration_time_ms": str(ms),
         "step_time_ms": "0", "repeat": "0"}
        for system, ms in (("adaptra-cpu", 1000.0), ("1f1b", 1200.0))
        for k in range(4)
    ]  # fmt: skip
    harness.plots.plot_throughput_over_time(rows, {"m": 12}, tmp_path / "t.png")
    (ax,) = figures[0].axes
    assert ax.get_ylim() == pytest.approx((0.0, 12.0 * 1.08))


def test_throughput_over_time_draws_a_one_iteration_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault timeline run for one measured iteration drew an empty chart (a line of one
    point draws nothing), which report.md embedded as its throughput over the timeline: a
    line of one point gets a marker; longer lines none."""
    figures: list[Any] = []
    monkeypatch.setattr(harness.plots, "save_figure", lambda fig, *_, **__: figures.append(fig))
    rows = [
        {"model": "m", "system": system, "iteration": str(k), "iteration_time_ms": "1000",
         "step_time_ms": "0", "repeat": "0"}
        for system, iterations in (("1f1b", 1), ("zb", 2))
        for k in range(iterations)
    ]  # fmt: skip
    harness.plots.plot_throughput_over_time(rows, {"m": 12}, tmp_path / "t.png")
    (ax,) = figures[0].axes
    assert [(line.get_label(), line.get_marker()) for line in ax.lines] == [
        ("1f1b", "o"),
        ("zb", ""),
    ]


def test_throughput_over_time_marks_whole_iterations_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of 3 iterations had its axis marked 0.00, 0.25, ... 2.00: no iteration is 0.25."""
    figures: list[Any] = []
    monkeypatch.setattr(harness.plots, "save_figure", lambda fig, *_, **__: figures.append(fig))
    rows = [
        {"model": "m", "system": "1f1b", "iteration": str(k), "iteration_time_ms": "1000",
         "step_time_ms": "0", "repeat": "0"}
        for k in range(3)
    ]  # fmt: skip
    harness.plots.plot_throughput_over_time(rows, {"m": 12}, tmp_path / "t.png")
    (ax,) = figures[0].axes
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)


def test_the_slowdown_bars_are_the_median_repeat_with_no_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault-free 100 ms in each repeat, delayed 100, 100 and 400 ms: a bar of 1.0 (the
    median, as the headline says; the mean is 2.0) and no error bar (a bootstrap's would be
    drawn anew each time)."""
    grids: list[Any] = []
    monkeypatch.setattr(harness.plots, "save_figure", lambda grid, *_, **__: grids.append(grid))
    runs = [_row("zb", "fault-free", 100.0, k) for k in range(3)]
    runs += [_row("zb", "0-1@10ms", ms, k) for k, ms in enumerate((100.0, 100.0, 400.0))]
    assert harness.plots.plot_slowdown(runs, tmp_path / "s.png")
    ((ax,),) = [grid.axes.flat for grid in grids]
    assert [bar.get_height() for bar in ax.patches if bar.get_height()] == [1.0]
    ((y_start, y_end),) = [line.get_ydata() for line in ax.lines]  # the 1.0 line alone
    assert y_start == y_end == 1.0


def test_time_per_step_vs_delay_plots_the_median_over_the_repeats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its axis says "median step": repeats of 100, 100 and 400 ms draw 100 ms (their mean,
    200 ms, is what seaborn draws by default)."""
    grids: list[Any] = []
    monkeypatch.setattr(harness.plots, "save_figure", lambda grid, *_, **__: grids.append(grid))
    runs = [
        {**_row("1f1b", scenario, ms, k), "links": links, "delay_ms": str(delay_ms)}
        for scenario, links, delay_ms, times in (
            ("fault-free", "", 0.0, (50.0, 50.0, 80.0)),
            ("0-1@10ms", "0-1", 10.0, (100.0, 100.0, 400.0)),
        )
        for k, ms in enumerate(times)
    ]
    harness.plots.plot_iteration_time_vs_delay(runs, tmp_path / "t.png")
    ((ax,),) = [grid.axes.flat for grid in grids]  # one model: one panel
    points = [tuple(xy) for line in ax.lines for xy in line.get_xydata()]
    assert points == [(0.0, 50.0), (10.0, 100.0)]
    assert ax.get_ylabel() == "median step (ms)"
    assert ax.get_xlim()[0] == 0.0  # no negative delays on the axis
    assert ax.get_ylim() == pytest.approx((0.0, 108.0))  # the top point's marker inside


def test_a_line_drawn_over_another_s_says_so_in_the_legend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Falcon's line under a delay it cannot see is ZB's, point for point: drawn over it, ZB's
    could not be seen, though the legend listed it (a user review)."""
    grids: list[Any] = []
    monkeypatch.setattr(harness.plots, "save_figure", lambda grid, *_, **__: grids.append(grid))
    steps = {"zb": (50.0, 90.0), "falcon": (50.0, 90.0), "adaptra": (50.0, 60.0)}
    runs = [
        {**_row(system, scenario, ms[i], 0), "links": links, "delay_ms": delay_ms}
        for system, ms in steps.items()
        for i, (scenario, links, delay_ms) in enumerate(
            (("fault-free", "", "0.0"), ("0-1@10ms", "0-1", "10.0"))
        )
    ]
    assert harness.plots.plot_iteration_time_vs_delay(runs, tmp_path / "t.png")
    labels = [text.get_text() for text in grids[-1].legend.get_texts()]
    assert [label for label in labels if label.split()[0] in steps] == [
        "zb (= falcon)",
        "falcon (= zb)",
        "adaptra",
    ]
    # Over one link set of two: said where (a line hidden on one link set was not named)
    runs += [
        {**_row(system, "1-2@10ms", ms, 0), "links": "1-2", "delay_ms": "10.0"}
        for system, ms in (("zb", 95.0), ("falcon", 99.0), ("adaptra", 60.0))
    ]
    assert harness.plots.plot_iteration_time_vs_delay(runs, tmp_path / "t.png")
    labels = [text.get_text() for text in grids[-1].legend.get_texts()]
    assert [label for label in labels if label.split()[0] in steps] == [
        "zb (= falcon on 0-1)",
        "falcon (= zb on 0-1)",
        "adaptra",
    ]


def test_a_line_equal_to_another_but_for_float_rounding_says_so_in_the_legend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adaptra's step under a DP ring delay it cannot move (a profile's own) was ZB's but for
    the last bits (290.8000000000002 against 290.79999999999995 ms, another sum's order):
    drawn over ZB's line, which the legend did not say."""
    grids: list[Any] = []
    monkeypatch.setattr(harness.plots, "save_figure", lambda grid, *_, **__: grids.append(grid))
    steps = {"zb": (270.79999999999995, 290.79999999999995), "adaptra": (270.8, 290.8000000000002)}
    runs = [
        {**_row(system, scenario, ms[i], 0), "links": links, "delay_ms": delay_ms}
        for system, ms in steps.items()
        for i, (scenario, links, delay_ms) in enumerate(
            (("fault-free", "", "0.0"), ("dp1:0-1@20ms", "dp1:0-1", "20.0"))
        )
    ]
    assert harness.plots.plot_iteration_time_vs_delay(runs, tmp_path / "t.png")
    labels = [text.get_text() for text in grids[-1].legend.get_texts()]
    assert [label for label in labels if label.split()[0] in steps] == [
        "zb (= adaptra)",
        "adaptra (= zb)",
    ]


def test_time_per_step_vs_delay_joins_a_model_s_fault_free_point_to_its_own_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`last` is link 2-3 of a 4-stage model and 6-7 of an 8-stage one: each panel drew a
    stray one-point line of the other model's link set at its fault-free step."""
    grids: list[Any] = []
    monkeypatch.setattr(harness.plots, "save_figure", lambda grid, *_, **__: grids.append(grid))
    runs = [
        {**_row("1f1b", scenario, ms, 0), "model": model, "links": links, "delay_ms": delay}
        for model, last, free_ms in (("a", "2-3", 50.0), ("b", "6-7", 70.0))
        for scenario, links, delay, ms in (
            ("fault-free", "", "0", free_ms),
            (f"{last}@10ms", last, "10", 2 * free_ms),
        )
    ]
    harness.plots.plot_iteration_time_vs_delay(runs, tmp_path / "t.png")
    (grid,) = grids
    panels = {
        ax.get_title(): [[tuple(xy) for xy in line.get_xydata()] for line in ax.lines]
        for ax in grid.axes.flat
    }
    drawn = {title: [points for points in lines if points] for title, lines in panels.items()}
    assert drawn == {
        "model = a": [[(0.0, 50.0), (10.0, 100.0)]],
        "model = b": [[(0.0, 70.0), (10.0, 140.0)]],
    }


@pytest.mark.parametrize(
    ("delays_ms", "delay"), [((0.0,), "0"), ((20.0,), "20")], ids=["fault-free", "one-delay"]
)
def test_a_report_with_one_delay_draws_no_time_per_step_vs_delay_plot_and_says_why(
    tmp_path: Path, delays_ms: tuple[float, ...], delay: str
) -> None:
    """One delay drew single dots with no line, on an axis from -0.04 to 0.04 ms when it
    was 0; an earlier report's plot in the directory goes too."""
    spec = dataclasses.replace(default_experiment(), systems=("1f1b", "zb"), delays_ms=delays_ms)
    run_dir = run_experiment(spec, tmp_path / "r")
    report = (run_dir / "report.md").read_text()
    assert "iteration_time_vs_delay.png" not in report
    assert not (run_dir / "iteration_time_vs_delay.png").exists()
    assert (
        "No plot of time per step vs delay: it needs two delays, and every configuration "
        f"without a fault timeline ran at {delay} ms."
    ) in report
    assert "](slowdown.png)" not in report  # no fault-free baseline, or no fault
    assert "](gantt_1f1b.png)" in report and "](gantt_zb.png)" in report
    (run_dir / "iteration_time_vs_delay.png").write_bytes(b"an earlier report's")
    main(["report", str(run_dir)])
    assert not (run_dir / "iteration_time_vs_delay.png").exists()
    assert not harness.plots.plot_iteration_time_vs_delay(
        [{"delay_ms": "20.0"}, {"delay_ms": "20"}], tmp_path / "t.png"
    )
    assert not (tmp_path / "t.png").exists()


def test_a_repeated_experiment_s_table_has_a_row_per_repeat_told_apart(tmp_path: Path) -> None:
    spec = dataclasses.replace(
        default_experiment(), systems=("1f1b",), delays_ms=(0.0,), num_repeats=2
    )
    report = (run_experiment(spec, tmp_path / "r") / "report.md").read_text()
    assert "| model | system | comm | controller | scenario | repeat | median step (ms) |" in report
    for repeat in (0, 1):
        assert f"| fig4-uniform-10ms | 1f1b | direct | fixed | fault-free | {repeat} | 450.0 |" in (
            report
        )
    assert report.count(" | none |") == 2  # no fault: no action
    once = dataclasses.replace(spec, num_repeats=1)
    assert "| repeat |" not in (run_experiment(once, tmp_path / "o") / "report.md").read_text()


def test_a_label_with_dollar_signs_is_drawn_as_written_not_as_a_formula(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """matplotlib read '$x^$' as mathtext and refused it: the run ended in an internal error
    and every report of it did too."""
    charts = _charts(monkeypatch)
    spec = dataclasses.replace(
        default_experiment(), models=("a$x^$b",), systems=("1f1b",), delays_ms=(0.0, 10.0)
    )
    run_dir = run_experiment(spec, tmp_path / "r")
    assert [c.title for c in charts] == ["a$x^$b: 1f1b (direct), 0-1@10ms, iteration 4, sim"]
    report = (run_dir / "report.md").read_text()
    assert report.count("| a$x^$b | 1f1b | direct | fixed |") == 2
    for figure in ("iteration_time_vs_delay.png", "slowdown.png", "gantt_1f1b.png"):
        assert f"]({figure})" in report
        assert (run_dir / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_label_with_a_pipe_stays_in_its_table_cell(tmp_path: Path) -> None:
    """A '|' ended the model's cell: every value of its rows sat a column to the right of its
    header, and the actions under no header at all."""
    spec = dataclasses.replace(
        default_experiment(), models=("a|b",), systems=("1f1b",), delays_ms=(0.0,)
    )
    report = (run_experiment(spec, tmp_path / "r") / "report.md").read_text()
    assert "| a\\|b | 1f1b | direct | fixed | fault-free | 450.0 |" in report


def _interrupted(default_run: tuple[Path, list[Any]], tmp_path: Path) -> Path:
    """A copy of the default run cut off after its first 12 of 16 configurations, as an
    interrupted run leaves it (runs.csv is written last)."""
    run_dir = tmp_path / "out" / "cut"
    shutil.copytree(default_run[0], run_dir)
    runs = run_dir / "runs.csv"
    runs.write_text("".join(runs.read_text().splitlines(keepends=True)[:13]))  # header + 12
    return run_dir


def test_an_interrupted_run_s_report_says_it_is_incomplete_and_how_to_finish_it(
    default_run: tuple[Path, list[Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _interrupted(default_run, tmp_path)
    main(["report", str(run_dir)])  # an error would exit (SystemExit)
    assert capsys.readouterr().out == (
        f"report written to {run_dir / 'report.md'} (12 of 16 configurations: incomplete)\n"
    )
    command = f"adaptra-bench run --out {run_dir.parent} --run-id cut"
    title, blank, first, *_ = (run_dir / "report.md").read_text().splitlines()
    assert (title, blank) == ("# default", "")
    assert first == (
        f"**12 of 16 configurations (incomplete: resume with `{command}` to finish).** The "
        "headline, the tables and the figures below cover these only."
    )
    main(shlex.split(command)[1:])  # the command it names finishes the run
    report = (run_dir / "report.md").read_text()
    assert "incomplete" not in report and report.count("| fig4-uniform-10ms |") == 16


def test_a_run_stopped_before_its_first_result_is_reported_as_unfinished(
    default_run: tuple[Path, list[Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """spec.json and no runs.csv: one line with how to finish it, exit 1 (it said "has no
    results in runs.csv", a file it lacks, and not how to resume)."""
    run_dir = tmp_path / "out" / "unstarted"
    run_dir.mkdir(parents=True)
    shutil.copy(default_run[0] / "spec.json", run_dir)
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(run_dir)])
    assert exit_.value.code == 1
    assert capsys.readouterr().err == (
        f"error: {run_dir} is an unfinished run (0 of 16 configurations): resume it with "
        f"`adaptra-bench run --out {run_dir.parent} --run-id unstarted`\n"
    )
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock", "spec.json"]


def test_the_resume_command_of_a_spec_file_s_run_names_the_spec_option(tmp_path: Path) -> None:
    spec = dataclasses.replace(default_experiment(), name="sweep")
    run_dir = tmp_path / "my out" / "r1"
    assert resume_command(spec, run_dir) == (
        f"adaptra-bench run --spec SPEC --out '{tmp_path}/my out' --run-id r1"
    )


def test_the_resume_command_of_a_run_reported_as_dot_names_its_folder(
    default_run: tuple[Path, list[Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cd OUT/cut && adaptra-bench report .` said `--out . --run-id ''`, which run refuses."""
    run_dir = _interrupted(default_run, tmp_path)
    monkeypatch.chdir(run_dir)
    main(["report", "."])
    command = f"adaptra-bench run --out {run_dir.parent} --run-id cut"
    assert f"resume with `{command}` to finish" in (run_dir / "report.md").read_text()
    assert resume_command(default_experiment(), Path("..") / "cut") == command


def test_report_refuses_a_run_directory_a_run_still_writes(
    default_run: tuple[Path, list[Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _interrupted(default_run, tmp_path)
    before = (run_dir / "report.md").read_bytes()
    with run_dir_held(run_dir), pytest.raises(SystemExit) as exit_:
        main(["report", str(run_dir)])
    assert exit_.value.code == 1
    assert capsys.readouterr().err == (
        f"error: {run_dir} is in use by another run or report (pid {os.getpid()}); report it "
        "once that run has ended\n"
    )
    assert (run_dir / "report.md").read_bytes() == before
    main(["report", str(run_dir)])  # once the run has ended
    assert "12 of 16 configurations" in (run_dir / "report.md").read_text()


def test_a_refused_report_draws_nothing(
    default_run: tuple[Path, list[Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model cell of runs.csv edited: the report drew the delay and slowdown plots from it
    before iterations.csv refused it, so the figures no longer matched report.md. Every
    file is read before anything is drawn."""
    run_dir = tmp_path / "out" / "r"
    shutil.copytree(default_run[0], run_dir)
    runs = run_dir / "runs.csv"
    header, first, *rest = runs.read_text().splitlines()
    fields = first.split(",")
    fields[RUNS_COLUMNS.index("model")] = "renamed"
    runs.write_text("\n".join([header, ",".join(fields), *rest]) + "\n")
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    assert {"iteration_time_vs_delay.png", "slowdown.png"} <= before.keys()
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(run_dir)])
    assert exit_.value.code == 1
    assert "iterations.csv has 0 rows of renamed 1f1b fault-free" in capsys.readouterr().err
    after = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name != ".lock"}
    assert after == {name: data for name, data in before.items() if name != ".lock"}


def test_a_report_removes_the_gantt_charts_it_no_longer_draws(
    default_run: tuple[Path, list[Any]], tmp_path: Path
) -> None:
    """A chart the new report does not draw (its timeline gone) would sit beside a report
    that does not mention it: it goes; files not named gantt_*.png stay."""
    run_dir = tmp_path / "out" / "r"
    shutil.copytree(default_run[0], run_dir)
    systems = default_experiment().systems
    assert sorted(p.name for p in run_dir.glob("gantt_*.png")) == sorted(
        f"gantt_{s}.png" for s in systems
    )
    (run_dir / "timelines" / "fig4-uniform-10ms_zb_0-1-40ms_r0.json").unlink()
    (run_dir / "gantt_falcon.png").write_bytes(b"an older run's")  # a system no longer in it
    kept = ["slowdown.png", "gantt_notes.txt", "my_gantt_zb.png"]
    (run_dir / "my_gantt_zb.png").write_bytes(b"not the report's")
    (run_dir / "gantt_notes.txt").write_text("not a chart")
    (run_dir / "gantt_dir.png").mkdir()  # not a file: left alone
    main(["report", str(run_dir)])
    left = sorted(p.name for p in run_dir.glob("gantt_*.png"))
    assert left == sorted(["gantt_dir.png", *(f"gantt_{s}.png" for s in systems if s != "zb")])
    assert all((run_dir / name).exists() for name in kept)
    report = (run_dir / "report.md").read_text()
    assert "gantt_zb.png" not in report and "gantt_falcon.png" not in report
    assert "![Gantt chart, 1f1b](gantt_1f1b.png)" in report
    assert "- zb: no chart, the run directory has no saved timeline" in report
    for timeline in (run_dir / "timelines").glob("*_0-1-40ms_r0.json"):
        timeline.unlink()
    main(["report", str(run_dir)])
    assert sorted(p.name for p in run_dir.glob("gantt_*.png")) == ["gantt_dir.png"]
    report = (run_dir / "report.md").read_text()
    assert "](gantt_" not in report and "](slowdown.png)" in report


def test_fig3_is_compared_with_each_candidate_link_of_its_kind() -> None:
    """The paper names no slow link: every DP ring link the preset slows is compared with the
    DP value, every PP link with the PP value (22 values: fault-free, 4 x 3 and 3 x 3)."""
    assert len(harness.paper.PAPER["fig3"]) == 22
    rows = [
        {**_row("zb", scenario, ms, 0, model="gpt2-7b-dp2")}
        for scenario, ms in (("fault-free", 490.0), ("dp2:0-1@20ms", 2410.0), ("1-2@30ms", 1110.0))
    ]
    compared = harness.report.paper_comparison("fig3", rows)
    assert [(r["scenario"], paper.value, ours) for r, paper, ours in compared] == [
        ("fault-free", 0.49, 0.49),
        ("dp2:0-1@20ms", 2.79, 2.41),
        ("1-2@30ms", 1.10, 1.11),
    ]


def test_each_paper_experiment_has_its_preset() -> None:
    presets = harness.paper.PAPER_PRESETS
    assert sorted(presets) == sorted(harness.paper.PAPER)
    for name, file in presets.items():
        assert load_spec(harness.paper.PRESETS_DIR / file).name == name


def test_only_a_run_of_the_paper_s_preset_is_compared_with_the_paper(tmp_path: Path) -> None:
    """A spec named fig16 of a 14B labelled gpt2-7b on a 25 Gbit/s network was compared with
    the paper's 7B (median error 127.3 %): its name and labels were all that was checked. The
    preset's setting is, now; a run of some of its configurations is still compared."""
    fig16 = load_spec(harness.paper.PRESETS_DIR / "fig16_models.yaml")
    assert harness.report.paper_experiment(fig16) == ("fig16", None)
    some = dataclasses.replace(
        fig16, models=("gpt2-7b",), systems=("1f1b",), delays_ms=(0.0, 30.0), num_repeats=2
    )
    assert harness.report.paper_experiment(some) == ("fig16", None)
    (tmp_path / "s.yaml").write_text(
        "name: fig16\nmodels: [{base: gpt2-14b, name: gpt2-7b}]\n"
        "hardware: {base: h800-ib400, network_gbps: 25}\nsystems: [1f1b, zb]\n"
        "link_sets: [[first]]\ndelays_ms: [0, 30, 60]\nnum_iterations: 3\n"
    )
    assert harness.report.paper_experiment(load_spec(tmp_path / "s.yaml")) == (
        None,
        "Not compared with the paper: this spec is named fig16, as the preset "
        "`harness/presets/fig16_models.yaml` is, but differs from it in models, hardware.",
    )
    longer = dataclasses.replace(fig16, num_iterations=4)
    assert harness.report.paper_experiment(longer)[1] == (
        "Not compared with the paper: this spec is named fig16, as the preset "
        "`harness/presets/fig16_models.yaml` is, but differs from it in num_iterations."
    )
    # The preset's hardware spelled out (a mapping changing no field): the same setting.
    spelled_out = dataclasses.replace(some, hardware={"base": "h800-ib400"})
    assert harness.report.paper_experiment(spelled_out) == ("fig16", None)
    assert harness.report.paper_experiment(dataclasses.replace(fig16, name="f")) == (None, None)
    # The Table 3 preset and its trace copied elsewhere: the same experiment (its files'
    # folders are not compared, what they hold is).
    for file in ("table3_trace.yaml", "table3_trace.txt"):
        shutil.copy(harness.paper.PRESETS_DIR / file, tmp_path / file)
    table3 = load_spec(tmp_path / "table3_trace.yaml")
    assert harness.report.paper_experiment(table3) == ("table3-trace", None)
    (tmp_path / "table3_trace.txt").write_text("15;2_3;0.03\n85;2_3;0\n")
    assert "differs from it in faults_text" in str(
        harness.report.paper_experiment(load_spec(tmp_path / "table3_trace.yaml"))[1]
    )


def test_a_preset_s_subset_is_compared_once_per_configuration_or_says_why_not() -> None:
    """A fig16 at a delay the preset lacks (45 ms) was taken for the preset, and then
    compared nothing, saying nothing; each repeat made a row of the paper table (and a
    value of its median); Fig. 15 run at 60 ms alone, its values slowdowns with no
    fault-free run to divide by, compared nothing, saying nothing."""
    fig16 = load_spec(harness.paper.PRESETS_DIR / "fig16_models.yaml")
    other_delay = dataclasses.replace(fig16, delays_ms=(45.0,))
    assert harness.report.paper_experiment(other_delay)[1] == (
        "Not compared with the paper: this spec is named fig16, as the preset "
        "`harness/presets/fig16_models.yaml` is, but differs from it in scenarios."
    )
    # the preset's scenarios named another way are the preset's: `last` is 6-7 at 14B
    one_model = dataclasses.replace(fig16, models=("gpt2-14b",), link_sets=(("6-7",),))
    assert harness.report.paper_experiment(one_model) == ("fig16", None)
    fig15 = load_spec(harness.paper.PRESETS_DIR / "fig15_slowdown.yaml")
    assert harness.report.paper_experiment(dataclasses.replace(fig15, link_sets=(("last",),)))[0]
    repeats = [
        _row("1f1b", "0-1@30ms", ms, repeat, model="gpt2-7b")
        for repeat, ms in enumerate((1000.0, 1200.0, 1100.0))
    ]
    ((row, _, ours),) = harness.report.paper_comparison("fig16", repeats)
    assert (row["repeat"], ours) == ("0", 1.1)  # the median of 1.0, 1.2 and 1.1 s
    slowed = [_row("adaptra", "6-7@60ms", 900.0, 0, model="gpt2-14b")]
    assert harness.report.paper_comparison("fig15", slowed) == []
    assert harness.report.uncompared_slowdowns("fig15", slowed) == (
        "Not compared with the paper: gpt2-14b adaptra 6-7@60ms: the paper's values there "
        "are slowdowns against the fault-free run, which this run did not make (add delay 0)."
    )
    with_base = [*slowed, _row("adaptra", "fault-free", 800.0, 0, model="gpt2-14b")]
    assert harness.report.uncompared_slowdowns("fig15", with_base) is None


def test_many_scenarios_get_upright_labels_and_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Fig. 3 preset's 21 scenarios: labels turned upright and a panel wide enough that
    they do not overlap (30 degrees in a 1.0 aspect overlapped)."""
    grids: list[Any] = []
    monkeypatch.setattr(harness.plots, "save_figure", lambda grid, *_, **__: grids.append(grid))
    runs = [_row("zb", "fault-free", 100.0, 0)]
    runs += [_row("zb", f"{link}@{ms}ms", 100.0 + ms, 0) for link in "abcdefg" for ms in (1, 2, 3)]
    assert harness.plots.plot_slowdown(runs, tmp_path / "s.png")
    ((ax,),) = [grid.axes.flat for grid in grids]
    assert {label.get_rotation() for label in ax.get_xticklabels()} == {90.0}
    width, height = grids[0].figure.get_size_inches()
    assert width >= 4.2 * 3.6 > height


def test_a_slowdown_chart_of_very_many_scenarios_labels_some_and_keeps_its_width(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each scenario widened the panel by a label's room: 1,000 scenarios drew a chart
    79,208 px wide in a minute. Past `_MAX_SCENARIO_LABELS` (here 5) the panel is as wide
    as for that many, and every k-th scenario is labelled."""
    grids: list[Any] = []
    monkeypatch.setattr(harness.plots, "save_figure", lambda grid, *_, **__: grids.append(grid))
    monkeypatch.setattr(harness.plots, "_MAX_SCENARIO_LABELS", 5)
    runs = [_row("zb", "fault-free", 100.0, 0)]
    runs += [_row("zb", f"0-1@{ms}ms", 100.0 + ms, 0) for ms in range(1, 21)]
    assert harness.plots.plot_slowdown(runs, tmp_path / "s.png")
    ((ax,),) = [grid.axes.flat for grid in grids]
    shown = [label.get_text() for label in ax.get_xticklabels() if label.get_visible()]
    assert shown == ["0-1@1ms", "0-1@5ms", "0-1@9ms", "0-1@13ms", "0-1@17ms"]
    assert sum(bar.get_height() > 1 for bar in ax.patches) == 20  # every scenario's bar
    width, _ = grids[0].figure.get_size_inches()
    assert width < 2 * 3.6  # it was 4 x 3.6 (aspect 0.2 x 20)


def test_an_interrupted_run_s_report_draws_only_the_configurations_in_runs_csv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run cut off after zb-h1 wrote its timeline and iterations.csv rows but before
    runs.csv (written last): its throughput line and Gantt chart were drawn from data a resume
    deletes as stale; now it is listed as unfinished and drawn nowhere."""
    (tmp_path / "f.yaml").write_text("- {start_iteration: 1, links: ['0-1'], delay_ms: 5}\n")
    (tmp_path / "s.yaml").write_text(
        "name: t\nmodel: m\nprofile: {stages: 2, microbatches: 4, t_f: 1, t_b: 1, t_w: 1}\n"
        "systems: [1f1b, zb-h1]\nfaults: f.yaml\nnum_iterations: 3\n"
    )
    run_dir = run_experiment(load_spec(tmp_path / "s.yaml"), tmp_path / "out" / "r")
    assert (run_dir / "gantt_zb-h1.png").exists()
    runs = run_dir / "runs.csv"
    runs.write_text("".join(runs.read_text().splitlines(keepends=True)[:2]))  # 1f1b's only
    plotted: list[set[str]] = []

    def spy(rows: list[dict[str, str]], samples: dict[str, int], path: Path) -> None:
        plotted.append({r["system"] for r in rows})

    monkeypatch.setattr(harness.report, "plot_throughput_over_time", spy)
    main(["report", str(run_dir)])
    assert plotted == [{"1f1b"}]
    report = (run_dir / "report.md").read_text().splitlines()
    assert report[4] == (
        "Unfinished, not in runs.csv (nothing of them is drawn): `m zb-h1 trace:f`."
    )
    assert "- zb-h1: no chart, unfinished (not in runs.csv)" in report
    assert sorted(p.name for p in run_dir.glob("gantt_*.png")) == ["gantt_1f1b.png"]


def test_a_report_counts_the_samples_its_run_resolved_not_today_s_preset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """spec.json keeps what the run's models resolved to (`resolved`): a later version whose
    preset has another batch, or another name, reports the run as it ran (12 samples per
    iteration); a spec.json of an older version, without it, is resolved with the cost model
    of the version reading it, and says so where that fails."""
    (tmp_path / "f.yaml").write_text("- {start_iteration: 1, links: ['0-1'], delay_ms: 5}\n")
    (tmp_path / "s.yaml").write_text(
        "name: t\nmodels: [gpt2-7b]\nsystems: [1f1b]\nfaults: f.yaml\nnum_iterations: 3\n"
    )
    run_dir = run_experiment(load_spec(tmp_path / "s.yaml"), tmp_path / "out" / "r")
    samples: list[dict[str, int]] = []

    def spy(rows: list[dict[str, str]], samples_of: dict[str, int], path: Path) -> None:
        samples.append(dict(samples_of))

    monkeypatch.setattr(harness.report, "plot_throughput_over_time", spy)
    model = cost_model.MODELS["gpt2-7b"]
    doubled = dataclasses.replace(model, microbatch_size=2 * model.microbatch_size)
    # Copies: the presets' own dict keeps its order (monkeypatch's undo of a delitem put
    # gpt2-7b back last, and an error listing the models read that order in another test).
    monkeypatch.setattr(cost_model, "MODELS", {**cost_model.MODELS, "gpt2-7b": doubled})
    main(["report", str(run_dir)])
    renamed = {("gpt2-7b-v2" if k == "gpt2-7b" else k): v for k, v in cost_model.MODELS.items()}
    monkeypatch.setattr(cost_model, "MODELS", renamed | {"gpt2-7b-v2": model})
    main(["report", str(run_dir)])
    assert samples == [{"gpt2-7b": 12}, {"gpt2-7b": 12}]
    gantt = "- 1f1b: `timelines/gpt2-7b_1f1b_trace-f_r0.json`, iteration 1, recorded by"
    assert gantt in (run_dir / "report.md").read_text()  # the model's recorded label

    record = json.loads((run_dir / "spec.json").read_text())
    del record["resolved"]  # as an older version wrote it
    (run_dir / "spec.json").write_text(json.dumps(record))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(run_dir)])
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: {run_dir / 'spec.json'}, of an older version, keeps no resolved models; "
        "resolving them with this version failed: unknown model 'gpt2-7b'; valid: "
    )
    assert len(err.splitlines()) == 1
    monkeypatch.setitem(cost_model.MODELS, "gpt2-7b", doubled)
    main(["report", str(run_dir)])
    assert samples[-1] == {"gpt2-7b": 24}


@pytest.mark.parametrize("checkpoint_every", [2, 1])
def test_a_gantt_chart_of_an_iteration_run_again_after_a_failure_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checkpoint_every: int
) -> None:
    """Link 0-1 down from measured iteration 3, the iteration the chart draws: its run with
    the failure ended in a restart and is not saved; the chart is of its run after the
    restart, and its title and report.md say so (iterations.csv shows a repeat only where
    the restart lost iterations: with a checkpoint every iteration, none)."""
    charts = _charts(monkeypatch, draw=False)
    (tmp_path / "f.yaml").write_text("- {start_iteration: 3, links: ['0-1'], down: true}\n")
    (tmp_path / "s.yaml").write_text(
        "name: t\nmodel: m\nprofile: {stages: 2, microbatches: 4, t_f: 1, t_b: 1, t_w: 1}\n"
        "systems: [1f1b]\nfaults: f.yaml\nnum_iterations: 6\n"
        f"checkpoint_every: {checkpoint_every}\n"
    )
    run_dir = run_experiment(load_spec(tmp_path / "s.yaml"), tmp_path / "out" / "r")
    assert [c.title for c in charts] == [
        "m: 1f1b (direct), trace:f, iteration 3, run again after a restart, sim"
    ]
    assert (
        "- 1f1b: `timelines/m_1f1b_trace-f_r0.json`, iteration 3, recorded by the sim backend; "
        "its run after a checkpoint restart (the run before it, which failed or was lost, is "
        "not saved)"
    ) in (run_dir / "report.md").read_text().splitlines()


def test_the_gantt_charts_show_the_slowest_of_the_scenarios_with_the_highest_delay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Fig. 3 preset's 30 ms on each of stage 0's and stage 2's ring links: the charts
    are of stage 2's (the slower: its all-reduce runs after the pipeline's last op), not of
    the first link set of that delay, whose chart looked like a healthy run."""
    charts = _charts(monkeypatch, draw=False)
    spec = dataclasses.replace(
        load_spec(PRESETS_DIR / "fig3_dp_link.yaml"),
        link_sets=(("dp0:0-1",), ("dp2:0-1",)),
        delays_ms=(30.0,),
    )
    run_dir = run_experiment(spec, tmp_path / "r")
    rows = read_csv_rows(run_dir / "runs.csv", RUNS_COLUMNS)
    runs = {r["scenario"]: float(r["median_wall_ms"]) for r in rows}
    assert runs["dp2:0-1@30ms"] > runs["dp0:0-1@30ms"]
    assert [c.title for c in charts] == [
        "gpt2-7b-dp2: zb (nccl-sleep), dp2:0-1@30ms, iteration 2, sim"
    ]


def test_a_report_s_gantt_chart_draws_each_stage_s_ring_from_messages_csv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1F1B at 2 stages x 2 replicas with 1 MB gradients, 30 ms on stage 1's ring link: the
    chart gets stage 0's short ring and stage 1's delayed one, as the simulator ran them
    (saved timelines keep no ring messages: the chart drew every stage's step alike)."""
    charts = _charts(monkeypatch, draw=False)
    fields = {
        "stages": 2, "microbatches": 4, "t_f": 10, "t_b": 10, "t_w": 5, "dp": 2,
        "allreduce_bytes": 1_000_000, "link_bandwidth_gbps": 10,
    }  # fmt: skip
    spec = dataclasses.replace(
        default_experiment(),
        name="ring",
        models=("m",),
        systems=("1f1b",),
        profile=Profile.from_dict(fields),
        link_sets=(("dp1:0-1",),),
        delays_ms=(30.0,),
        num_iterations=2,
    )
    run_dir = run_experiment(spec, tmp_path / "r")
    slow = Profile.from_dict({**fields, "dp_delay_ms": {"dp1:0-1": 30}})
    timeline = simulate(one_f_one_b(slow), slow)
    simulated = [*ring_spans(timeline), *ring_spans(timeline, replica=1)]
    assert simulated[1].fault_ms == 30.0 and simulated[0].fault_ms == 0.0
    (rings,) = [c.rings for c in charts]
    assert rings is not None  # each replica's
    assert [(r.replica, r.stage, r.fault_ms) for r in rings] == [
        (0, 0, 0.0), (0, 1, 30.0), (1, 0, 0.0), (1, 1, 30.0)
    ]  # fmt: skip
    for got, want in zip(rings, simulated, strict=True):  # messages.csv keeps 1 us
        assert got.start_ms == pytest.approx(want.start_ms, abs=1e-3)
        assert got.end_ms == pytest.approx(want.end_ms, abs=1e-3)
        assert got.fault_ms == pytest.approx(want.fault_ms, abs=1e-3)
    (run_dir / "messages.csv").write_text(  # a DP row cut short
        "".join((run_dir / "messages.csv").read_text().splitlines(keepends=True)[:-1])
        + "m,1f1b,dp1:0-1@30ms,0,1,dp1:0-1,forward\n"
    )
    with pytest.raises(ConfigError, match=r"messages.csv: a row has 7 fields, not 16"):
        read_ring_spans(run_dir, {("m", "1f1b", "dp1:0-1@30ms", "0"): 1})


def test_the_table_names_what_each_system_did_about_its_faults(tmp_path: Path) -> None:
    """A NIC down from iteration 1: 1F1B restarts from its checkpoint, Adaptra-CPU's delegates
    fail over. report.md's table gave their times alone; runs.csv counted the actions."""
    spec = nic_down_spec(tmp_path, ("1f1b", "adaptra-cpu"))
    rows = [
        line.split(" | ")[1::8]  # the system and its actions
        for line in (run_experiment(spec, tmp_path / "r") / "report.md").read_text().splitlines()
        if line.startswith("| m |")
    ]
    assert rows == [["1f1b", "1 restart |"], ["adaptra-cpu", "2 failovers |"]]


def test_the_table_tells_a_restarting_system_s_samples_per_second_from_0(tmp_path: Path) -> None:
    """Link 0-1 down in the one measured iteration: 1F1B and Adaptra restart, their 2
    samples over sim's 10-min restart mostly, 0.00333 samples/s (runs.csv's). The table read
    0.00 for both: no samples at all."""
    faults = tmp_path / "f.yaml"
    faults.write_text('- {start_iteration: 0, links: ["0-1"], down: true}\n')
    spec = ExperimentSpec(
        name="a", models=("m",), profile=Profile.uniform(2, 2, 10, 10, 10),
        systems=("1f1b", "adaptra"), num_iterations=1, num_warmup_iterations=0,
        faults=str(faults),
    )  # fmt: skip
    run_dir = run_experiment(spec, tmp_path / "r")
    rates = {
        r["system"]: float(r["throughput_samples_per_s"])
        for r in read_csv_rows(run_dir / "runs.csv", RUNS_COLUMNS)
    }
    assert all(0.003 < rate < 0.004 for rate in rates.values())
    cells = {
        line.split(" | ")[1]: line.split(" | ")[7]  # the system and its samples/s
        for line in (run_dir / "report.md").read_text().splitlines()
        if line.startswith("| m |")
    }
    assert cells == {system: f"{rate:.3g}" for system, rate in rates.items()}
    assert cells["1f1b"] == "0.00333"


def test_the_table_names_falcon_s_rebalance(tmp_path: Path) -> None:
    """20 ms on replica 1's PP link 1-2 in iterations 3-13: Falcon rebalances the global
    batch away from that replica (iterations.csv's `microbatches`): the table said "none"
    for it. A link down in iteration 9 restarts the run from its start: Falcon keeps its
    split, and iterations 0 and 6-8 run rebalanced twice, each counted once (10 of 20)."""
    faults = tmp_path / "f.yaml"
    faults.write_text(
        '- {start_iteration: 3, end_iteration: 14, links: ["pp1:1-2"], delay_ms: 20}\n'
        '- {start_iteration: 9, end_iteration: 10, links: ["dp0:0-1"], down: true}\n'
    )
    profile = Profile.uniform(
        4, 8, 5, 5, 5, message_bytes=4096, num_replicas=2,
        allreduce_bytes=3_000_000, dp_bucket_bytes=125_000,
    )  # fmt: skip
    spec = ExperimentSpec(
        name="a", models=("m",), profile=profile, systems=("zb", "falcon"),
        num_iterations=20, faults=str(faults),
    )  # fmt: skip
    run_dir = run_experiment(spec, tmp_path / "r")
    rows = [
        line.split(" | ")[1::8]
        for line in (run_dir / "report.md").read_text().splitlines()
        if line.startswith("| m |")
    ]
    assert rows == [["zb", "1 restart |"], ["falcon", "1 restart, 10 iterations rebalanced |"]]


def test_a_run_whose_saved_fault_timeline_this_version_refuses_still_reports(
    tmp_path: Path,
) -> None:
    """A run saved by a version that read `delay_ms: "20"` as 20 (now refused, as the specs
    refuse a quoted number): `report` failed on it. It reports, its charts of the first saved
    iteration, and says why."""
    faults = tmp_path / "f.yaml"
    faults.write_text('- {start_iteration: 1, links: ["0-1"], delay_ms: 20}\n')
    spec = ExperimentSpec(
        name="a", models=("m",), profile=Profile.uniform(2, 4, 1, 1, 1), systems=("1f1b",),
        num_iterations=3, faults=str(faults),
    )  # fmt: skip
    run_dir = run_experiment(spec, tmp_path / "r")
    record = json.loads((run_dir / "spec.json").read_text())
    record["spec"]["faults_text"] = record["spec"]["faults_text"].replace("20", '"20"')
    (run_dir / "spec.json").write_text(json.dumps(record))
    main(["report", str(run_dir)])  # an error would exit (SystemExit)
    lines = (run_dir / "report.md").read_text().splitlines()
    assert any(
        line.startswith("- the fault timeline saved in spec.json does not read with this")
        and "delay_ms must be a number or inf, got '20' (line 1)" in line
        for line in lines
    ), lines
    assert "- 1f1b: `timelines/" in "\n".join(lines)


def test_the_paper_s_values_the_cost_model_is_fitted_on_are_no_predictions() -> None:
    """Fig. 1's fault-free 1F1B and ZB times are two of the cost model's fit targets: they
    counted in the report's median error as predictions, at +0.1 % (a user review)."""
    fig1 = harness.paper.PAPER["fig1"]
    assert [key for key, value in fig1.items() if value.fitted] == [
        ("gpt2-14b", "1f1b", "fault-free"),
        ("gpt2-14b", "zb", "fault-free"),
    ]
    assert harness.paper.PAPER["fig3"]["gpt2-7b-dp2", "zb", "fault-free"].fitted
    compared = [
        ({}, fig1["gpt2-14b", "1f1b", "fault-free"], 0.86),
        ({}, fig1["gpt2-14b", "1f1b", "6-7@20ms"], 1.33 * 1.02),
        ({}, fig1["gpt2-14b", "zb", "6-7@20ms"], 1.36 * 0.96),
    ]
    assert harness.report._error_summary(compared) == (
        "Median relative error 3.0 % over 2 predicted values (max 4.0 %). 1 value the cost "
        "model is fitted on, marked (fitted), not counted."
    )


def test_a_collect_cut_short_is_not_sent_to_a_run_that_refuses_it(
    default_run: tuple[Path, list[Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A collected run directory with spec.json and no runs.csv (its `collect` killed by
    SIGKILL between the two): `report` said "resume it with `adaptra-bench run ... --run-id
    ID`", which refuses a collected directory ("holds what a cluster job ran"); it says to
    collect it again instead, as `compare` does."""
    run_dir = tmp_path / "out" / "cut"
    run_dir.mkdir(parents=True)
    record = json.loads((default_run[0] / "spec.json").read_text())
    job = tmp_path / "the job"
    record.update(ran_by="a cluster job (launch --spec)", collected_from=str(job))
    (run_dir / "spec.json").write_text(json.dumps(record))
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(run_dir)])
    assert exit_.value.code == 1
    advice = (
        f"its collect was cut short (a run cannot resume it): remove it and collect again "
        f"with `adaptra-bench collect '{job}' --out {run_dir.parent} --run-id cut`"
    )
    assert capsys.readouterr().err == (
        f"error: {run_dir} is an unfinished run (0 of 16 configurations): {advice}\n"
    )
    with pytest.raises(ConfigError, match="holds what a cluster job"):  # as it said: no resume
        run_experiment(default_experiment(), run_dir)
    with pytest.raises(SystemExit) as exit_:
        main(["compare", str(default_run[0]), str(run_dir)])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.endswith(f"{advice} and compare it once finished\n")
