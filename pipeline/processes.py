"""Which process runs: a pid with its start time, which a reused pid does not share; and a
command run with every process it starts stopped on the way out."""

from __future__ import annotations

import codecs
import contextlib
import io
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from pipeline.signals import held_signals

__all__ = [
    "WATCH_INTERVAL_S",
    "PipeReader",
    "process_start_time",
    "process_tree",
    "stop_orphan",
]

_Known = dict[int, int]
"""Processes by pid, each with its start time (what tells it from a later one of its pid)."""

WATCH_INTERVAL_S = 0.25
"""How often `process_tree` looks for its command's descendants while the command runs (a
look reads /proc: about 1.5 ms of CPU with 100 processes here), so that those whose parent
dies (a crashed torchrun's workers, in sessions of their own) are still known at the exit.
One that starts and loses its parent between two looks is not."""


def process_start_time(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), or None if it does not run."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "; comm may have spaces
    if fields[0] in ("Z", "X"):  # a zombie has ended; only its exit status is left
        return None
    return int(fields[19])  # field 22 of proc(5), counted from field 3


@contextlib.contextmanager
def process_tree(
    argv: list[str], *, grace_s: float = 10.0, **popen: Any
) -> Iterator[subprocess.Popen[Any]]:
    """`argv` started in a session of its own (`popen`: Popen's other arguments); on the way
    out, done or not (an exception, a timeout, a signal), every process it started is
    stopped: its session and every descendant, also one in a session of its own (torchrun
    starts its workers so) and one whose parent has ended (the command itself too: a thread
    notes the descendants every WATCH_INTERVAL_S while the body runs), get SIGTERM, those
    left after `grace_s` SIGKILL, and the command is waited for. Descendants are found by
    /proc (Linux); elsewhere its session only."""
    command: subprocess.Popen[Any] | None = None
    seen: _Known = {}
    watch: _Watch | None = None
    try:
        with held_signals():  # a command started is a command recorded (the exit stops it)
            command = subprocess.Popen(argv, start_new_session=True, **popen)
        watch = _Watch(command, seen)
        yield command
    finally:
        if watch is not None:
            watch.stop()
        if command is not None:
            _stop(command, seen, grace_s)


def stop_orphan(pid: int, start_time: int, *, grace_s: float = 10.0) -> bool:
    """Stop process `pid`, if it is still the one that started at `start_time`, and its tree
    (descendants and session members, also those in sessions of their own below it), as
    `process_tree`'s exit stops a command's: SIGTERM to each once, SIGKILL to those left
    after `grace_s`. For a process whose parent was killed before that exit ran (a killed
    `launch --run`'s torchrun): nothing here reaps it, so it is polled. Whether it ran."""
    root = {pid: start_time}
    if not _running(root):
        return False
    signalled: _Known = {}
    deadline = time.monotonic() + grace_s
    while True:
        found = _tree(set(_running({**root, **signalled})))
        for member in found.keys() - signalled.keys():
            _kill(member, signal.SIGTERM)
        signalled.update(found)
        if not _running(signalled) or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    _kill_the_rest(signalled)
    return True


class _Watch:
    """Notes `command`'s tree into `seen` every WATCH_INTERVAL_S, from a thread of its own,
    until stopped."""

    def __init__(self, command: subprocess.Popen[Any], seen: _Known) -> None:
        self._command, self._seen = command, seen
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="process-tree", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            _members(self._command, self._seen)
            if self._done.wait(WATCH_INTERVAL_S):
                return

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


class PipeReader:
    """Reads a command's stdout and stderr pipes (those it has) to their end from threads of
    its own, so that the caller can wait for the command's exit, not for its pipes' end: a
    descendant left running (a crashed torchrun's workers) holds them open until
    `process_tree`'s exit stops it. Each thread takes what its pipe holds as it comes
    (`os.read` on a copy of its descriptor: a text or buffered pipe's `read(n)` waits for n
    characters or the end), so what came before a holder's silence is never held back."""

    def __init__(self, command: subprocess.Popen[Any]) -> None:
        self._pipes = (command.stdout, command.stderr)
        self._chunks: tuple[list[bytes], list[bytes]] = ([], [])
        self._threads = {
            index: threading.Thread(
                target=_read, args=(os.dup(pipe.fileno()), chunks), name="pipe-reader", daemon=True
            )
            for index, (pipe, chunks) in enumerate(zip(self._pipes, self._chunks, strict=True))
            if pipe is not None
        }
        for thread in self._threads.values():
            thread.start()

    def result(self, timeout_s: float = 5.0) -> tuple[Any, Any]:
        """What stdout and stderr gave (None for one not piped; str or bytes as the pipe
        reads: text `_decoded`), once both have ended or after `timeout_s`: what they gave by
        then (a process outside the command's tree may hold one)."""
        deadline = time.monotonic() + timeout_s
        for thread in self._threads.values():
            thread.join(max(deadline - time.monotonic(), 0))
        out, err = (
            None
            if pipe is None
            else _decoded(pipe, b"".join(list(chunks)), ended=not self._threads[index].is_alive())
            for index, (pipe, chunks) in enumerate(zip(self._pipes, self._chunks, strict=True))
        )
        return out, err


