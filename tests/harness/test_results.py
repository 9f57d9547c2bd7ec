"""Result files: the run directory, its lock, and the fault-free baseline."""

import datetime as dt
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import experiment, results
from harness.experiment import new_run_dir
from harness.results import (
    ITERATIONS_COLUMNS,
    RESULTS_SCHEMA_VERSION,
    RUNS_COLUMNS,
    fault_free_wall_ms,
    git_revision,
    read_csv_rows,
    read_iterations,
    read_spec_record,
    run_dir_held,
    run_dir_holder,
    write_csv_atomic,
)
from pipeline.errors import ConfigError


def test_the_slowdown_baseline_is_the_median_of_the_fault_free_repeats() -> None:
    rows = [
        {"model": "m", "system": "s", "scenario": "fault-free", "median_wall_ms": ms}
        for ms in ("100", "101", "300")
    ]
    rows.append({"model": "m", "system": "s", "scenario": "0-1@10ms", "median_wall_ms": "500"})
    assert fault_free_wall_ms(rows) == {("m", "s"): 101.0}


_KEY = {"model": "m", "system": "1f1b", "scenario": "trace:f", "repeat": 0}


def _write_iterations(run_dir: Path, iterations: list[int]) -> None:
    rows = [{**dict.fromkeys(ITERATIONS_COLUMNS, 1), **_KEY, "iteration": k} for k in iterations]
    write_csv_atomic(run_dir / "iterations.csv", ITERATIONS_COLUMNS, rows)


def test_iterations_csv_repeats_an_iteration_only_where_a_restart_ran_it_again(
    tmp_path: Path,
) -> None:
    """3 iterations, one lost to a restart: 0 1 1 2 is whole; 0 1 1 1 has as many rows but
    lacks iteration 2, and passed. A configuration without restarts repeats none."""
    run = {**_KEY, "iterations": "3", "lost_iterations": "1"}
    _write_iterations(tmp_path, [0, 1, 1, 2])
    assert [r["iteration"] for r in read_iterations(tmp_path, [run])] == ["0", "1", "1", "2"]
    _write_iterations(tmp_path, [0, 1, 1, 1])
    with pytest.raises(ConfigError) as damaged:
        read_iterations(tmp_path, [run])
    assert str(damaged.value) == (
        f"{tmp_path}/iterations.csv has no row of iteration 2 of m 1f1b trace:f (repeat 0): "
        "damaged?"
    )
    _write_iterations(tmp_path, [0, 1, 3, 2])
    with pytest.raises(ConfigError) as damaged:
        read_iterations(tmp_path, [run])
    assert str(damaged.value) == (
        f"{tmp_path}/iterations.csv line 4: iteration 3 of m 1f1b trace:f (repeat 0), which "
        "runs.csv says ran iterations 0 to 2: damaged?"
    )
    _write_iterations(tmp_path, [0, 0, 1])
    with pytest.raises(ConfigError, match=r"line 3 repeats iteration 0 of m 1f1b trace:f"):
        read_iterations(tmp_path, [{**run, "lost_iterations": "0"}])


def test_runs_csv_holds_each_configuration_once(tmp_path: Path) -> None:
    """A repeated row passed `report` (listed twice) and a resume, which `compare` refused."""
    row = {**dict.fromkeys(RUNS_COLUMNS, 1), **_KEY, "schema_version": RESULTS_SCHEMA_VERSION}
    other = {**row, "repeat": 1}
    path = tmp_path / "runs.csv"
    write_csv_atomic(path, RUNS_COLUMNS, [row, other])
    assert [r["repeat"] for r in read_csv_rows(path, RUNS_COLUMNS)] == ["0", "1"]
    write_csv_atomic(path, RUNS_COLUMNS, [row, other, row])
    with pytest.raises(ConfigError) as damaged:
        read_csv_rows(path, RUNS_COLUMNS)
    assert str(damaged.value) == (
        f"{path} line 4 repeats line 2's configuration, m 1f1b trace:f (repeat 0): damaged?"
    )


