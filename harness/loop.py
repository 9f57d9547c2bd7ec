"""The per-iteration control loop: any engine, any controller, the faults in force.

    for k in iterations:  plan = controller.plan(k)
                          outcome = engine.run(plan, k, faults.at(k, topology, rates=rates))
                          controller.observe(k, outcome.timeline)
                          on_iteration(k, outcome.timeline, measured)

Warm-up iterations come first and run healthy; a fault view counts its iterations from the
first measured one. Metrics are taken per iteration as it ends, so memory stays flat in the
number of iterations unless the caller keeps the timelines: a caller that wants some of them,
or wants to save each one as it ends, passes `on_iteration` (harness.saved).
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
import time
from collections.abc import Callable

from pipeline.checks import check_wait_s
from pipeline.engines import Action, Controller, Engine, check_link_terms, check_plan
from pipeline.errors import ConfigError, LinkFailure
from pipeline.faults import NO_FAULTS, AfterWarmup, FaultView
from pipeline.metrics import Metrics, compute_metrics
from pipeline.simulator import CommMode
from pipeline.timeline import Timeline
from pipeline.topology import Topology

__all__ = [
    "CHECKPOINT_RESTART",
    "MAX_ITERATIONS",
    "IterationDecision",
    "OnIteration",
    "Recovery",
    "RunResult",
    "iteration_name",
    "run_loop",
]

MAX_ITERATIONS = 100_000
"""The most iterations one run takes, warm-ups and measured each: a run keeps every
iteration's records (100,000 of a 2-stage sim: 0.69 GB, 10 s here)."""

OnIteration = Callable[[int, Timeline, bool, int | None], None]
"""Called as each iteration ends: (the engine's iteration index, warm-ups included; its
timeline; whether it is measured; the earlier iteration it repeats, `Outcome.same_as`).
After a restart the lost iterations end again."""

_REMEMBERED = 64
"""Metrics of this many computed iterations are kept for the iterations that repeat them."""


@dataclasses.dataclass(frozen=True, slots=True)
class IterationDecision:
    """What the controller believed when it planned a measured iteration, and what it ran
    (the `iterations` records of `run --format json` and iterations.csv)."""

    detected_ms: dict[str, float]
    """The links it called slow (PP and DP ring links), with their estimated extra delays
    (ms)."""
    policy: str
    """The policy that made the iteration's schedule (empty: the run's)."""
    comm: dict[str, str]
    """Each PP link's comm mode: "direct", "delegated" (or "ideal")."""
    microbatches: str = ""
    """How the global batch was split over the DP replicas where unevenly (a rebalance),
    e.g. "12+4" (`ReplicaSchedules`); empty: equally."""
    num_delegates: int = 0
    """The delegates per link direction and side its delegated messages went through
    (`Plan.num_delegates`, else all those started); 0: none went over delegates."""


