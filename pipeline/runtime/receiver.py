"""Receiver threads: when each message really arrived.

gloo marks a posted receive (`irecv`) complete only inside a `wait()` on it: `is_completed()`
stays False however long ago the data came in. A compute thread that waits when its op needs a
message therefore learns when it asked, not when the message came. A `Receiver` is one thread
per neighbour that waits on that neighbour's receives in the order the neighbour sends them
(one TCP pair per neighbour delivers in order, so each wait returns as its message lands) and
stamps `time.monotonic()` as each wait returns. The compute thread takes a message with `take`,
which blocks on an event, never on gloo. A DP ring's receiver (`more`) is fed each bucket's
receives as they are posted (`add`) and lives for the whole all-reduce.

Limits: `take` gives up after its timeout counted from the op's ask, naming what it waited
for (None: no limit, for a wait that spans a peer's pipeline, the DP ring's first chunks:
pipeline.runtime.dp_ring); while it waits it calls its `check` every `CHECK_EVERY_S` (a
worker's look for a failure of its own sends: a sender delegate that found no NIC left),
which may raise. The
thread's own wait has no limit (`THREAD_WAIT_S`): it waits until the message comes, its
connection breaks or the process ends. A limit there, counted from the neighbour's previous
message (or the iteration's start), bounded the gap between a neighbour's consecutive
messages, which long healthy ops between them make as long as they like (two stages busy
with 3 s W ops under a 1 s timeout failed while no op waited more than 0.2 s), not any op's
wait; and gloo, when a wait times out, closes every connection of its process, so the
thread cannot wait in slices either. A neighbour silent for good is found by the op that
asks for its message (`take`'s timeout), by `finish` at the end of the iteration, or, where
no worker's own limit ends a wait, by the pool's bound on a time without progress
(pipeline.runtime.pool). The first error ends the thread; every message not yet received
then raises that error in whoever takes it, and `finish` raises it at the end of the
iteration.

Over gloo the stamp is never early. It is late by the thread's wake-up once gloo's own thread
has read the message, plus the wait for the GIL once awake: next to nothing while the compute
thread sleeps or runs GIL-free code (gloo sends, torch ops), about the interpreter's switch
interval while it runs Python (workers set 0.5 ms, `worker.SWITCH_INTERVAL_S`; Python's default
is 5 ms); and on a loaded machine, any time the OS keeps the thread off a core (BENCHMARKS.md,
"Runtime: how late a message's arrival is stamped"). Over NCCL, which no pool takes
(`devices.WHY_NOT_NCCL`), `wait()` only makes a CUDA stream wait unless
TORCH_NCCL_BLOCKING_WAIT=1, so stamps would come early.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from pipeline.errors import ScheduleError
from pipeline.runtime.transport import (
    ACTIVATION,
    Arrival,
    PendingReceive,
    describe,
    describe_chunk,
)

__all__ = ["CHECK_EVERY_S", "THREAD_WAIT_S", "Receiver", "wait_checking"]

THREAD_WAIT_S = 30 * 24 * 3600.0
"""The limit the thread gives its wait for a message: 30 days, none in practice (the
module's docstring: why it has none). It must be given: gloo's wait without one (or with 0)
takes the process group's timeout (`init_process_group`'s: a pool's start-up bound)."""

CHECK_EVERY_S = 0.1
"""How often `take`, while it waits, calls its `check`."""


def wait_checking(
    pending: PendingReceive, timeout_s: float, check: Callable[[], None], what: str
) -> Arrival | None:
    """`pending.wait` for up to `timeout_s` in slices of `CHECK_EVERY_S`, calling `check`
    between them (which may raise), for a receive whose wait goes on after it timed out (a
    delegated one: a gloo wait's timeout closes its process's connections). TimeoutError
    naming `what` if nothing came."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return pending.wait(min(CHECK_EVERY_S, max(deadline - time.monotonic(), 0.0)))
        except TimeoutError as err:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{what} did not come within {timeout_s:g} s") from err
        check()


class _Slot:
    """One message's outcome, written once by the receiver thread, then `done` is set."""

    __slots__ = ("arrival", "done", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.arrival = Arrival(0.0)
        self.error: BaseException | None = None


class Receiver:
    """The thread that receives one neighbour's messages (all of one kind) in one iteration."""

    def __init__(
        self,
        peer: int,
        kind: int | None,
        receives: Sequence[tuple[int, PendingReceive]],
        *,
        more: bool = False,
        check: Callable[[], None] | None = None,
    ) -> None:
        """`receives`: (microbatch, its posted receive) in the order rank `peer` sends them
        (the thread waits on each without a limit: `THREAD_WAIT_S`). `kind` None: DP
        all-reduce chunks, by their index in place of a microbatch (pipeline.runtime.dp_ring).
        `more`: further receives come by `add` while the thread runs, until `finish`.
        `check`: called (by the thread that takes) while `take` waits."""
        self.peer, self.kind = peer, kind
        self._receives: list[tuple[int, PendingReceive]] = []
        self._slots: dict[int, _Slot] = {}
        self._check = check
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._posted = threading.Condition()
        """Guards `_receives`, `_slots` and `_closed` (`add` appends while the thread reads)."""
        self._closed = False
        what = {None: "all-reduce chunks", ACTIVATION: "activations"}.get(kind, "gradients")
        self.name = f"receiver of {what} from rank {peer}"
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self.add(receives)
        self._closed = not more

    def start(self) -> None:
        self._thread.start()

    def add(self, receives: Sequence[tuple[int, PendingReceive]]) -> None:
        """More receives, sent after those before (a receiver made with `more`)."""
        with self._posted:
            if self._closed:
                raise RuntimeError(f"the {self.name} takes no more receives")
            for microbatch, receive in receives:
                self._receives.append((microbatch, receive))
                self._slots[microbatch] = _Slot()
                if self._error is not None:  # the thread has stopped: these fail alike
                    self._fail(self._slots[microbatch], self._error)
            self._posted.notify()

    def take(self, microbatch: int, timeout_s: float | None) -> Arrival:
        """Block until the message of `microbatch` is here; when it arrived (monotonic s) and
        what copying it into its buffer took.

        Raises the exception the thread met receiving it (or an earlier message: the thread
        stops at its first error), TimeoutError if nothing came within `timeout_s` (None: no
        limit), or ScheduleError if the peer's schedule never sends it."""
        if self.kind is None:
            what = describe_chunk(self.peer, microbatch)
        else:
            what = describe(self.peer, self.kind, microbatch)
        with self._posted:
            slot = self._slots.get(microbatch)
        if slot is None:
            raise ScheduleError(f"{what} never comes: rank {self.peer}'s schedule does not send it")
        if not self._wait(slot, timeout_s):
            assert timeout_s is not None  # a wait without a limit ends only with the message
            raise TimeoutError(f"waiting for {what} failed: nothing came within {timeout_s:g} s")
        if slot.error is not None:
            raise slot.error
        return slot.arrival

    def _wait(self, slot: _Slot, timeout_s: float | None) -> bool:
        """Whether `slot` is done within `timeout_s` (None: it waits until it is), calling
        `check` as it waits."""
        if self._check is None:
            return slot.done.wait(timeout_s)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left_s = CHECK_EVERY_S if deadline is None else deadline - time.monotonic()
            if slot.done.wait(min(CHECK_EVERY_S, max(left_s, 0.0))):
                return True
            self._check()
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def finish(self, timeout_s: float) -> None:
        """Join the thread once every message is in (no more come by `add`). Raises
        TimeoutError if it still waits after `timeout_s`, or the error it stopped at (a
        message sent but never taken)."""
        self._close()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"the {self.name} still waits after {timeout_s:g} s")
        if self._error is not None:
            raise self._error

    def stop(self, grace_s: float) -> bool:
        """Let the thread end after its current wait, and join it for up to `grace_s`. False
        if it still waits (a wait without a limit, on a message that may never come: a daemon
        thread, it cannot keep the process alive)."""
        self._stop.set()
        self._close()
        if self._thread.ident is not None:  # started
            self._thread.join(grace_s)
        return not self._thread.is_alive()

    def _close(self) -> None:
        with self._posted:
            self._closed = True
            self._posted.notify()

    def _next(self, num_done: int) -> tuple[int, PendingReceive] | None:
        """The receive after the first `num_done`, once it is posted; None once no more come."""
        with self._posted:
            while num_done == len(self._receives) and not self._closed:
                self._posted.wait()
            return self._receives[num_done] if num_done < len(self._receives) else None

    @staticmethod
    def _fail(slot: _Slot, err: BaseException) -> None:
        slot.error = err
        slot.done.set()

    def _run(self) -> None:
        num_done = 0
        try:
            while (posted := self._next(num_done)) is not None:
                if self._stop.is_set():
                    raise RuntimeError(f"the {self.name} was stopped")
                microbatch, receive = posted
                stamped = receive.wait(THREAD_WAIT_S)
                slot = self._slots[microbatch]
                slot.arrival = stamped or Arrival(time.monotonic())
                slot.done.set()
                num_done += 1
        except BaseException as err:  # handed to whoever takes a message not received
            with self._posted:
                self._error = err
                for microbatch, _ in self._receives[num_done:]:
                    self._fail(self._slots[microbatch], err)
