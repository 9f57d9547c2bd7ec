import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from pipeline.signals import (
    HELD_SIGNALS,
    held_signals,
    raised_by_a_signal,
    redelivered_if_swallowed,
)


class _Handled(BaseException):
    pass


def _raising(signum: int, frame: object) -> None:
    raise _Handled(signum)


@pytest.fixture
def raising_handlers():  # type: ignore[no-untyped-def]
    previous = {signum: signal.signal(signum, _raising) for signum in HELD_SIGNALS}
    yield
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def test_a_signal_inside_is_handled_once_on_the_way_out(raising_handlers: None) -> None:
    reached = []
    with pytest.raises(_Handled) as info, held_signals():
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGHUP)  # the same again: still one shutdown
        reached.append("after the signals")
    assert reached == ["after the signals"]
    assert info.value.args == (signal.SIGHUP,)
    assert all(signal.getsignal(signum) is _raising for signum in HELD_SIGNALS)


def test_nothing_noted_means_nothing_raised_and_handlers_restored(raising_handlers: None) -> None:
    with held_signals():
        assert signal.getsignal(signal.SIGTERM) is not _raising  # held meanwhile
    assert all(signal.getsignal(signum) is _raising for signum in HELD_SIGNALS)


def test_an_ignored_signal_stays_ignored() -> None:
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with held_signals():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_outside_the_main_thread_it_holds_nothing(raising_handlers: None) -> None:
    seen = []

    def body() -> None:
        with held_signals():
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [_raising]


_FINALIZER_SIGNALS = textwrap.dedent("""
    import os, signal, time
    from pipeline.signals import redelivered_if_swallowed
    calls = []
    def handle(signum, frame):
        calls.append(signum)
        raise redelivered_if_swallowed(SystemExit(7), signum, lambda: calls.append("again"))
    signal.signal(signal.SIGUSR1, handle)
    class SignalsItself:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGUSR1)
            for _ in range(100):  # bytecode boundaries: the handler runs in here
                pass
    class FailsItself:
        def __del__(self):
            raise ValueError("a finalizer's own error")
    try:
        FailsItself()
        SignalsItself()
        time.sleep(10)
        print("went on", calls, flush=True)
    except SystemExit:
        print("caught", calls, flush=True)
        raise
""")


