"""benchmarks/under_load.py: a command run beside busy processes, and its report."""

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_a_run_ends_with_its_command_not_with_a_child_it_left_behind() -> None:
    """The command leaves a child holding its output open (as a stray worker of a test run
    may): the report comes once the command has ended (it waited for that child's end, which
    closed the pipes it read); the failing run's output is shown, and the exit status is 1."""
    leaves_a_child = "sleep 300 & echo $!"
    fails = "echo out; echo why >&2; exit 3"
    script = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks/under_load.py"), "--busy", "1", "--runs", "1",
         "--", "sh", "-c", f"{leaves_a_child}; {fails}"],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        # (the child left behind holds the command's output, not the script's)
        out, _ = script.communicate(timeout=120)
        lines = out.splitlines()
        assert lines[0].startswith("run 1/1: exit 3 in ") and lines[0].endswith(": out"), lines
        child = int(lines[1])  # the failing run's output, shown
        assert lines[2:4] == ["out", ""] and "why" in lines[4:], lines
        assert lines[-1] == "0 passed, 1 failed, 1 busy process(es) beside"
        assert script.returncode == 1
        assert Path(f"/proc/{child}").exists()  # still asleep: not waited for
    finally:
        os.killpg(script.pid, signal.SIGKILL)  # the child left behind, in its group
        script.wait()


def _on_its_terminal() -> None:
    """In the child, after its new session: its stdin, a pty, becomes its controlling
    terminal, and its process group that terminal's foreground job."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


@pytest.mark.parametrize("stop", ["Ctrl-C on its terminal", "SIGINT to it alone", "SIGTERM"])
def test_a_stopped_run_lets_its_command_end_by_itself(tmp_path: Path, stop: str) -> None:
    """A Ctrl-C typed on the script's terminal (the command, in its process group, gets it
    too), a `kill -INT` of the script alone with no terminal (a background job), or SIGTERM
    to it: the command ends by its own handler, which takes a second (as pytest tears its
    fixtures down on Ctrl-C), and the script then ends by the signal (it killed the command
    0.25 s after a Ctrl-C, and at once on SIGTERM; a SIGINT to it alone reached the command
    only as the SIGKILL 30 s later)."""
    ready, ended = tmp_path / "ready", tmp_path / "ended"
    trap = f"trap 'echo $$ >> {ended}; sleep 1; exit 1' INT TERM"  # a line per signal taken
    terminal, its_side = os.openpty() if stop.startswith("Ctrl-C") else (-1, -1)
    script = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks/under_load.py"), "--busy", "0", "--",
         "sh", "-c", f"{trap}; touch {ready}; while :; do sleep 0.1; done"],
        stdin=its_side if its_side >= 0 else subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
        preexec_fn=_on_its_terminal if its_side >= 0 else None,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60  # start-up under load: a hang bound
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists()
        if terminal >= 0:
            os.write(terminal, b"\x03")  # the line discipline: SIGINT to the foreground job
        else:
            script.send_signal(signal.SIGTERM if stop == "SIGTERM" else signal.SIGINT)
        _, err = script.communicate(timeout=60)
        assert ended.read_text().count("\n") == 1  # once: not passed on after a Ctrl-C
        signum = signal.SIGTERM if stop == "SIGTERM" else signal.SIGINT
        assert script.returncode == 128 + signum, err
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(script.pid, signal.SIGKILL)
        script.wait()
        for fd in (terminal, its_side):
            if fd >= 0:
                os.close(fd)
