"""Policy and system names: what orders the ops, and what the results call a system."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable

from adaptra.control import DelegatingController, DetectingController, unmeasurable_kinds
from adaptra.control.detector import DEFAULT_THRESHOLDS
from adaptra.oracle import OracleController
from adaptra.scheduler import plan_adaptra, plan_initial
from baselines import one_f_one_b, zb_auto, zb_h1, zb_h2
from baselines.falcon import FalconController
from baselines.falcon.changepoint import DEFAULT_CHANGES
from baselines.fixed_plan import FixedPlan
from harness.loop import CHECKPOINT_RESTART, Recovery
from injectors.fault_model import FaultModel, TargetKind
from pipeline.allreduce import largest_chunk_bytes
from pipeline.checks import MAX_WAIT_S
from pipeline.engines import Controller, Plan
from pipeline.errors import ConfigError
from pipeline.faults import NO_FAULTS, FaultView
from pipeline.link_terms import ALL_LINK_TERMS, LinkTerms
from pipeline.profile import Profile
from pipeline.schedule import Schedule
from pipeline.simulator import CommMode
from pipeline.topology import Link, link_name

__all__ = [
    "DEFAULT_MILP_TIME_LIMIT_S",
    "GIVEN_POLICY",
    "POLICIES",
    "SYSTEMS",
    "PlannedSchedule",
    "blind_detector_warning",
    "noisy_ring_warning",
    "plan",
    "resolve_system",
    "static_dp_delay_warning",
    "sub_onset_delay_warning",
    "system_controller",
    "with_delegate_count",
]

DEFAULT_MILP_TIME_LIMIT_S = 30.0
GIVEN_POLICY = "given"
"""The `policy` of a schedule read from a file (--schedule); its `method` names the file."""


@dataclasses.dataclass(frozen=True, slots=True)
class PlannedSchedule:
    policy: str
    method: str
    schedule: Schedule
    generation_ms: float


Builder = Callable[[Profile, float | None], tuple[Schedule, str]]


def _static(build: Callable[[Profile], Schedule], method: str) -> Builder:
    return lambda profile, _time_limit_s: (build(profile), method)


def _adaptra(profile: Profile, time_limit_s: float | None) -> tuple[Schedule, str]:
    """Adaptra's plan; `method` says what was proven, as `milp`'s does: a search that
    reached the lower bound is optimal (a CP-SAT proof says so itself)."""
    planned = plan_adaptra(profile, exact_time_limit_s=time_limit_s)
    at_bound = planned.optimal and "cp-sat" not in planned.method
    return planned.schedule, planned.method + (": at the lower bound, optimal" if at_bound else "")


def _milp(profile: Profile, time_limit_s: float | None) -> tuple[Schedule, str]:
    """The exact solver, warm-started from `adaptra`'s plan (its heuristic and, on a small
    problem, its own short solve: a start never worse than `adaptra`); `method` says what
    was proven."""
    from adaptra.exact import rounded_to, solve_exact  # OR-Tools loads slowly: when used

    limit = DEFAULT_MILP_TIME_LIMIT_S if time_limit_s is None else time_limit_s
    warm = plan_adaptra(profile)
    if warm.optimal:  # nothing left to search (a short limit might not prove it again)
        return warm.schedule, f"adaptra's, proven optimal ({warm.method}): no solve"
    result = solve_exact(profile, time_limit_s=limit, warm_start=warm.schedule)
    # A profile's times not whole microseconds: the proof is of the model rounded to 1 us
    # (or coarser, where 1 us units would be longer than a profile's times may be).
    rounded = rounded_to(result)
    if result.optimal:
        return result.schedule, f"cp-sat optimal{rounded}"
    return result.schedule, (
        f"cp-sat best found in {limit:g} s (bound {result.lower_bound_ms:g} ms{rounded}), "
        f"warm-started from {warm.method}"
    )


POLICIES: dict[str, Builder] = {
    "1f1b": _static(one_f_one_b, "megatron warm-up"),
    "zb-h1": _static(zb_h1, "handcrafted"),
    "zb-h2": _static(zb_h2, "handcrafted"),
    "zb": _static(zb_auto, "automatic heuristic, fault-free order"),
    "adaptra-initial": _static(plan_initial, "alg1+generator"),
    "adaptra": _adaptra,
    "milp": _milp,
}


TIMED_POLICIES = ("adaptra", "milp")
"""The policies that run the exact solver, which a time limit bounds."""


def plan(policy: str, profile: Profile, *, time_limit_s: float | None = None) -> PlannedSchedule:
    """Build the policy's schedule for the profile, timing everything the call does."""
    if policy not in POLICIES:
        raise ConfigError(f"unknown policy {policy!r}; valid policies: {', '.join(POLICIES)}")
    if time_limit_s is not None:
        if policy not in TIMED_POLICIES:
            raise ConfigError(
                f"--time-limit is for the exact solver ({', '.join(TIMED_POLICIES)}), not {policy}"
            )
        if not 0 < time_limit_s <= MAX_WAIT_S:
            raise ConfigError(
                f"--time-limit must be in (0, {MAX_WAIT_S}] seconds, got {time_limit_s:g}"
            )
    start = time.perf_counter()
    schedule, method = POLICIES[policy](profile, time_limit_s)
    generation_ms = (time.perf_counter() - start) * 1000.0
    return PlannedSchedule(policy, method, schedule, generation_ms)