def test_a_handler_s_exception_swallowed_by_a_finalizer_is_raised_again_outside_it() -> None:
    """A handler that runs inside a `__del__` raised there, and Python printed "Exception
    ignored" and went on (the testbed and the CLI then ran on after SIGTERM): the signal is
    sent again and its handler's exception reaches the program; another finalizer's error
    is still reported as Python does."""
    out = subprocess.run(
        [sys.executable, "-c", _FINALIZER_SIGNALS], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 7
    assert out.stdout.splitlines() == [f"caught [{signal.SIGUSR1}, 'again', {signal.SIGUSR1}]"]
    assert "ValueError: a finalizer's own error" in out.stderr
    assert "SystemExit" not in out.stderr


_SIGNAL_WHILE_THE_HOOK_REPORTS = textwrap.dedent("""
    import os, signal, sys, time
    from pipeline.signals import catch_swallowed, redelivered_if_swallowed
    if sys.argv[1] == "python-hook":  # a hook set before (a library's, pytest's): Python code
        def report(unraisable):
            print("reported:", str(unraisable.exc_value), file=sys.stderr, flush=True)
        sys.unraisablehook = report
    calls = []
    def handle(signum, frame):
        calls.append(signum)
        raise redelivered_if_swallowed(SystemExit(7), signum, lambda: calls.append("again"))
    signal.signal(signal.SIGTERM, handle)
    catch_swallowed()  # with the handler, before any signal
    class Slow(Exception):
        def __str__(self):  # run by the hook as it reports
            os.kill(os.getpid(), signal.SIGTERM)  # the signal arrives while it reports
            for _ in range(100):  # bytecode boundaries: the handler runs in here
                pass
            return "a finalizer's own error"
    class FailsItself:
        def __del__(self):
            raise Slow()
    try:
        FailsItself()
        time.sleep(10)
        print("went on", calls, flush=True)
    except SystemExit:
        print("caught", calls, flush=True)
        raise
""")


@pytest.mark.parametrize(
    ("previous_hook", "reported"),
    [
        ("default", "Slow: a finalizer's own error"),
        ("python-hook", "reported: a finalizer's own error"),
    ],
)
def test_a_handler_s_exception_raised_while_the_hook_reports_another_error_is_raised_again(
    previous_hook: str, reported: str
) -> None:
    """A handler that ran while `sys.unraisablehook` reported another finalizer's error
    (here inside that error's `__str__`) raised there, and the hook dropped its exception:
    Python's own hook printed "<exception str() failed>", a hook set before let it out of
    the wrapper, which Python ignored; the program went on. With the hook wrapped where the
    handler is set (`catch_swallowed`) the signal is held while the earlier hook reports, then
    handled, its exception caught and the signal sent again; the report is whole."""
    out = subprocess.run(
        [sys.executable, "-c", _SIGNAL_WHILE_THE_HOOK_REPORTS, previous_hook],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 7
    assert out.stdout.splitlines() == [f"caught [{signal.SIGTERM}, 'again', {signal.SIGTERM}]"]
    assert reported in out.stderr.splitlines()
    assert "SystemExit" not in out.stderr and "failed" not in out.stderr


_SWALLOWED_AT_THE_END = textwrap.dedent("""
    import os, signal, sys
    from pipeline.signals import redelivered_if_swallowed, wait_for_redelivery
    sys.setswitchinterval(100)  # another thread runs only where this one waits (blocks)
    calls = []
    def handle(signum, frame):
        calls.append(signum)
        raise redelivered_if_swallowed(SystemExit(7), signum, lambda: calls.append("again"))
    signal.signal(signal.SIGUSR1, handle)
    class SignalsItself:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGUSR1)
            for _ in range(100):  # bytecode boundaries: the handler runs in here
                pass
    try:
        SignalsItself()  # the program's last act
        if sys.argv[1] == "wait":
            wait_for_redelivery()
    except SystemExit:
        print("caught", calls, flush=True)
        raise
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)  # its handler gone, as the CLI's at its end
""")


def test_a_signal_swallowed_as_the_program_ends_is_still_sent() -> None:
    """The signal was sent again from a daemon thread, which the interpreter's exit did not
    wait for: a program whose handler ran in a finalizer as it ended exited 0 (20 of 20).
    Now the exit waits for it: the signal, at its default by then, ends the process."""
    out = subprocess.run(
        [sys.executable, "-c", _SWALLOWED_AT_THE_END, "end"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == -signal.SIGUSR1
    assert (out.stdout, out.stderr) == ("", "")


def test_wait_for_redelivery_has_the_handler_run_where_it_is_called() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _SWALLOWED_AT_THE_END, "wait"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 7
    assert out.stdout.splitlines() == [f"caught [{signal.SIGUSR1}, 'again', {signal.SIGUSR1}]"]


_SCRIPT = """
import contextlib, pathlib, sys, time
from pipeline.signals import run_script

marker = pathlib.Path(sys.argv[1])

def main():
    if sys.argv[2] == "return":
        return 3
    with contextlib.ExitStack() as stack:
        stack.callback(marker.write_text, "cleaned up")
        try:
            print("started", flush=True)
            time.sleep(60)
        except BaseException as err:
            if sys.argv[2] == "wrapped":  # as a C extension's import meeting it does
                raise ImportError("initialization failed") from err
            raise

run_script(main)
"""


@pytest.mark.parametrize(
    ("signum", "line"),
    [
        (signal.SIGTERM, "terminated (SIGTERM)"),
        (signal.SIGHUP, "terminated (SIGHUP)"),
        (signal.SIGINT, "interrupted (SIGINT)"),
    ],
)
def test_run_script_ends_a_script_on_a_shutdown_signal_as_on_ctrl_c(
    tmp_path: "os.PathLike[str]", signum: int, line: str
) -> None:
    """A script run by `run_script` (every benchmark's entry point) unwinds its context
    managers on SIGTERM, SIGHUP and SIGINT (started ignored too, as a background job's
    SIGINT), prints one line and exits 128 + the signal; else it exits with what `main`
    returned."""
    marker = os.path.join(tmp_path, "marker")
    command = [sys.executable, "-c", _SCRIPT, marker]
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by the child
    try:
        child = subprocess.Popen(
            [*command, "wait"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    finally:
        signal.signal(signal.SIGINT, ignored)
    try:
        assert child.stdout is not None and child.stdout.readline() == "started\n"
        child.send_signal(signum)
        _, err = child.communicate(timeout=60)  # a hang bound, not a timing
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert (child.returncode, err) == (128 + signum, line + "\n")
    with open(marker) as cleaned:
        assert cleaned.read() == "cleaned up"
    returned = subprocess.run([*command, "return"], capture_output=True, text=True, timeout=60)
    assert (returned.returncode, returned.stderr) == (3, "")


def test_run_script_ends_by_a_signal_that_code_it_met_turned_into_another_error(
    tmp_path: "os.PathLike[str]",
) -> None:
    """The handler's exception met by code that raises another from it (a C extension's
    import: `ImportError: initialization failed`): the script still ends as the signal
    ends it, not with that error's traceback."""
    marker = os.path.join(tmp_path, "marker")
    child = subprocess.Popen(
        [sys.executable, "-c", _SCRIPT, marker, "wrapped"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline() == "started\n"
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=60)  # a hang bound, not a timing
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert (child.returncode, err) == (128 + signal.SIGTERM, "terminated (SIGTERM)\n")


def test_an_error_raised_from_a_signal_s_exception_is_the_signal() -> None:
    """What the command line takes for the signal: an error raised from the handler's own
    (marked) exception, however deep; not one merely raised while it was handled (a
    cleanup's bug on the way out stays a bug), nor any other."""
    stop = redelivered_if_swallowed(KeyboardInterrupt(), signal.SIGINT)
    wrapped = ImportError("initialization failed")
    wrapped.__cause__ = stop
    outer = RuntimeError("again")
    outer.__cause__ = wrapped
    assert raised_by_a_signal(wrapped) is stop and raised_by_a_signal(outer) is stop
    cleanup = OSError("a cleanup's bug")
    cleanup.__context__ = stop
    assert raised_by_a_signal(cleanup) is None
    assert raised_by_a_signal(ImportError("a real one")) is None
    unmarked = ValueError()
    unmarked.__cause__ = KeyboardInterrupt()  # not the handler's
    assert raised_by_a_signal(unmarked) is None


_SECOND_SIGNAL_AS_IT_EXITS = """
import os, signal, sys
from pipeline.signals import Terminated, handled_shutdown
try:
    with handled_shutdown(put_back=False):
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()  # the handler raises here
except Terminated:
    print("terminated", flush=True)
os.kill(os.getpid(), signal.SIGHUP)  # a second signal as the program ends (atexit, teardown)
print("still ending", flush=True)
sys.exit(128 + signal.SIGTERM)
"""


_CALM_EXIT_THEN_A_SIGNAL = """
import os, signal
from pipeline.signals import handled_shutdown
with handled_shutdown(put_back=False):
    pass
os.kill(os.getpid(), signal.SIGHUP)
print("not reached")
"""


def test_a_second_signal_as_a_signal_s_shutdown_exits_does_not_end_it_by_its_own() -> None:
    """SIGTERM, then SIGHUP once the cleanups had run and the program was exiting: the
    defaults put back, the SIGHUP killed it (exit status -1, after "terminated (SIGTERM)"
    was said; 2 of 6 tries by hand). A shutdown on its way out leaves the signals ignored;
    a program that ends without one still gets the defaults (a signal then ends it)."""
    out = subprocess.run(
        [sys.executable, "-c", _SECOND_SIGNAL_AS_IT_EXITS],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (out.returncode, out.stdout, out.stderr) == (143, "terminated\nstill ending\n", "")
    calm = _CALM_EXIT_THEN_A_SIGNAL
    out = subprocess.run([sys.executable, "-c", calm], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (-signal.SIGHUP, "")
