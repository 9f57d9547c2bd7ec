"""The worker pools' marked folders and `cleanup`'s removal of those whose process is gone."""

import os
import signal
import subprocess
from pathlib import Path

import pytest

from pipeline.processes import process_start_time
from pipeline.runtime.scratch import (
    FORK_SERVER_PREFIX,
    POOL_PREFIX,
    SLOTS_PREFIX,
    TORCHRUN_PREFIX,
    clean_orphaned,
    owned_folder,
    share_folder,
    stop_orphaned_torchruns,
)


def _gone_mark() -> str:
    """A mark of a process that no longer runs: this pid with another start time (a pid
    reused by a later process)."""
    start_time = process_start_time(os.getpid())
    assert start_time is not None
    return f"{os.getpid()} {start_time + 1}\n"


def _folder(parent: Path, name: str, mark: str | None) -> Path:
    folder = parent / name
    folder.mkdir()
    if mark is not None:
        (folder / ".owner").write_text(mark)
    return folder


def test_a_mark_that_is_not_ours_is_left_and_the_rest_still_removed(tmp_path: Path) -> None:
    """Another program's `pymp-` folder with a mark of its own made `int(pid)` raise, and
    the command stopped before any other folder (and every namespace) was seen."""
    foreign = [
        _folder(tmp_path, f"{FORK_SERVER_PREFIX}foreign", "someone else\n"),
        _folder(tmp_path, f"{POOL_PREFIX}words", "12 soon\n"),
        _folder(tmp_path, f"{POOL_PREFIX}three", "1 2 3\n"),
        _folder(tmp_path, f"{SLOTS_PREFIX}negative", "-1 5\n"),
        _folder(tmp_path, f"{SLOTS_PREFIX}unmarked", None),
    ]
    orphaned = [
        _folder(tmp_path, f"{FORK_SERVER_PREFIX}zz-ours", _gone_mark()),
        _folder(tmp_path, f"{POOL_PREFIX}zz-ours", _gone_mark()),
    ]
    start_time = process_start_time(os.getpid())
    live = _folder(tmp_path, f"{POOL_PREFIX}live", f"{os.getpid()} {start_time}\n")
    assert sorted(clean_orphaned([str(tmp_path)]).removed) == sorted(orphaned)
    assert sorted(tmp_path.iterdir()) == sorted([*foreign, live])


