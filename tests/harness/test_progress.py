"""Long commands show progress on a terminal, and only there."""

import os
import pty
import subprocess
import sys
from pathlib import Path

from tests.harness.test_cli import write_profile


def test_run_shows_progress_on_a_terminal_only(tmp_path: Path) -> None:
    """On a terminal's stderr, one line rewritten per iteration; piped (as here, and with
    --format json) nothing but the result."""
    profile = str(write_profile(tmp_path, stages=2, microbatches=2))
    args = [sys.executable, "-m", "harness", "run", "--profile", profile, "--policy", "1f1b"]
    args += ["--iterations", "3"]
    piped = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and "iteration 1/4" not in piped.stderr
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
    assert done.returncode == 0
    text = shown.decode()
    assert all(f"\riteration {k}/4, " in text for k in (1, 2, 3, 4)), text
