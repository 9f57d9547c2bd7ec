"""One configuration (schedule x profile x comm x backend) run for K measured iterations."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable

from injectors.fault_timeline import FaultTimeline
from pipeline.allreduce import AllReduce
from pipeline.errors import ConfigError
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.schedule import Schedule, validate_schedule
from pipeline.simulator import CommMode, simulate_iterations
from pipeline.timeline import Timeline

__all__ = ["BACKENDS", "Replan", "RunResult", "run_configuration"]

BACKENDS = ("sim", "emulated", "megatron")

Replan = Callable[[Profile], tuple[Schedule, Profile, CommMode]]
"""What a system runs under an iteration's (delayed) profile: its schedule, the profile that
schedule sees, and its comm mode (a controller re-planning at iteration boundaries)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RunResult:
    """Measured iterations only: warm-up iterations are run but not reported."""

    iteration_times_ms: tuple[float, ...]
    step_times_ms: tuple[float, ...]
    bubble_ratios: tuple[float, ...]
    comms: tuple[CommMode, ...]
    """The comm mode of each measured iteration (a controller may switch it)."""
    timeline: Timeline | None
    """Every iteration's ops and messages (None when the caller did not keep it)."""

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


def run_configuration(
    schedule: Schedule,
    profile: Profile,
    *,
    backend: str = "sim",
    comm: CommMode | str = CommMode.DIRECT,
    num_iterations: int = 5,
    num_warmup_iterations: int = 1,
    faults: FaultTimeline | None = None,
    replan: Replan | None = None,
    allreduce: AllReduce | None = None,
    keep_timeline: bool = True,
) -> RunResult:
    """Warm-up iterations come first; a fault timeline counts iterations from the first
    measured one, and its delays add to the profile's. With `replan`, every iteration runs
    what it returns for that iteration's profile instead of `schedule` over `comm`."""
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}; valid backends: {', '.join(BACKENDS)}")
    if backend == "megatron":
        raise ConfigError("backend 'megatron' is not implemented yet; use sim or emulated")
    if num_iterations < 1 or num_warmup_iterations < 0:
        raise ConfigError("iterations must be >= 1 and warm-up iterations >= 0")
    total = num_warmup_iterations + num_iterations
    profiles = [profile] * num_warmup_iterations + _faulty_profiles(profile, faults, num_iterations)
    plans = [replan(p) if replan else (schedule, p, CommMode(comm)) for p in profiles]
    if backend == "sim":
        parts = simulate_iterations(plans, allreduce=allreduce)
    else:
        if allreduce is not None:
            raise ConfigError("the emulated runtime does not model the DP all-reduce step yet")
        parts = _run_emulated(plans)
    measured = [compute_metrics(parts[i], i) for i in range(num_warmup_iterations, total)]
    return RunResult(
        iteration_times_ms=tuple(m.iteration_time_ms for m in measured),
        step_times_ms=tuple(m.step_time_ms for m in measured),
        bubble_ratios=tuple(m.bubble_ratio for m in measured),
        comms=tuple(comm for _, _, comm in plans[num_warmup_iterations:]),
        timeline=Timeline.concat(parts) if keep_timeline else None,
    )


def _faulty_profiles(
    profile: Profile, faults: FaultTimeline | None, num_iterations: int
) -> list[Profile]:
    if faults is None:
        return [profile] * num_iterations
    faults.validate(profile.num_stages, num_iterations)
    if faults.failed_at(num_iterations - 1):
        raise ConfigError(
            "the fault timeline fails a NIC; failures are not modelled by the "
            "sim and emulated backends yet (they come with NIC failover)"
        )
    return [
        profile.with_delays(
            [
                a + b
                for a, b in zip(
                    profile.delay_ms, faults.delays_at(i, profile.num_stages), strict=True
                )
            ]
        )
        for i in range(num_iterations)
    ]


def _run_emulated(plans: list[tuple[Schedule, Profile, CommMode]]) -> list[Timeline]:
    """Real worker processes, one per stage, each op a sleep of its profiled time."""
    for _, _, comm in plans:
        if comm is not CommMode.DIRECT:
            raise ConfigError(
                f"comm {comm.value!r} is not available in the emulated runtime yet; "
                "use --comm direct"
            )
    from pipeline.runtime import IterationConfig, WorkerPool  # torch: only when needed

    first = plans[0][1]
    for schedule, _, _ in plans:
        validate_schedule(schedule, first.num_stages, first.num_microbatches)
    with WorkerPool(first.num_stages) as pool:
        return [
            pool.run_iteration(IterationConfig(i, schedule, p))
            for i, (schedule, p, _) in enumerate(plans)
        ]