@dataclasses.dataclass(frozen=True, slots=True)
class RunResult:
    """Measured iterations only: warm-up iterations are run but not reported."""

    iteration_times_ms: tuple[float, ...]
    """One per measured iteration run, in the order run (after a restart, the lost ones
    again)."""
    step_times_ms: tuple[float, ...]
    bubble_ratios: tuple[float, ...]
    comms: tuple[CommMode, ...]
    """The comm mode of each measured iteration (a controller may switch it)."""
    timeline: Timeline | None
    """Every iteration's ops and messages (None when the caller did not keep it)."""
    controller: str = "fixed"
    """Which controller planned the iterations (pipeline.engines.control)."""
    losses: tuple[float, ...] = ()
    """Training loss of each measured iteration (engines that train; empty otherwise)."""
    params_sha256: str = ""
    """The trained model's parameters after the last iteration (pipeline.runtime.digest;
    engines that train; empty otherwise)."""
    devices: str = ""
    """Where a runtime's workers computed and how they talked (`Outcome.devices`)."""
    iterations: tuple[int, ...] = ()
    """Which measured iteration (from 0) each time is of."""
    reused_iterations: int = 0
    """Iterations the engine did not compute again: the same plan and faults as an earlier
    one (the simulator; per-message draws rule it out)."""
    restarts: int = 0
    """Checkpoint-restarts: after link or NIC failures, and those a controller asked for."""
    lost_iterations: int = 0
    """Iterations run again after restarts (they are in the times too)."""
    restart_wall_ms: float = 0.0
    """Measured: the harness's time restarting engines (closing and starting pools)."""
    restart_model_ms: float = 0.0
    """Modelled: per restart, the failed iteration up to its failure, the detection timeout
    (sim) and the configured restart cost (harness.loop.Recovery); a restart a controller
    asked for, the configured restart cost."""
    decisions: tuple[IterationDecision, ...] = ()
    """One per measured iteration run, as the times."""
    rerun_iterations: frozenset[int] = frozenset()
    """The measured iterations (from 0) run again after a restart: their run before it failed
    (the one a link failure came in) or was lost (since the checkpoint). Their last run is the
    one after the restart."""
    num_failovers: tuple[int, ...] = ()
    """One per measured iteration run, as the times: its timeline's `failovers`, the moves to
    another NIC (delegated runs; one per sender delegate that moved in the runtimes, one per
    link direction in the simulator)."""
    num_moved_workers: tuple[int, ...] = ()
    """One per measured iteration run, as the times: its timeline's `swaps`, the workers a
    rank swap moved to another position at its start (in the first iteration after a
    failure's restart, which places the workers anew, those playing another position than
    in the last iteration that ran: a swap made in the failed iteration; after a restart a
    controller asked for, none: no iteration failed, and Falcon's return to the default
    placement there is the restart's, no rank swap)."""
    restart_causes: tuple[str, ...] = ()
    """One line per restart, in order: what failed (the `LinkFailure`, its iterations counted
    from the first measured one), or the controller that asked, and when."""
    restarted_before: tuple[int, ...] = ()
    """One per restart, in order: the index in `timeline.iterations` (warm-ups too) of the
    first iteration run after it (`pipeline.trace.RestartMark`)."""

    @property
    def comms_run(self) -> str:
        """The comm modes its measured iterations ran over, in the order first used:
        "direct", "nccl-sleep", "direct+delegated" (a controller that moved)."""
        return "+".join(dict.fromkeys(comm.value for comm in self.comms))

    @property
    def median_iteration_ms(self) -> float:
        return statistics.median(self.iteration_times_ms)

    @property
    def wall_times_ms(self) -> tuple[float, ...]:
        """Iteration plus step (DP all-reduce and optimizer): the time per training step."""
        return tuple(
            t + s for t, s in zip(self.iteration_times_ms, self.step_times_ms, strict=True)
        )

    @property
    def median_wall_ms(self) -> float:
        return statistics.median(self.wall_times_ms)

    @property
    def mean_iteration_ms(self) -> float:
        return statistics.fmean(self.iteration_times_ms)

    @property
    def total_ms(self) -> float:
        """The whole run's time: every step run (lost ones again) and the restarts."""
        return math.fsum(self.wall_times_ms) + self.restart_model_ms


@dataclasses.dataclass(frozen=True, slots=True)
class Recovery:
    """How a job comes back from a failed link or NIC that its traffic does not fail over
    (1F1B and ZB always, Adaptra over the direct path or with no NIC left): the harness
    checkpoint-restarts it."""

    checkpoint_every: int = 500
    """Measured iterations between checkpoints (torchtitan's default `checkpoint.interval`:
    500 steps); the run starts from one."""
    failure_timeout_ms: float = 600_000.0
    """How long the simulated job takes to notice a failure: the collective's timeout (10 min:
    torch.distributed's NCCL default and Megatron's `--distributed-timeout-minutes`). The
    runtimes' fault hook fails the send at once: there it is not added."""
    restart_ms: float = 0.0
    """The cluster's cost to restart the job and reload its checkpoint (rescheduling,
    process start, communicator set-up, loading): not modelled unless configured."""
    transport_timeout_s: float = 60.0
    """How long a runtime worker waits for one message before it gives up (`run --timeout`,
    a spec's `transport_timeout_s`; the pool's default; at most a day, MAX_WAIT_S): on the
    namespace testbed a failed NIC is noticed by this timeout, and the failed iteration's
    measured time includes it."""

    def __post_init__(self) -> None:
        if self.checkpoint_every < 1 or not (self.failure_timeout_ms >= 0 and self.restart_ms >= 0):
            raise ConfigError("checkpoint_every must be >= 1 and the restart costs >= 0 ms")
        check_wait_s("transport_timeout_s", self.transport_timeout_s)  # as run --timeout


CHECKPOINT_RESTART = Recovery()
"""The default recovery (the values above)."""


@dataclasses.dataclass(slots=True)
class _Restarts:
    count: int = 0
    lost_iterations: int = 0
    wall_ms: float = 0.0
    model_ms: float = 0.0
    attempted: int = -1
    """The highest iteration (warm-ups included) an engine began: one at or below it runs
    again."""
    rerun: set[int] = dataclasses.field(default_factory=set)
    """Measured iterations (from 0) run again."""
    causes: list[str] = dataclasses.field(default_factory=list)
    before: list[int] = dataclasses.field(default_factory=list)
    """Per restart: how many iterations had ended by then, warm-ups too (`restarted_before`)."""


