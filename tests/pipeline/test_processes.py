"""`process_tree` stops every process its command started, also one in a session of its
own, also one that ignores SIGTERM, whatever ends the block."""

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from pipeline import processes
from pipeline.processes import PipeReader, process_start_time, process_tree, stop_orphan

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")


def _pids_written(path: Path, count: int) -> list[int]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pids = path.read_text().split() if path.exists() else []
        if len(pids) >= count:
            return [int(p) for p in pids]
        time.sleep(0.05)
    raise AssertionError(f"the command wrote no {count} pids to {path}")


def test_an_exception_stops_the_command_and_a_descendant_in_a_session_of_its_own(
    tmp_path: Path,
) -> None:
    """As torchrun starts its workers (a session each): the command's group alone misses
    them; the one that ignores SIGTERM gets SIGKILL after the grace period."""
    pids = tmp_path / "pids"
    script = (
        f"setsid sh -c 'echo $$ >> {pids}; exec sleep 60' & "
        f"sh -c 'trap \"\" TERM; echo $$ >> {pids}; while :; do sleep 0.1; done' & "
        "wait"
    )
    started = time.monotonic()
    with pytest.raises(KeyError), process_tree(["sh", "-c", script], grace_s=1.0) as command:
        children = _pids_written(pids, 2)
        assert all(process_start_time(pid) is not None for pid in children)
        raise KeyError("the block failed")
    assert command.returncode is not None
    assert [process_start_time(pid) for pid in children] == [None, None]
    assert time.monotonic() - started < 20


def test_an_orphan_is_stopped_with_its_tree_and_a_reused_pid_is_left(tmp_path: Path) -> None:
    """`cleanup`'s stop of a killed launch's torchrun: the process, its child in a session of
    its own (a worker) and one that ignores SIGTERM (SIGKILL after the grace period); a pid
    whose start time is not the one recorded is another process: left running."""
    pids = tmp_path / "pids"
    script = (
        f"setsid sh -c 'echo $$ >> {pids}; exec sleep 60' & "
        f"sh -c 'trap \"\" TERM; echo $$ >> {pids}; while :; do sleep 0.1; done' & "
        "wait"
    )
    with subprocess.Popen(["sh", "-c", script], start_new_session=True) as root:
        try:
            children = _pids_written(pids, 2)
            start_time = process_start_time(root.pid)
            assert start_time is not None
            assert not stop_orphan(root.pid, start_time + 1, grace_s=1.0)  # a reused pid
            assert all(process_start_time(pid) is not None for pid in [root.pid, *children])
            assert stop_orphan(root.pid, start_time, grace_s=1.0)
            assert [process_start_time(pid) for pid in [root.pid, *children]] == [None] * 3
            assert not stop_orphan(root.pid, start_time)  # gone: nothing to stop
        finally:
            for pid in [root.pid, *_pids_written(pids, 0)]:
                if process_start_time(pid) is not None:
                    os.kill(pid, signal.SIGKILL)


def test_a_command_that_ends_by_itself_is_only_reaped() -> None:
    with process_tree(["true"]) as command:
        command.wait()
    assert command.returncode == 0
    with process_tree(["sh", "-c", "exit 3"], stdout=subprocess.PIPE) as command:
        out, _ = command.communicate(timeout=30)
    assert command.returncode == 3 and out == b""


def test_a_wait_past_its_limit_stops_the_command_and_what_it_started(tmp_path: Path) -> None:
    """`launch --run-timeout-s`'s way out: the wait's TimeoutExpired ends the block."""
    pids = tmp_path / "pids"
    script = f"setsid sh -c 'echo $$ >> {pids}; exec sleep 60' & wait"
    with (
        pytest.raises(subprocess.TimeoutExpired),
        process_tree(["sh", "-c", script], grace_s=1.0) as command,
    ):
        (child,) = _pids_written(pids, 1)
        command.wait(timeout=0.5)
    assert command.returncode is not None and process_start_time(child) is None


def _leader_that_dies(tmp_path: Path, text: str = "") -> tuple[list[str], Path, Path]:
    """A command (a crashed torchrun) that starts a child in a session of its own, writes
    `text` to stderr, waits for the file `go`, and dies by SIGKILL; the child's pid goes to
    the file `pids`."""
    pids, go = tmp_path / "pids", tmp_path / "go"
    script = (
        f"setsid sh -c 'echo $$ > {pids}; exec sleep 60' & echo {text} >&2; "
        f"while [ ! -e {go} ]; do sleep 0.05; done; kill -9 $$"
    )
    return ["sh", "-c", script], pids, go


