"""The controller side: a pool of worker processes, started once and reused.

Each iteration the pool sends every worker its `IterationConfig` and waits until each has set
it up (receives posted, DP ring buffers made, the compute backend's own set-up such as a
checkpoint's load) and says it is ready; only then does it pick a common start time on the
host's monotonic clock (shared by all processes of one host), the start margin from now, and
send it, so no worker's set-up is in the iteration's time (but a rank swap's: the workers set
up after the swap, the iteration's first work, and each mover's swap record spans it). It then
gathers their records into one timeline. Between runs `place_default` moves the workers back
to the default placement, untimed. A dead, failing or silent worker ends the pool with a
`WorkerError` that names the rank, of the subclass that says what happened
(remote_error.py), and `close()` leaves no process behind.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import shutil
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import TracebackType
from typing import NoReturn

from pipeline.errors import LinkFailure, ScheduleError
from pipeline.ops import OpKind
from pipeline.runtime.compute import ComputeBackend, EmulatedCompute
from pipeline.runtime.config import IterationConfig, RankResult
from pipeline.runtime.devices import RankDevices
from pipeline.runtime.hooks import LaunchHook, local_launch
from pipeline.runtime.remote_error import (
    RemoteError,
    WorkerCrash,
    WorkerError,
    WorkerTimeout,
    worker_error,
)
from pipeline.runtime.scratch import POOL_PREFIX, SLOTS_PREFIX, make_folder
from pipeline.runtime.transport import DelegateFactory, Failover, route_kind
from pipeline.runtime.worker import DOING, PLACING, PROGRESS, start_up_limit_s, worker_main
from pipeline.signals import held_signals
from pipeline.timeline import (
    FailoverRecord,
    IterationRecord,
    MessageRecord,
    OpRecord,
    SwapRecord,
    Timeline,
)
from pipeline.topology import DEFAULT_NICS, Direction, Link, Position, Topology

__all__ = [
    "BACKSTOP",
    "DEFAULT_TIMEOUT_S",
    "IterationConfig",
    "WorkerError",
    "WorkerPool",
    "assemble_timeline",
]

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 60.0
"""How long a worker waits for one message unless its pool is told otherwise."""
BACKSTOP = 2.0
"""The pool's wait for word from its workers during an iteration, in units of their
`timeout_s` (plus BACKSTOP_GRACE_S): longer than a healthy worker goes without progress while
limits of its own run (an op's wait for its message, then its send: each up to `timeout_s`),
so that where a worker has a limit of its own, it ends a wait first and names what waited.
It is the one bound on the waits that have none: a receiver thread's (receiver.py) and the
DP ring's wait for its first chunks, which spans the peer replicas' pipelines (dp_ring.py);
their peers' progress (an op or a ring chunk done) restarts it."""

BACKSTOP_GRACE_S = 5.0

DEATH_GRACE_S = 1.0
"""How long a broken connection's report (what a neighbour's death looks like) waits for a
dead process, or another rank's report of what went wrong, before it is blamed on the rank
that spoke. Any other report is raised at once."""

CLOSE_GRACE_S = 5.0
"""How long a close waits for idle workers to end once asked (here they take about 0.05 s:
BENCHMARKS.md); those still running then are terminated."""

BUSY_GRACE_S = 0.1
"""The same for workers inside a start-up or an iteration (a failed or interrupted one): they
cannot hear the ask. Those that reported an error end by themselves within a few ms; the
others are terminated."""

TERMINATE_GRACE_S = 1.0
"""How long terminated workers have to end before they are killed."""


class WorkerPool:
    """`num_stages` x `num_replicas` workers (rank = replica * S + stage), one per process."""

    def __init__(
        self,
        num_stages: int,
        num_replicas: int = 1,
        *,
        compute_factory: Callable[[], ComputeBackend] = EmulatedCompute,
        launch: LaunchHook = local_launch,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        start_margin_s: float = 0.02,
        delegates: DelegateFactory | None = None,
        num_delegates: int = 0,
    ) -> None:
        """`delegates`: how each worker starts `num_delegates` delegates per link direction
        and side, with the pool (adaptra.transport), for iterations that delegate;
        `start_margin_s`: how long after the last worker is ready an iteration starts (its
        start must reach every worker first)."""
        self.num_stages, self.num_replicas = num_stages, num_replicas
        self.delegates, self.num_delegates = delegates, num_delegates
        self.num_ranks = num_stages * num_replicas
        self._compute_factory = compute_factory
        self._launch = launch
        self.timeout_s = timeout_s
        self._start_margin_s = start_margin_s
        self._processes: list[BaseProcess] = []
        self._conns: list[Connection] = []
        self._tmpdir: str | None = None
        self._slot_dir: str | None = None
        self._origin: float | None = None
        self._grid = Topology(num_stages, num_replicas)
        """The default placement: where workers start."""
        self._placement = self._grid
        """Which worker plays which position now (errors name the stage it plays)."""
        self.pids: list[int] = []
        self.delegate_pids: list[list[int]] = []
        """Each rank's delegate processes (none without delegates)."""
        self.devices: list[RankDevices] = []
        """Each rank's devices and process-group backend, as it chose them at start-up."""
        self.bytes_sent = 0
        """What the workers sent over gloo so far (`RankResult.bytes_sent`)."""
        self.last_results: list[RankResult] = []
        """Every rank's records of the latest iteration, in rank order."""
        self.exit_codes: list[int | None] = []
        """Every rank's exit status at the last close, in rank order: 0 for a worker that
        ended when asked (or after reporting its failure), -15 or -9 for one the close had to
        terminate or kill, None for one still running even then."""
        self._busy = False
        """Whether the workers are inside a command (start-up, an iteration), deaf to a stop."""
        self._doing: dict[int, tuple[str, float]] = {}
        """What each rank last said it did in the command waited on (`worker.Progress`), and
        when that came (host monotonic s): what the pool's timeout names."""

    @property
    def running(self) -> bool:
        """Whether its workers are up: started, and not closed since (by `close`, or by a
        failure or an interruption, which close the pool before they are raised)."""
        return bool(self._processes)

    def __enter__(self) -> WorkerPool:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        if self._processes or self._tmpdir is not None:
            raise RuntimeError("the worker pool is already running (close it before a restart)")
        if self.delegates is not None and self.num_delegates < 1:
            raise ValueError(f"delegates need num_delegates >= 1, not {self.num_delegates}")
        self._busy = True
        self._placement = self._grid
        try:  # from the first folder on: a signal at any point leaves nothing behind
            with held_signals():  # each folder recorded as it is made: close() removes it
                self._tmpdir = make_folder(POOL_PREFIX)
            init_file = str(Path(self._tmpdir) / "rendezvous")
            # The delegates' slot files: in memory where there is /dev/shm, else with the
            # rest; the pool's own, so close() removes them whatever happened to the workers.
            memory = os.path.isdir("/dev/shm") and self.delegates is not None
            with held_signals():
                self._slot_dir = make_folder(SLOTS_PREFIX, "/dev/shm") if memory else self._tmpdir
            for rank in range(self.num_ranks):
                parent, child = multiprocessing.get_context("spawn").Pipe()
                args = (
                    rank,
                    self.num_stages,
                    self.num_replicas,
                    init_file,
                    child,
                    self.timeout_s,
                    self._compute_factory(),
                    self.delegates,
                    self.num_delegates,
                    self._slot_dir,
                )
                with held_signals():  # a worker started is a worker recorded (close ends it)
                    self._processes.append(self._launch(rank, worker_main, args))
                self._conns.append(parent)
                child.close()
            limit_s = start_up_limit_s(self.num_ranks)
            answers = self._gather(
                "start-up", "a ready message (group joined, stage set up)", limit_s
            )
            ready: list[tuple[int, list[int], RankDevices]] = answers  # type: ignore[assignment]
            self.pids = [int(pid) for pid, _, _ in ready]
            self.delegate_pids = [list(d) for _, d, _ in ready]
            self.devices = [devices for _, _, devices in ready]
            self._busy = False
        except BaseException:
            self.close()
            raise

    def run_iteration(
        self, config: IterationConfig, on_start: Callable[[float], None] | None = None
    ) -> Timeline:
        """Run one iteration on every worker; its records, times in ms from the first start.
        Two rounds: the config to every worker, each answering once it has set the iteration
        up; then the start, `start_margin_s` after the last answer, which the workers wait
        for. `on_start` is told the monotonic time the workers start at, before they get it
        (an exception from it ends the pool: the workers wait, set up, for the start)."""
        if not self._processes:
            raise WorkerError("the worker pool is not running (never started, or closed)")
        if config.schedule.num_stages != self.num_stages:
            raise ValueError(
                f"schedule has {config.schedule.num_stages} stages, pool has {self.num_stages}"
            )
        if config.profile.num_replicas != self.num_replicas:
            raise ValueError(
                f"profile has {config.profile.num_replicas} DP replica(s), pool has "
                f"{self.num_replicas}"
            )
        self._busy = True
        what = f"iteration {config.iteration}"
        self._placement = config.topology or self._grid
        try:
            self._send_all(config, what)
            self._gather(what, "a ready message (the iteration set up)")
            start_at = time.monotonic() + self._start_margin_s
            if self._origin is None:
                self._origin = start_at
            if on_start is not None:
                on_start(start_at)
            self._send_all(start_at, what)
            results: list[RankResult] = self._gather(what, "records")  # type: ignore[assignment]
        except BaseException:
            # Cut off (a KeyboardInterrupt, a signal handler's exception, an answer that
            # would not unpickle): the answers still owed would be taken for the next
            # iteration's, so the pool ends here (a WorkerError's `_fail` has ended it).
            if self._processes:
                self.close()
            raise
        self._busy = False
        self.bytes_sent += sum(r.bytes_sent for r in results)
        self.last_results = results
        assert self._origin is not None
        nics = DEFAULT_NICS if config.topology is None else config.topology.nics
        return assemble_timeline(
            self.num_stages, config.iteration, self._origin, start_at, results, nics
        )

    def place_default(self) -> None:
        """Every worker back on the default placement, where a fresh pool's workers start, if the
        last iteration left them on another: between runs (a new run's iteration 0 starts
        there, from the initial state), outside any iteration, so nothing is timed or
        recorded and no state moves (`_Worker.place`: the delegates
        whose peer changes are rewired, a worker that moves builds its stage, as at its
        start-up, and has as long for it: `start_up_limit_s`). A failure ends the pool with a
        `WorkerError`, as in an iteration."""
        if not self._processes or self._placement.workers == self._grid.workers:
            return
        what = PLACING
        self._busy = True
        try:
            self._send_all(self._grid, what)
            # a mover builds the stage it played at its start-up (megatron's model): as
            # long as a start-up may take, not an iteration's time without progress
            limit_s = start_up_limit_s(self.num_ranks)
            self._gather(what, "a ready message (the default placement played)", limit_s)
        except BaseException:
            if self._processes:  # as in `run_iteration`: answers owed would be misread
                self.close()
            raise
        self._busy = False
        self._placement = self._grid

    def _send_all(self, command: object, what: str) -> None:
        """`command` to every worker; a worker gone is a WorkerCrash."""
        for rank, conn in enumerate(self._conns):
            try:
                conn.send(command)
            except OSError:  # its end of the pipe closed: the process is gone
                self._fail(WorkerCrash(f"{self._name(rank)} is gone", rank=rank), what)

    def _gather(self, what: str, owed: str, limit_s: float | None = None) -> list[object]:
        """One answer per rank (`owed`: what each owes, in words), in rank order; any death,
        error or timeout is a WorkerError. The wait is for a time without progress from the
        ranks waited for: an answer, or their `PROGRESS` (an iteration's op or ring chunk
        done; every second of a rank swap's rewiring of the delegates, a wait with limits of
        its own) restarts it, so a long healthy iteration is no timeout; their `DOING` (what
        they do, said every second while they wait) does not, and the timeout names what each
        said last. By default it is `BACKSTOP` x the pool's timeout plus `BACKSTOP_GRACE_S`:
        where workers have limits of their own, they give up first and say what waited, so
        their word comes first."""
        answers: dict[int, object] = {}
        self._doing = {}
        why = ""
        if limit_s is None:
            limit_s = BACKSTOP * self.timeout_s + BACKSTOP_GRACE_S
            why = (
                f" ({BACKSTOP:g} x the workers' {self.timeout_s:g} s wait for one message, "
                f"plus {BACKSTOP_GRACE_S:g} s)"
            )
        deadline = time.monotonic() + limit_s
        while len(answers) < self.num_ranks:
            waiting = [r for r in range(self.num_ranks) if r not in answers]
            handles: dict[object, int] = {self._conns[r]: r for r in waiting}
            handles.update({self._processes[r].sentinel: r for r in waiting})
            ready = wait(list(handles), timeout=max(deadline - time.monotonic(), 0))  # type: ignore[arg-type]
            if not ready:
                self._fail(
                    WorkerTimeout(
                        f"no progress from rank(s) {waiting} for {limit_s:g} s during {what}"
                        f"{why}: neither {owed}, progress nor an error came from them, and they "
                        f"did not exit{self._last_words(waiting)}",
                        rank=waiting[0] if len(waiting) == 1 else None,
                    ),
                    what,
                )
            for rank in sorted({handles[item] for item in ready}):
                answer = self._receive(rank)  # an answer (or a last word) beats the exit code
                if answer is None:  # its pipe closed or its process ended, unanswered
                    self._fail(
                        WorkerCrash(
                            f"{self._name(rank)} ended without an answer during {what}", rank=rank
                        ),
                        what,
                    )
                status, payload = answer
                if status in (PROGRESS, DOING):
                    now = time.monotonic()
                    self._doing[rank] = (str(payload), now)
                    if status == PROGRESS:  # on its way: the wait starts again
                        deadline = now + limit_s
                    continue
                if status == "error":
                    error = (
                        worker_error(payload)
                        if isinstance(payload, RemoteError)
                        else WorkerCrash(f"{self._name(rank)}: {payload}", rank=rank)
                    )
                    self._fail(error, what, reporter=rank)
                answers[rank] = payload
        return [answers[rank] for rank in range(self.num_ranks)]

    def _last_words(self, ranks: list[int]) -> str:
        """What `ranks` last said they did, for the timeout's message: "; by their last word,
        rank 1 (stage 0): in the DP ring of stage 0, waiting for chunk 0 (of chunks 0-1) from
        rank 0 over dp0:0-1 (said 0.4 s before)"; "" where none of them said anything (a
        set-up: an iteration's run speaks, `worker.Progress`, and a start-up once, as each
        worker begins its join). A worker speaks every PROGRESS_INTERVAL_S while an iteration
        waits, so its word is that old at most, unless its process itself stood still."""
        if not any(rank in self._doing for rank in ranks):
            return ""
        now = time.monotonic()
        words = []
        for rank in ranks:
            said = self._doing.get(rank)
            doing = (
                "nothing said" if said is None else f"{said[0]} (said {now - said[1]:.1f} s before)"
            )
            words.append(f"{self._name(rank)}: {doing}")
        return "; by their last word, " + "; ".join(words)

    def _receive(self, rank: int) -> tuple[str, object] | None:
        """The rank's next message, or None if there is none (or its pipe is closed)."""
        conn = self._conns[rank]
        try:
            if conn.poll():
                status, payload = conn.recv()
                return str(status), payload
        except (EOFError, OSError):
            pass
        return None

    def _cause(self, error: WorkerError, what: str, reporter: int | None) -> WorkerError | None:
        """What caused `error` (reported by rank `reporter`, if any), if not itself: a dead
        rank (a non-zero exit status) is always looked for; where `error` is a broken
        connection, what a neighbour's death looks like, the death, or another rank's report
        of a failure of its own, is awaited up to DEATH_GRACE_S: a killed rank's sockets close
        before its exit status is there, so its neighbours' errors can arrive first."""
        secondary = _is_secondary(error)
        deadline = time.monotonic() + (DEATH_GRACE_S if secondary else 0.0)
        while True:
            for rank, process in enumerate(self._processes):
                code = process.exitcode
                if rank != reporter and code is not None and code != 0:
                    message = f"{self._name(rank)} exited with code {code} during {what}"
                    return WorkerCrash(message, rank=rank)
            if secondary:
                for rank in range(self.num_ranks):
                    answer = None if rank == reporter else self._receive(rank)
                    if answer is not None and isinstance(answer[1], RemoteError):
                        other = worker_error(answer[1])
                        if not _is_secondary(other):
                            return other
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.005)

    def _name(self, rank: int) -> str:
        """The rank and the stage it plays (in the latest iteration)."""
        return f"rank {rank} (stage {self._placement.position_of_worker(rank).stage})"

    def _fail(self, error: WorkerError, what: str, reporter: int | None = None) -> NoReturn:
        """Close the pool and raise: what caused `error` (`_cause`: a dead rank's
        `WorkerCrash`, or another rank's report), `error` (what came first, e.g. a
        neighbour's report of the broken connection) as its cause; else `error`. The close
        gives the workers, deaf inside the failed command, BUSY_GRACE_S before terminating
        them, so the error is raised soon after it came. Both are stamped with when it came
        (`WorkerError.noticed_s`), before the waits for a cause and the close."""
        noticed_s = time.monotonic()
        error.noticed_s = noticed_s
        cause = self._cause(error, what, reporter)
        if cause is not None:
            cause.noticed_s = noticed_s
        self.close()
        if cause is not None:
            raise cause from error
        raise error

    def close(self) -> None:
        """Stop every worker: ask, then terminate, then kill; remove the rendezvous files.
        Idle workers end when asked (exit status 0) and get CLOSE_GRACE_S for it; workers
        inside a command (a failed or interrupted one) cannot hear it and get BUSY_GRACE_S.
        A shutdown signal meanwhile is handled once all that is done (`held_signals`)."""
        with held_signals():
            self._close()

    def _close(self) -> None:
        grace_s = BUSY_GRACE_S if self._busy else CLOSE_GRACE_S
        for conn in self._conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)
        _join(self._processes, grace_s)
        running = [process for process in self._processes if process.is_alive()]
        if running and not self._busy:
            logger.warning(
                "%d worker(s) did not end within %g s of being asked to; terminating them",
                len(running),
                grace_s,
            )
        for process in running:
            process.terminate()
        _join(running, TERMINATE_GRACE_S)
        running = [process for process in running if process.is_alive()]
        for process in running:
            process.kill()
        _join(running, TERMINATE_GRACE_S)
        for conn in self._conns:
            conn.close()
        if self._processes:
            self.exit_codes = [process.exitcode for process in self._processes]
        self._processes, self._conns = [], []
        self._busy = False
        for folder in {self._tmpdir, self._slot_dir} - {None}:
            shutil.rmtree(str(folder), ignore_errors=True)
        self._tmpdir = self._slot_dir = None


def _join(processes: list[BaseProcess], limit_s: float) -> None:
    """Wait for every one of `processes` to end, up to `limit_s` in all."""
    deadline = time.monotonic() + limit_s
    for process in processes:
        process.join(max(deadline - time.monotonic(), 0))


def _is_secondary(error: WorkerError) -> bool:
    """Whether `error` may only be the echo of another rank's end: a broken connection (a
    ConnectionError other than a LinkFailure, or gloo's bare RuntimeError) or a rank that
    ended unanswered; a rank's failure of its own (a timeout, a LinkFailure, a bug) is not."""
    remote = error.remote
    if remote is None:
        return isinstance(error, WorkerCrash)
    if remote.is_a(LinkFailure):
        return False
    return remote.is_a(ConnectionError) or remote.type_name == "builtins.RuntimeError"


def assemble_timeline(
    num_stages: int,
    iteration: int,
    origin: float,
    start_at: float,
    results: list[RankResult],
    nics: tuple[str, ...] = DEFAULT_NICS,
) -> Timeline:
    """One iteration's timeline from every rank's records; times in ms from `origin`, the
    iteration starting at `start_at`; `nics`: the hosts' data-plane NICs, by index. Every
    message sent must have been taken in by an op."""

    def ms(t: float) -> float:
        return (t - origin) * 1000.0

    ops = [
        OpRecord(iteration, r.stage, OpKind(kind), m, ms(a), ms(b), r.replica)
        for r in results
        for kind, m, a, b in r.ops
    ]
    taken = {
        (_sender_replica(link, d, r.replica), link, d, m): (arrived, needed, copy_in)
        for r in results
        for link, d, m, arrived, needed, copy_in in r.receives
    }
    messages: list[MessageRecord] = []
    dp_messages: list[MessageRecord] = []
    for r in results:
        for link, direction, m, num_bytes, a, b, fault_ms, wire, pid in r.sends:
            times = taken.get((r.replica, link, direction, m))
            if times is None:
                raise ScheduleError(
                    f"iteration {iteration}: no op took in the {direction} message of "
                    f"microbatch {m} on link {link} (replica {r.replica}): the schedule is invalid"
                )
            arrived, needed, copy_in = times
            (dp_messages if route_kind(link) == "dp" else messages).append(
                MessageRecord(
                    iteration,
                    link,
                    direction,
                    m,
                    num_bytes,
                    ms(a),
                    ms(b),
                    ms(arrived),
                    ms(needed),
                    r.replica,
                    fault_ms,
                    ms(wire),
                    copy_in * 1000.0,
                    pid,
                )
            )
    # The step (all-reduce, optimizer) ends when the last rank's does: a stage whose
    # pipeline ends early reduces while the others still run.
    end = max((rec.end_ms for rec in ops), default=ms(start_at))
    step_end = max([end, *(ms(r.step_end) for r in results)])
    return Timeline(
        num_stages,
        tuple(ops),
        tuple(messages),
        (IterationRecord(iteration, ms(start_at), step_end, step_end - end, _pids(results)),),
        tuple(
            _failover_record(f, r.replica if f.replica is None else f.replica, nics, ms)
            for r in results
            for f in r.failovers
        ),
        tuple(dp_messages),
        tuple(_swap_record(iteration, r, ms) for r in results if r.moved is not None),
    )


