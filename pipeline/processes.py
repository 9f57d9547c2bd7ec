"""Which process runs: a pid with its start time, which a reused pid does not share; and a
command run with every process it starts stopped on the way out."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.signals import held_signals

__all__ = ["process_start_time", "process_tree"]

_Known = dict[int, int]
"""Processes by pid, each with its start time (what tells it from a later one of its pid)."""


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
    starts its workers so), get SIGTERM, those left after `grace_s` SIGKILL, and the command
    is waited for. Descendants are found by /proc (Linux); elsewhere its session only."""
    command: subprocess.Popen[Any] | None = None
    try:
        with held_signals():  # a command started is a command recorded (the exit stops it)
            command = subprocess.Popen(argv, start_new_session=True, **popen)
        yield command
    finally:
        if command is not None:
            _stop(command, grace_s)


def _stop(command: subprocess.Popen[Any], grace_s: float) -> None:
    """SIGTERM to `command`'s session and descendants, each once (a second one could cut
    short the cleanup the first started), SIGKILL to those left after `grace_s`; then
    `command` is reaped."""
    known: _Known = {}
    _signal_new(command, known, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _signal_new(command, known, signal.SIGTERM)  # started since: they stop too
        if command.poll() is not None and not _running(known):
            break
        time.sleep(0.05)
    if command.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(command.pid, signal.SIGKILL)
    _signal_new(command, known, signal.SIGKILL)
    for pid in _running(known):
        _kill(pid, signal.SIGKILL)
    command.wait()
    deadline = time.monotonic() + 5.0  # SIGKILL takes effect soon, not at once
    while _running(known) and time.monotonic() < deadline:
        time.sleep(0.01)


def _signal_new(command: subprocess.Popen[Any], known: _Known, signum: int) -> None:
    """Send `signum` to each of `command`'s descendants and session not in `known` (to its
    process group if /proc shows none), while it runs; add them to `known`."""
    if command.poll() is not None:
        return  # its pid may be another's by now: what it left is in `known`
    found = _tree(command.pid)
    if not found and not known:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(command.pid, signum)
    for pid in found.keys() - known.keys():
        _kill(pid, signum)
    known.update(found)


def _kill(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


def _running(known: _Known) -> list[int]:
    """The processes of `known` that still run (a reused pid is another process)."""
    return [pid for pid, start in known.items() if process_start_time(pid) == start]


def _tree(root: int) -> _Known:
    """The running processes descended from `root` or in its session (its own included)."""
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
    found = {pid for pid, (_, session, _) in stats.items() if session == root}
    todo = [root, *found]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return {pid: stats[pid][2] for pid in found if pid in stats}
