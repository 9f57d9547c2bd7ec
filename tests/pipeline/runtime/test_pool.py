"""The runtime with real processes and real gloo traffic (emulated compute: sleeps)."""

import contextlib
import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, ClassVar

import numpy as np
import pytest
import torch

from adaptra.generator import generate_schedule
from adaptra.transport import Delegates
from adaptra.transport.delegated import DelegateTransport
from baselines import one_f_one_b, zb_h2
from injectors.fault_files import parse_yaml
from pipeline.link_rates import NO_RATES
from pipeline.metrics import compute_metrics
from pipeline.ops import Op, OpKind
from pipeline.profile import Profile
from pipeline.runtime import (
    EmulatedCompute,
    IterationConfig,
    WorkerCrash,
    WorkerDeadlock,
    WorkerError,
    WorkerLinkFailure,
    WorkerPool,
    WorkerTimeout,
)
from pipeline.runtime import pool as pool_module
from pipeline.runtime.config import StepOutput
from pipeline.runtime.devices import RankDevices
from pipeline.runtime.hooks import local_launch
from pipeline.runtime.pool import BACKSTOP, BACKSTOP_GRACE_S
from pipeline.runtime.transport import DelegateSetup
from pipeline.runtime.worker import worker_main
from pipeline.schedule import Schedule
from pipeline.simulator import CommMode, simulate
from pipeline.topology import Link, Position, Topology
from pipeline.trace import to_chrome_trace
from tests.fidelity import HANG

pytestmark = pytest.mark.multiprocess

MB = 1 << 20


def test_one_pool_runs_several_schedules_and_delays_without_restarting() -> None:
    profile = Profile.uniform(4, 12, 10, 10, 10, message_bytes=MB)
    schedules = [
        one_f_one_b(profile),
        zb_h2(profile),
        generate_schedule(profile, [9, 5, 3, 1], cap_in_flight=True),
    ]
    assert schedules[2].warmup_counts() == (9, 5, 3, 1)
    delays = [0.0, 15.0, 30.0]
    ratios = []
    with WorkerPool(4, timeout_s=60) as pool:
        pids = list(pool.pids)
        assert len(set(pids)) == 4 and os.getpid() not in pids
        # gloo connects each pair of ranks on first use: a warm-up iteration pays for that.
        pool.run_iteration(IterationConfig(0, schedules[0], profile))
        for iteration, (schedule, delay) in enumerate(zip(schedules, delays, strict=True), 1):
            delayed = profile.with_delays([delay, 0.0, 0.0])
            timeline = pool.run_iteration(IterationConfig(iteration, schedule, delayed))
            assert pool.pids == pids  # the same processes
            assert len(timeline.ops) == sum(len(ops) for ops in schedule.stages)
            assert len(timeline.messages) == 2 * 12 * 3
            assert {m.num_bytes for m in timeline.messages} == {MB}
            slow = [m for m in timeline.messages if m.link == "0-1"]
            # The fault hook sleeps before each send on the slow link: the send takes that long.
            assert all(m.send_end_ms - m.send_start_ms >= delay for m in slow)
            measured = compute_metrics(timeline, iteration).iteration_time_ms
            predicted = compute_metrics(simulate(schedule, delayed, CommMode.DIRECT))
            # Never faster than the model (load only adds time); above it, slower only by the
            # runtime's own costs and load (BENCHMARKS.md measures the fidelity, within 5 % on
            # a quiet machine).
            assert predicted.iteration_time_ms <= measured, (measured, predicted)
            ratios.append(measured / predicted.iteration_time_ms)
        # The fastest of the three against the model (a preempted iteration cannot fail it),
        # each against a hang guard.
        assert min(ratios) < HANG and max(ratios) < 10 * HANG, ratios
        # Every message's MiB went through gloo (the workers count what their sends passed).
        assert pool.bytes_sent == 4 * 72 * MB
    assert not any(_alive(pid) for pid in pids)


