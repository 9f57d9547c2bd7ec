"""The `emulated` and `megatron` engines: a pool of real worker processes, kept for the
engine's life (configurations of one experiment share it), one per position.

`emulated` workers sleep each op's profiled time and send messages of the profile's size,
then run the DP all-reduce's ring message by message (pipeline.allreduce) and sleep the
optimizer's time; `megatron` workers compute a megatron-core GPT (the profile gives the stage
and microbatch counts and the delays, not the op times), sum its real gradients over the same
DP ring (through the fault path) and start from the initial parameters again at every run's
iteration 0. A run starts as on a fresh pool: its workers on the default placement (the
last run's rank swaps undone before it, untimed) and its delegates on the first NIC. A plan
with another delegate count than the pool's gets a fresh pool (its delegates start with
it), which a training engine refuses in the middle of a run (its workers hold the model's
state).
"""

from __future__ import annotations

import functools
import shutil
import tempfile
import time
from collections.abc import Callable

from pipeline.engines.base import Capabilities, Closing, Outcome, Plan
from pipeline.errors import ConfigError, LinkFailure
from pipeline.faults import IterationFaults
from pipeline.link_terms import NO_LINK_TERMS
from pipeline.runtime.compute import ComputeBackend, EmulatedCompute
from pipeline.runtime.config import IterationConfig, replicas_loss
from pipeline.runtime.devices import describe_pool
from pipeline.runtime.digest import params_sha256, whole_model_params
from pipeline.runtime.hooks import LaunchHook, local_launch, preload_in_workers
from pipeline.runtime.pool import WorkerPool
from pipeline.runtime.remote_error import WorkerError, WorkerLinkFailure
from pipeline.runtime.scratch import CHECKPOINTS_PREFIX, make_folder
from pipeline.runtime.transport import DelegateFactory
from pipeline.schedule import Schedule
from pipeline.simulator import CommMode

__all__ = ["RuntimeEngine", "emulated_engine", "megatron_engine"]


