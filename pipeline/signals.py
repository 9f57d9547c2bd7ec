"""The signals that end a run, and a way to hold them over the few lines between starting a
process and recording it (so that whatever unwinds on the signal can stop it)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

__all__ = ["HELD_SIGNALS", "held_signals"]

HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that end a run (the harness unwinds every context manager on each)."""


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
