"""Result files: written whole or not at all, readable like any other output file."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from harness.results import atomic_writer, run_dir_held, write_atomic
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