SYSTEMS: dict[str, tuple[str, str]] = {
    "1f1b": ("1f1b", "direct"),
    "zb-h1": ("zb-h1", "direct"),
    "zb-h2": ("zb-h2", "direct"),
    "zb": ("zb", "direct"),
    "adaptra-cpu": ("zb", "delegated"),
    "adaptra": ("adaptra", "delegated"),
    "adaptra-oracle": ("adaptra", "delegated"),
    "falcon": ("zb", "direct"),
}
"""The benchmarked systems as (policy, comm). `adaptra` plans from what its detector
measures (adaptra.control); `adaptra-cpu` delegates ZB's schedule throughout; both move a
slow DP ring link they detect onto a PP edge (a rank swap); `adaptra-oracle` reads the
fault model (adaptra.oracle): the reference for what detecting costs. `falcon` runs ZB's
schedule and mitigates a slow DP link from what it measures (baselines.falcon)."""

ADAPTIVE = ("adaptra", "adaptra-oracle")
"""The systems whose controller re-plans during a run."""


def resolve_system(system: str, profile: Profile) -> tuple[str, str]:
    """The policy and comm of a system under a profile: Adaptra stays on the direct path while
    no straggler is seen (no delay), and delegates once one is."""
    if system not in SYSTEMS:
        raise ConfigError(f"unknown system {system!r}; valid systems: {', '.join(SYSTEMS)}")
    policy, comm = SYSTEMS[system]
    if system in ADAPTIVE and not any(profile.delay_ms):
        comm = "direct"
    return policy, comm


Planner = Callable[[str, Profile], Schedule]
"""A policy's schedule for a profile (memoise it to share plans between configurations)."""


def _planned(policy: str, profile: Profile) -> Schedule:
    return plan(policy, profile).schedule


_MEASURED_KINDS = {"adaptra": ("PP", "DP"), "adaptra-cpu": ("DP",)}
"""The kinds of link each detector-driven system's controller reads."""


NOISY_CHUNK_BYTES = 4 << 20
"""Ring chunks this large or larger (`noisy_ring_warning`): on 2 busy cores, healthy rings of
8 MiB chunks were called slow in 32 and 38 of 40 fault-free iterations (two runs), and
swapped twice in each; of 2 MiB in none (benchmarks/bench_detector.py, section 4)."""


def noisy_ring_warning(system: str, profile: Profile, backend: str) -> str | None:
    """A warning line where `system`'s detector reads the DP ring of a runtime backend (its
    times this host's) whose chunks are `NOISY_CHUNK_BYTES` or larger: a loaded host moves
    such a chunk's time from iteration to iteration, and ring to ring, by more than the
    detector's onset (adaptra.control.detector's known limits)."""
    if backend == "sim" or "DP" not in _MEASURED_KINDS.get(system, ()):
        return None
    if profile.num_replicas < 2:
        return None
    largest = max(
        largest_chunk_bytes(grad_bytes, profile.dp_bucket_bytes, profile.num_replicas)
        for grad_bytes in profile.allreduce_bytes
    )
    if largest < NOISY_CHUNK_BYTES:
        return None
    return (
        f"warning: {system}'s detector compares the DP rings' chunk times with each other, "
        f"and chunks this large (up to {largest / (1 << 20):.3g} MiB) vary on a loaded host by "
        "more than its onset: it may call healthy rings slow and swap them (on 2 busy cores, "
        "rings of 8 MiB chunks were called slow in 32-38 of 40 fault-free iterations, of 2 MiB "
        "chunks in none: BENCHMARKS.md); smaller DP buckets (dp_bucket_bytes) make smaller "
        "chunks"
    )


