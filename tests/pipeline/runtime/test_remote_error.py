"""RemoteError: an exception described in strings and ints; the WorkerError chosen from it.

No processes here: test_pool.py sends them through real workers."""

import dataclasses
import pickle
import socket
import threading

import pytest

import pipeline.runtime
import pipeline.runtime.pool
from pipeline.errors import AdaptraBenchError, DeadlockError, LinkFailure, ScheduleError
from pipeline.runtime.remote_error import (
    RemoteError,
    WorkerCrash,
    WorkerDeadlock,
    WorkerError,
    WorkerLinkFailure,
    WorkerTimeout,
    worker_error,
)
from pipeline.runtime.worker import PLACING


class _NicDown(LinkFailure):
    """A subclass the controller has never heard of."""


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


def _raise_in_hook() -> None:
    raise LinkFailure("link 1-2 (forward) has failed")


def _caught(
    make: type[BaseException] | None = None, /, *, via: BaseException | None = None
) -> BaseException:
    """An exception (a LinkFailure if no type is given) raised from `via` and caught, with its
    traceback."""
    try:
        if make is None:
            _raise_in_hook()
        else:
            raise make("boom") from via
    except BaseException as err:
        return err
    raise AssertionError("unreachable")


def _remote(err: BaseException, **where: int | str | None) -> RemoteError:
    place = {"rank": 3, "stage": 1, "replica": 1, "iteration": 5, "op": "F3", **where}
    return RemoteError.from_exception(err, **place)  # type: ignore[arg-type]


def test_from_exception_describes_type_message_place_and_traceback() -> None:
    remote = _remote(_caught())
    assert remote.type_name == "pipeline.errors.LinkFailure"
    assert remote.short_type_name == "LinkFailure"
    assert remote.type_names[:2] == (
        "pipeline.errors.LinkFailure",
        "pipeline.errors.AdaptraBenchError",
    )
    assert "builtins.ConnectionError" in remote.type_names
    assert "builtins.object" not in remote.type_names
    assert remote.message == "link 1-2 (forward) has failed"
    assert (remote.rank, remote.stage, remote.replica, remote.iteration, remote.op) == (
        3,
        1,
        1,
        5,
        "F3",
    )
    assert remote.traceback_text.startswith("Traceback (most recent call last):")
    assert "in _raise_in_hook" in remote.traceback_text
    assert remote.traceback_text.rstrip().endswith("LinkFailure: link 1-2 (forward) has failed")
    assert remote.cause_type_name is None


def test_from_exception_names_the_cause_explicit_or_implicit() -> None:
    explicit = _remote(_caught(TimeoutError, via=RuntimeError("gloo: Timed out")))
    assert explicit.type_name == "builtins.TimeoutError"
    assert explicit.cause_type_name == "builtins.RuntimeError"
    assert "gloo: Timed out" in explicit.traceback_text  # the chain is in the traceback

    try:
        try:
            {}["missing"]
        except KeyError:
            raise ValueError("while handling") from None
    except ValueError as err:
        suppressed = _remote(err)
    assert suppressed.cause_type_name is None

    try:
        try:
            {}["missing"]
        except KeyError:
            raise ValueError("while handling")  # noqa: B904 (the implicit context is the point)
    except ValueError as err:
        implicit = _remote(err)
    assert implicit.cause_type_name == "builtins.KeyError"


def test_it_pickles_whatever_the_exception_held() -> None:
    lock = threading.Lock()  # unpicklable
    err = _caught(ValueError, via=OSError(5, "io"))
    err.args = (lock, "text")
    with pytest.raises(TypeError):
        pickle.dumps(err)
    remote = _remote(err)
    again = pickle.loads(pickle.dumps(remote))
    assert again == remote
    assert again.type_name == "builtins.ValueError" and again.cause_type_name == "builtins.OSError"
    assert "text" in again.message


def test_an_unprintable_exception_is_still_described() -> None:
    remote = _remote(_caught(_Unprintable))
    assert remote.message == "<_Unprintable: message not printable>"
    assert remote.type_name.endswith("test_remote_error._Unprintable")
    assert "_caught" in remote.traceback_text


def test_summary_is_one_line_naming_the_place() -> None:
    err = _caught(RuntimeError, via=None)
    err.args = ("first line\nException raised from c10 ...\nframe #0: ...",)
    assert _remote(err).summary() == (
        "rank 3 (stage 1, replica 1), iteration 5, op F3: RuntimeError: first line"
    )
    no_op = _remote(_caught(), replica=0, op=None)
    assert no_op.summary() == (
        "rank 3 (stage 1), iteration 5: LinkFailure: link 1-2 (forward) has failed"
    )
    start_up = _remote(_caught(ValueError), replica=0, iteration=None, op=None)
    assert start_up.summary() == "rank 3 (stage 1) could not start: ValueError: boom"
    between = _remote(_caught(ValueError), replica=0, iteration=None, op=PLACING)
    assert between.summary() == (
        "rank 3 (stage 1), the move back to the default placement: ValueError: boom"
    )
    empty = dataclasses.replace(_remote(_caught(KeyError), op=None), message="")
    assert empty.summary().endswith("iteration 5: KeyError")


@pytest.mark.parametrize(
    ("err", "kind"),
    [
        (_caught(), WorkerLinkFailure),
        (_caught(_NicDown), WorkerLinkFailure),  # a subclass, known by its bases' names
        (_caught(TimeoutError), WorkerTimeout),
        (_caught(socket.timeout), WorkerTimeout),
        (_caught(ScheduleError), WorkerDeadlock),
        (_caught(DeadlockError), WorkerDeadlock),
        (_caught(ValueError), WorkerCrash),
        (_caught(ConnectionResetError), WorkerCrash),  # a broken connection, not a failed link
    ],
)
def test_worker_error_picks_the_subclass_from_the_remote_type(
    err: BaseException, kind: type[WorkerError]
) -> None:
    remote = _remote(err)
    error = worker_error(remote)
    assert type(error) is kind
    assert isinstance(error, WorkerError) and isinstance(error, AdaptraBenchError)
    assert error.remote is remote and error.rank == 3
    assert str(error) == remote.summary()


def test_the_traceback_is_a_note_and_an_attribute_never_in_the_message() -> None:
    remote = _remote(_caught())
    error = worker_error(remote)
    assert "\n" not in str(error) and "Traceback" not in str(error)
    assert error.traceback_text == remote.traceback_text
    assert error.__notes__ == [f"rank 3's traceback:\n{remote.traceback_text.rstrip()}"]
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is WorkerLinkFailure and str(again) == str(error)
    assert again.rank == 3 and again.remote == remote
    assert again.__notes__ == error.__notes__  # once, not twice


def test_a_death_has_no_report() -> None:
    crash = WorkerCrash("rank 1 (stage 1) exited with code -9 during iteration 0", rank=1)
    assert crash.remote is None and crash.traceback_text == ""
    assert not hasattr(crash, "__notes__")


def test_worker_error_is_importable_where_it_always_was() -> None:
    assert pipeline.runtime.WorkerError is WorkerError
    assert pipeline.runtime.pool.WorkerError is WorkerError