def run_loop(
    engine: Engine,
    controller: Controller,
    *,
    num_iterations: int,
    num_warmup_iterations: int = 1,
    faults: FaultView = NO_FAULTS,
    keep_timeline: bool = True,
    recovery: Recovery = CHECKPOINT_RESTART,
    on_iteration: OnIteration | None = None,
) -> RunResult:
    """A link failure in a measured iteration restarts the job from its last checkpoint on
    repaired hardware (the failures that had started by the failed message's time replaced;
    one that starts later in that iteration still happens when it runs again): the
    iterations since are lost and run again (they count in the times); the failed iteration
    costs `restart_model_ms` (its time to the failure, the detection timeout in sim, the
    configured restart cost). A plan whose action is
    `Action.RESTART` (a controller's choice, in a measured iteration) restarts the same way
    before that iteration runs, on hardware without the failures and slow links that started
    before it (the restart leaves them out; those that start in it still happen), at the
    configured restart cost."""
    if num_iterations < 1 or num_warmup_iterations < 0:
        raise ConfigError("iterations must be >= 1 and warm-up iterations >= 0")
    check_link_terms(engine, controller)
    view: FaultView = AfterWarmup(faults, num_warmup_iterations)
    total = num_warmup_iterations + num_iterations
    times, steps, bubbles, comms, losses, parts, indices = [], [], [], [], [], [], []
    num_failovers: list[int] = []
    num_moved_workers: list[int] = []
    decisions: list[IterationDecision] = []
    params_sha256 = devices = ""
    restarts = _Restarts()
    reused = num_ended = 0
    remembered: dict[int, Metrics] = {}
    checkpoint = num_warmup_iterations
    k = 0
    asked = restarted = False
    placed: Topology | None = None
    """The placement of the last iteration that ran (None: none since the start or a restart
    the controller asked for)."""
    while k < total:
        plan = controller.plan(k)
        check_plan(engine, plan)
        if plan.action is Action.RESTART:
            if k < num_warmup_iterations or asked:
                raise ConfigError(
                    f"controller {controller.name} asked for a restart at iteration {k}: "
                    + ("in the warm-up" if not asked else "again, before any iteration ran")
                )
            _restart(engine, restarts, recovery, None, k - checkpoint, num_ended)
            restarts.causes.append(
                f"controller {controller.name}'s request before iteration "
                f"{k - num_warmup_iterations}"
            )
            remembered.clear()  # the indices run again, under other faults
            view = view.repaired(k, stragglers=True)
            controller.restarted(k, stragglers=True)
            k, asked, restarted = checkpoint, True, True
            placed = None  # no iteration failed: none of its swaps went uncounted
            continue
        asked = False
        topology = plan.topology or plan.profile.topology
        digest = k == total - 1 and engine.capabilities.trains
        # A checkpoint is the state after iteration k: the end of the warm-up, then every
        # `checkpoint_every` measured iterations.
        done = k + 1 - num_warmup_iterations
        save = done >= 0 and done % recovery.checkpoint_every == 0
        if k <= restarts.attempted:  # again after a restart (from a checkpoint: measured)
            restarts.rerun.add(k - num_warmup_iterations)
        restarts.attempted = max(restarts.attempted, k)
        try:
            in_force = view.at(k, topology, rates=plan.profile.link_rates)
            outcome = engine.run(plan, k, in_force, digest=digest, checkpoint=save)
        except LinkFailure as failure:
            if k < num_warmup_iterations or not engine.capabilities.restarts:
                raise
            _restart(engine, restarts, recovery, failure, k - checkpoint, num_ended)
            named = measured_numbering(str(failure), num_warmup_iterations)
            restarts.causes.append(f"{type(failure).__name__}: {named}")
            remembered.clear()
            at_ms = math.inf if failure.at_ms is None else failure.at_ms
            view = view.repaired(k, at_ms=at_ms)  # what had failed by then
            controller.restarted(k, stragglers=False, at_ms=at_ms)
            k, restarted = checkpoint, True
            continue
        controller.observe(k, outcome.timeline)
        # The first iteration after a restart places the workers anew, its swaps no rank
        # swap's; but a swap made in the failed iteration stays: its workers moved. After a
        # restart the controller asked for (`placed` None) none failed: none moved.
        moved_workers = len(outcome.timeline.swaps)
        if restarted:
            moved_workers = 0 if placed is None else _num_moved(placed, topology)
        placed, restarted = topology, False
        params_sha256 = outcome.params_sha256 or params_sha256
        devices = outcome.devices or devices
        reused += outcome.same_as is not None
        if on_iteration is not None:
            on_iteration(k, outcome.timeline, k >= num_warmup_iterations, outcome.same_as)
        if keep_timeline:
            parts.append(outcome.timeline)
        num_ended += 1
        k += 1
        if k <= num_warmup_iterations:
            continue
        if (k - num_warmup_iterations) % recovery.checkpoint_every == 0:
            checkpoint = k
        # Kept under the iteration that ran: a warm-up one too, which later ones can repeat.
        ran = k - 1 if outcome.same_as is None else outcome.same_as
        metrics = None if outcome.same_as is None else remembered.get(ran)
        if metrics is None:
            metrics = compute_metrics(outcome.timeline, k - 1)
            if len(remembered) >= _REMEMBERED:
                remembered.pop(next(iter(remembered)))
            remembered[ran] = metrics
        indices.append(k - 1 - num_warmup_iterations)
        times.append(metrics.iteration_time_ms)
        steps.append(metrics.step_time_ms)
        bubbles.append(metrics.bubble_ratio)
        comms.append(plan.comm)
        num_failovers.append(len(outcome.timeline.failovers))
        num_moved_workers.append(moved_workers)
        decisions.append(
            IterationDecision(
                dict(plan.believed_ms),
                plan.policy,
                plan.comm_by_link(),
                "" if plan.replica_schedules is None else str(plan.replica_schedules),
                plan.num_delegates_used() if plan.uses_delegates() else 0,
            )
        )
        if outcome.loss is not None:
            losses.append(outcome.loss)
    return RunResult(
        iteration_times_ms=tuple(times),
        step_times_ms=tuple(steps),
        bubble_ratios=tuple(bubbles),
        comms=tuple(comms),
        timeline=Timeline.concat(parts) if keep_timeline else None,
        controller=controller.name,
        losses=tuple(losses),
        params_sha256=params_sha256,
        devices=devices,
        iterations=tuple(indices),
        reused_iterations=reused,
        restarts=restarts.count,
        lost_iterations=restarts.lost_iterations,
        restart_wall_ms=restarts.wall_ms,
        restart_model_ms=restarts.model_ms,
        decisions=tuple(decisions),
        rerun_iterations=frozenset(restarts.rerun),
        num_failovers=tuple(num_failovers),
        num_moved_workers=tuple(num_moved_workers),
        restart_causes=tuple(restarts.causes),
        restarted_before=tuple(restarts.before),
    )


