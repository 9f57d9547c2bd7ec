"""Errors across processes: what a failed worker reports, and what the controller raises.

A worker whose iteration (or start-up) fails sends the controller a `RemoteError`: the
exception's qualified type and its bases, its message and formatted traceback, and where it
happened (rank, stage, replica, iteration, op). It holds strings and ints only, so it always
pickles, whatever the exception held. The controller raises the `WorkerError` subclass that
`worker_error` picks from it; a death (or silence) has no report and is raised directly.
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Callable

from pipeline.errors import AdaptraBenchError, LinkFailure, ScheduleError

__all__ = [
    "RemoteError",
    "WorkerCrash",
    "WorkerDeadlock",
    "WorkerError",
    "WorkerLinkFailure",
    "WorkerTimeout",
    "qualified_name",
    "worker_error",
]


def qualified_name(kind: type) -> str:
    """A type's module and qualified name: "pipeline.errors.LinkFailure", "builtins.OSError"."""
    return f"{kind.__module__}.{kind.__qualname__}"


def _text(make: Callable[[], str], fallback: str) -> str:
    """`make()`, or `fallback` if it raises (an exception's `__str__` may)."""
    try:
        return str(make())
    except Exception:
        return fallback


@dataclasses.dataclass(frozen=True, slots=True)
class RemoteError:
    """An exception raised in another process, described in strings and ints."""

    type_name: str
    """Qualified: "pipeline.errors.LinkFailure", "builtins.TimeoutError"."""
    message: str
    """`str()` of the exception; may span lines (torch appends C++ stack traces)."""
    traceback_text: str
    """The formatted traceback in the worker, chained causes included."""
    rank: int
    stage: int
    replica: int
    iteration: int | None
    """None: the worker failed outside iterations: while starting, or in what `op` names."""
    op: str | None = None
    """The op running when it failed ("F3"); None outside ops. Outside iterations, what the
    worker did ("the move back to the default placement"); None: its start."""
    type_names: tuple[str, ...] = ()
    """The type and its bases in method resolution order, qualified (`object` left out)."""
    cause_type_name: str | None = None
    """The qualified type of the exception it was raised from (or during), if any."""
    at_ms: float | None = None
    """A `LinkFailure`'s `at_ms`: how far into its iteration the failed message went."""

    @classmethod
    def from_exception(
        cls,
        err: BaseException,
        *,
        rank: int,
        stage: int,
        replica: int,
        iteration: int | None = None,
        op: str | None = None,
    ) -> RemoteError:
        """Describe the live exception `err`, raised at the given place."""
        kind = type(err)
        cause = err.__cause__
        if cause is None and not err.__suppress_context__:
            cause = err.__context__
        unprintable = f"<{kind.__name__}: message not printable>"
        return cls(
            type_name=qualified_name(kind),
            message=_text(lambda: str(err), unprintable),
            traceback_text=_text(
                lambda: "".join(traceback.format_exception(err)), "(no traceback: not printable)"
            ),
            rank=int(rank),
            stage=int(stage),
            replica=int(replica),
            iteration=None if iteration is None else int(iteration),
            op=None if op is None else str(op),
            type_names=tuple(qualified_name(t) for t in kind.__mro__ if t is not object),
            cause_type_name=None if cause is None else qualified_name(type(cause)),
            at_ms=err.at_ms if isinstance(err, LinkFailure) else None,
        )

    @property
    def short_type_name(self) -> str:
        """The type's own name: "LinkFailure"."""
        return self.type_name.rpartition(".")[2]

    def is_a(self, kind: type) -> bool:
        """Whether the remote exception was a `kind` (or a subclass), judged by name."""
        name = qualified_name(kind)
        return name == self.type_name or name in self.type_names

    def summary(self) -> str:
        """One line: "rank 2 (stage 2), iteration 5, op F3: LinkFailure: link 1-2 ...";
        only the message's first line."""
        who = f"rank {self.rank} (stage {self.stage}"
        who += f", replica {self.replica})" if self.replica else ")"
        if self.iteration is None:
            where = f"{who} could not start" if self.op is None else f"{who}, {self.op}"
        else:
            where = f"{who}, iteration {self.iteration}"
            if self.op is not None:
                where += f", op {self.op}"
        lines = self.message.strip().splitlines()
        what = f"{self.short_type_name}: {lines[0]}" if lines else self.short_type_name
        return f"{where}: {what}"


class WorkerError(AdaptraBenchError, RuntimeError):
    """A worker died, failed or did not answer in time; the pool is closed.

    `rank`: the rank it is about (None where it is about no single rank); `remote`: what that
    worker reported (None where it reported nothing: it died or stayed silent). The worker's
    traceback is in `traceback_text` and in the exception's notes, never in `str()`."""

    def __init__(
        self, message: str, *, rank: int | None = None, remote: RemoteError | None = None
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.remote = remote
        self.noticed_s: float | None = None
        """When the pool heard of it (host monotonic s: the report's arrival, the death or
        silence found), before it closed itself; None where it was raised elsewhere."""
        if remote is not None and remote.traceback_text:
            self.add_note(f"rank {remote.rank}'s traceback:\n{remote.traceback_text.rstrip()}")

    @property
    def traceback_text(self) -> str:
        """The worker's traceback; empty where it reported none."""
        return "" if self.remote is None else self.remote.traceback_text


class WorkerLinkFailure(WorkerError):
    """A worker sent on a link (or through a NIC) that has failed: a `LinkFailure` there."""


class WorkerTimeout(WorkerError):
    """A wait timed out: a `TimeoutError` in a worker (its message names the op that waited,
    or the receiver thread), or the controller's own wait for the workers' answers (`remote`
    None)."""


class WorkerDeadlock(WorkerError):
    """The schedule cannot run to its end: a `ScheduleError` in a worker. The runtime raises
    no `DeadlockError` itself; it tells a deadlock only where an op waits for a message its
    peer's schedule never sends (`Receiver.take`). A cyclic wait between valid-looking
    schedules shows as a `WorkerTimeout`."""


class WorkerCrash(WorkerError):
    """A worker process died (`remote` None, the exit status in the message), ended without
    an answer, or failed with any other exception (a bug in a compute backend, a closed
    connection, ...)."""


def worker_error(remote: RemoteError) -> WorkerError:
    """The controller's exception for a worker's report: the one place the subclass is chosen."""
    kind: type[WorkerError] = WorkerCrash
    if remote.is_a(LinkFailure):
        kind = WorkerLinkFailure
    elif remote.is_a(TimeoutError):
        kind = WorkerTimeout
    elif remote.is_a(ScheduleError):
        kind = WorkerDeadlock
    return kind(remote.summary(), rank=remote.rank, remote=remote)
