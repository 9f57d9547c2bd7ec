"""A run directory keeps what its engines measured (messages.csv, timelines/), and the report
draws from it: nothing is planned or simulated again."""

import ast
import dataclasses
import io
import itertools
import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import harness.experiment
from harness.cli import main
from harness.experiment import run_experiment
from harness.policies import plan
from harness.results import ITERATIONS_COLUMNS, MESSAGES_COLUMNS, read_csv_rows
from harness.saved import (
    ConfigurationRecorder,
    drawn_iterations,
    drop_stale,
    read_timeline,
    write_timeline,
)
from harness.spec import ExperimentSpec
from injectors.fault_files import parse_yaml
from pipeline.files import read_json
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.simulator import CommMode, simulate
from pipeline.timeline import SwapRecord, Timeline


def _messages(run_dir: Path, system: str) -> list[dict[str, str]]:
    return [
        r
        for r in read_csv_rows(run_dir / "messages.csv", MESSAGES_COLUMNS)
        if r["system"] == system
    ]


def _chart_sources(run_dir: Path) -> dict[str, tuple[Path, int]]:
    """report.md's record of where each Gantt chart came from: system -> (file, iteration)."""
    found = re.findall(
        r"^- (\S+): `(timelines/[^`]+)`, iteration (\d+),",
        (run_dir / "report.md").read_text(),
        re.M,
    )
    return {system: (run_dir / path, int(iteration)) for system, path, iteration in found}


def _saved(path: Path) -> Timeline:
    return Timeline.from_dict(read_json(path, "timeline"))


def _csv_times(row: dict[str, str]) -> tuple[float, ...]:
    columns = ("first_send_start_ms", "last_send_end_ms", "last_arrival_ms", "send_ms")
    return tuple(float(row[c]) for c in columns)


@pytest.mark.multiprocess
def test_an_emulated_report_draws_what_the_workers_measured(tmp_path: Path) -> None:
    profile = Profile.uniform(2, 3, 3, 3, 3, message_bytes=4096)
    spec = ExperimentSpec(
        name="em",
        models=("m",),
        profile=profile,
        systems=("1f1b", "zb-h1"),
        num_iterations=3,
        backend="emulated",
    )
    run_dir = run_experiment(spec, tmp_path / "em")
    sources = _chart_sources(run_dir)
    assert set(sources) == {"1f1b", "zb-h1"}
    assert "recorded by the emulated backend" in (run_dir / "report.md").read_text()
    for system in spec.systems:
        rows = _messages(run_dir, system)
        # one row per link direction per measured iteration: link 0-1 both ways, 3 messages
        keys = sorted((int(r["iteration"]), r["direction"]) for r in rows)
        assert keys == sorted(itertools.product(range(3), ("backward", "forward")))
        assert {
            (r["link"], r["replica"], r["num_messages"], r["num_bytes"], r["fault_ms"])
            for r in rows
        } == {("0-1", "0", "3", str(3 * 4096), "0.000")}
        path, iteration = sources[system]
        assert path.name == f"m_{system}_fault-free_r0.json" and iteration == 2
        saved = _saved(path)
        assert [r.iteration for r in saved.iterations] == [2]  # the last measured only
        assert (run_dir / f"gantt_{system}.png").read_bytes()[:4] == b"\x89PNG"
        # The chart's file holds what the run measured: iterations.csv's time, to the bit...
        measured = next(
            r
            for r in read_csv_rows(run_dir / "iterations.csv", ITERATIONS_COLUMNS)
            if r["system"] == system and r["iteration"] == "2"
        )
        assert compute_metrics(saved, 2).iteration_time_ms == float(measured["iteration_time_ms"])
        # ...and messages.csv's rows of that iteration, from its start, to 1 us...
        mine = saved.one_iteration(2)
        for row in (r for r in rows if r["iteration"] == "2"):
            ours = [m for m in mine.messages if m.direction == row["direction"]]
            expected = (
                min(m.send_start_ms for m in ours),
                max(m.send_end_ms for m in ours),
                max(m.arrival_ms for m in ours),
                sum(m.send_end_ms - m.send_start_ms for m in ours),
            )
            assert _csv_times(row) == pytest.approx(expected, abs=0.002)
        # ...which are real clocks' times, not the simulator's.
        simulated = simulate(plan(system, profile).schedule, profile, CommMode.DIRECT)
        predicted = {(r.stage, r.kind, r.microbatch): r.start_ms for r in simulated.ops}
        starts = {(r.stage, r.kind, r.microbatch): r.start_ms for r in mine.ops}
        assert starts.keys() == predicted.keys()
        assert all(starts[op] != predicted[op] for op in starts if predicted[op] > 0)


def _trace_spec(tmp_path: Path, num_iterations: int, **changes: Any) -> ExperimentSpec:
    trace = tmp_path / "two.txt"
    trace.write_text("2;0_1;0.02\n5;0_1;0\n")  # 20 ms on link 0-1 from iteration 2, off at 5
    values: dict[str, Any] = {
        "name": "tr",
        "models": ("m",),
        "profile": Profile.uniform(2, 2, 1, 1, 1),
        "systems": ("1f1b", "zb"),
        "faults": str(trace),
        "num_iterations": num_iterations,
        **changes,
    }
    return ExperimentSpec(**values)


def test_a_fault_timeline_keeps_the_iterations_around_each_event(tmp_path: Path) -> None:
    run_dir = run_experiment(_trace_spec(tmp_path, 8), tmp_path / "tr")
    sources = _chart_sources(run_dir)
    for system in ("1f1b", "zb"):
        path, iteration = sources[system]
        assert path.name == f"m_{system}_trace-two_r0.json"
        assert iteration == 2  # a fault timeline's chart: where its first event starts
        saved = _saved(path)
        # the last, and before/at each event (counted from the first measured iteration)
        assert [r.iteration for r in saved.iterations] == [1, 2, 4, 5, 7]
        assert {m.fault_ms for m in saved.messages if m.iteration in (2, 4)} == {20.0}
        assert {m.fault_ms for m in saved.messages if m.iteration in (1, 5, 7)} == {0.0}
        rows = _messages(run_dir, system)
        assert len(rows) == 8 * 2  # every iteration: link 0-1 both ways
        faults = {(int(r["iteration"]), float(r["fault_ms"])) for r in rows}
        assert faults == {(i, 40.0 if 2 <= i < 5 else 0.0) for i in range(8)}  # 2 messages


def test_retained_timelines_do_not_grow_with_iterations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    peaks: list[int] = []

    class Counting(ConfigurationRecorder):
        def __call__(
            self, iteration: int, timeline: Timeline, measured: bool, same_as: int | None = None
        ) -> None:
            super().__call__(iteration, timeline, measured, same_as)
            peaks[-1] = max(peaks[-1], self.num_kept)

    monkeypatch.setattr(harness.experiment, "ConfigurationRecorder", Counting)
    kept = {}
    for num_iterations in (40, 400):
        peaks.append(0)
        spec = _trace_spec(tmp_path, num_iterations, systems=("1f1b",), num_warmup_iterations=0)
        run_dir = run_experiment(spec, tmp_path / str(num_iterations))
        assert len(_messages(run_dir, "1f1b")) == num_iterations * 2
        saved = _saved(next((run_dir / "timelines").iterdir()))
        kept[num_iterations] = [r.iteration for r in saved.iterations]
    assert peaks == [5, 5]  # 2 events x 2 iterations + the last, at any length
    assert kept == {40: [1, 2, 4, 5, 39], 400: [1, 2, 4, 5, 399]}


def test_drawn_iterations() -> None:
    assert drawn_iterations(5) == {4}
    assert drawn_iterations(5, [0, 2, 4]) == {0, 1, 2, 3, 4}
    assert drawn_iterations(1, [0]) == {0}