_SWAPPING = ("adaptra", "adaptra-cpu")
"""The systems that move a DP ring link they find slow onto a PP edge (a rank swap) from the
start (Falcon waits for a change in iteration time, which a profile's delay never makes:
`_falcon_blind_warning`)."""


def static_dp_delay_warning(system: str, profile: Profile) -> str | None:
    """A warning line where `system` swaps a slow DP ring link (`_SWAPPING`) and the delay
    is `profile`'s own: that goes with its logical link through a swap (pipeline.profile;
    a fault timeline's stays on its hosts), so a swap pays its cost and moves nothing."""
    delayed = sorted(str(link) for link, delay_ms in profile.dp_delay_ms if delay_ms)
    if system not in _SWAPPING or not delayed or profile.num_stages < 2:
        return None
    return (
        f"warning: {system} moves a DP ring link it finds slow onto a PP edge (a rank swap), "
        f"but the profile's own delay on {', '.join(delayed)} goes with the logical link "
        "through a swap: a swap cannot move it, and costs its time (a fault timeline's delay "
        "stays on its hosts: give it as a timeline row to see a swap move it)"
    )


def blind_detector_warning(
    system: str,
    profile: Profile,
    faults: FaultView = NO_FAULTS,
    *,
    num_warmup_iterations: int = 1,
) -> str | None:
    """A warning line where `system` decides from what it measures and cannot see the
    delays it runs under: Adaptra's detectors where every link of a kind they read is slow
    from the first iteration they see (`_adaptra_blind_warning`), Falcon where a delay is
    there before its change-point detector has its healthy level (`_falcon_blind_warning`).
    `faults` and `num_warmup_iterations`: the run's (a timeline counts from the first
    measured iteration; the warm-up runs healthy)."""
    if system == "falcon":
        return _falcon_blind_warning(profile, faults, num_warmup_iterations)
    if system in _MEASURED_KINDS:
        return _adaptra_blind_warning(system, profile, faults, num_warmup_iterations)
    return None


def _adaptra_blind_warning(
    system: str, profile: Profile, faults: FaultView, num_warmup_iterations: int
) -> str | None:
    """Where the delays in force in the first iteration slow every link of a kind `system`
    reads, or every DP ring link whose chunks are as large, within 5 % (`unmeasurable_kinds`,
    `pipeline.message_sizes`): nothing is left to compare them against, and it sees none of
    them slow. Those are the profile's own, and a fault timeline's where no warm-up
    iteration runs before it (the detector's floor is the least time it has seen: a healthy
    warm-up sets it)."""
    measured = _MEASURED_KINDS[system]
    delayed = profile
    blind = [k for k in unmeasurable_kinds(delayed) if k in measured]
    advice = "delay some of the links only, or start the delay later with a fault timeline"
    if not blind and not num_warmup_iterations:
        delayed = _with_first_iteration_faults(profile, faults)
        blind = [k for k in unmeasurable_kinds(delayed) if k in measured]
        advice = "run a warm-up iteration first, or delay some of the links only"
    if not blind:
        return None
    some_rings = "DP" in blind and not _every_ring_delayed(delayed)
    links = " and every ".join(
        "DP link with chunks of one size" if kind == "DP" and some_rings else f"{kind} link"
        for kind in blind
    )
    return (
        f"warning: {system} finds slow links by comparing them with healthy ones, and every "
        f"{links} here is delayed from the first iteration: it will see none "
        f"{'of them ' if some_rings else ''}slow ({advice})"
    )