def test_a_killed_worker_fails_the_run_clearly_and_leaves_no_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 1 is killed in the iteration, which cannot end without it: stage 2 stalls before
    its first gradient, which stage 1 waits for (a 1.2 s iteration went through whole where
    a loaded host ran the kill's timer, due at 0.3 s, late). Its exit status is named
    however late the fork server, which reaps it, reports it: the pool waits up to
    DEATH_GRACE_S for it (60 s here; a fork server held 2 s made it "ended without an
    answer" within the product's 1 s)."""
    monkeypatch.setattr(pool_module, "DEATH_GRACE_S", 60.0)  # read by the pool, at its wait
    profile = Profile.uniform(3, 6, 50, 50, 50)
    timeout_s = 120.0  # stage 1's wait for the stalled gradient: the kill comes within it
    config = IterationConfig(
        0, one_f_one_b(profile), profile, fault_hook=_StallBeforeGradient(0, 3600.0)
    )
    with WorkerPool(3, timeout_s=timeout_s) as pool:
        pids = list(pool.pids)
        victim = pids[1]
        threading.Timer(0.3, os.kill, (victim, signal.SIGKILL)).start()
        start = time.monotonic()
        with pytest.raises(WorkerCrash, match=r"rank 1 \(stage 1\) exited with code -9") as info:
            pool.run_iteration(config)
        assert time.monotonic() - start < timeout_s  # it did not wait for the timeout
    assert info.value.rank == 1 and info.value.remote is None  # a death: no report
    assert info.value.traceback_text == ""
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)


@dataclasses.dataclass(frozen=True)
class _DieSlowly:
    """A fault hook: the stage that sends the first gradient shuts its TCP connections down
    (its neighbour fails at once with "Connection closed by peer"), then exits 0.3 s later
    with status 7: the neighbour's error reaches the controller before the death does (after
    a SIGKILL it only sometimes does)."""

    def __call__(self, link: str, direction: str, *args: object) -> float:
        if direction != "backward":
            return 0.0
        for fd in os.listdir("/proc/self/fd"):
            try:
                sock = socket.socket(fileno=int(fd))
            except OSError:
                continue  # not a socket
            if sock.family in (socket.AF_INET, socket.AF_INET6):  # gloo's; not the pipe
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            sock.detach()
        time.sleep(0.3)
        os._exit(7)


def test_a_death_is_named_even_when_a_neighbour_s_error_comes_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pool waits up to DEATH_GRACE_S after a neighbour's "connection closed" for the
    death behind it. Here it waits far longer than the 0.3 s the dying stage takes, however
    late a loaded host runs it: what is tested is that the death is named, not the grace."""
    monkeypatch.setattr(pool_module, "DEATH_GRACE_S", 60.0)  # read by the pool, at its wait
    profile = Profile.uniform(2, 2, 1, 1, 1)
    with WorkerPool(2, timeout_s=20) as pool:
        pids = list(pool.pids)
        config = IterationConfig(0, one_f_one_b(profile), profile, fault_hook=_DieSlowly())
        # Status 7, or -6: gloo's own threads may abort the process on its shut sockets first.
        with pytest.raises(
            WorkerCrash, match=r"^rank 1 \(stage 1\) exited with code (7|-6) "
        ) as info:
            pool.run_iteration(config)
    assert info.value.rank == 1 and info.value.remote is None
    # What came first (rank 0's report, or rank 1's silent end) is kept as the cause.
    assert isinstance(info.value.__cause__, WorkerError)
    assert not any(_alive(pid) for pid in pids)


def test_a_message_the_peer_never_sends_fails_at_once_naming_the_op() -> None:
    """A stage whose schedule never sends what its neighbour takes in: no wait, an error."""
    profile = Profile.uniform(2, 2, 1, 1, 1)
    with WorkerPool(2, timeout_s=30) as pool:
        pids = list(pool.pids)
        good = one_f_one_b(profile)
        pool.run_iteration(IterationConfig(0, good, profile))
        # Stage 1's list lacks F1/BW1, so BW1's gradient never comes to stage 0.
        broken = Schedule((good.stages[0], good.stages[1][:2]))
        start = time.monotonic()
        with pytest.raises(
            WorkerDeadlock,
            match=r"^rank 0 \(stage 0\), iteration 1, op BW1: ScheduleError: the gradient of "
            r"microbatch 1 from rank 1 never comes: rank 1's schedule does not send it",
        ) as info:
            pool.run_iteration(IterationConfig(1, broken, profile))
        assert time.monotonic() - start < 30  # it did not wait for the timeout
    assert "\n" not in str(info.value)  # one line; the traceback is in the notes
    remote = info.value.remote
    assert remote is not None and remote.type_name == "pipeline.errors.ScheduleError"
    assert (remote.rank, remote.iteration, remote.op) == (0, 1, "BW1")
    assert not any(_alive(pid) for pid in pids)


def _profile(t_f_ms: float, t_b_ms: float, t_w_ms: float, stage_1_t_f_ms: float = 1.0) -> Profile:
    """Two stages, two microbatches, 1 KiB messages; stage 0's op times as given, stage 1's
    1 ms but its F."""
    return Profile(
        num_stages=2,
        num_microbatches=2,
        t_f_ms=(t_f_ms, stage_1_t_f_ms),
        t_b_ms=(t_b_ms, 1.0),
        t_w_ms=(t_w_ms, 1.0),
        message_bytes=1024,
    )


@dataclasses.dataclass(frozen=True)
class _StallBeforeGradient:
    """A fault hook: the sender of the gradient of `microbatch` sleeps `stall_s` first."""

    microbatch: int
    stall_s: float

    def __call__(
        self, link: str, direction: str, iteration: int, kind: str, m: int, *_: object
    ) -> float:
        if direction == "backward" and m == self.microbatch:
            time.sleep(self.stall_s)
            return self.stall_s * 1000.0
        return 0.0


def test_a_silent_peer_is_a_timeout_naming_the_op() -> None:
    """Stage 1 stalls 60 s before BW1's gradient. Stage 0 asks for it after its 0.2 s BW0 and
    gives up 2 s later (its receiver thread, whose wait has no limit, still waits), naming
    the op and the message. (The pool then ends stage 1 in its stall: the stall costs no
    time. At 6 s, a stage 0 whose op thread a loaded host held 4 s past its deadline found
    the gradient there, its receiver thread having run, and no timeout came.)"""
    profile = _profile(1.0, 100.0, 100.0)
    schedule = one_f_one_b(profile)
    assert schedule.stages[0][2:] == (Op(OpKind.BW, 0), Op(OpKind.BW, 1))
    with WorkerPool(2, timeout_s=2) as pool:
        pids = list(pool.pids)
        quick = _profile(1.0, 1.0, 1.0)
        pool.run_iteration(IterationConfig(0, schedule, quick))  # gloo connects the pair
        # Stage 1 stalls far past stage 0's timeout (ended in its stall by the pool's close).
        config = IterationConfig(1, schedule, profile, fault_hook=_StallBeforeGradient(1, 60.0))
        with pytest.raises(
            WorkerTimeout,
            match=r"^rank 0 \(stage 0\), iteration 1, op BW1: TimeoutError: waiting for the "
            r"gradient of microbatch 1 from rank 1 failed: nothing came within 2 s",
        ) as info:
            pool.run_iteration(config)
    remote = info.value.remote
    assert remote is not None and info.value.rank == 0
    assert (remote.type_name, remote.op) == ("builtins.TimeoutError", "BW1")
    assert not any(_alive(pid) for pid in pids)


@dataclasses.dataclass(frozen=True)
class _StallBefore:
    """A fault hook: the sender of each (direction, microbatch, stall_s) of `stalls` sleeps
    `stall_s` before it sends that message (on its compute thread: its next op waits too)."""

    stalls: tuple[tuple[str, int, float], ...]

    def __call__(
        self, link: str, direction: str, iteration: int, kind: str, m: int, *_: object
    ) -> float:
        for stalled, microbatch, stall_s in self.stalls:
            if (stalled, microbatch) == (direction, m):
                time.sleep(stall_s)
                return stall_s * 1000.0
        return 0.0


def test_a_neighbour_s_messages_far_apart_are_no_timeout_when_no_op_waits_long() -> None:
    """A receiver thread's wait had a limit, 2 x the timeout from the arrival of the
    neighbour's message before: two messages that far apart failed the iteration, however
    short the ops' waits. Stage 0 stalls 4.5 s before F1's activation, more than 2 x the 2 s
    timeout after F0's; stage 1, stalled 4 s before B0's gradient meanwhile, asks for F1's
    about 0.5 s before it comes, and stage 0 asks for B0's gradient about 0.5 s after it came:
    no op waits near the timeout (1.5 s to spare, by the stalls: a worker held up that long
    on a loaded host still waits less than the timeout), and the iteration runs. (One held
    longer starts a new pool, up to 3: the old receiver's limit failed every try.)"""
    profile = _profile(1.0, 1.0, 1.0)
    schedule = Schedule.from_text(
        [["F0", "F1", "B0", "W0", "B1", "W1"], ["F0", "B0", "W0", "F1", "B1", "W1"]]
    )
    timeout_s = 2.0
    hook = _StallBefore((("forward", 1, 4.5), ("backward", 0, 4.0)))
    for attempt in fresh_tries():
        with attempt, WorkerPool(2, timeout_s=timeout_s) as pool:
            config = IterationConfig(0, schedule, profile, fault_hook=hook)
            timeline = pool.run_iteration(config)
    assert len(timeline.ops) == 12
    messages = {(m.direction, m.microbatch): m for m in timeline.messages}
    assert sorted(messages) == [("backward", 0), ("backward", 1), ("forward", 0), ("forward", 1)]
    assert {key: m.fault_ms for key, m in messages.items() if m.fault_ms} == {
        ("forward", 1): 4500.0,
        ("backward", 0): 4000.0,
    }
    # F1's activation left at least its stall after F0's (the same thread sent both).
    first, second = messages["forward", 0], messages["forward", 1]
    assert second.arrival_ms - first.send_end_ms > 2 * timeout_s * 1000.0


def test_a_failed_link_is_a_link_failure_of_the_rank_that_sent() -> None:
    """Stage 0's first activation goes on a failed link: its rank reports the LinkFailure,
    the op and the fault hook's frame; its neighbour's broken connection comes later."""
    profile = _profile(1.0, 1.0, 1.0)
    down = parse_yaml('[{start_iteration: 0, links: ["0-1"], down: true}]').at(
        0, Topology(2), rates=NO_RATES
    )
    config = IterationConfig(0, one_f_one_b(profile), profile, faults=down)
    with WorkerPool(2, timeout_s=20) as pool:
        pids = list(pool.pids)
        started = time.monotonic()
        with pytest.raises(WorkerLinkFailure) as info:
            pool.run_iteration(config)
        took_ms = (time.monotonic() - started) * 1000.0
    err = info.value
    assert isinstance(err, WorkerError) and err.rank == 0
    assert str(err) == (
        "rank 0 (stage 0), iteration 0, op F0: LinkFailure: link pp0:0-1 (forward) has "
        "failed: the F message of microbatch 0 in iteration 0 cannot go"
    )
    remote = err.remote
    assert remote is not None
    assert (remote.rank, remote.stage, remote.replica, remote.iteration) == (0, 0, 0, 0)
    # How far into the iteration the message went: after F0 (1 ms), before the pool heard.
    assert remote.at_ms is not None and 1.0 <= remote.at_ms < took_ms
    assert remote.type_name == "pipeline.errors.LinkFailure"
    assert "builtins.ConnectionError" in remote.type_names
    # The worker's traceback, down to the hook that raised: an attribute and a note.
    assert "hooks.py" in err.traceback_text
    assert "raise LinkFailure(" in err.traceback_text
    assert any(err.traceback_text.rstrip() in note for note in err.__notes__)
    assert not any(_alive(pid) for pid in pids)


def test_a_failure_after_a_swap_names_the_stage_the_worker_plays() -> None:
    """Workers 0 and 1 exchange stages: the failed link's sender is worker 1, now stage 0."""
    profile = _profile(1.0, 1.0, 1.0)
    swapped = Topology(2).swapped(Position(0, 0), Position(1, 0))
    down = parse_yaml('[{start_iteration: 0, links: ["0-1"], down: true}]').at(
        0, swapped, rates=NO_RATES
    )
    with WorkerPool(2, timeout_s=20) as pool:
        pool.run_iteration(IterationConfig(0, one_f_one_b(profile), profile))
        config = IterationConfig(1, one_f_one_b(profile), profile, topology=swapped, faults=down)
        with pytest.raises(WorkerLinkFailure) as info:
            pool.run_iteration(config)
    assert str(info.value).startswith("rank 1 (stage 0), iteration 1, op F0: LinkFailure: ")
    assert info.value.remote is not None and info.value.remote.stage == 0


def test_a_worker_dead_between_iterations_is_named_at_the_next_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 1, killed, is seen dead (a zombie) before the next iteration; its exit status
    comes once the fork server has reaped it, and the pool waits up to DEATH_GRACE_S for it
    (60 s here: a fork server held 2 s, as a loaded host may, made the death "ended without
    an answer" within the product's 1 s)."""
    monkeypatch.setattr(pool_module, "DEATH_GRACE_S", 60.0)  # read by the pool, at its wait
    profile = _profile(1.0, 1.0, 1.0)
    config = IterationConfig(0, one_f_one_b(profile), profile)
    with WorkerPool(2, timeout_s=20) as pool:
        pool.run_iteration(config)
        os.kill(pool.pids[1], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _alive(pool.pids[1]) and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(WorkerCrash, match=r"^rank 1 \(stage 1\) exited with code -9 ") as info:
            pool.run_iteration(dataclasses.replace(config, iteration=1))
        assert info.value.rank == 1
        with pytest.raises(WorkerError, match="not running"):  # closed, not half-open
            pool.run_iteration(dataclasses.replace(config, iteration=2))


def test_an_iteration_cut_off_by_an_exception_ends_the_pool_not_the_next_iteration() -> None:
    """A signal handler's exception while the pool waits for an iteration's answers: those
    answers were still owed, and the next iteration took them for its own (its ops began
    before it did); the pool ends instead, every worker with it, and says so."""
    profile = Profile.uniform(2, 4, 250.0, 250.0, 250.0)  # some 3 s: cut off at 1 s

    class CutOff(Exception):
        pass

    def cut_off(signum: int, frame: object) -> None:
        raise CutOff

    config = IterationConfig(0, one_f_one_b(profile), profile)
    previous = signal.signal(signal.SIGALRM, cut_off)
    try:
        with WorkerPool(2, timeout_s=20) as pool:
            pids = pool.pids
            with pytest.raises(CutOff):
                signal.setitimer(signal.ITIMER_REAL, 1.0)
                pool.run_iteration(config)
            assert not [pid for pid in pids if _alive(pid)]
            with pytest.raises(WorkerError, match="not running"):
                pool.run_iteration(dataclasses.replace(config, iteration=1))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def interrupt_the_first_join(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The pool's first wait for its workers to end (`pool._join`) raises SIGINT as it
    begins; the list of the waits' limits, as they come."""
    import pipeline.runtime.pool as pool_module

    joins: list[float] = []
    real_join = pool_module._join

    def interrupted_join(processes: list, limit_s: float) -> None:
        joins.append(limit_s)
        if len(joins) == 1:
            signal.raise_signal(signal.SIGINT)  # Python's handler: a KeyboardInterrupt
        real_join(processes, limit_s)

    monkeypatch.setattr(pool_module, "_join", interrupted_join)
    return joins


def test_a_signal_while_the_pool_closes_waits_until_its_folders_are_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second Ctrl-C while the pool stops its workers cut the close short: the pool's
    folder and its delegates' slot folder stayed behind. The signal now comes after."""
    joins = interrupt_the_first_join(monkeypatch)
    pool = WorkerPool(2, delegates=Delegates(), num_delegates=1, timeout_s=20)
    pool.start()
    folders = [pool._tmpdir, pool._slot_dir]
    assert all(folder is not None and Path(folder).is_dir() for folder in folders)
    pids = pool.pids
    # Python's own SIGINT handler (a pytest-xdist worker starts with SIGINT ignored).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            pool.close()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert joins  # interrupted inside
    assert not [folder for folder in folders if Path(str(folder)).exists()]
    assert not [pid for pid in pids if _alive(pid)]


def test_delegates_without_a_delegate_count_are_refused_before_any_process_starts() -> None:
    pool = WorkerPool(2, delegates=Delegates())
    with pytest.raises(ValueError, match="num_delegates >= 1, not 0"):
        pool.start()
    assert pool.pids == [] and pool.exit_codes == []


class _BrokenBackward(EmulatedCompute):
    """A compute backend with a bug: stage 1's backward raises a plain ValueError."""

    def run(
        self, kind: OpKind, microbatch: int, inputs: torch.Tensor | None, profile: Profile
    ) -> torch.Tensor | None:
        if self._stage == 1 and kind is OpKind.BW:
            raise ValueError(f"a backend bug in {kind.value}{microbatch}")
        return super().run(kind, microbatch, inputs, profile)


class _BrokenSetup(EmulatedCompute):
    """A compute backend that cannot set itself up."""

    def setup(self, stage: int, num_stages: int, replica: int, devices: RankDevices) -> None:
        raise ValueError(f"no device for stage {stage}")


def test_a_bug_in_a_compute_backend_is_a_crash_with_its_type() -> None:
    profile = _profile(1.0, 1.0, 1.0)
    pool = WorkerPool(2, compute_factory=_BrokenBackward, timeout_s=20)
    with pool, pytest.raises(WorkerCrash) as info:
        pool.run_iteration(IterationConfig(0, one_f_one_b(profile), profile))
    err = info.value
    assert str(err) == "rank 1 (stage 1), iteration 0, op BW0: ValueError: a backend bug in BW0"
    assert err.rank == 1 and err.remote is not None
    assert err.remote.type_name == "builtins.ValueError" and err.remote.op == "BW0"
    assert "in run" in err.traceback_text  # the backend's frame


def test_a_worker_that_cannot_start_says_so() -> None:
    pool = WorkerPool(1, compute_factory=_BrokenSetup, timeout_s=20)
    with pytest.raises(WorkerCrash) as info:
        pool.start()
    assert str(info.value) == "rank 0 (stage 0) could not start: ValueError: no device for stage 0"
    remote = info.value.remote
    assert remote is not None and remote.iteration is None and remote.op is None
    assert remote.type_name == "builtins.ValueError"
    assert "in setup" in remote.traceback_text


class _Interrupted(BaseException):
    pass


def test_a_signal_while_a_worker_starts_still_ends_that_worker() -> None:
    """A shutdown signal inside a launch (a fork server slow to answer, under load) is handled
    once the started worker is recorded, so the unwinding pool stops it: left running, it
    waited out its rendezvous holding the controller's stderr (and on a testbed made its
    removed namespace anew)."""
    started = []

    def launch(rank: int, target, args):  # type: ignore[no-untyped-def]
        process = local_launch(rank, target, args)
        started.append(process)
        os.kill(os.getpid(), signal.SIGHUP)  # its handler would run here, before the return
        return process

    def interrupt(signum: int, frame: object) -> None:
        raise _Interrupted

    previous = signal.signal(signal.SIGHUP, interrupt)
    try:
        with pytest.raises(_Interrupted):
            WorkerPool(2, launch=launch, timeout_s=20).start()
    finally:
        signal.signal(signal.SIGHUP, previous)
        alive = [process for process in started if process.is_alive()]
        for process in alive:
            process.kill()
            process.join()
    assert len(started) == 1  # the signal came in the first launch, and ended the start
    assert not alive and started[0].exitcode is not None


def test_a_message_s_arrival_and_the_moment_it_is_needed_are_both_recorded() -> None:
    """Stage 1 spends 2 s on F0 while F1's activation has long arrived; stage 0 asks for
    BW0's gradient long before stage 1 sends it. Load only makes things later, so the test
    asserts orderings and at least half of each known gap: a loaded host may hold a
    worker, or the thread that stamps, for a second (at 400 ms, a 250 ms hold of stage 0
    failed it)."""
    profile = _profile(1.0, 1.0, 1.0, stage_1_t_f_ms=2000.0)
    schedule = one_f_one_b(profile)
    assert schedule.stages[1] == tuple(Op.parse(t) for t in ("F0", "BW0", "F1", "BW1"))
    with WorkerPool(2, timeout_s=30) as pool:
        quick = _profile(1.0, 1.0, 1.0)  # the same schedule, without the 2 s F0
        pool.run_iteration(IterationConfig(0, schedule, quick))  # gloo connects the pair
        timeline = pool.run_iteration(IterationConfig(1, schedule, profile))
    ops = {(r.stage, str(Op(r.kind, r.microbatch))): r for r in timeline.ops}
    msgs = {(m.direction, m.microbatch): m for m in timeline.messages}
    assert len(msgs) == len(timeline.messages) == 4
    for msg in timeline.messages:
        assert msg.arrival_ms >= msg.send_start_ms  # causality, on one host's clock
    # F1's activation: there while stage 1 still ran F0, needed only after BW0.
    f1 = msgs["forward", 1]
    assert f1.arrival_ms < ops[1, "F0"].end_ms
    assert f1.needed_ms >= ops[1, "BW0"].end_ms
    assert f1.needed_ms - f1.arrival_ms >= 0.5 * (2000.0 + 2.0)
    assert ops[1, "F1"].start_ms >= f1.needed_ms
    # BW0's gradient: stage 0 asked for it after F1, and waited for it.
    grad0 = msgs["backward", 0]
    assert grad0.needed_ms <= ops[0, "BW0"].start_ms
    assert grad0.arrival_ms >= ops[1, "BW0"].end_ms
    assert grad0.arrival_ms - grad0.needed_ms >= 0.5 * (2000.0 + 2.0)
    assert ops[0, "BW0"].start_ms >= grad0.arrival_ms
    # The trace shows both: the slice ends at the arrival, the instant marks the need.
    events = [e for e in to_chrome_trace(timeline)["traceEvents"] if e.get("name", "")[:2] == "m1"]
    forward = [e for e in events if e.get("cat") == "forward"]
    (in_flight,) = [e for e in forward if e["ph"] == "X"]
    (needed,) = [e for e in forward if e["ph"] == "i"]
    assert needed["ts"] - (in_flight["ts"] + in_flight["dur"]) >= 0.5 * 2_002_000  # us


class _SlowToReport(EmulatedCompute):
    """Stamps (monotonic s) the end of its step and the start and end of what it does after
    the step, which takes `REPORT_S` (as a big model's digest or checkpoint would)."""

    REPORT_S = 2.0

    def end_iteration(self, config: IterationConfig) -> StepOutput:
        output = super().end_iteration(config)
        return dataclasses.replace(output, params=(("stepped", np.array([time.monotonic()])),))

    def after_step(self, config: IterationConfig, output: StepOutput) -> StepOutput:
        started = time.monotonic()
        time.sleep(self.REPORT_S)
        stamps = np.array([started, time.monotonic()])
        return dataclasses.replace(output, params=(*(output.params or ()), ("reported", stamps)))


def test_the_step_ends_before_the_backend_reports_or_saves() -> None:
    """A digest's copy of every parameter and a checkpoint's save are not the optimizer
    step: the step's end is stamped before they start (2 s here), so no step time holds them."""
    profile = _profile(1.0, 1.0, 1.0)
    with WorkerPool(2, compute_factory=_SlowToReport, timeout_s=20) as pool:
        timeline = pool.run_iteration(IterationConfig(0, one_f_one_b(profile), profile))
        results = pool.last_results
    for result in results:
        stamps = dict(result.step_output.params or ())
        assert stamps.keys() == {"stepped", "reported"}
        (stepped,), (report_start, report_end) = stamps["stepped"], stamps["reported"]
        assert result.step_start <= stepped <= result.step_end <= report_start
        assert report_end - report_start >= _SlowToReport.REPORT_S
    # The iteration's step: from the last op's end to the last rank's step end (before its
    # report, above).
    last_op_end = max(end for r in results for _, _, _, end in r.ops)
    last_step_end = max(r.step_end for r in results)
    (record,) = timeline.iterations
    assert record.step_time_ms == pytest.approx((last_step_end - last_op_end) * 1000.0, abs=1e-6)


class _SlowToSetUp(EmulatedCompute):
    """Its own set-up of each iteration takes `SET_UP_S`, five times the pool's start margin
    (as a checkpoint's load may), and stamps (monotonic s) its end."""

    SET_UP_S = 0.1

    def begin_iteration(self, config: IterationConfig) -> None:
        time.sleep(self.SET_UP_S)
        self._set_up_end = time.monotonic()

    def end_iteration(self, config: IterationConfig) -> StepOutput:
        output = super().end_iteration(config)
        return dataclasses.replace(output, params=(("set up", np.array([self._set_up_end])),))


def test_an_iteration_starts_once_every_worker_has_set_it_up() -> None:
    """The start is picked only when every worker is ready: each one's set-up (the compute
    backend's, here five times the start margin; the DP ring's buffers, 8 MB each, made
    before it) ends before the start, so stage 0's first op (no dependency) is held back by
    no set-up. Orderings on one clock: no load can break them (a start picked before the
    set-up, 20 ms ahead, comes before a 100 ms set-up's end whatever the load)."""
    profile = Profile.uniform(2, 2, 1, 1, 1, num_replicas=2, allreduce_bytes=(8 * MB,) * 2)
    starts: list[float] = []
    with WorkerPool(2, 2, compute_factory=_SlowToSetUp, timeout_s=20) as pool:
        for iteration in range(2):
            pool.run_iteration(
                IterationConfig(iteration, one_f_one_b(profile), profile), starts.append
            )
            results = pool.last_results
            set_up_ends = [dict(r.step_output.params or ())["set up"][0] for r in results]
            first_ops = [min(start for _, _, start, _ in r.ops) for r in results]
            assert max(set_up_ends) <= starts[-1] <= min(first_ops), (set_up_ends, starts)


def test_a_swap_s_record_spans_the_set_up_that_follows_it() -> None:
    """A rank swap is its iteration's first work, and every worker sets the iteration up
    after it, under the position it then plays (receives, the DP ring's buffers, the
    backend's set-up: 100 ms here), inside the iteration: each mover's record spans that
    set-up too, up to its first op (it ended with the state exchange: 100 ms of the
    iteration before the first op were in no record). Orderings on one clock."""
    profile = Profile.uniform(2, 2, 1, 1, 1, num_replicas=2, allreduce_bytes=4096)
    swapped = Topology(2, 2).swapped(Position(0, 1), Position(1, 0))
    starts: list[float] = []
    with WorkerPool(2, 2, compute_factory=_SlowToSetUp, timeout_s=20) as pool:
        pool.run_iteration(IterationConfig(0, one_f_one_b(profile), profile), starts.append)
        config = IterationConfig(1, one_f_one_b(profile), profile, topology=swapped)
        timeline = pool.run_iteration(config, starts.append)
        results, pids = pool.last_results, list(pool.pids)

    def ms(t: float) -> float:  # as the timeline counts: from the first iteration's start
        return (t - starts[0]) * 1000.0

    assert sorted(
        (s.stage_from, s.replica_from, s.stage_to, s.replica_to) for s in timeline.swaps
    ) == [
        (0, 1, 1, 0),
        (1, 0, 0, 1),
    ]
    for swap in timeline.swaps:
        result = results[pids.index(swap.pid)]
        set_up_end = ms(dict(result.step_output.params or ())["set up"][0])
        first_op = ms(min(start for _, _, start, _ in result.ops))
        assert ms(starts[1]) <= swap.start_ms < set_up_end <= swap.end_ms <= first_op


class _Tied(EmulatedCompute):
    """The first and the last stage tie a weight (as megatron's embedding and output
    weight), whose gradient they sum after the DP ring."""

    def setup(self, stage: int, num_stages: int, replica: int, devices: RankDevices) -> None:
        super().setup(stage, num_stages, replica, devices)
        self._num_stages = num_stages
        self._weight = torch.zeros(256, requires_grad=True)

    def begin_iteration(self, config: IterationConfig) -> None:
        self._weight.grad = torch.full((256,), float(1 + self._stage))  # this iteration's

    def ties(self, stage: int, num_stages: int) -> bool:
        return stage in (0, num_stages - 1)

    def tied_weight(self) -> torch.Tensor | None:
        return self._weight if self.ties(self._stage, self._num_stages) else None

    def after_step(self, config: IterationConfig, output: StepOutput) -> StepOutput:
        grad = self._weight.grad
        kept = np.zeros(0) if grad is None else grad.numpy().copy()  # none: no sum ran
        return dataclasses.replace(output, params=(("tied grad", kept),))


def test_a_tied_sum_waits_for_the_other_stage_s_ring_longer_than_the_timeout() -> None:
    """Stage 0's DP ring is slowed by 700 ms on each of its 2 messages over dp0:0-1 (each
    delay within the 1 s timeout for one message), stage 1's is not: stage 1 reaches the tied
    sum 1.4 s before stage 0 does. Its send of the tied gradient found no receive posted at
    stage 0 and gloo gave up on it after the 1 s timeout: a healthy iteration failed with
    "sending the tied weight's gradient ... Timed out". Both stages' sums are 1 + 2. (A
    rank's own 1 s wait for a message that a neighbour held on a loaded host timed out starts
    a new pool, up to 3; the old tied send's timeout, every try's, still fails the test.)"""
    plain = Profile.uniform(2, 2, 1, 1, 1, num_replicas=2, allreduce_bytes=4096)
    slow_ring = dataclasses.replace(plain, dp_delay_ms=((Link.parse("dp0:0-1"), 700.0),))
    for attempt in fresh_tries():
        with attempt, WorkerPool(2, 2, compute_factory=_Tied, timeout_s=1.0) as pool:
            pool.run_iteration(IterationConfig(0, one_f_one_b(plain), plain))  # gloo connects
            config = IterationConfig(1, one_f_one_b(slow_ring), slow_ring)
            timeline = pool.run_iteration(config)
            results = pool.last_results
    assert timeline.iterations[0].step_time_ms >= 2 * 700.0
    for result in results:
        (name, grad), *_ = result.step_output.params or ()
        assert name == "tied grad" and set(grad.tolist()) == {3.0}


class _TiedWithoutGradientAtIteration1(_Tied):
    """`_Tied`, but in iteration 1 neither tied copy has a gradient."""

    def begin_iteration(self, config: IterationConfig) -> None:
        super().begin_iteration(config)
        if config.iteration == 1:
            self._weight.grad = None


def test_tied_copies_without_a_gradient_swap_zeros_and_the_next_iteration_gets_its_own() -> None:
    """The tied gradient's receive is posted at set-up: where neither copy had a gradient
    and no swap ran, it stayed posted, took the next iteration's gradient in the old buffer,
    and that iteration's own receive waited for good. Zeros are swapped instead. (A rank's
    own 1 s wait for a message that a neighbour held on a loaded host timed out starts a new
    pool, up to 3; a receive that waits for good is the pool's timeout, raised at once.)"""
    profile = Profile.uniform(2, 2, 1, 1, 1)
    compute = _TiedWithoutGradientAtIteration1
    for attempt in fresh_tries():
        with attempt, WorkerPool(2, compute_factory=compute, timeout_s=1.0) as pool:
            sums = []
            for iteration in range(3):
                pool.run_iteration(IterationConfig(iteration, one_f_one_b(profile), profile))
                sums.append(
                    [
                        set(dict(r.step_output.params or ())["tied grad"].tolist())
                        for r in pool.last_results
                    ]
                )
    assert sums == [[{3.0}, {3.0}], [{0.0}, {0.0}], [{3.0}, {3.0}]]


class _StopsAtItsFirstOp(EmulatedCompute):
    """Stage 1 stops its own process (SIGSTOP: gloo's threads too) in its first op, and stage
    0 sends its next message only once it is stopped: that message, larger than the sockets'
    buffers, cannot go. (Sent at once, a loaded host's stage 1 could take it whole, its receive
    posted, before its main thread stopped: stage 0 then timed out waiting for a gradient.)
    Stage 1 says its pid in a file named after their parent, the fork server."""

    def _stopped_file(self) -> Path:
        return Path(tempfile.gettempdir()) / f"adb-test-stopped-{os.getppid()}"

    def run(
        self, kind: OpKind, microbatch: int, inputs: torch.Tensor | None, profile: Profile
    ) -> torch.Tensor | None:
        if self._stage == 1:
            told = self._stopped_file().with_suffix(".part")
            told.write_text(str(os.getpid()))
            told.rename(self._stopped_file())
            os.kill(os.getpid(), signal.SIGSTOP)
        elif kind is OpKind.F and microbatch == 1:  # stage 0's second F, once 1 is stopped
            deadline = time.monotonic() + 60.0
            while time.monotonic() < deadline:
                try:
                    pid = int(self._stopped_file().read_text())
                    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                except (FileNotFoundError, ValueError):
                    state = ""
                if state == "T":
                    self._stopped_file().unlink()
                    break
                time.sleep(0.01)
        return super().run(kind, microbatch, inputs, profile)


class _SlowToMove(EmulatedCompute):
    """A move to another position takes 2 s (megatron builds the stage it plays next)."""

    MOVE_S = 2.0

    def move(self, stage: int, replica: int) -> None:
        time.sleep(self.MOVE_S)
        super().move(stage, replica)


def test_a_rank_swap_longer_than_the_timeout_is_no_timeout() -> None:
    """Two workers trade places, each taking 2 s for it, under a 1 s timeout: the workers
    that stay send to and wait for the movers' first messages from the iteration's start,
    and timed out after 1 s ("waiting for the activation of microbatch 0 from rank 1 failed:
    nothing came within 1 s"). The swap is the iteration's first work: it goes through.
    (The other ops' messages wait 1 s each: one that a worker held on a loaded host timed
    out starts a new pool, up to 3; the old failure, every try's, still fails the test.)"""
    profile = Profile.uniform(2, 2, 1, 1, 1, num_replicas=2, allreduce_bytes=4096)
    swapped = Topology(2, 2).swapped(Position(0, 1), Position(1, 0))
    for attempt in fresh_tries():
        with attempt, WorkerPool(2, 2, compute_factory=_SlowToMove, timeout_s=1.0) as pool:
            pool.run_iteration(IterationConfig(0, one_f_one_b(profile), profile))
            config = IterationConfig(1, one_f_one_b(profile), profile, topology=swapped)
            timeline = pool.run_iteration(config)
            after = pool.run_iteration(
                IterationConfig(2, one_f_one_b(profile), profile, topology=swapped)
            )
    assert len(timeline.swaps) == 2
    assert all(s.end_ms - s.start_ms >= 1000 * _SlowToMove.MOVE_S for s in timeline.swaps)
    assert (
        len(after.ops) == len(timeline.ops) == 2 * sum(len(o) for o in one_f_one_b(profile).stages)
    )


class _SlowToMoveBack(EmulatedCompute):
    """A move back to its own default position takes 2.5 s (megatron builds that stage, as
    at its start-up); other moves are quick."""

    MOVE_S = 2.5

    def setup(self, stage: int, num_stages: int, replica: int, devices: RankDevices) -> None:
        super().setup(stage, num_stages, replica, devices)
        self._default = (stage, replica)

    def move(self, stage: int, replica: int) -> None:
        if (stage, replica) == self._default:
            time.sleep(self.MOVE_S)
        super().move(stage, replica)


def test_a_move_back_to_the_default_placement_may_take_as_long_as_a_start_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Between runs the workers go back to their default positions, untimed: a move there
    builds the stage a worker played at its start-up, and may take as long (`place_default`
    waits the start-up bound for it). It waited the pool's bound on an iteration's time
    without progress (2 x 0.5 s + 0.5 s here) and the pool ended with a WorkerTimeout.
    That short grace is in force for the move back alone: in the iterations around it (the
    product's 5 s) a worker held 1.5 s on a loaded host ended the pool. A rank's own 0.5 s
    wait for a message that a held neighbour timed out starts a new pool (up to 3); the
    move back's failure, the pool's own timeout, fails at once."""
    profile = Profile.uniform(2, 2, 1, 1, 1, num_replicas=2, allreduce_bytes=4096)
    swapped = Topology(2, 2).swapped(Position(0, 1), Position(1, 0))
    for attempt in fresh_tries():
        with (
            attempt,
            WorkerPool(2, 2, compute_factory=_SlowToMoveBack, timeout_s=0.5) as pool,
        ):
            config = IterationConfig(0, one_f_one_b(profile), profile, topology=swapped)
            pool.run_iteration(config)
            with monkeypatch.context() as patched:
                patched.setattr(pool_module, "BACKSTOP_GRACE_S", 0.5)  # read at its wait
                started = time.monotonic()
                pool.place_default()
                assert time.monotonic() - started >= _SlowToMoveBack.MOVE_S
            timeline = pool.run_iteration(IterationConfig(0, one_f_one_b(profile), profile))
    assert not timeline.swaps


def test_a_send_gloo_gives_up_on_is_a_timeout_naming_the_send() -> None:
    profile = dataclasses.replace(_profile(1.0, 1.0, 1.0), message_bytes=32 * MB)
    with WorkerPool(2, compute_factory=_StopsAtItsFirstOp, timeout_s=1) as pool:
        pids = list(pool.pids)
        with pytest.raises(WorkerTimeout) as info:
            pool.run_iteration(IterationConfig(0, one_f_one_b(profile), profile))
    err = info.value
    # gloo's text: "Timed out waiting 1000ms for send ..." or, where another wait on the
    # same pair timed out first, "Application timeout caused pair closure".
    assert re.fullmatch(
        r"rank 0 \(stage 0\), iteration 0, op F1: TimeoutError: sending the activation of "
        r"microbatch 1 to rank 1 on link 0-1 failed: .*(Timed out|timeout).*",
        str(err),
    ), str(err)
    remote = err.remote
    assert remote is not None and err.rank == 0
    assert (remote.type_name, remote.op) == ("builtins.TimeoutError", "F1")
    assert remote.cause_type_name == "builtins.RuntimeError"  # gloo's, kept as the cause
    assert "in send" in remote.traceback_text  # the transport's frame
    assert not any(_alive(pid) for pid in pids)


class _Stuck(EmulatedCompute):
    """A compute backend whose op never ends and never waits on gloo: a silent worker."""

    def run(
        self, kind: OpKind, microbatch: int, inputs: torch.Tensor | None, profile: Profile
    ) -> torch.Tensor | None:
        time.sleep(3600)
        return None


def test_a_silent_worker_is_the_pool_s_timeout_stating_what_it_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One stage alone (no neighbour's wait can time out first), its op stuck: the pool waits
    twice the 0.5 s timeout plus its grace (5 s here), says so, what it waited for and what
    the worker said it did last (its progress thread speaks while the op runs, first 1 s into
    it: with a 1 s grace, a worker held 1 s on a loaded host said nothing in the pool's 2 s),
    and ends the worker."""
    monkeypatch.setattr(pool_module, "BACKSTOP_GRACE_S", 5.0)  # read by the pool, at its wait
    profile = Profile.uniform(1, 1, 1, 1, 1)
    with WorkerPool(1, compute_factory=_Stuck, timeout_s=0.5) as pool:
        pids = list(pool.pids)
        with pytest.raises(WorkerTimeout) as info:
            pool.run_iteration(IterationConfig(0, one_f_one_b(profile), profile))
    message = re.sub(r"said \d+\.\d s before", "said N s before", str(info.value))
    assert message == (
        "no progress from rank(s) [0] for 6 s during iteration 0 (2 x the workers' 0.5 s "
        "wait for one message, plus 5 s): neither records, progress nor an error came from "
        "them, and they did not exit; by their last word, rank 0 (stage 0): op F0, computing "
        "(said N s before)"
    )
    assert info.value.rank == 0 and info.value.remote is None
    assert pool.exit_codes == [-signal.SIGTERM]  # inside its op, it could not hear the ask
    assert not any(_alive(pid) for pid in pids)


def test_a_long_healthy_iteration_is_no_timeout() -> None:
    """The pool's wait bounds a time without word from the workers, not the iteration: with
    a 2 s timeout (the pool's wait 9 s), an iteration of 1F1B over 2 stages x 102
    microbatches of 30 ms ops lasts at least stage 0's 9.18 s of ops, and no message waits
    near 2 s (some 60 ms: a worker held up 1.9 s on a loaded host still waits less; one held
    longer, timing out its neighbour's wait, starts a new pool, up to 3: the pool's own
    timeout, what is tested, fails at once)."""
    profile = Profile.uniform(2, 102, 30, 30, 30, message_bytes=1024)
    timeout_s = 2.0
    for attempt in fresh_tries():
        with attempt, WorkerPool(2, timeout_s=timeout_s) as pool:
            timeline = pool.run_iteration(IterationConfig(0, one_f_one_b(profile), profile))
    (iteration,) = timeline.iterations
    pool_wait_ms = (BACKSTOP * timeout_s + BACKSTOP_GRACE_S) * 1000.0
    assert iteration.end_ms - iteration.start_ms > pool_wait_ms == 9000.0
    assert len(timeline.ops) == 2 * 2 * 102


def test_a_rank_swap_s_rewiring_longer_than_the_pool_s_wait_is_no_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The delegates' rewiring at a rank swap waits for the delegates' connections with limits
    of its own (a minute, however short the timeout: a loaded host's delegates may not run
    for seconds), longer than the pool's wait for word (2 x 2 s + 1 s here): here it takes
    2 s longer than that, and the swap's iteration goes through, its messages carried by
    the rewired delegates (the two workers trade places: each re-points all of its own).
    (The pool's short grace is in force for the swap's iteration alone, and a rank's own 2 s
    wait for a message that a neighbour held on a loaded host timed out starts a new pool,
    up to 3; the pool's own timeout, what is tested, fails at once.)"""
    profile = Profile.uniform(2, 2, 1, 1, 1, message_bytes=64)
    swapped = Topology(2).swapped(Position(0, 0), Position(1, 0))
    delegates = _SlowToRewire()
    for attempt in fresh_tries():
        with (
            attempt,
            WorkerPool(2, delegates=delegates, num_delegates=1, timeout_s=2.0) as pool,
        ):
            config = IterationConfig(0, one_f_one_b(profile), profile, comm="delegated")
            pool.run_iteration(config)
            old = {p for pids in pool.delegate_pids for p in pids}
            config = IterationConfig(
                1, one_f_one_b(profile), profile, topology=swapped, comm="delegated"
            )
            with monkeypatch.context() as patched:
                patched.setattr(pool_module, "BACKSTOP_GRACE_S", _SlowToRewire.grace_s)
                timeline = pool.run_iteration(config)
    assert {(s.pid, s.stage_from, s.stage_to) for s in timeline.swaps} == {
        (pool.pids[0], 0, 1),
        (pool.pids[1], 1, 0),
    }
    assert min(s.end_ms - s.start_ms for s in timeline.swaps) > _SlowToRewire.extra_s * 1000
    carriers = {m.carrier_pid for m in timeline.messages}
    assert len(timeline.messages) == 2 * 2 and carriers <= old and len(carriers) == 2


@dataclasses.dataclass(frozen=True, slots=True)
class _SlowToRewire(Delegates):
    """Delegates whose rewiring at a rank swap first waits 2 s longer than the pool waits
    for word (`timeout_s` 2 s), as a loaded host's new delegates may take to start."""

    grace_s: ClassVar[float] = 1.0
    """The pool's grace in the test (monkeypatched there; the delegates read only this)."""
    extra_s: ClassVar[float] = BACKSTOP * 2.0 + grace_s + 2.0

    def connect(self, setup: DelegateSetup) -> DelegateTransport:
        return _SlowRewire(setup, self)


class _SlowRewire(DelegateTransport):
    def rewire(self, setup: DelegateSetup) -> None:
        time.sleep(_SlowToRewire.extra_s)
        super().rewire(setup)


def test_a_worker_started_seconds_after_the_others_joins_however_short_the_timeout() -> None:
    """A loaded host starts a pool's workers seconds apart (here rank 1, 3 s after rank 0):
    they joined their process group with the per-message timeout (1 s), and rank 0 gave up
    on the rendezvous ("Wait timeout"), although a start-up may take 120 s. Now the join
    takes the start-up bound, and a send still the timeout (test_a_send_gloo_gives_up_...).
    The iteration's ops wait for their messages under that 1 s timeout too, a few ms each: a
    worker held 1 s on a loaded host fails one of them, which is no start-up's failure, and
    the pool is started again (up to 3 starts)."""

    def launch(rank: int, target, args):  # type: ignore[no-untyped-def]
        if rank == 1:
            time.sleep(3.0)
        return local_launch(rank, target, args)

    profile = Profile.uniform(2, 2, 1, 1, 1, message_bytes=64)
    for attempt in fresh_tries(an_op_s_wait_timed_out):
        with attempt, WorkerPool(2, launch=launch, timeout_s=1.0) as pool:
            timeline = pool.run_iteration(IterationConfig(0, one_f_one_b(profile), profile))
    assert len(timeline.messages) == 2 * 2  # the activations and gradients of 2 microbatches


def an_op_s_wait_timed_out(err: WorkerTimeout) -> bool:
    """Whether `err` is a rank's own timeout in a pipeline op (F3, BW0: its wait for a
    message, or its send), what a worker held up past the timeout on a loaded host causes;
    not a start-up's, the pool's, or the DP ring's ("AR") or the tied sum's."""
    remote = err.remote
    return (
        remote is not None
        and remote.type_name == "builtins.TimeoutError"
        and re.fullmatch(r"(F|B|W|BW)\d+", remote.op or "") is not None
    )


class _Try:
    """One try of `fresh_tries`: a failure within it that its `retried` accepts ends the try,
    not the test, unless it is the last."""

    def __init__(self, last: bool, retried: Callable[[WorkerTimeout], bool]) -> None:
        self.last, self.retried, self.succeeded = last, retried, False

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, err: BaseException | None, traceback: object) -> bool:
        if err is None:
            self.succeeded = True
            return False
        return not self.last and isinstance(err, WorkerTimeout) and self.retried(err)


def fresh_tries(
    retried: Callable[[WorkerTimeout], bool] | None = None, num_tries: int = 3
) -> Iterator[_Try]:
    """The tries of a block that starts its own pool (`for attempt in fresh_tries(): with
    attempt: ...`): another, on a fresh pool, where one failed as `retried` says (default
    `a_rank_s_own_wait_timed_out`: a worker held past a short timeout on a loaded host), up
    to `num_tries`; any other failure, and the last try's, is raised."""
    for index in range(num_tries):
        attempt = _Try(index == num_tries - 1, retried or a_rank_s_own_wait_timed_out)
        yield attempt
        if attempt.succeeded:
            return


def a_rank_s_own_wait_timed_out(err: WorkerTimeout) -> bool:
    """Whether `err` is a rank's own timeout in any op (a pipeline op, the DP ring's, the
    tied sum's), what a worker held up past the timeout on a loaded host causes; not the
    pool's (no word from a rank within its bound), nor a start-up's or a placement's (no
    iteration)."""
    remote = err.remote
    return (
        remote is not None
        and remote.type_name == "builtins.TimeoutError"
        and remote.iteration is not None
    )


def test_a_neighbour_whose_delegates_start_late_is_waited_for_however_short_the_timeout() -> None:
    """One host's delegates start 3 s after its neighbour's (a loaded host may not run them
    for seconds): the neighbour waited for their ports the per-message timeout (2 s) and
    failed the pool's start ("rank 1's delegate ports ... did not come within 2 s"), though
    the delegates themselves may take a minute to start. Now it waits as long. (A rank's own
    2 s wait in the iteration for a message that a neighbour held on a loaded host timed out
    starts a new pool, up to 3; the start's failure, what is tested, has no iteration and
    fails at once.)"""
    profile = Profile.uniform(2, 2, 1, 1, 1, message_bytes=64)
    for attempt in fresh_tries():
        with (
            attempt,
            WorkerPool(2, delegates=_LateOnRank1(), num_delegates=1, timeout_s=2.0) as pool,
        ):
            config = IterationConfig(0, one_f_one_b(profile), profile, comm="delegated")
            timeline = pool.run_iteration(config)
            carriers = {pid for pids in pool.delegate_pids for pid in pids}
    assert len(timeline.messages) == 2 * 2
    assert {m.carrier_pid for m in timeline.messages} <= carriers


def test_a_worker_that_never_joins_is_told_from_those_waiting_at_the_join(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 1 hangs before it joins its process group: the others wait in the rendezvous as
    long as a start-up may take (120 s; 10 s for the pool here: rank 0's word must come
    within it on a loaded host), and the timeout named every rank alike ("no progress from
    rank(s) [0, 1]"). Now each worker says it is joining, and the timeout's last words tell
    the silent one."""
    monkeypatch.setattr(pool_module, "start_up_limit_s", lambda num_ranks: 10.0)

    def launch(rank: int, target, args):  # type: ignore[no-untyped-def]
        return local_launch(rank, _never_joins if rank == 1 else target, args)

    with pytest.raises(WorkerTimeout) as info:
        WorkerPool(2, launch=launch, timeout_s=1.0).start()
    message = str(info.value)
    assert message.startswith("no progress from rank(s) [0, 1] for 10 s during start-up")
    assert "rank 0 (stage 0): joining the process group" in message
    assert "rank 1 (stage 1): nothing said" in message


def _never_joins(*args: object) -> None:
    time.sleep(60)


_CONTROLLER_OF_A_STUCK_JOIN = """
import sys, time
from pipeline.runtime import WorkerPool
from pipeline.runtime.hooks import local_launch
from tests.pipeline.runtime.test_pool import _never_joins

def launch(rank, target, args):
    process = local_launch(rank, _never_joins if rank == 1 else target, args)
    print(process.pid, flush=True)
    return process

WorkerPool(2, launch=launch, timeout_s=1.0).start()
"""


def test_a_worker_waiting_in_its_join_ends_with_its_killed_controller(short_tmp: Path) -> None:
    """Rank 0 waits in gloo's rendezvous for a rank 1 that never comes (since 5d8429d up to
    the start-up bound, 120 s), and the controller is killed: nothing waits for rank 0 any
    more, and it lived on to the bound, holding the killed run's output pipes (a CI run's
    kill test timed out on them). It ends with its controller now. (The killed controller's
    pool and fork server folders go with `short_tmp`.)"""
    with _controller(_CONTROLLER_OF_A_STUCK_JOIN, short_tmp) as (controller, pids):
        # Rank 0 in its join, its watch started: gloo's file store, which only rank 0 opens,
        # is there (a sleep was no sign of it: a loaded rank 0 not yet at its join ended on
        # its broken pipe, and the test passed without a join to end).
        deadline = time.monotonic() + 120  # a hang bound: the start-up bound
        while not any(short_tmp.glob("adaptra-pool-*/rendezvous")):
            assert time.monotonic() < deadline and controller.poll() is None
            time.sleep(0.05)
        controller.kill()
        controller.wait()
        deadline = time.monotonic() + 30  # a hang bound, far under the start-up bound
        while _alive(pids[0]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pids[0])
        assert sorted(p.name.split("-")[0] for p in short_tmp.iterdir()) == ["adaptra", "pymp"]


_CONTROLLER_OF_LATE_WORKERS = """
from pipeline.runtime import WorkerPool
from pipeline.runtime.hooks import local_launch
from tests.pipeline.runtime.test_pool import _after_its_controller

def launch(rank, target, args):
    process = local_launch(rank, _after_its_controller, args)
    print(process.pid, flush=True)
    return process

WorkerPool(2, launch=launch, timeout_s=1.0).start()
"""


def _after_its_controller(*args: object) -> None:
    """`worker_main` once the controller's end of its pipe (its 5th argument) has closed: a
    worker a loaded host runs only after its controller was killed."""
    conn = args[4]
    assert isinstance(conn, Connection)
    conn.poll(None)  # the pool says nothing before a worker's ready answer: this is its end
    worker_main(*args)  # type: ignore[arg-type]


def test_a_worker_whose_controller_is_gone_before_its_first_word_ends_quietly(
    short_tmp: Path, tmp_path: Path
) -> None:
    """Each worker begins after its killed controller is gone, its first word (that it is
    joining) into a broken pipe: it ends, as a worker whose pipe breaks later does, without
    a traceback (one per worker, twice "BrokenPipeError", went to the killed run's stderr)."""
    stderr = tmp_path / "stderr"
    with (
        stderr.open("w") as err,
        _controller(_CONTROLLER_OF_LATE_WORKERS, short_tmp, err) as (controller, pids),
    ):
        controller.kill()
        controller.wait()
        deadline = time.monotonic() + 60  # a hang bound
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in pids)
        assert "Traceback" not in stderr.read_text(), stderr.read_text()


@contextlib.contextmanager
def _controller(
    script: str, short_tmp: Path, stderr: IO[str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], list[int]]]:
    """A controller process running `script`, with its temporary folders (its pool's, its
    fork server's) in `short_tmp`, and its two workers' pids, the first lines it prints;
    killed at the end, with its workers."""
    controller = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=Path(__file__).parents[3],
        env={**os.environ, "TMPDIR": str(short_tmp)},
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )
    pids: list[int] = []
    try:
        assert controller.stdout is not None
        pids += [int(controller.stdout.readline()) for _ in range(2)]
        yield controller, pids
    finally:
        controller.kill()
        controller.wait()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (not a zombie: an ended child of the fork server)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@dataclasses.dataclass(frozen=True, slots=True)
class _LateOnRank1(Delegates):
    """Rank 1's delegates start 3 s late."""

    def connect(self, setup: DelegateSetup) -> DelegateTransport:
        if setup.rank == 1:
            time.sleep(3.0)
        return DelegateTransport(setup, self)


def test_a_clean_close_ends_every_worker_by_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Idle workers asked to stop end with exit status 0: none is terminated or killed (by
    themselves, not within the pool's CLOSE_GRACE_S, 5 s: a loaded host may be slower)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its folders, no other pool's
    monkeypatch.setattr(pool_module, "CLOSE_GRACE_S", 60.0)  # read by the pool, at its close
    profile = Profile.uniform(2, 4, 1, 1, 1, num_replicas=2, allreduce_bytes=4096)
    with WorkerPool(2, 2, timeout_s=30) as pool:
        pids = list(pool.pids)
        pool.run_iteration(IterationConfig(0, one_f_one_b(profile), profile))
        assert pool.exit_codes == []  # not closed yet
    assert pool.exit_codes == [0, 0, 0, 0]
    assert not any(_alive(pid) for pid in pids)
    pool.start()  # a pool starts again after a close, and ends the same way
    started = _pool_folders()
    assert len(started) == 1
    with pytest.raises(RuntimeError, match="already running"):
        pool.start()  # not over a running pool: its workers and folders would be lost
    assert _pool_folders() == started and len(pool.pids) == 4
    pool.close()
    assert pool.exit_codes == [0, 0, 0, 0]
    assert not any(_alive(pid) for pid in pool.pids)
    assert not _pool_folders()  # its rendezvous folder is gone


def _pool_folders() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("adaptra-pool-*")}


def test_a_closed_pool_says_so() -> None:
    profile = Profile.uniform(2, 2, 1, 1, 1)
    pool = WorkerPool(2)
    with pytest.raises(WorkerError, match="not running"):
        pool.run_iteration(IterationConfig(0, one_f_one_b(profile), profile))


def test_a_signal_while_the_pool_makes_its_folder_leaves_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM arrives between the folder and its mark (here: sent by the mark's own lookup):
    it is held until the folder is marked and recorded, then ends the start, and the pool
    removes the folder (before, it stayed unmarked, where `cleanup` never looks)."""
    import pipeline.runtime.scratch as scratch

    real = scratch.process_start_time

    def signalled(pid: int) -> int | None:
        os.kill(os.getpid(), signal.SIGTERM)
        return real(pid)

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    monkeypatch.setattr(scratch, "process_start_time", signalled)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        pool = WorkerPool(2, timeout_s=20)
        with pytest.raises(SystemExit) as ended:
            pool.start()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert ended.value.code == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []
