"""The receiver thread on its own, over stand-in receives (no processes, no gloo)."""

import threading
import time
from collections.abc import Iterator
from typing import ClassVar

import pytest

from pipeline.errors import ScheduleError
from pipeline.runtime.receiver import THREAD_WAIT_S, Receiver, wait_checking
from pipeline.runtime.transport import ACTIVATION, GRADIENT


class _Receive:
    """A posted receive that completes when the test says so (or fails with `error`)."""

    made: ClassVar[list["_Receive"]] = []
    """Every one made in the running test (`_no_receiver_left` releases them)."""

    def __init__(self, error: Exception | None = None) -> None:
        _Receive.made.append(self)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.error = error
        self.returned_s: float | None = None

    def wait(self, timeout_s: float) -> None:
        self.entered.set()
        if self.error is not None:
            raise self.error
        if not self.release.wait(timeout_s):
            raise TimeoutError("stand-in receive timed out")
        self.returned_s = time.monotonic()


def _receiver_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("receiver of ")]


@pytest.fixture(autouse=True)
def _no_receiver_left(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A test that fails midway leaves no thread waiting (the next tests assert that none
    runs): every stand-in receive it made is released, every receiver it started stopped."""
    started: list[Receiver] = []
    start = Receiver.start

    def recorded(receiver: Receiver) -> None:
        started.append(receiver)
        start(receiver)

    monkeypatch.setattr(Receiver, "start", recorded)
    _Receive.made.clear()
    try:
        yield
    finally:
        for receive in _Receive.made:
            receive.release.set()
        _Receive.made.clear()
        for receiver in started:
            receiver.stop(grace_s=10)


def test_a_message_is_stamped_when_it_arrives_not_when_it_is_taken() -> None:
    first, second = _Receive(), _Receive()
    receiver = Receiver(3, GRADIENT, [(0, first), (1, second)])
    receiver.start()
    first.release.set()
    # The thread waits on the next receive only after it has stamped the first one.
    assert second.entered.wait(10)
    asked_s = time.monotonic()
    arrived_s = receiver.take(0, timeout_s=10).arrived_s
    assert first.returned_s is not None
    assert first.returned_s <= arrived_s < asked_s
    second.release.set()
    assert receiver.take(1, timeout_s=10).arrived_s >= arrived_s
    receiver.finish(timeout_s=10)
    assert receiver.name == "receiver of gradients from rank 3"
    assert receiver.name not in [t.name for t in _receiver_threads()]


def test_the_thread_s_error_reaches_the_taker_with_its_type_and_message() -> None:
    error = ConnectionResetError("waiting for the link failed: Connection closed by peer")
    receives = [(0, _Receive()), (2, _Receive(error)), (1, _Receive())]
    receives[0][1].release.set()
    receiver = Receiver(0, ACTIVATION, receives)
    receiver.start()
    receiver.take(0, timeout_s=10)
    for microbatch in (2, 1):  # the failed one, and one after it the thread never waited on
        with pytest.raises(ConnectionResetError, match="Connection closed by peer") as caught:
            receiver.take(microbatch, timeout_s=10)
        assert caught.value is error
    assert not receives[2][1].entered.is_set()
    with pytest.raises(ConnectionResetError):  # the end of the iteration says so too
        receiver.finish(timeout_s=10)
    assert not _receiver_threads()


def test_an_error_no_op_took_still_ends_the_iteration_with_it() -> None:
    receiver = Receiver(0, ACTIVATION, [(0, _Receive(TimeoutError("gloo timed out")))])
    receiver.start()
    with pytest.raises(TimeoutError, match="gloo timed out"):
        receiver.finish(timeout_s=10)


def test_a_message_never_sent_and_one_that_does_not_come_are_named() -> None:
    stuck, later = _Receive(), _Receive()
    receiver = Receiver(1, ACTIVATION, [(0, stuck), (1, later)])
    receiver.start()
    with pytest.raises(ScheduleError, match="activation of microbatch 5 from rank 1 never comes"):
        receiver.take(5, timeout_s=10)
    with pytest.raises(
        TimeoutError,
        match=r"^waiting for the activation of microbatch 0 from rank 1 failed: nothing came "
        r"within 0.05 s$",
    ):
        receiver.take(0, timeout_s=0.05)
    with pytest.raises(TimeoutError, match="the receiver of activations from rank 1 still waits"):
        receiver.finish(timeout_s=0.05)
    assert not receiver.stop(grace_s=0.05)  # still inside its wait on microbatch 0
    stuck.release.set()
    assert receiver.stop(grace_s=10)  # and once that wait is over, it stops
    assert not later.entered.is_set()
    assert not _receiver_threads()


def test_stopping_a_receiver_never_started_is_fine() -> None:
    assert Receiver(0, GRADIENT, [(0, _Receive())]).stop(grace_s=1)


def test_receives_added_while_it_runs_are_waited_on_in_order_until_finish() -> None:
    """A ring's receiver (`more`): each bucket's receives come as the bucket before starts."""
    first, second, third = _Receive(), _Receive(), _Receive()
    receiver = Receiver(2, None, [(0, first)], more=True)
    receiver.start()
    first.release.set()
    arrived_s = receiver.take(0, timeout_s=10).arrived_s
    assert first.returned_s is not None and arrived_s >= first.returned_s
    receiver.add([(1, second), (2, third)])  # the thread was waiting for them
    second.release.set()
    third.release.set()
    assert receiver.take(2, timeout_s=10).arrived_s >= receiver.take(1, timeout_s=10).arrived_s
    assert second.returned_s is not None and third.returned_s is not None
    assert second.returned_s <= third.returned_s
    assert receiver.name in [t.name for t in _receiver_threads()]  # more may come
    receiver.finish(timeout_s=10)
    assert receiver.name == "receiver of all-reduce chunks from rank 2"
    assert not _receiver_threads()
    with pytest.raises(RuntimeError, match="takes no more receives"):
        receiver.add([(3, _Receive())])


def test_an_error_fails_the_receives_added_after_it_and_stop_ends_a_waiting_thread() -> None:
    error = ConnectionResetError("Connection closed by peer")
    failed = Receiver(0, None, [(0, _Receive(error))], more=True)
    failed.start()
    with pytest.raises(ConnectionResetError):
        failed.take(0, timeout_s=10)
    failed.add([(1, _Receive())])
    with pytest.raises(ConnectionResetError) as caught:
        failed.take(1, timeout_s=10)
    assert caught.value is error
    with pytest.raises(ConnectionResetError):
        failed.finish(timeout_s=10)
    idle = Receiver(1, None, [], more=True)
    idle.start()  # waits for receives that never come
    assert idle.stop(grace_s=10)
    assert not _receiver_threads()


def test_the_thread_s_wait_has_no_limit_so_an_op_s_wait_gives_up_first() -> None:
    """The thread's wait bounds no op's wait: a limit on it would bound the gap between a
    neighbour's consecutive messages (from the previous one's arrival), which long healthy ops
    make as long as they like; and gloo closes every connection of a process whose wait times
    out. It names a limit all the same (gloo's wait without one takes the process group's
    timeout), one that never ends it first: an op waiting on a silent neighbour reports the
    timeout itself while the thread still waits, and a message that comes later is taken."""

    class _Timed(_Receive):
        def wait(self, timeout_s: float) -> None:
            self.timeout_s = timeout_s
            super().wait(timeout_s)

    silent = _Timed()
    receiver = Receiver(0, ACTIVATION, [(0, silent)])
    receiver.start()
    assert silent.entered.wait(10)
    assert silent.timeout_s == THREAD_WAIT_S >= 30 * 24 * 3600  # days: no limit in practice
    with pytest.raises(TimeoutError, match="nothing came within 0.2 s"):
        receiver.take(0, timeout_s=0.2)  # (an op's wait is the worker's timeout)
    silent.release.set()  # the thread was still waiting: the message is taken after all
    assert receiver.take(0, timeout_s=10).arrived_s > 0
    receiver.finish(timeout_s=10)


def test_a_wait_ends_with_what_its_check_raises() -> None:
    """The check (a worker's look for a sender delegate with no NIC left) is called while
    `take` waits, and its error, not the wait's timeout, ends the wait; a message already
    in is taken without calling it."""
    calls: list[float] = []

    def check() -> None:
        calls.append(time.monotonic())
        if len(calls) == 3:
            raise ConnectionAbortedError("the sender delegate found no NIC left")

    here, never = _Receive(), _Receive()
    here.release.set()
    receiver = Receiver(1, ACTIVATION, [(0, here), (1, never)], check=check)
    receiver.start()
    assert never.entered.wait(10)
    receiver.take(0, timeout_s=600)
    assert calls == []
    with pytest.raises(ConnectionAbortedError, match="no NIC left"):
        receiver.take(1, timeout_s=600)
    assert len(calls) == 3
    never.release.set()
    receiver.finish(timeout_s=10)


def test_a_take_without_a_limit_waits_for_its_message_checking_all_the_while() -> None:
    """The DP ring's first chunks, whose wait spans the peer replicas' pipelines: `take`
    with no limit waits until the message comes, calling its check as it waits (its error
    would end the wait); without a check it waits on the message alone."""
    late = _Receive()
    calls: list[int] = []

    def check() -> None:
        calls.append(1)
        if len(calls) == 5:  # the message comes while the take is checking
            late.release.set()

    receiver = Receiver(1, None, [(0, late)], check=check)
    receiver.start()
    arrival = receiver.take(0, timeout_s=None)
    assert late.returned_s is not None and arrival.arrived_s >= late.returned_s
    assert len(calls) >= 5
    receiver.finish(timeout_s=10)
    quiet = _Receive()
    unchecked = Receiver(1, None, [(0, quiet)])
    unchecked.start()
    assert quiet.entered.wait(10)
    releasing = threading.Timer(0.2, quiet.release.set)
    releasing.start()
    assert unchecked.take(0, timeout_s=None).arrived_s >= 0
    releasing.join()
    unchecked.finish(timeout_s=10)


class _Resumable:
    """A delegated receive's wait: it times out `num_timeouts` times, then the message is in
    (or it never is); each timed-out wait may be followed by another."""

    def __init__(self, num_timeouts: int | None) -> None:
        self.num_timeouts, self.waits = num_timeouts, 0

    def wait(self, timeout_s: float) -> None:
        self.waits += 1
        if self.num_timeouts is None or self.waits <= self.num_timeouts:
            time.sleep(timeout_s)
            raise TimeoutError(f"nothing within {timeout_s:g} s")


def test_a_resumable_wait_checks_between_its_slices_and_names_what_never_came() -> None:
    checks: list[int] = []
    pending = _Resumable(num_timeouts=2)
    assert wait_checking(pending, 600.0, lambda: checks.append(1), "the gradient") is None
    assert (pending.waits, len(checks)) == (3, 2)

    def stranded() -> None:
        raise ConnectionAbortedError("no NIC left")

    with pytest.raises(ConnectionAbortedError, match="no NIC left"):
        wait_checking(_Resumable(num_timeouts=None), 600.0, stranded, "the gradient")
    with pytest.raises(
        TimeoutError, match=r"^the tied weight's gradient did not come within 0.3 s"
    ):
        wait_checking(
            _Resumable(num_timeouts=None), 0.3, lambda: None, "the tied weight's gradient"
        )