def sub_onset_delay_warning(
    system: str, profile: Profile, faults: FaultView = NO_FAULTS
) -> str | None:
    """A warning line where `system`'s detector reads links that a delay slows by less than
    its onset (`Thresholds.onset_ms`, 8 ms: set clear of a loaded host's noise, not by what a
    delay costs): the profile's own, or a fault timeline's delay rows (their fixed or mean
    delay) on links of a kind it reads, or on hosts or a NIC. It never calls such a link
    slow, and the run goes on over its fault-free plan, however much the delay costs there
    (0.1 ms ops, 6 ms on one PP link: ZB's and Adaptra's iteration 24x the fault-free one)."""
    measured = _MEASURED_KINDS.get(system, ())
    if not measured:
        return None
    onset_ms = DEFAULT_THRESHOLDS.onset_ms

    def under(delay_ms: float) -> bool:
        return 0 < delay_ms < onset_ms

    delays = []
    if "PP" in measured:
        delays += [
            f"{d:g} ms on {link_name(i)}" for i, d in enumerate(profile.delay_ms) if under(d)
        ]
    if "DP" in measured:
        delays += [f"{d:g} ms on {link}" for link, d in profile.dp_delay_ms if under(d)]
    if isinstance(faults, FaultModel):
        for event in faults.events:
            effect, target = event.effect, event.target
            mean_ms = effect.normal_ms[0] if effect.normal_ms is not None else effect.delay_ms
            read = target.kind is not TargetKind.LINKS or any(
                ("PP" if link.is_pp else "DP") in measured for link in target.links
            )
            if effect.kind == "delay" and read and under(mean_ms):
                delays.append(f"{mean_ms:g} ms on {target} (the timeline's row {event.row})")
    if not delays:
        return None
    return (
        f"warning: {system}'s detector calls a link slow from {onset_ms:g} ms of extra delay "
        f"(its onset, set clear of a loaded host's noise) and never sees {'; '.join(delays)}: "
        "it runs them on its fault-free plan, whatever they cost there (adaptra-oracle plans "
        "for the delays it is told)"
    )


def _every_ring_delayed(profile: Profile) -> bool:
    """Whether `profile`'s own delays slow every stage's DP ring link (else only those of
    the stages whose chunks are as large, within 5 %, leave the detector blind:
    `unmeasurable_kinds`)."""
    delayed = {link for link, delay_ms in profile.dp_delay_ms if delay_ms}
    rings = (profile.topology.dp_ring(stage) for stage in range(profile.num_stages))
    return all(link in delayed for ring in rings for link in ring)


def _with_first_iteration_faults(profile: Profile, faults: FaultView) -> Profile:
    """`profile` with the delays a fault timeline keeps in force in its iteration 0 added: on
    a DP ring link its own, on a PP link the least of any replica's (a profile's PP delay
    slows that link in every replica)."""
    if not isinstance(faults, FaultModel):
        return profile
    topology = profile.topology
    pp_ms = [
        (profile.delay_ms[stage] if stage < len(profile.delay_ms) else 0.0)
        + min(
            faults.link_delay_ms(0, topology, Link.pp(stage, replica))
            for replica in range(topology.num_replicas)
        )
        for stage in range(topology.num_stages - 1)
    ]
    dp_ms = dict(profile.dp_delay_ms)
    for name, delay_ms in faults.dp_delays_ms(0, topology):
        link = Link.parse(name)
        dp_ms[link] = dp_ms.get(link, 0.0) + delay_ms
    return profile.with_delays(pp_ms, dp_ms)


def _falcon_blind_warning(
    profile: Profile, faults: FaultView, num_warmup_iterations: int
) -> str | None:
    """Where Falcon's change-point detector takes a delayed iteration time for the healthy
    one: it sets its prior from the run's first `num_calibration` iterations (warm-up ones
    included; baselines.falcon.changepoint), so a delay in the profile (there from the
    first iteration) or a fault timeline's delay in force in any of them (two slow ones
    among three set the level) may never be seen as a change."""
    calibration = DEFAULT_CHANGES.num_calibration
    first_clear = max(0, calibration - num_warmup_iterations)  # a delay may start here on
    if any(profile.delay_ms) or any(delay_ms for _, delay_ms in profile.dp_delay_ms):
        return (
            "warning: falcon finds a slow link by a change in iteration time, and this "
            "profile's delays are there from the first iteration: it will see no change "
            "and leave them unmitigated (start the delay later with a fault timeline, "
            f"from measured iteration {first_clear} on)"
        )
    topology = profile.topology
    early = [
        k
        for k in range(first_clear)
        if any(faults.pp_delays_ms(k, topology)) or faults.dp_delays_ms(k, topology)
    ]
    if not early:
        return None
    return (
        f"warning: falcon takes its healthy iteration time from the run's first {calibration} "
        f"iterations (warm-up included), and the fault timeline delays a link from measured "
        f"iteration {early[0]}: it may take the slow time for the healthy one and see no "
        f"change (start the faults at measured iteration {first_clear} or later, or run more "
        "warm-up iterations)"
    )


