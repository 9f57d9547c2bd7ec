import os
import signal
import threading

import pytest

from pipeline.signals import HELD_SIGNALS, held_signals


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
