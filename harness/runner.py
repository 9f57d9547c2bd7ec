"""One configuration (schedule x profile x comm x backend) run for K measured iterations."""

from __future__ import annotations

import dataclasses
import functools
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
    losses: tuple[float, ...] = ()
    """Training loss of each measured iteration (the megatron backend; empty otherwise)."""

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
    model: str | None = None,
) -> RunResult:
    """Warm-up iterations come first; a fault timeline counts iterations from the first
    measured one, and its delays add to the profile's. `model` names the megatron backend's
    GPT configuration (default: tiny); the other backends take none."""
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}; valid backends: {', '.join(BACKENDS)}")
    if model is not None and backend != "megatron":
        raise ConfigError(f"--model applies to --backend megatron only, not {backend!r}")
    if num_iterations < 1 or num_warmup_iterations < 0:
        raise ConfigError("iterations must be >= 1 and warm-up iterations >= 0")
    total = num_warmup_iterations + num_iterations
    profiles = [profile] * num_warmup_iterations + _faulty_profiles(profile, faults, num_iterations)
    losses: tuple[float, ...] = ()
    if backend == "sim":
        timeline = simulate_iterations(schedule, profiles, CommMode(comm))
    elif backend == "emulated":
        timeline = _run_emulated(schedule, profiles, CommMode(comm))
    else:
        timeline, all_losses = _run_megatron(schedule, profiles, CommMode(comm), model or "tiny")
        losses = tuple(all_losses[num_warmup_iterations:])
    measured = [compute_metrics(timeline, i) for i in range(num_warmup_iterations, total)]
    return RunResult(
        iteration_times_ms=tuple(m.iteration_time_ms for m in measured),
        step_times_ms=tuple(m.step_time_ms for m in measured),
        bubble_ratios=tuple(m.bubble_ratio for m in measured),
        timeline=timeline,
        losses=losses,
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


def _run_megatron(
    schedule: Schedule, profiles: list[Profile], comm: CommMode, model: str
) -> tuple[Timeline, list[float]]:
    """Real worker processes, one per stage, each computing its stage of a megatron GPT; the
    profile gives the stage and microbatch counts and the injected delays (not op times)."""
    if comm is not CommMode.DIRECT:
        raise ConfigError(
            f"comm {comm.value!r} is not available in the megatron runtime yet; use --comm direct"
        )
    from pipeline.runtime import IterationConfig, WorkerPool  # torch: only when needed
    from pipeline.runtime.megatron import MegatronCompute, get_preset

    first = profiles[0]
    get_preset(model).check_stages(first.num_stages)
    validate_schedule(schedule, first.num_stages, first.num_microbatches)
    parts, losses = [], []
    factory = functools.partial(MegatronCompute, model)
    with WorkerPool(first.num_stages, compute_factory=factory) as pool:
        for i, p in enumerate(profiles):
            parts.append(pool.run_iteration(IterationConfig(i, schedule, p)))
            last = [r.step_output.loss for r in pool.last_results if r.step_output.loss is not None]
            losses.append(last[0])
    return Timeline.concat(parts), losses