def system_controller(
    system: str,
    profile: Profile,
    faults: FaultView = NO_FAULTS,
    *,
    num_warmup_iterations: int = 1,
    planner: Planner = _planned,
    profile_for: Callable[[Schedule], Profile] | None = None,
    direct_comm: CommMode = CommMode.DIRECT,
    recovery: Recovery = CHECKPOINT_RESTART,
    link_terms: LinkTerms = ALL_LINK_TERMS,
) -> Controller:
    """What runs `system` on `profile` (its op times and static delays) under `faults`:
    Adaptra's controller from measurements (it never reads `faults` or the profile's
    delays; the harness provisions the delegated systems' delegates, D started, for the
    longest delay `faults` keeps, as the paper's artifact set D per experiment:
    `with_delegate_count`; Adaptra's plans use as many of them as they believe needed),
    Adaptra's oracle (it re-plans where the delays in force change), or for the other
    systems their fixed plan. `num_warmup_iterations`: the run's, which its plans'
    iterations count and `faults` does not. `profile_for`: the op times a schedule runs
    under (a cost model's fused or split times). `direct_comm`: how the systems on the direct
    path send (the paper's models: `nccl-sleep`, its GPU path as its artifact injects delays;
    Adaptra before it delegates and Falcon stay on `direct`). `recovery`: the run's, which
    Falcon's ladder weighs a restart by. `link_terms`: the link-model terms the engine that
    runs it imposes on messages, which the detector-driven controllers expect of them
    (`harness.runner.link_terms(backend, injection)`; the default: the simulator's, which
    harness.loop refuses to run on a runtime)."""
    policy, comm = resolve_system(system, profile)
    if SYSTEMS[system][1] == "delegated":
        profile = with_delegate_count(profile, faults)
    if system == "adaptra":
        return DetectingController(
            profile,
            link_terms=link_terms,
            planner=functools.partial(planner, policy),
            profile_for=profile_for,
        )
    if system == "adaptra-oracle":
        return OracleController(
            profile,
            faults,
            num_warmup_iterations=num_warmup_iterations,
            planner=functools.partial(planner, policy),
            profile_for=profile_for,
        )
    schedule = planner(policy, profile)
    if system == "falcon":
        return FalconController(
            schedule,
            profile,
            link_terms=link_terms,
            planner=functools.partial(planner, policy),
            checkpoint_every=recovery.checkpoint_every,
            restart_overhead_ms=recovery.restart_ms,
        )
    run_profile = profile
    if profile_for is not None:
        profile = dataclasses.replace(
            profile_for(schedule).with_delays(profile.delay_ms, profile.dp_delay_ms),
            num_delegates=profile.num_delegates,
        )
    sends = direct_comm if comm == "direct" else CommMode(comm)
    fixed = Plan(schedule, profile, sends, policy=policy)
    if system == "adaptra-cpu":
        return DelegatingController(fixed, run_profile, link_terms=link_terms)
    return FixedPlan(fixed)


def with_delegate_count(profile: Profile, faults: FaultView = NO_FAULTS) -> Profile:
    """`profile` with the delegates started for a whole run settled: its `num_delegates`, or
    the paper's rule for the longest delay the run will see (the profile's, plus the longest
    a fault timeline keeps on a link), so that every engine (the runtimes start their
    delegates once, with their pool) starts the same D (a plan may use fewer:
    `Plan.num_delegates`)."""
    if profile.num_delegates is not None:
        return profile
    extra_ms = faults.longest_delay_ms() if isinstance(faults, FaultModel) else 0.0
    return dataclasses.replace(profile, num_delegates=profile.delegates_needed(extra_ms))