class RuntimeEngine(Closing):
    def __init__(
        self,
        name: str,
        num_stages: int,
        *,
        num_replicas: int = 1,
        compute_factory: Callable[[], ComputeBackend] = EmulatedCompute,
        launch: LaunchHook = local_launch,
        trains: bool = False,
        timeout_s: float = 60.0,
        on_start: Callable[[float], None] | None = None,
        delegates: DelegateFactory | None = None,
    ) -> None:
        """`timeout_s`: how long a worker waits on one message before it gives up;
        `on_start`: told each iteration's start (monotonic s) before the workers start;
        `delegates`: how workers start their delegates (adaptra.transport), for plans that
        delegate (the pool then starts them with its workers: `Profile.delegate_count` per
        link direction and side)."""
        self.name = name
        self.num_stages, self.num_replicas = num_stages, num_replicas
        self.capabilities = Capabilities(
            comms=frozenset({CommMode.DIRECT, *([CommMode.DELEGATED] if delegates else [])}),
            link_terms=NO_LINK_TERMS,  # its fault hook sleeps the delays and faults only
            trains=trains,
            restarts=True,
        )
        self._pool = WorkerPool(
            num_stages,
            num_replicas,
            compute_factory=compute_factory,
            launch=launch,
            timeout_s=timeout_s,
            delegates=delegates,
        )
        self._on_start = on_start
        self._failed_over = False
        """A delegate of the pool moved to another NIC (a new run takes a fresh pool, its
        delegates on the first)."""
        self._validated: dict[int, Schedule] = {}
        self._checkpoints: str | None = None
        """Where a training engine writes its checkpoints: a temporary folder made at the
        first save, removed at close (marked as this process's: `adaptra-bench cleanup`
        removes it after a kill). Each checkpoint iteration's files (one per stage and
        replica) go into a folder of their own, which counts only once the whole iteration
        succeeded (a failure can come after some stages saved)."""
        self._committed: str | None = None
        """The folder of the last checkpoint that every worker saved."""
        self._resume: str | None = None

    @property
    def pids(self) -> list[int]:
        return list(self._pool.pids)

    @property
    def delegate_pids(self) -> list[list[int]]:
        """Each rank's delegate processes (none in an engine without delegates)."""
        return [list(pids) for pids in self._pool.delegate_pids]

    def run(
        self,
        plan: Plan,
        iteration: int,
        faults: IterationFaults,
        *,
        digest: bool = False,
        checkpoint: bool = False,
    ) -> Outcome:
        profile = plan.profile
        if profile.num_replicas != self.num_replicas:
            raise ConfigError(
                f"the profile has {profile.num_replicas} DP replica(s), the {self.name} engine's "
                f"pool {self.num_replicas}"
            )
        if iteration == 0:  # a new run: from the initial parameters, not another run's state
            self._drop_checkpoint()
            self._resume = None
            if self._failed_over:  # a new run starts on healthy hardware, its delegates on
                self._pool.close()  # the first NIC (as in the simulator): fresh ones
                self._failed_over = False
            # ... and its workers on the default placement, as a fresh pool's (and the
            # simulator's): the last run's swaps are undone outside any iteration.
            self._pool.place_default()
        plan.validate(self._validated)
        if self._pool.delegates is not None:
            wanted = profile.delegate_count()
            if self._pool.running and wanted != self._pool.num_delegates:
                self._check_restartable(iteration, wanted)
                self._pool.close()  # its delegates are started with it: a fresh one
            self._pool.num_delegates = wanted
        if not self._pool.running:  # never started, or closed by a failure: a fresh one
            self._pool.start()
        saves = checkpoint and self.capabilities.trains
        config = IterationConfig(
            iteration,
            plan.schedule,
            plan.iteration_profile(),
            comm=plan.comm.value,
            link_comms=tuple((str(c.link), c.direction, c.comm.value) for c in plan.link_comms),
            topology=plan.topology,
            replica_schedules=plan.replica_schedules,
            faults=faults,
            collect_params=digest,
            save_checkpoint=self._checkpoint_dir() if saves else None,
            load_checkpoint=self._resume,
        )
        started: list[float] = []

        def on_start(start_at: float) -> None:
            started.append(start_at)
            if self._on_start is not None:
                self._on_start(start_at)

        try:
            timeline = self._pool.run_iteration(config, on_start)
        except BaseException as err:
            if config.save_checkpoint is not None:  # some stages may have saved: not a checkpoint
                shutil.rmtree(config.save_checkpoint, ignore_errors=True)
            if not isinstance(err, WorkerError):  # the pool closed itself all the same
                raise
            if isinstance(err, WorkerLinkFailure):
                at_ms = None if err.remote is None else err.remote.at_ms
                if at_ms is None and started:  # noticed, not injected: when the pool heard
                    noticed_s = time.monotonic() if err.noticed_s is None else err.noticed_s
                    at_ms = (noticed_s - started[0]) * 1000.0
                raise LinkFailure(str(err), at_ms=at_ms) from err
            raise
        self._resume = None
        self._failed_over = self._failed_over or bool(timeline.failovers)
        if config.save_checkpoint is not None:
            self._drop_checkpoint()
            self._committed = config.save_checkpoint
        results = self._pool.last_results
        return Outcome(
            timeline,
            loss=replicas_loss(results),
            params_sha256=params_sha256(whole_model_params(results)) if digest else "",
            devices=describe_pool(self._pool.devices),
        )

    def _check_restartable(self, iteration: int, num_delegates: int) -> None:
        """A new delegate count needs a fresh pool: a training engine's workers hold the
        model's state, which a fresh pool has only at iteration 0 or from a checkpoint it
        loads (after a restart)."""
        if self.capabilities.trains and iteration > 0 and self._resume is None:
            raise ConfigError(
                f"the {self.name} engine cannot change the delegate count from "
                f"{self._pool.num_delegates} to {num_delegates} at iteration {iteration}: its "
                "workers hold the model's state, which fresh ones would lose (keep the "
                "count for the run, as the built-in controllers do)"
            )

    def _checkpoint_dir(self) -> str:
        """A new, empty folder for a checkpoint."""
        if self._checkpoints is None:
            self._checkpoints = make_folder(f"{CHECKPOINTS_PREFIX}{self.name}-")
        return tempfile.mkdtemp(prefix="save-", dir=self._checkpoints)

    def _drop_checkpoint(self) -> None:
        if self._committed is not None:
            shutil.rmtree(self._committed, ignore_errors=True)
            self._committed = None

    def restart(self) -> None:
        """A fresh pool of workers (the failed one is closed); a training engine's first
        iteration then loads the run's last checkpoint, if it saved one."""
        self._pool.close()
        self._pool.start()
        self._failed_over = False
        self._resume = self._committed

    def close(self) -> None:
        """Close the pool and remove the checkpoints' folder, also when the pool's close
        raises (a shutdown signal it held while it stopped the workers comes out of it)."""
        try:
            self._pool.close()
        finally:
            if self._checkpoints is not None:
                shutil.rmtree(self._checkpoints, ignore_errors=True)
                self._checkpoints, self._committed = None, None
            self._validated.clear()


def emulated_engine(
    num_stages: int,
    *,
    num_replicas: int = 1,
    launch: LaunchHook = local_launch,
    timeout_s: float = 60.0,
    on_start: Callable[[float], None] | None = None,
    delegates: DelegateFactory | None = None,
) -> RuntimeEngine:
    return RuntimeEngine(
        "emulated",
        num_stages,
        num_replicas=num_replicas,
        launch=launch,
        timeout_s=timeout_s,
        on_start=on_start,
        delegates=delegates,
    )


def megatron_engine(
    num_stages: int,
    model: str,
    *,
    seed: int = 0,
    num_replicas: int = 1,
    launch: LaunchHook = local_launch,
    timeout_s: float = 60.0,
    on_start: Callable[[float], None] | None = None,
    delegates: DelegateFactory | None = None,
) -> RuntimeEngine:
    """Importing megatron-core only inside the workers, once in their fork server (and to
    check the model's split). `seed`: the model's initial weights and its synthetic tokens
    (`MegatronCompute`)."""
    from pipeline.runtime.megatron import WORKER_IMPORTS, MegatronCompute, get_preset

    get_preset(model).check_stages(num_stages)
    preload_in_workers(WORKER_IMPORTS)
    factory = functools.partial(MegatronCompute, model, seed=seed)
    return RuntimeEngine(
        "megatron",
        num_stages,
        num_replicas=num_replicas,
        compute_factory=factory,
        trains=True,
        launch=launch,
        timeout_s=timeout_s,
        on_start=on_start,
        delegates=delegates,
    )
