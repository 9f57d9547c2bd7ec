"""Every benchmark script answers --help with its usage and exits at once: none of them runs
its benchmark (or builds a testbed, or starts workers) when asked how to call it.

The scripts run one after another in one interpreter, each as `python script.py --help`
would run it (`runpy.run_path` as `__main__`, its own argv and sys.path[0], an empty
working and temporary folder, its own file descriptors 1 and 2, a hang bound of its own):
most import torch, which one interpreter imports once where a process per script took 2-6 s
each on a loaded machine. What one script leaves in the interpreter (modules imported,
handlers set) the next ones see: each sets only its shutdown signals' handlers before its
usage (`run_script`), and sets the defaults back as it exits."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))
SCRIPT_HANG_S = 60
"""A hang bound per script, not a timing assertion: an import of torch on a loaded machine
takes seconds."""

_EACH_HELP = """
import json, os, runpy, signal, sys, tempfile, traceback

class Hung(Exception):
    pass

def hung(signum, frame):
    raise Hung

signal.signal(signal.SIGALRM, hung)
captures, limit_s, pairs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
real_out, real_err = os.dup(1), os.dup(2)
answers = {}
for script, folder in zip(pairs[0::2], pairs[1::2]):
    name = os.path.basename(script)
    os.write(real_err, f"{name}\\n".encode())  # the last named is the one a crash stopped in
    os.chdir(folder)
    os.environ["TMPDIR"] = tempfile.tempdir = folder
    sys.argv = [script, "--help"]
    sys.path[0] = os.path.dirname(script)  # as `python script.py` has it
    out_path, err_path = (os.path.join(captures, f"{name}.{fd}") for fd in (1, 2))
    with open(out_path, "w") as out, open(err_path, "w") as err:
        os.dup2(out.fileno(), 1)  # the descriptors: a child's output is caught too
        os.dup2(err.fileno(), 2)
        code = None
        signal.alarm(limit_s)
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as stop:
            code = stop.code
        except Hung:
            code = f"still running after {limit_s} s"
        except Exception:  # the others still answer
            code = traceback.format_exc()
        finally:
            signal.alarm(0)
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(real_out, 1)
            os.dup2(real_err, 2)
    with open(out_path) as out, open(err_path) as err:
        stdout, stderr = out.read(), err.read()
    answers[name] = {"code": code, "stdout": stdout, "stderr": stderr,
                     "made": sorted(os.listdir(folder))}
print(json.dumps(answers))
"""


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each script's exit code (None: it returned without exiting; a traceback: it raised; a
    sentence: it was still running after SCRIPT_HANG_S), stdout and stderr (its file
    descriptors'), and what it made in its folder."""
    pairs = [(str(s), str(tmp_path_factory.mktemp(s.stem))) for s in SCRIPTS]
    captures = tmp_path_factory.mktemp("captured")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", _EACH_HELP, str(captures), str(SCRIPT_HANG_S)]
        + [part for pair in pairs for part in pair],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=SCRIPT_HANG_S * len(SCRIPTS),
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
