"""One configuration (schedule x profile x comm x backend) run for K measured iterations."""

from __future__ import annotations

import dataclasses
import functools
import statistics
from collections.abc import Callable

from injectors.fault_timeline import FaultTimeline
from pipeline.allreduce import AllReduce
from pipeline.errors import ConfigError
from pipeline.host_costs import FREE, HostCosts
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.schedule import Schedule, validate_schedule
from pipeline.simulator import CommMode, simulate_iterations
from pipeline.timeline import Timeline

__all__ = ["BACKENDS", "INJECTIONS", "Replan", "RunResult", "run_configuration"]

BACKENDS = ("sim", "emulated", "megatron")
INJECTIONS = ("hook", "network")
"""How the emulated runtime injects a profile's link delays: a sleep before each send in the
fault hook (the paper's artifact), or in the network of a namespace testbed (a delay wire per
slow link, and htb caps for a link bandwidth; root only)."""

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
    losses: tuple[float, ...] = ()
    """Training loss of each measured iteration (the megatron backend; empty otherwise)."""
    params_sha256: str = ""
    """The trained model's parameters after the last iteration (pipeline.runtime.digest;
    the megatron backend; empty otherwise)."""

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
    injection: str = "hook",
    model: str | None = None,
    host: HostCosts = FREE,
) -> RunResult:
    """Warm-up iterations come first; a fault timeline counts iterations from the first
    measured one, and its delays add to the profile's. With `replan`, every iteration runs
    what it returns for that iteration's profile instead of `schedule` over `comm`. `model`
    names the megatron backend's GPT configuration (default: tiny); the others take none.
    `host`: a host's runtime costs for the simulator (the sim backend only)."""
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}; valid backends: {', '.join(BACKENDS)}")
    if model is not None and backend != "megatron":
        raise ConfigError(f"--model applies to --backend megatron only, not {backend!r}")
    if num_iterations < 1 or num_warmup_iterations < 0:
        raise ConfigError("iterations must be >= 1 and warm-up iterations >= 0")
    if injection not in INJECTIONS:
        raise ConfigError(f"unknown injection {injection!r}; valid: {', '.join(INJECTIONS)}")
    if host != FREE and backend != "sim":
        raise ConfigError(
            f"a calibration is for the simulator (backend sim); the {backend} runtime is "
            "what it is calibrated on"
        )
    if injection == "network" and backend == "sim":
        raise ConfigError("--inject network needs a runtime backend (emulated)")
    total = num_warmup_iterations + num_iterations
    profiles = [profile] * num_warmup_iterations + _faulty_profiles(profile, faults, num_iterations)
    plans = [replan(p) if replan else (schedule, p, CommMode(comm)) for p in profiles]
    losses: list[float] = []
    digest = ""
    if allreduce is not None and backend != "sim":
        raise ConfigError(f"the {backend} runtime does not model the DP all-reduce step yet")
    if backend == "sim":
        parts = simulate_iterations(plans, allreduce=allreduce, host=host)
    elif backend == "emulated":
        parts = _run_emulated(plans, injection)
    else:
        if injection != "hook":
            raise ConfigError("--inject network is for the emulated backend")
        parts, losses, digest = _run_megatron(plans, model or "tiny")
    measured = [compute_metrics(parts[i], i) for i in range(num_warmup_iterations, total)]
    return RunResult(
        iteration_times_ms=tuple(m.iteration_time_ms for m in measured),
        step_times_ms=tuple(m.step_time_ms for m in measured),
        bubble_ratios=tuple(m.bubble_ratio for m in measured),
        comms=tuple(comm for _, _, comm in plans[num_warmup_iterations:]),
        timeline=Timeline.concat(parts) if keep_timeline else None,
        losses=tuple(losses[num_warmup_iterations:]),
        params_sha256=digest,
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


def _check_runtime_plans(plans: list[tuple[Schedule, Profile, CommMode]], runtime: str) -> Profile:
    """The first iteration's profile, once every plan is runnable by the worker runtime:
    direct comm only (no delegate transport yet), schedules valid for that profile."""
    first = plans[0][1]
    for schedule, _, comm in plans:
        if comm is not CommMode.DIRECT:
            raise ConfigError(
                f"comm {comm.value!r} is not available in the {runtime} runtime yet; "
                "use --comm direct"
            )
        validate_schedule(schedule, first.num_stages, first.num_microbatches)
    return first


def _run_emulated(
    plans: list[tuple[Schedule, Profile, CommMode]], injection: str = "hook"
) -> list[Timeline]:
    """Real worker processes, one per stage, each op a sleep of its profiled time."""
    first = _check_runtime_plans(plans, "emulated")
    from pipeline.runtime import IterationConfig, WorkerPool  # torch: only when needed

    if injection == "hook":
        with WorkerPool(first.num_stages) as pool:
            return [
                pool.run_iteration(IterationConfig(i, schedule, p))
                for i, (schedule, p, _) in enumerate(plans)
            ]
    if any(p.delay_ms != first.delay_ms for _, p, _ in plans):
        raise ConfigError(
            "--inject network sets each link's delay once, for the whole run; replay a "
            "fault timeline with --inject hook"
        )
    from injectors.testbed import Testbed

    with Testbed(first.num_stages) as bed:
        for link, delay_ms in enumerate(first.delay_ms):
            if delay_ms:
                bed.add_delay(link, link + 1, plane=0, delay_ms=delay_ms)
            if first.link_bandwidth_gbps is not None:
                for src, dst in ((link, link + 1), (link + 1, link)):
                    bed.cap_bandwidth(src, dst, plane=0, rate_mbit=first.link_bandwidth_gbps * 1e3)
        with WorkerPool(first.num_stages, launch=bed.launcher()) as pool:
            return [
                pool.run_iteration(IterationConfig(i, schedule, p.with_delays(())))  # no sleeps
                for i, (schedule, p, _) in enumerate(plans)
            ]


def _run_megatron(
    plans: list[tuple[Schedule, Profile, CommMode]], model: str
) -> tuple[list[Timeline], list[float], str]:
    """Real worker processes, one per stage, each computing its stage of a megatron GPT; the
    profile gives the stage and microbatch counts and the injected delays (not op times).
    Returns the timelines, the losses and the trained parameters' digest."""
    first = _check_runtime_plans(plans, "megatron")
    from pipeline.runtime import IterationConfig, WorkerPool  # torch: only when needed
    from pipeline.runtime.digest import params_sha256, whole_model_params
    from pipeline.runtime.megatron import MegatronCompute, get_preset

    get_preset(model).check_stages(first.num_stages)
    parts, losses = [], []
    factory = functools.partial(MegatronCompute, model)
    with WorkerPool(first.num_stages, compute_factory=factory) as pool:
        for i, (schedule, p, _) in enumerate(plans):
            config = IterationConfig(i, schedule, p, collect_params=i == len(plans) - 1)
            parts.append(pool.run_iteration(config))
            last = [r.step_output.loss for r in pool.last_results if r.step_output.loss is not None]
            losses.append(last[0])
        digest = params_sha256(whole_model_params(pool.last_results))
    return parts, losses, digest
