"""Every benchmark script answers --help with its usage and exits at once: none of them runs
its benchmark (or builds a testbed, or starts workers) when asked how to call it.

The scripts run one after another in one interpreter, each as `python script.py --help`
would run it (`runpy.run_path` as `__main__`, its own argv and sys.path[0], an empty
working and temporary folder): most import torch, which one interpreter imports once where a
process per script took 2-6 s each on a loaded machine."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))
HANG_S = 300
"""A hang bound for all of them, not a timing assertion: an import of torch on a loaded
machine takes seconds."""

_EACH_HELP = """
import contextlib, io, json, os, runpy, sys, tempfile, traceback
answers = {}
for script, folder in zip(sys.argv[1::2], sys.argv[2::2]):
    os.chdir(folder)
    os.environ["TMPDIR"] = tempfile.tempdir = folder
    sys.argv = [script, "--help"]
    sys.path[0] = os.path.dirname(script)  # as `python script.py` has it
    out, err, code = io.StringIO(), io.StringIO(), None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        code = stop.code
    except Exception:  # the others still answer
        code = traceback.format_exc()
    answers[os.path.basename(script)] = {
        "code": code, "stdout": out.getvalue(), "stderr": err.getvalue(),
        "made": sorted(os.listdir(folder)),
    }
print(json.dumps(answers))
"""


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each script's exit code (None: it returned without exiting; a traceback: it raised),
    stdout, stderr and what it made in its folder."""
    pairs = [(str(s), str(tmp_path_factory.mktemp(s.stem))) for s in SCRIPTS]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", _EACH_HELP, *[part for pair in pairs for part in pair]],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    answered: dict[str, dict[str, Any]] = json.loads(done.stdout.splitlines()[-1])
    return answered


def test_every_benchmark_script_is_listed() -> None:
    assert len(SCRIPTS) > 30


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_help_prints_the_usage_and_runs_nothing(
    script: Path, answers: dict[str, dict[str, Any]]
) -> None:
    answer = answers[script.name]
    assert answer["code"] in (0, None), f"{answer['code']}\n{answer['stdout']}{answer['stderr']}"
    # The usage comes first: nothing of a benchmark (a table, a progress line) before it.
    assert answer["stdout"].startswith(f"usage: {script.name} "), answer["stdout"][:500]
    assert "|---" not in answer["stdout"]  # no result table after it either
    assert answer["made"] == []  # no scratch folder, pool or testbed made
