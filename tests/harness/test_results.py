"""Result files: the run directory, its lock, and the fault-free baseline."""

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import experiment
from harness.experiment import new_run_dir
from harness.results import fault_free_wall_ms, git_revision, run_dir_held
from pipeline.errors import ConfigError


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


def test_the_git_revision_says_when_tracked_files_differ_from_it(tmp_path: Path) -> None:
    """A results file names the code that made it: the commit, "-dirty" where a tracked file
    was changed since (an untracked one is not the code's), "unknown" outside a checkout."""
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