def _sender_replica(link: str, direction: Direction, receiver: int) -> int:
    """The replica that sent a message `receiver` took in: its own on a PP link; on a DP
    link, the link's lower replica forward, its upper one backward (`Link.sender`)."""
    if route_kind(link) != "dp":
        return receiver
    return Link.parse(link).sender(direction).replica


def _failover_record(
    failover: Failover, replica: int, nics: tuple[str, ...], ms: Callable[[float], float]
) -> FailoverRecord:
    f = failover
    return FailoverRecord(
        f.iteration, f.direction.link, f.direction.direction, replica, f.cause,
        nics[f.nic_from], nics[f.nic_to], ms(f.noticed_s), ms(f.resumed_s), f.resume_seq,
        f.carrier_pid,
    )  # fmt: skip


def _swap_record(iteration: int, result: RankResult, ms: Callable[[float], float]) -> SwapRecord:
    m = result.moved
    assert m is not None
    return SwapRecord(
        iteration, result.pid, m.from_stage, m.from_replica, result.stage, result.replica,
        m.num_bytes, ms(m.start_s), ms(m.end_s),
    )  # fmt: skip


def _pids(results: list[RankResult]) -> tuple[int, ...]:
    """The pid that played each position, by position index."""
    grid = Topology(1 + max(r.stage for r in results), 1 + max(r.replica for r in results))
    by_position = {grid.index(Position(r.stage, r.replica)): r.pid for r in results}
    return tuple(by_position[i] for i in range(grid.num_positions))