def test_a_fault_s_end_is_drawn_as_its_start_is() -> None:
    """A YAML row's `end_iteration` and a stall's next iteration change what is in force, as
    a start does: the iteration before each change and the one it is in are drawn."""
    faults = parse_yaml(
        '[{start_iteration: 2, links: ["0-1"], stall_ms: 50},'
        ' {start_iteration: 5, end_iteration: 7, links: ["1-2"], delay_ms: 10},'
        ' {start_iteration: 8, links: ["1-2"], delay_ms: 20}]'
    )
    assert faults.change_iterations() == (2, 3, 5, 7, 8)
    assert drawn_iterations(12, faults.change_iterations()) == {1, 2, 3, 4, 5, 6, 7, 8, 11}


def test_report_without_saved_timelines_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = ExperimentSpec(
        name="old", models=("m",), profile=Profile.uniform(2, 2, 1, 1, 1), systems=("1f1b",)
    )
    run_dir = run_experiment(spec, tmp_path / "old")
    for path in [*(run_dir / "timelines").iterdir(), *run_dir.glob("gantt_*.png")]:
        path.unlink()
    main(["report", str(run_dir)])  # returns: exit status 0 (errors exit 1, 2 or 3)
    assert capsys.readouterr().out == f"report written to {run_dir / 'report.md'}\n"
    report = (run_dir / "report.md").read_text()
    assert (
        "- 1f1b: no chart, the run directory has no saved timeline "
        "`timelines/m_1f1b_fault-free_r0.json`" in report
    )
    assert "gantt_" not in report and not list(run_dir.glob("gantt_*.png"))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ({1: 5}, r"ops\[7\] is of stage 5 \(of 2\) from 52 to 54 ms: damaged\?"),
        ({1: -1}, r"ops\[7\] is of stage -1 \(of 2\) from 52 to 54 ms: damaged\?"),
        ({4: 54.0, 5: 52.0}, r"ops\[7\] is of stage 0 \(of 2\) from 54 to 52 ms: damaged\?"),
    ],
)
def test_a_report_refuses_a_saved_timeline_with_an_op_it_cannot_draw(
    tmp_path: Path, damage: dict[int, Any], message: str
) -> None:
    """An op of a stage the timeline lacks was left out of the chart without a word, one
    ending before its start drawn backwards; the report said it drew the saved timeline."""
    spec = ExperimentSpec(
        name="t", models=("m",), profile=Profile.uniform(2, 2, 1, 1, 1), systems=("1f1b",)
    )
    run_dir = run_experiment(spec, tmp_path / "t")
    path = run_dir / "timelines" / "m_1f1b_fault-free_r0.json"
    data = read_json(path, "timeline")
    assert data["ops"][7] == [4, 0, "BW", 1, 52.0, 54.0, 0]  # iteration 4, the last
    for field, value in damage.items():
        data["ops"][7][field] = value
    path.write_text(json.dumps(data))
    out = subprocess.run(
        [sys.executable, "-m", "harness", "report", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stderr
    assert re.search(message, out.stderr) and len(out.stderr.strip().splitlines()) == 1


def test_the_report_imports_no_runner() -> None:
    """The report reads results: it can neither plan nor run (nor import the experiment)."""
    code = (
        "import sys, harness.report; "
        "print(sorted(m for m in sys.modules if m.startswith(('harness.', 'adaptra', "
        "'baselines', 'injectors'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert ast.literal_eval(out.stdout) == [
        "harness.names",
        "harness.paper",
        "harness.plots",
        "harness.report",
        "harness.resolved",
        "harness.results",
        "harness.saved",
    ]


def test_a_drawn_iteration_run_again_after_a_restart_is_kept_once() -> None:
    """Iteration 1 ends, is lost to a restart, and runs again (300 ms later): the kept
    timeline holds its second run only (it held both, and a Gantt chart drew them over each
    other); messages.csv has both runs' rows, as iterations.csv has both runs."""
    profile = Profile.uniform(2, 2, 10, 10, 10)
    schedule = plan("1f1b", profile).schedule
    out = io.StringIO()
    recorder = ConfigurationRecorder(out, ("m", "1f1b", "fault-free", "0"), {1}, num_warmup=0)
    for iteration, start_ms in ((0, 0.0), (1, 90.0), (1, 390.0)):
        timeline = simulate(schedule, profile, iteration=iteration, start_ms=start_ms)
        recorder(iteration, timeline, True)
    kept = recorder.timeline()
    assert recorder.num_kept == 1
    assert [(r.iteration, r.start_ms) for r in kept.iterations] == [(1, 390.0)]
    assert len(kept.ops) == 2 * 2 * 2  # one iteration's: 2 stages x (F, BW) x 2 microbatches
    lines = out.getvalue().splitlines()
    # a row per link direction (link 0-1 both ways) per run
    assert sum(line.startswith("m,1f1b,fault-free,0,1,") for line in lines) == 2 * 2


def test_a_drawn_iteration_keeps_its_rank_swaps_renumbered(tmp_path: Path) -> None:
    """A saved timeline holds the drawn iterations' rank swaps (README: timelines/), numbered
    as iterations.csv numbers them, as their ops are: run iteration 3 after one warm-up is
    measured iteration 2."""
    profile = Profile.uniform(2, 2, 10, 10, 10)
    schedule = plan("1f1b", profile).schedule
    swap = SwapRecord(3, 7, 0, 0, 1, 0, 4096, 0.0, 5.0)
    timeline = dataclasses.replace(simulate(schedule, profile, iteration=3), swaps=(swap,))
    key = ("m", "1f1b", "fault-free", "0")
    recorder = ConfigurationRecorder(io.StringIO(), key, {2}, num_warmup=1)
    recorder(3, timeline, True)
    write_timeline(tmp_path, key, recorder.timeline())
    saved = read_timeline(tmp_path, key)
    assert saved is not None
    assert saved.swaps == (swap._replace(iteration=2),)
    assert {r.iteration for r in saved.ops} == {2}


_KILLED_WRITER = """
import sys, time
from pathlib import Path
from pipeline.files import atomic_writer
with atomic_writer(Path(sys.argv[1])) as out:
    out.write("half")
    out.flush()
    print("writing", flush=True)
    time.sleep(60)
"""


def test_a_resume_removes_every_temporary_file_a_killed_run_left(tmp_path: Path) -> None:
    """A SIGKILL mid-write (no handler runs) left `.runs.csv.XXXXXXXX.tmp`, which a resume
    did not remove (only messages.csv's); now every file named as the writers name their
    temporary ones goes, in the run directory and its timelines, and nothing else."""
    run_dir = tmp_path / "run"
    (run_dir / "timelines").mkdir(parents=True)
    (run_dir / "runs.csv").write_text("old\n")
    writer = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(run_dir / "runs.csv")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert writer.stdout is not None and writer.stdout.readline() == "writing\n"
    writer.send_signal(signal.SIGKILL)
    assert writer.wait() == -signal.SIGKILL
    writer.stdout.close()
    [killed] = [p.name for p in run_dir.glob(".runs.csv.*.tmp")]
    left = [
        ".iterations.csv.a1b2c3d4.tmp",
        ".spec.json.zz_9zz9z.tmp",
        "timelines/.m.json.0a1b2c3d.tmp",
    ]
    kept = [".lock", "notes.tmp", ".runs.csv.tmp", "timelines/m.json", "timelines/.m.json.ab.tmp"]
    for name in left + kept:
        (run_dir / name).write_text("")
    drop_stale(run_dir, set(), [])
    found = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file())
    assert found == sorted([*kept, "runs.csv"]) and killed not in found
    assert (run_dir / "runs.csv").read_text() == "old\n"
