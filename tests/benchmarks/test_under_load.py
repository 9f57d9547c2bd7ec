"""benchmarks/under_load.py: a command run beside busy processes, and its report."""

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

import pytest

from tests.benchmarks.scripts import ROOT, load_script


def test_a_run_ends_with_its_command_not_with_a_child_it_left_behind(tmp_path: Path) -> None:
    """The command leaves a child holding its output open (as a stray worker of a test run
    may): the report comes once the command has ended (it waited for that child's end, which
    closed the pipes it read); the failing run's output is shown, and the exit status is 1."""
    child_file = tmp_path / "child"
    leaves_a_child = f"sleep 300 & echo $! > {child_file}"
    fails = "echo out; echo why >&2; exit 3"
    script = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks/under_load.py"), "--busy", "1", "--runs", "1",
         "--", "sh", "-c", f"{leaves_a_child}; {fails}"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # (the child left behind holds the command's output, not the script's)
        out, _ = script.communicate(timeout=120)
        lines = out.splitlines()
        assert lines[0].startswith("run 1/1: exit 3 in ") and lines[0].endswith(": out"), lines
        assert lines[1:3] == ["out", ""] and "why" in lines[3:], lines  # its output, shown
        assert lines[-1] == "0 passed, 1 failed, 1 busy process(es) beside"
        assert script.returncode == 1
        assert Path(f"/proc/{child_file.read_text().strip()}").exists()  # not waited for
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()
        if child_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(child_file.read_text()), signal.SIGKILL)


def _on_its_terminal() -> None:
    """In the child, after its new session: its stdin, a pty, becomes its controlling
    terminal, and its process group that terminal's foreground job."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


@pytest.mark.parametrize(
    "stop", ["Ctrl-C on its terminal", "SIGINT to its process group", "SIGINT to it", "SIGTERM"]
)
def test_a_stopped_run_lets_its_command_end_by_itself(tmp_path: Path, stop: str) -> None:
    """A Ctrl-C typed on the script's terminal, a SIGINT to its process group with no
    terminal (CI, `timeout -s INT`), one to the script alone (a background job's `kill
    -INT`), or SIGTERM: the command takes the stop once and ends by its own handler, which
    takes a second (as pytest tears its fixtures down on Ctrl-C), and the script then ends by
    the signal (it killed the command 0.25 s after a Ctrl-C, and at once on SIGTERM; a
    SIGINT to the script alone reached the command only as the SIGKILL 30 s later; one to
    the group with no terminal, twice)."""
    ready, ended = tmp_path / "ready", tmp_path / "ended"
    trap = f"trap 'echo $$ >> {ended}; sleep 1; exit 1' INT TERM"  # a line per signal taken
    terminal, its_side = os.openpty() if stop.startswith("Ctrl-C") else (-1, -1)
    script = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks/under_load.py"), "--busy", "0", "--",
         "sh", "-c", f"{trap}; echo $$ > {ready}; while :; do sleep 0.1; done"],
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
        elif stop == "SIGINT to its process group":
            os.killpg(script.pid, signal.SIGINT)
        else:
            script.send_signal(signal.SIGTERM if stop == "SIGTERM" else signal.SIGINT)
        _, err = script.communicate(timeout=60)
        assert ended.read_text().count("\n") == 1  # once: not passed on after a Ctrl-C
        signum = signal.SIGTERM if stop == "SIGTERM" else signal.SIGINT
        assert script.returncode == 128 + signum, err
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()
        if ready.exists():  # the command, in a process group of its own
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.killpg(int(ready.read_text()), signal.SIGKILL)
        for fd in (terminal, its_side):
            if fd >= 0:
                os.close(fd)


def test_a_stop_as_the_command_starts_is_passed_on_once_it_has_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C that comes after the command has started but before `Popen` has returned
    (a loaded host can leave the script unscheduled that long): the script passes it on to
    the command's group, once, and ends by it. (It ended at once, and the command, in a
    group of its own, was left running untold: a CI run saw that.)"""
    under_load = load_script("under_load")
    ready, ended = tmp_path / "ready", tmp_path / "ended"
    started: list[subprocess.Popen[bytes]] = []

    class StoppedAsItStarts(subprocess.Popen[bytes]):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[call-overload]
            started.append(self)
            deadline = time.monotonic() + 60  # start-up under load: a hang bound
            while not ready.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            signal.raise_signal(signal.SIGINT)  # Python's default handler: KeyboardInterrupt

    monkeypatch.setattr(subprocess, "Popen", StoppedAsItStarts)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # xdist's may differ
    trap = f"trap 'echo $$ >> {ended}; exit 1' INT TERM"
    try:
        with pytest.raises(KeyboardInterrupt), tempfile.TemporaryFile() as out:
            under_load._run(
                ["sh", "-c", f"{trap}; echo $$ > {ready}; while :; do sleep 0.1; done"], out, out
            )
        assert ended.read_text() == ready.read_text()  # the command took the stop, once
        assert started[0].returncode == 1  # and ended by its own handler
    finally:
        signal.signal(signal.SIGINT, previous)
        for command in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(command.pid, signal.SIGKILL)
            command.wait()
