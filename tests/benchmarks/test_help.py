"""Every benchmark script answers --help with its usage and exits at once: none of them runs
its benchmark (or builds a testbed, or starts workers) when asked how to call it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))
HANG_S = 60
"""A hang bound, not a timing assertion: an import of torch on a loaded machine takes seconds."""


def test_every_benchmark_script_is_listed() -> None:
    assert len(SCRIPTS) > 30


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_help_prints_the_usage_and_runs_nothing(script: Path, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "TMPDIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, str(script), "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # The usage comes first: nothing of a benchmark (a table, a progress line) before it.
    assert done.stdout.startswith(f"usage: {script.name} "), done.stdout[:500]
    assert "|---" not in done.stdout  # no result table after it either
    assert not list(tmp_path.iterdir())  # no scratch folder, pool or testbed made