@pytest.mark.parametrize(
    ("table", "column", "text", "problem"),
    [
        # counts and indices: an inf or nan crashed report and resume (int(float(...)), exit 3)
        ("iterations.csv", "iteration", "inf", "'inf', not a finite number >= 0"),
        ("iterations.csv", "iteration", "nan", "'nan', not a finite number >= 0"),
        ("iterations.csv", "iteration", "-1", "'-1', not a finite number >= 0"),
        ("iterations.csv", "iteration", "1.5", "'1.5', not a whole number"),
        ("runs.csv", "iterations", "inf", "'inf', not a finite number >= 0"),
        ("runs.csv", "iterations", "1e400", "'1e400', not a finite number >= 0"),
        ("runs.csv", "lost_iterations", "-3", "'-3', not a finite number >= 0"),
        ("runs.csv", "restarts", "0.5", "'0.5', not a whole number"),
        ("runs.csv", "failovers", "2.25", "'2.25', not a whole number"),
        # the delegates messages went through (schema 9): a count like the others
        ("runs.csv", "num_delegates", "2.5", "'2.5', not a whole number"),
        ("iterations.csv", "num_delegates", "-1", "'-1', not a finite number >= 0"),
        ("iterations.csv", "num_delegates", "all", "'all', not a number"),
        # measurements: a nan, inf or negative time was reported as if measured
        ("runs.csv", "median_wall_ms", "nan", "'nan', not a finite number >= 0"),
        ("runs.csv", "median_wall_ms", "inf", "'inf', not a finite number >= 0"),
        ("runs.csv", "median_wall_ms", "-5", "'-5', not a finite number >= 0"),
        ("runs.csv", "throughput_samples_per_s", "-inf", "'-inf', not a finite number >= 0"),
        ("runs.csv", "delay_ms", "-10", "'-10', not a finite number >= 0"),
        ("iterations.csv", "step_time_ms", "NaN", "'NaN', not a finite number >= 0"),
        ("iterations.csv", "bubble_ratio", "-0.1", "'-0.1', not a finite number >= 0"),
        ("iterations.csv", "iteration_time_ms", "", "empty, not a number"),
        ("iterations.csv", "iteration_time_ms", "fast", "'fast', not a number"),
        # an iteration of no time: the report's throughput over a fault timeline divided by
        # it (an internal error, exit 3)
        ("iterations.csv", "iteration_time_ms", "0", "'0', not a number > 0"),
        ("iterations.csv", "iteration_time_ms", "-0.0", "'-0.0', not a number > 0"),
    ],
)
def test_a_damaged_number_is_refused_naming_the_file_and_line(
    tmp_path: Path, table: str, column: str, text: str, problem: str
) -> None:
    """Only what the harness writes passes: a finite number >= 0, a whole one in a count or an
    index. `read_csv_rows` is where report and resume read both files."""
    columns = {"runs.csv": RUNS_COLUMNS, "iterations.csv": ITERATIONS_COLUMNS}[table]
    row = {**dict.fromkeys(columns, "1"), **_KEY}
    if "schema_version" in row:  # runs.csv's
        row["schema_version"] = RESULTS_SCHEMA_VERSION
    path = tmp_path / table
    write_csv_atomic(path, columns, [row, {**row, "repeat": 1, column: text}])
    with pytest.raises(ConfigError) as damaged:
        read_csv_rows(path, columns)
    assert str(damaged.value) == f"{path} line 3: {column} is {problem}: damaged?"


@pytest.mark.parametrize("loss", ["", "nan", "inf", "2.5", "0"])
def test_a_loss_may_be_empty_or_any_number(tmp_path: Path, loss: str) -> None:
    """A run without a model has no loss, and a diverged training's is nan or inf: measured,
    not damage. Whole numbers in a float's form (as `float` writes them) pass as counts."""
    row = {**dict.fromkeys(ITERATIONS_COLUMNS, "1.0"), **_KEY, "loss": loss, "iteration": "0"}
    path = tmp_path / "iterations.csv"
    write_csv_atomic(path, ITERATIONS_COLUMNS, [row])
    assert [r["loss"] for r in read_csv_rows(path, ITERATIONS_COLUMNS)] == [loss]


def test_a_run_directory_is_held_by_one_run_at_a_time(tmp_path: Path) -> None:
    run_dir = tmp_path / "out" / "r1"
    with run_dir_held(run_dir):
        mine = rf"in use by another run or report \(pid {os.getpid()}\)"
        with pytest.raises(ConfigError, match=mine), run_dir_held(run_dir):
            pass
        # The CLI, a second process, refuses too, before it writes anything.
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "harness",
                "run",
                "--out",
                str(run_dir.parent),
                "--run-id",
                "r1",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 1 and "in use by another run or report" in out.stderr
        assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]
    with run_dir_held(run_dir):  # free again once released
        pass


