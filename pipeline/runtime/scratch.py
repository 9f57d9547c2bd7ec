"""A worker pool's folders (its rendezvous, checkpoints, the delegates' slot files; the
temporary folder `launch --run` gives torchrun), each marked with the process that made it,
and the removal of those whose process is gone (a killed controller cannot remove its own);
the stop of a torchrun whose launch is gone."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from pipeline.processes import process_start_time, stop_orphan
from pipeline.signals import held_signals

__all__ = [
    "CHECKPOINTS_PREFIX",
    "FORK_SERVER_PREFIX",
    "POOL_PREFIX",
    "SLOTS_PREFIX",
    "TORCHRUN_PREFIX",
    "FolderCleanup",
    "clean_orphaned",
    "make_folder",
    "mark_folder",
    "owned_folder",
    "share_folder",
    "stop_orphaned_torchruns",
]

POOL_PREFIX, SLOTS_PREFIX = "adaptra-pool-", "adaptra-slots-"
FORK_SERVER_PREFIX = "pymp-"
"""multiprocessing's folder of the process that starts the workers' fork server (its socket):
the workers' launch marks it (pipeline.runtime.hooks); an unmarked one is another's."""
CHECKPOINTS_PREFIX = "adaptra-checkpoints-"
"""A training engine's checkpoints (pipeline.engines.runtime): a model's state per stage."""
TORCHRUN_PREFIX = "adaptra-torchrun-"
"""The temporary folder of a torchrun that `launch --run` starts (its logs, its workers')."""
_OWNER = ".owner"
"""A folder's mark: "<pid> <start time>" of the process that made it, a line more for each
process that shares it (`share_folder`)."""


def make_folder(prefix: str, parent: str | None = None) -> str:
    """A new folder (in `parent`, default the temporary folder) marked as this process's; a
    signal is held until it has its mark (a folder without one is never removed by
    `clean_orphaned`). A caller that must remove it holds signals across the call and
    the folder's record too."""
    with held_signals():
        folder = tempfile.mkdtemp(prefix=prefix, dir=parent)
        mark_folder(folder)
    return folder


@contextlib.contextmanager
def owned_folder(prefix: str, parent: str | None = None) -> Iterator[str]:
    """A folder of `make_folder`'s, removed on the way out (an exception, a signal: it is
    recorded before a held one is handled); one its process could not remove (killed) is
    `clean_orphaned`'s."""
    folder = None
    try:
        with held_signals():
            folder = make_folder(prefix, parent)
        yield folder
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def mark_folder(folder: str) -> None:
    """Mark `folder` as this process's (once: a folder marked already keeps its mark), so
    that `clean_orphaned` removes it once this process is gone."""
    mark = Path(folder, _OWNER)
    if not mark.exists():
        pid = os.getpid()
        mark.write_text(f"{pid} {process_start_time(pid)}\n")


def share_folder(folder: str, pid: int) -> None:
    """Mark `folder` as process `pid`'s too (a child in a session of its own, which a kill
    of this process leaves running: launch's torchrun), so that `clean_orphaned` leaves it
    while either runs. Nothing where `pid` no longer runs."""
    start_time = process_start_time(pid)
    if start_time is not None:
        with Path(folder, _OWNER).open("a") as mark:
            mark.write(f"{pid} {start_time}\n")


@dataclasses.dataclass(frozen=True, slots=True)
class FolderCleanup:
    """What `clean_orphaned` did: the folders it removed, and those it could not, with why."""

    removed: tuple[Path, ...]
    failed: tuple[tuple[Path, str], ...]


def clean_orphaned(parents: Iterable[str] | None = None) -> FolderCleanup:
    """Remove the pools' folders in `parents` (default: the temporary folder and /dev/shm),
    the fork server's and launch's torchrun's, whose process no longer runs. A folder without
    its mark, or whose mark is not one of ours (being made, of another version, another
    program's `pymp-`), is left; one that cannot be removed whole is named, with why, and
    keeps its mark (removed last), so that a later cleanup tries it again."""
    if parents is None:
        parents = [tempfile.gettempdir(), "/dev/shm"]
    prefixes = (POOL_PREFIX, SLOTS_PREFIX, CHECKPOINTS_PREFIX, FORK_SERVER_PREFIX, TORCHRUN_PREFIX)
    removed, failed = [], []
    for parent in parents:
        for prefix in prefixes:
            for folder in sorted(Path(parent).glob(f"{prefix}*")):
                owners = _owners(folder)
                if owners and all(process_start_time(pid) != start for pid, start in owners):
                    why = _remove(folder)
                    if why is None:
                        removed.append(folder)
                    else:
                        failed.append((folder, why))
    return FolderCleanup(tuple(removed), tuple(failed))


def _remove(folder: Path) -> str | None:
    """Remove `folder`, its mark last; why it could not be, or None (also where another
    cleanup removed it first)."""
    try:
        for entry in folder.iterdir():
            if entry.name == _OWNER:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        Path(folder, _OWNER).unlink(missing_ok=True)
        folder.rmdir()
    except OSError as err:
        if not os.path.lexists(folder):
            return None
        return f"{err.filename}: {err.strerror}" if err.filename else str(err)
    return None


def stop_orphaned_torchruns(parents: Iterable[str] | None = None) -> list[int]:
    """Stop the torchruns, with their workers, whose `launch --run` is gone (its torchrun
    folder's first mark; `parents` as `clean_orphaned`'s): a launch killed where no handler
    ran (SIGKILL) leaves its torchrun running on, its results going nowhere. Their pids."""
    if parents is None:
        parents = [tempfile.gettempdir(), "/dev/shm"]
    stopped = []
    for parent in parents:
        for folder in sorted(Path(parent).glob(f"{TORCHRUN_PREFIX}*")):
            owners = _owners(folder)
            if owners and process_start_time(owners[0][0]) != owners[0][1]:
                stopped += [pid for pid, start in owners[1:] if stop_orphan(pid, start)]
    return stopped


def _owners(folder: Path) -> list[tuple[int, int]]:
    """The pids and start times `folder`'s mark names (a line each), or none: no mark, or
    not one of ours."""
    owners = []
    try:
        for line in Path(folder, _OWNER).read_text().splitlines():
            pid, start_time = map(int, line.split())
            if pid <= 0 or start_time < 0:
                return []
            owners.append((pid, start_time))
    except (OSError, ValueError):  # unreadable; not two whole numbers a line
        return []
    return owners