def test_a_folder_that_cannot_be_removed_is_not_said_removed_and_keeps_its_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file in an orphaned folder that cannot be deleted (another user's, a busy mount):
    the folder was said removed (rmtree ignored the error), `cleanup` exited 0, and its
    mark was gone with the rest, so no later cleanup looked at it again. Now it is named
    with why, the others still removed, and it keeps its mark."""
    stuck = _folder(tmp_path, f"{POOL_PREFIX}stuck", _gone_mark())
    (stuck / "held").write_text("x")
    removable = _folder(tmp_path, f"{SLOTS_PREFIX}removable", _gone_mark())
    unlink = os.unlink

    def refuse_held(path: str | os.PathLike[str], *args: object, **kwargs: object) -> None:
        if Path(path).name == "held":
            raise PermissionError(1, "Operation not permitted", str(path))
        unlink(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "unlink", refuse_held)
    assert list(clean_orphaned([str(tmp_path)]).removed) == [removable]
    assert sorted(p.name for p in stuck.iterdir()) == [".owner", "held"]
    cleaned = clean_orphaned([str(tmp_path)])
    assert cleaned.removed == ()
    assert cleaned.failed == ((stuck, f"{stuck / 'held'}: Operation not permitted"),)


def test_launch_s_torchrun_folder_is_marked_and_removed_once_its_process_is_gone(
    tmp_path: Path,
) -> None:
    """`launch --run` gave torchrun a plain temporary folder: a killed launch left it, and
    `cleanup` knew neither its prefix nor its owner."""
    with owned_folder(TORCHRUN_PREFIX, str(tmp_path)) as folder:
        start_time = process_start_time(os.getpid())
        assert Path(folder).name.startswith("adaptra-torchrun-")
        assert Path(folder, ".owner").read_text() == f"{os.getpid()} {start_time}\n"
        assert clean_orphaned([str(tmp_path)]).removed == ()  # its process runs
    assert list(tmp_path.iterdir()) == []  # gone on the way out
    left = _folder(tmp_path, f"{TORCHRUN_PREFIX}killed", _gone_mark())
    assert list(clean_orphaned([str(tmp_path)]).removed) == [left]
    assert list(tmp_path.iterdir()) == []


def test_a_shared_folder_stays_while_any_of_its_processes_runs(tmp_path: Path) -> None:
    """A killed `launch --run` leaves its torchrun running (a session of its own): `cleanup`
    removed the torchrun's folder under it. Now the torchrun shares the mark, and the folder
    goes only once both are gone."""
    folder = _folder(tmp_path, f"{TORCHRUN_PREFIX}killed", _gone_mark())
    with subprocess.Popen(["sleep", "60"]) as torchrun:
        try:
            share_folder(str(folder), torchrun.pid)
            assert clean_orphaned([str(tmp_path)]).removed == ()  # the launch is gone, not torchrun
            assert len((folder / ".owner").read_text().splitlines()) == 2
        finally:
            torchrun.kill()
    assert list(clean_orphaned([str(tmp_path)]).removed) == [folder]
    share_folder(str(tmp_path), torchrun.pid)  # a process gone: no mark
    assert list(tmp_path.iterdir()) == []


def test_a_torchrun_is_stopped_once_its_launch_is_gone(tmp_path: Path) -> None:
    """A launch killed by SIGKILL left its torchrun (and workers) running on, sending its
    results to no one, and `cleanup` kept its folder for it: now `cleanup` stops it first.
    One whose launch still runs is that launch's."""
    live_mark = f"{os.getpid()} {process_start_time(os.getpid())}\n"
    killed = _folder(tmp_path, f"{TORCHRUN_PREFIX}killed", _gone_mark())
    live = _folder(tmp_path, f"{TORCHRUN_PREFIX}live", live_mark)
    with (
        subprocess.Popen(["sleep", "60"], start_new_session=True) as orphan,
        subprocess.Popen(["sleep", "60"], start_new_session=True) as running,
    ):
        try:
            share_folder(str(killed), orphan.pid)
            share_folder(str(live), running.pid)
            assert stop_orphaned_torchruns([str(tmp_path)]) == [orphan.pid]
            assert orphan.wait(timeout=30) == -signal.SIGTERM
            assert running.poll() is None
            assert list(clean_orphaned([str(tmp_path)]).removed) == [killed]
        finally:
            orphan.kill()
            running.kill()


def test_an_owned_folder_goes_on_an_exception_too(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="inside"), owned_folder("x-", str(tmp_path)) as folder:
        Path(folder, "log").write_text("torchrun wrote this")
        raise RuntimeError("inside")
    assert list(tmp_path.iterdir()) == []


def test_the_fork_server_s_folder_is_marked_before_the_server_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first worker's start makes the fork server's `pymp-` folder and waits while the
    server imports torch (about a second): a SIGKILL then left it unmarked (the mark came
    after the start), and `cleanup` left it as another program's. It is marked before."""
    import multiprocessing.util

    from pipeline.runtime import hooks

    folder = tmp_path / f"{FORK_SERVER_PREFIX}x"
    folder.mkdir()
    monkeypatch.setattr(multiprocessing.util, "get_temp_dir", lambda: str(folder))
    marked_at_start = []

    class Started:
        def __init__(self, **_: object) -> None:
            pass

        def start(self) -> None:  # where a SIGKILL may come, for a second or so
            marked_at_start.append((folder / ".owner").exists())

    class Context:
        Process = Started

    monkeypatch.setattr(hooks, "worker_context", Context)
    hooks.start_worker(0, print, ())
    assert marked_at_start == [True]
    assert (folder / ".owner").read_text() == (f"{os.getpid()} {process_start_time(os.getpid())}\n")