def _seen_by_the_watch(monkeypatch: pytest.MonkeyPatch, wanted: list[int]) -> threading.Event:
    """Set once the thread that notes the command's tree has found the pid in `wanted`."""
    seen = threading.Event()
    real = processes._tree

    def spy(roots: set[int]) -> dict[int, int]:
        found = real(roots)
        if wanted and wanted[0] in found:
            seen.set()
        return found

    monkeypatch.setattr(processes, "_tree", spy)
    return seen


def test_a_descendant_whose_parent_died_is_stopped_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command itself ended first (a torchrun killed by the OOM killer): its child, in a
    session of its own and a child of init now, was found by nothing at the exit and ran on."""
    argv, pids, go = _leader_that_dies(tmp_path)
    child: list[int] = []
    seen = _seen_by_the_watch(monkeypatch, child)
    try:
        with process_tree(argv, grace_s=1.0) as command:
            child.extend(_pids_written(pids, 1))
            assert seen.wait(30)  # noted while its parent ran
            go.touch()
            assert command.wait(timeout=30) == -signal.SIGKILL
            assert process_start_time(child[0]) is not None  # orphaned, running
        assert process_start_time(child[0]) is None
    finally:
        if child and process_start_time(child[0]) is not None:
            os.kill(child[0], signal.SIGKILL)


def test_a_pipe_reader_gives_the_output_once_the_tree_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`launch --run`'s wait: for the command's exit, then its output; the orphan holding
    the pipes (until the exit stops it) does not hold the output back."""
    argv, pids, go = _leader_that_dies(tmp_path, "torchrun: error")
    child: list[int] = []
    seen = _seen_by_the_watch(monkeypatch, child)
    try:
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
        with process_tree(argv, grace_s=1.0, **pipes) as command:
            output = PipeReader(command)
            child.extend(_pids_written(pids, 1))
            assert seen.wait(30)
            go.touch()
            command.wait(timeout=30)
        assert output.result(timeout_s=30) == ("", "torchrun: error\n")
        assert process_start_time(child[0]) is None
    finally:
        if child and process_start_time(child[0]) is not None:
            os.kill(child[0], signal.SIGKILL)


@pytest.mark.parametrize("text", [True, False])
def test_a_pipe_reader_gives_what_came_while_a_holder_keeps_the_pipe_open(
    tmp_path: Path, text: bool
) -> None:
    """A holder the watch never saw (here one detached from the start) keeps the pipes open
    past the command's exit: the reader's result by its limit is what came by then (it read
    nothing: a text pipe's read(65536) waits for 65536 characters or the end). Text is
    decoded as the pipe would, with universal newlines, a byte it cannot decode replaced."""
    pid_file = tmp_path / "holder"
    script = (
        r"printf 'torchrun: error: worker 1 failed \303\251\377\r\n' >&2; "
        f"setsid sh -c 'echo $$ > {pid_file}; exec sleep 60' & exit 1"
    )
    pipes = {"text": True, "encoding": "utf-8"} if text else {}
    command = subprocess.Popen(
        ["sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, **pipes
    )
    holder: list[int] = []
    try:
        output = PipeReader(command)
        assert command.wait(timeout=30) == 1
        holder.extend(_pids_written(pid_file, 1))
        line = "torchrun: error: worker 1 failed é"
        expected = ("", f"{line}\ufffd\n") if text else (b"", line.encode() + b"\xff\r\n")
        # Each result comes at its limit (the holder keeps the pipes open) with what the
        # reader has by then; on a loaded host its thread may not have run yet: ask again,
        # up to a hang bound (a reader that never gives it still fails).
        deadline = time.monotonic() + 30
        while (out_err := output.result(timeout_s=0.2)) != expected:
            if time.monotonic() > deadline:
                break
        assert out_err == expected
        assert process_start_time(holder[0]) is not None  # it held the pipes all along
    finally:
        if holder:
            os.kill(holder[0], signal.SIGKILL)
        for pipe in (command.stdout, command.stderr):
            if pipe is not None:
                pipe.close()