def _read(fd: int, chunks: list[bytes]) -> None:
    """The pipe `fd` (this thread's own copy, closed at the end) to its end, into `chunks`,
    each part as soon as it is there."""
    try:
        with contextlib.suppress(OSError):
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
    finally:
        os.close(fd)


def _decoded(pipe: IO[Any], data: bytes, *, ended: bool) -> Any:
    """`data` as `pipe` reads it: bytes, or text in its wrapper's encoding with universal
    newlines (as subprocess's text mode), bytes it cannot decode replaced where its errors
    are "strict" (output read for a diagnosis: a bad byte must not lose the rest). `ended`:
    nothing follows; else an incomplete last character is left out (the rest may follow)."""
    if not isinstance(pipe, io.TextIOWrapper):
        return data
    errors = "replace" if pipe.errors in (None, "strict") else pipe.errors
    decoder = io.IncrementalNewlineDecoder(
        codecs.getincrementaldecoder(pipe.encoding)(errors), translate=True
    )
    return decoder.decode(data, final=ended)


def _stop(command: subprocess.Popen[Any], seen: _Known, grace_s: float) -> None:
    """SIGTERM to `command`'s session and descendants (those `seen` included), each once (a
    second one could cut short the cleanup the first started), SIGKILL to those left after
    `grace_s`; then `command` is reaped."""
    signalled: _Known = {}
    _signal_new(command, seen, signalled, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _signal_new(command, seen, signalled, signal.SIGTERM)  # started since: they stop too
        if command.poll() is not None and not _running(signalled):
            break
        time.sleep(0.05)
    if command.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(command.pid, signal.SIGKILL)
    _signal_new(command, seen, signalled, signal.SIGKILL)
    _kill_the_rest(signalled)
    command.wait()


def _signal_new(
    command: subprocess.Popen[Any], seen: _Known, signalled: _Known, signum: int
) -> None:
    """Send `signum` to each running process of `command`'s tree (`_members`) not in
    `signalled` (to its process group if /proc shows none), and add them there."""
    found = _members(command, seen)
    if not found and not signalled and command.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(command.pid, signum)
    for pid in found.keys() - signalled.keys():
        _kill(pid, signum)
    signalled.update(found)


def _members(command: subprocess.Popen[Any], seen: _Known) -> _Known:
    """The running processes of `command`'s tree, also noted in `seen`: those descended from,
    or in the session of, the command (while it runs: once reaped, its pid may be another's)
    or a process of `seen` that still runs."""
    roots = set(_running(seen))
    if command.poll() is None:
        roots.add(command.pid)
    found = _tree(roots)
    seen.update(found)
    return found


def _kill_the_rest(signalled: _Known) -> None:
    """SIGKILL to the processes of `signalled` that still run, and a wait for them to go
    (SIGKILL takes effect soon, not at once; at most 5 s)."""
    for pid in _running(signalled):
        _kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while _running(signalled) and time.monotonic() < deadline:
        time.sleep(0.01)


def _kill(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


def _running(known: _Known) -> list[int]:
    """The processes of `known` that still run (a reused pid is another process)."""
    return [pid for pid, start in list(known.items()) if process_start_time(pid) == start]


def _tree(roots: set[int]) -> _Known:
    """The running processes descended from one of `roots` or in its session (the roots
    included)."""
    stats: dict[int, tuple[int, int, int]] = {}  # pid: parent, session, start time
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue  # ended while we looked
            fields = stat[stat.rindex(")") + 2 :].split()
            if fields[0] not in ("Z", "X"):
                stats[int(entry.name)] = (int(fields[1]), int(fields[3]), int(fields[19]))
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    found = {pid for pid, (_, session, _) in stats.items() if session in roots}
    found |= roots
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return {pid: stats[pid][2] for pid in found if pid in stats}