def test_a_hold_whose_lock_its_holder_removed_makes_the_folder_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that wrote nothing removes its folder and `.lock` as it lets go: a run that
    opened that `.lock` while waiting for it must not hold a removed file (two runs would
    then hold the same folder, one of them writing into nothing)."""
    run_dir = tmp_path / "r1"
    real_flock, removed = results.fcntl.flock, []

    def holder_let_go(fd: int, operation: int) -> None:
        if not removed:  # the holder removed the folder just before it let go
            removed.append(True)
            (run_dir / ".lock").unlink()
            run_dir.rmdir()
        real_flock(fd, operation)

    monkeypatch.setattr(results.fcntl, "flock", holder_let_go)
    with run_dir_held(run_dir):
        assert (run_dir / ".lock").read_text() == f"{os.getpid()}\n"
        assert run_dir_holder(run_dir) == str(os.getpid())


def test_a_hold_waits_out_a_probe_and_readers_share_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`compare`'s probe (`run_dir_holder`) holds the lock for microseconds: a run starting
    meanwhile tries again rather than refuse; reports (readers) hold it together, and the
    probe passes them, while a run is refused."""
    run_dir = tmp_path / "r1"
    real_flock, refused = results.fcntl.flock, [3]

    def busy_at_first(fd: int, operation: int) -> None:
        if refused[0]:  # as if a probe held it for the first three tries
            refused[0] -= 1
            raise BlockingIOError
        real_flock(fd, operation)

    monkeypatch.setattr(results.fcntl, "flock", busy_at_first)
    with run_dir_held(run_dir):
        assert refused == [0]
    monkeypatch.setattr(results.fcntl, "flock", real_flock)
    with run_dir_held(run_dir, shared=True), run_dir_held(run_dir, shared=True):
        assert run_dir_holder(run_dir) is None  # compare reads a directory only reports hold
        refused_run = pytest.raises(ConfigError, match=r"in use by another run or report")
        with refused_run, run_dir_held(run_dir):
            pass
    assert run_dir_holder(run_dir) is None


def test_two_runs_started_in_the_same_second_get_a_directory_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class SameSecond(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> "SameSecond":
            return cls(2026, 12, 5, 1, 2, 3, tzinfo=tz)

    monkeypatch.setattr(experiment.dt, "datetime", SameSecond)
    names = [new_run_dir(tmp_path / "out", "exp").name for _ in range(3)]
    assert names == ["exp-20261205-010203", "exp-20261205-010203-2", "exp-20261205-010203-3"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == names


def test_the_git_revision_says_when_tracked_files_differ_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A results file names the code that made it: the commit, "-dirty" where a tracked file
    was changed since (an untracked one is not the code's), "unknown" outside a checkout.
    (git looks no higher than the test's folder: a TMPDIR inside a checkout is no failure.)"""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert git_revision(tmp_path) == "unknown"

    def git(*args: str) -> str:
        command = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args]
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    git("init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "code.py")
    git("commit", "-q", "-m", "first")
    head = git("rev-parse", "HEAD")
    assert len(head) == 40 and git_revision(tmp_path) == head
    (tmp_path / "notes.txt").write_text("untracked\n")
    assert git_revision(tmp_path) == head
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_revision(tmp_path) == f"{head}-dirty"


def test_a_damaged_spec_json_is_refused_as_any_input_file(tmp_path: Path) -> None:
    """spec.json was read with a bare json.loads: nested brackets were an internal error
    (RecursionError) for `report`, `run --run-id` and `compare`, a 5,000-digit number one too
    (Python's limit on reading one), and a key given twice kept the last, where every other
    input file refuses all three. It is read as they are now, one line naming it."""
    path = tmp_path / "spec.json"
    for text, said in (
        ("[" * 100_000 + "]" * 100_000, "lists and mappings nested more than 64 deep"),
        ('{"spec": {}, "n": ' + "1" * 5000 + "}", r"\(5000 digits\) is too large a number"),
        ('{"spec": {"a": 1}, "spec": {}}', "key 'spec' given twice in one object"),
        ("{garb", "is not valid JSON"),
    ):
        path.write_text(text)
        with pytest.raises(ConfigError, match=f"^run record {re.escape(str(path))}.*{said}"):
            read_spec_record(tmp_path)
