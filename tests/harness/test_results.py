"""Result files: written whole or not at all, readable like any other output file."""

import datetime as dt
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from harness import experiment
from harness.experiment import new_run_dir
from harness.results import atomic_writer, fault_free_wall_ms, run_dir_held, write_atomic
from pipeline.errors import ConfigError


def test_a_result_file_gets_the_mode_open_would_give_it(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "runs.csv", "a,b\n")
        (tmp_path / "plain.txt").write_text("x")
    finally:
        os.umask(old)
    mode = stat.S_IMODE((tmp_path / "runs.csv").stat().st_mode)
    assert mode == stat.S_IMODE((tmp_path / "plain.txt").stat().st_mode) == 0o644


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path: Path) -> None:
    path = tmp_path / "runs.csv"
    write_atomic(path, "old\n")
    with pytest.raises(RuntimeError), atomic_writer(path) as handle:
        handle.write("half")
        raise RuntimeError("midway")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["runs.csv"]


def test_an_append_adds_to_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "runs.csv"
    write_atomic(path, "a,b\n1,2\n")
    with atomic_writer(path, append=True) as handle:
        handle.write("3,4\n")
    assert path.read_text() == "a,b\n1,2\n3,4\n"


def test_a_write_that_fails_before_its_handle_leaves_no_descriptor_open(tmp_path: Path) -> None:
    """The old file cannot be copied (it is a folder): the temporary file's descriptor is
    closed and the file removed, every time."""
    path = tmp_path / "runs.csv"
    path.mkdir()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        with pytest.raises(IsADirectoryError), atomic_writer(path, append=True):
            pass
    assert len(os.listdir("/proc/self/fd")) == before
    assert [p.name for p in tmp_path.iterdir()] == ["runs.csv"]


def test_the_slowdown_baseline_is_the_median_of_the_fault_free_repeats() -> None:
    rows = [
        {"model": "m", "system": "s", "scenario": "fault-free", "median_wall_ms": ms}
        for ms in ("100", "101", "300")
    ]
    rows.append({"model": "m", "system": "s", "scenario": "0-1@10ms", "median_wall_ms": "500"})
    assert fault_free_wall_ms(rows) == {("m", "s"): 101.0}


def test_a_run_directory_is_held_by_one_run_at_a_time(tmp_path: Path) -> None:
    run_dir = tmp_path / "out" / "r1"
    with run_dir_held(run_dir):
        mine = rf"in use by another run \(pid {os.getpid()}\)"
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
        assert out.returncode == 1 and "in use by another run" in out.stderr
        assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]
    with run_dir_held(run_dir):  # free again once released
        pass


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
