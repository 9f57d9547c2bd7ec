"""The signals that end a run: handled as Ctrl-C is (`handled_shutdown`: every context
manager unwinds; `run_script`, a script's entry point), a way to hold them over the few lines
between starting a process and recording it (so that whatever unwinds on the signal can stop
it), and a way for a handler's exception not to be lost in a finalizer
(`redelivered_if_swallowed`)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, NoReturn, TypeVar

__all__ = [
    "HELD_SIGNALS",
    "Terminated",
    "catch_swallowed",
    "handled_shutdown",
    "held_signals",
    "raised_by_a_signal",
    "redelivered_if_swallowed",
    "run_script",
    "say_ending",
    "shutdown_handler",
    "sigint_blocked",
    "signals_unwrapped",
    "wait_for_redelivery",
]

_E = TypeVar("_E", bound=BaseException)
_MARK = "_adaptra_signal"
"""The attribute that marks a handler's exception: (its signal, what to do if swallowed)."""

HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that end a run, each the way Ctrl-C (SIGINT) does: every context manager
unwinds (worker pools, temporary files, namespaces), one line, exit status 128 + the signal.
They are handled even where the process inherited them ignored (`nohup`'s SIGHUP, a
background job's SIGINT)."""


class Terminated(BaseException):
    """A shutdown signal arrived (a BaseException, like KeyboardInterrupt: nothing catches
    it on the way out but the cleanups)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def shutdown_handler(
    owner_pid: int, under_way: list[int] | None = None
) -> Callable[[int, FrameType | None], None]:
    """The handler of `HELD_SIGNALS`: the first raises KeyboardInterrupt or
    `Terminated`; every later one is ignored while that exception is on its way out (one
    shutdown: a second signal, Ctrl-C's too, must not cut its cleanups short). One that a
    finalizer swallows (`redelivered_if_swallowed`) did not start the shutdown: its signal
    is sent again and handled as a first. `under_way`: where it keeps the signal whose
    exception is on its way out (empty: none), for the caller to read."""
    if under_way is None:
        under_way = []

    def handle(signum: int, frame: FrameType | None) -> None:
        if os.getpid() != owner_pid:  # a forked helper (pyroute2 forks some): it just dies
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if under_way:
            return
        under_way.append(signum)
        err = KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)
        raise redelivered_if_swallowed(err, signum, on_swallowed=under_way.clear)

    return handle


@contextlib.contextmanager
def handled_shutdown(put_back: bool = True) -> Iterator[None]:
    """Within, `HELD_SIGNALS` end the program as Ctrl-C does
    (`shutdown_handler`), SIGINT too where the process started with it ignored, as a shell
    starts a script's background job (there too `kill -INT` ends it, after every cleanup).
    After it, the handlers before are put back, or with `put_back` False the defaults (a
    program that ends there: a signal then ends it by that signal), but where a signal's
    shutdown is on its way out: then ignored, so that a second signal as the interpreter
    exits does not end it by its own (its exit status and its line are the first's)."""
    under_way: list[int] = []
    handler = shutdown_handler(os.getpid(), under_way)
    catch_swallowed()  # before the first signal, which may come as a finalizer's error is reported
    previous = {signum: signal.signal(signum, handler) for signum in HELD_SIGNALS}
    try:
        yield
    finally:
        after = signal.SIG_IGN if under_way else signal.SIG_DFL
        for signum, earlier in previous.items():
            signal.signal(signum, earlier if put_back else after)


def run_script(main: Callable[[], int | None]) -> NoReturn:
    """A script's entry point (the benchmarks'): `main()`, its return its exit status (None:
    0). SIGINT, SIGTERM and SIGHUP end it as Ctrl-C does: every context manager unwinds
    (worker pools, delegates, shared memory, namespaces), one line on stderr, exit status 128
    + the signal."""
    try:
        with handled_shutdown(put_back=False), signals_unwrapped():
            status = main()
            # A signal a finalizer swallowed as `main` ended is handled here, as one not
            # swallowed is.
            wait_for_redelivery()
    except KeyboardInterrupt:
        say_ending("interrupted (SIGINT)")
        sys.exit(128 + signal.SIGINT)
    except Terminated as err:
        say_ending(f"terminated ({err})")
        sys.exit(128 + err.signum)
    sys.exit(status or 0)


def say_ending(line: str) -> None:
    """A shutdown signal's one line on stderr, where stderr still goes: a closed terminal
    (its SIGHUP) or a pipe whose reader the Ctrl-C ended too (`2>&1 | tee log`) made the
    write fail (EIO, EPIPE), and that error ended the program with exit status 1, not 128 +
    the signal. stderr then goes to /dev/null: Python's flush of it at exit fails too."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (open until the process ends)


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """Within, a shutdown signal is noted, not handled; on the way out each noted one is
    raised again, once, so that its own handler runs after the block. Only the main thread
    handles signals, so elsewhere this holds nothing (and needs not: there a signal's
    handler never runs in the middle of the block)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        if signum not in noted:
            noted.append(signum)

    previous: dict[signal.Signals, Any] = {}
    for held in HELD_SIGNALS:
        handler = signal.getsignal(held)
        if handler is not None and handler != signal.SIG_IGN:  # None: set outside Python
            previous[held] = signal.signal(held, note)
    try:
        yield
    finally:
        # Blocked while the handlers go back, so that none runs with only some restored.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
        try:
            for held, handler in previous.items():
                signal.signal(held, handler)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for signum in noted:
            signal.raise_signal(signum)


@contextlib.contextmanager
def sigint_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread within (one that arrives is handled after, not lost);
    a process started within inherits the block through its exec: one that ignores SIGINT
    once it has started (a userspace wire, the workers' fork server) is not ended by a
    terminal's Ctrl-C during its start, which prints a KeyboardInterrupt traceback."""
    from multiprocessing import resource_tracker

    # A spawn starts multiprocessing's resource tracker first if it is not running, and
    # that start unblocks SIGINT as it ends: started here, before the block, it keeps it.
    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def redelivered_if_swallowed(
    exc: _E, signum: int, on_swallowed: Callable[[], None] | None = None
) -> _E:
    """`exc`, which `signum`'s handler is about to raise, marked so that it is not lost: a
    handler runs at the next bytecode boundary, which may be inside a finalizer (a `__del__`,
    a weakref callback: pyroute2 drops an asyncio loop and forks a helper per namespace
    opened), and Python swallows an exception raised there ("Exception ignored in ...").
    Where that happens to `exc`, `sys.unraisablehook` (wrapped by `catch_swallowed`, here
    too if it is not yet) calls `on_swallowed` and has `signum` sent to this process again
    once the hook has returned (`_send_later`): its handler runs again at a later boundary,
    normally outside any finalizer (where not, the same happens again)."""
    setattr(exc, _MARK, (signum, on_swallowed))
    catch_swallowed()
    return exc


def raised_by_a_signal(err: BaseException) -> BaseException | None:
    """The exception a shutdown signal's handler raised (`shutdown_handler`'s, marked) that
    `err` was raised from (its `__cause__` chain), else None: a C extension's import that met
    the handler's KeyboardInterrupt raises `ImportError: initialization failed` from it
    (matplotlib's, pybind11's), which is the signal, not a bug. An error merely raised while
    handling one (a cleanup's, on the way out) is not: it stays an error."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if getattr(cause, _MARK, None) is not None:
            return cause
        seen.add(id(cause))
        cause = cause.__cause__
    return None


@contextlib.contextmanager
def signals_unwrapped() -> Iterator[None]:
    """Within, an error raised from a shutdown signal's own exception (`raised_by_a_signal`)
    comes out as that exception, to be handled as the signal is (a Ctrl-C that met a C
    extension's import ended a command as an "internal error")."""
    try:
        yield
    except Exception as err:
        if (stop := raised_by_a_signal(err)) is None:
            raise
        raise stop from None


def catch_swallowed() -> None:
    """Wrap `sys.unraisablehook` (once) so that a handler's exception that a finalizer
    swallows is raised again (`redelivered_if_swallowed`). Call it where the handler is
    installed: the hook may be reporting when the first signal comes, and there, as in a
    finalizer, the handler's exception would be lost. The wrapper hands every other
    unraisable exception to the hook that was there before, with the shutdown signals held
    meanwhile (`held_signals`): a handler that raises a marked exception while that hook
    runs (it formats the exception, calls its `__str__`, writes to stderr) then raises it
    at the end, in the wrapper, which catches it as it catches a swallowed one."""
    if not getattr(sys.unraisablehook, _MARK, False):
        sys.unraisablehook = _redelivering(sys.unraisablehook)


def wait_for_redelivery() -> None:
    """Return once every signal to be sent again (its handler's exception was swallowed:
    `_send_later`) is sent; in the main thread its handler runs meanwhile or at the next
    bytecode boundary (this loop's jump back is one), and its exception comes out of here.
    Call it where a program ends while its handlers are still set, so that a signal
    swallowed just before is handled as one that was not (else it is sent, at the latest,
    as the interpreter exits, to whatever handler is there then)."""
    for thread in list(_sending):
        thread.join()


def _redelivering(
    previous: Callable[[sys.UnraisableHookArgs], object],
) -> Callable[[sys.UnraisableHookArgs], None]:
    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        try:
            exc = unraisable.exc_value
            if getattr(exc, _MARK, None) is None:
                with held_signals():  # a handler that ran meanwhile raises at the end here
                    previous(unraisable)
                return
        except BaseException as err:  # a handler ran in here: its exception is not lost
            if getattr(err, _MARK, None) is None:
                raise
            exc = err
        while True:
            signum, on_swallowed = getattr(exc, _MARK)
            try:
                if on_swallowed is not None:
                    on_swallowed()
                _send_later(signum)
                return
            except BaseException as err:  # a handler ran in here (another signal): its too
                if getattr(err, _MARK, None) is None:
                    raise
                exc = err

    setattr(hook, _MARK, True)
    return hook


_sending: set[threading.Thread] = set()
"""The threads of `_send_later` that have not yet sent their signal."""


def _send_later(signum: int) -> None:
    """`signum` to this process from a thread of its own, after this call: sent here, its
    handler would run at the next bytecode boundary, still inside the hook, and its
    exception would be swallowed again ("Exception ignored in sys.unraisablehook"). The
    thread waits for the gate, released last here, and then for the GIL, which this thread
    keeps until it next yields it (a blocking call, or after its switch interval). It is
    not a daemon: where the program ends first, the interpreter's exit waits for it, so
    the signal is sent then (a daemon thread never ran again, and the process exited 0)."""
    gate = threading.Lock()
    gate.acquire()

    def send() -> None:
        try:
            with gate:
                pass
            os.kill(os.getpid(), signum)  # process-directed: a thread not blocking it takes it
        finally:
            _sending.discard(threading.current_thread())

    thread = threading.Thread(target=send, name="adaptra-signal-again")
    _sending.add(thread)
    try:
        thread.start()
    finally:  # even where a handler raised in start(): else the exit would wait forever
        if thread.ident is None:  # not started
            _sending.discard(thread)
        gate.release()