def _num_moved(before: Topology, after: Topology) -> int:
    """The workers playing another position under `after` than under `before`."""
    return sum(a != b for a, b in zip(before.workers, after.workers, strict=True))


_ENGINE_ITERATION = re.compile(r"\biteration (\d+)\b(?!\.\d)")
"""An iteration an engine's error names: counted by the engine, warm-ups too."""


def iteration_name(index: int, num_warmup_iterations: int, num_iterations: int) -> str:
    """The engine's iteration `index` (warm-ups first) as progress names it: "warm-up
    iteration 0 of 0-0", "iteration 6 of 0-11", from 0 among the measured ones, as the
    fault timeline, the results and a failure's message count them (a failure in "iteration
    7" comes after "iteration 6 of 0-11")."""
    if index < num_warmup_iterations:
        return f"warm-up iteration {index} of 0-{num_warmup_iterations - 1}"
    return f"iteration {index - num_warmup_iterations} of 0-{num_iterations - 1}"


def measured_numbering(text: str, num_warmup_iterations: int) -> str:
    """`text`, an engine's error, counting iterations as the results and the fault timeline
    do: from the first measured one, "warm-up iteration N" before it."""

    def measured(match: re.Match[str]) -> str:
        index = int(match.group(1)) - num_warmup_iterations
        return f"iteration {index}" if index >= 0 else f"warm-up iteration {match.group(1)}"

    return _ENGINE_ITERATION.sub(measured, text)


def _restart(
    engine: Engine,
    restarts: _Restarts,
    recovery: Recovery,
    failure: LinkFailure | None,
    lost: int,
    num_ended: int,
) -> None:
    """`failure`: what failed (None: a controller asked for the restart); `num_ended`: the
    iterations that had ended by then (warm-ups too)."""
    started = time.monotonic()
    engine.restart()
    restarts.wall_ms += (time.monotonic() - started) * 1000.0
    restarts.count += 1
    restarts.before.append(num_ended)
    restarts.lost_iterations += lost
    restarts.model_ms += recovery.restart_ms
    if failure is not None:
        detection_ms = recovery.failure_timeout_ms if engine.name == "sim" else 0.0
        restarts.model_ms += (failure.at_ms or 0.0) + detection_ms
