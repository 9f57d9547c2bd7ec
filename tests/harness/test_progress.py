"""Long commands show progress on a terminal, and only there."""

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli_common import IterationProgress
from tests.harness.test_cli import write_profile


def test_run_shows_progress_on_a_terminal_only(tmp_path: Path) -> None:
    """On a terminal's stderr, one line rewritten per iteration; piped (as here, and with
    --format json) nothing but the result."""
    profile = str(write_profile(tmp_path, stages=2, microbatches=2))
    args = [sys.executable, "-m", "harness", "run", "--profile", profile, "--policy", "1f1b"]
    args += ["--iterations", "3"]
    piped = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and "iteration 0 of 0-2" not in piped.stderr
    returncode, text = on_a_terminal(args)
    assert returncode == 0
    assert "\rwarm-up iteration 0 of 0-0, " in text  # the default warm-up, counted apart
    assert all(f"\riteration {k} of 0-2, " in text for k in (0, 1, 2)), text


def test_a_restarts_re_run_iterations_are_shown_as_what_they_are(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The line counted calls: after a restart it said "iteration 9/5". It now says which
    iteration ended, and that a re-run one runs again; numbered from 0 as the failure's
    message and the fault timeline number them (it said "iteration 2/3" for measured
    iteration 1, before the failure in "iteration 2", a user review)."""
    progress = IterationProgress(3, 1)
    for k in (0, 1, 2, 1, 2, 3):  # a failure in measured iteration 2: back to the checkpoint
        progress.step(k)
    shown = [line.split(",")[0] for line in capsys.readouterr().err.split("\r")[1:]]
    assert shown == [
        "warm-up iteration 0 of 0-0", "iteration 0 of 0-2", "iteration 1 of 0-2",
        "iteration 0 of 0-2 again (after a restart)", "iteration 1 of 0-2 again (after a restart)",
        "iteration 2 of 0-2",
    ]  # fmt: skip


def test_profile_shows_progress_on_a_terminal(tmp_path: Path) -> None:
    out = tmp_path / "measured.json"
    args = [sys.executable, "-m", "harness", "profile", "--stages", "2", "--iterations", "2"]
    returncode, text = on_a_terminal([*args, "--out", str(out)])
    assert returncode == 0, text
    assert "\rwarm-up iteration 0 of 0-0, " in text and "iteration 2 " not in text  # apart
    assert all(f"\riteration {k} of 0-1, " in text for k in (0, 1)), text
    assert json.loads(out.read_text())["stages"] == 2


def on_a_terminal(args: list[str]) -> tuple[int, str]:
    """Run `args` with stderr on a pseudo-terminal; its exit status and what it showed there."""
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(args, stdout=subprocess.PIPE, stderr=follower, text=True, timeout=120)
        os.close(follower)
        follower = -1
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal's other end is closed: all read
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    return done.returncode, shown.decode()
