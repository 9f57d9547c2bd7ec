"""One configuration (schedule x profile x comm x backend) run for K measured iterations."""

from __future__ import annotations

import dataclasses
import statistics

from injectors.fault_timeline import FaultTimeline
from pipeline.errors import ConfigError
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.schedule import Schedule, validate_schedule
from pipeline.simulator import CommMode, simulate_iterations
from pipeline.timeline import Timeline

__all__ = ["BACKENDS", "RunResult", "run_configuration"]

BACKENDS = ("sim", "emulated", "megatron")


@dataclasses.dataclass(frozen=True, slots=True)
class RunResult:
    """Measured iterations only: warm-up iterations are run but not reported."""

    iteration_times_ms: tuple[float, ...]
    step_times_ms: tuple[float, ...]
    bubble_ratios: tuple[float, ...]
    timeline: Timeline

    @property
    def median_iteration_ms(self) -> float:
        return statistics.median(self.iteration_times_ms)

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
) -> RunResult:
    """Warm-up iterations come first; a fault timeline counts iterations from the first
    measured one, and its delays add to the profile's."""
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}; valid backends: {', '.join(BACKENDS)}")
    if backend == "megatron":
        raise ConfigError("backend 'megatron' is not implemented yet; use sim or emulated")
    if num_iterations < 1 or num_warmup_iterations < 0:
        raise ConfigError("iterations must be >= 1 and warm-up iterations >= 0")
    total = num_warmup_iterations + num_iterations
    profiles = [profile] * num_warmup_iterations + _faulty_profiles(profile, faults, num_iterations)
    if backend == "sim":
        timeline = simulate_iterations(schedule, profiles, CommMode(comm))
    else:
        timeline = _run_emulated(schedule, profiles, CommMode(comm))
    measured = [compute_metrics(timeline, i) for i in range(num_warmup_iterations, total)]
    return RunResult(
        iteration_times_ms=tuple(m.iteration_time_ms for m in measured),
        step_times_ms=tuple(m.step_time_ms for m in measured),
        bubble_ratios=tuple(m.bubble_ratio for m in measured),
        timeline=timeline,
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


def _run_emulated(schedule: Schedule, profiles: list[Profile], comm: CommMode) -> Timeline:
    """Real worker processes, one per stage, each op a sleep of its profiled time."""
    if comm is not CommMode.DIRECT:
        raise ConfigError(
            f"comm {comm.value!r} is not available in the emulated runtime yet; use --comm direct"
        )
    from pipeline.runtime import IterationConfig, WorkerPool  # torch: only when needed

    first = profiles[0]
    validate_schedule(schedule, first.num_stages, first.num_microbatches)
    with WorkerPool(first.num_stages) as pool:
        parts = [
            pool.run_iteration(IterationConfig(i, schedule, p)) for i, p in enumerate(profiles)
        ]
    return Timeline.concat(parts)
