"""`process_tree` stops every process its command started, also one in a session of its
own, also one that ignores SIGTERM, whatever ends the block."""

import subprocess
import time
from pathlib import Path

import pytest

from pipeline.processes import process_start_time, process_tree

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
