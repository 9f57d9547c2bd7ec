"""One configuration (a controller's plans x backend x faults) run for K measured iterations,
and the engines it runs on: opened here, shared by an experiment's configurations."""

from __future__ import annotations

import functools
import math
import os
import statistics
from collections.abc import Callable

from baselines.fixed_plan import FixedPlan
from harness.loop import (
    CHECKPOINT_RESTART,
    OnIteration,
    Recovery,
    RunResult,
    measured_numbering,
    run_loop,
)
from harness.policies import (
    blind_detector_warning,
    noisy_ring_warning,
    static_dp_delay_warning,
    sub_onset_delay_warning,
)
from injectors.fault_model import Effect, FaultModel, TargetKind
from injectors.kernel_probe import PerLinkPath, per_link_path
from pipeline.allreduce import largest_chunk_bytes
from pipeline.engines import Controller, Engine, Plan
from pipeline.engines.base import Closing
from pipeline.engines.sim import SimEngine
from pipeline.errors import ConfigError
from pipeline.faults import NO_FAULTS, FaultView
from pipeline.host_costs import FREE, HostCosts
from pipeline.link_terms import NO_LINK_TERMS, LinkTerms
from pipeline.profile import Profile
from pipeline.schedule import Schedule
from pipeline.simulator import CommMode
from pipeline.topology import Link, LinkKind, Position

__all__ = [
    "BACKENDS",
    "INJECTIONS",
    "RunResult",
    "RuntimeEngines",
    "check_hold",
    "fixed_plan",
    "idle_fault_rows_warning",
    "largest_messages",
    "link_terms",
    "longest_hold_ms",
    "run_configuration",
    "run_warnings",
    "unimposed_link_terms_warning",
]

BACKENDS = ("sim", "emulated", "megatron")
INJECTIONS = ("hook", "network")
"""How the emulated runtime injects the profile's delays and the fault timeline: in each
worker's fault hook (a sleep before each send, a raised LinkFailure; the paper's artifact),
or in the network of a namespace testbed (harness.network; root only)."""


class RuntimeEngines(Closing):
    """The runtime engines of an experiment, one per (backend, stages, replicas, model, seed,
    ...), each started at its first iteration and kept until the experiment ends:
    configurations share pools."""

    def __init__(self) -> None:
        self._engines: dict[tuple[str, int, int, str, int, float, bool], Engine] = {}

    def get(
        self,
        backend: str,
        num_stages: int,
        model: str | None,
        *,
        num_replicas: int = 1,
        timeout_s: float = CHECKPOINT_RESTART.transport_timeout_s,
        delegated: bool = False,
        seed: int = 0,
    ) -> Engine:
        """`delegated`: its plans may delegate (its pool then starts delegates); `seed`: the
        megatron model's initial weights and data (the emulated backend has neither)."""
        model = "" if backend == "emulated" else model or "tiny"  # one pool per model run
        seed = 0 if backend == "emulated" else seed
        key = (backend, num_stages, num_replicas, model, seed, timeout_s, delegated)
        if key not in self._engines:
            from adaptra.transport import Delegates  # torch, as the engines below
            from pipeline.engines.runtime import emulated_engine, megatron_engine

            delegates = Delegates() if delegated else None
            self._engines[key] = (
                emulated_engine(
                    num_stages, num_replicas=num_replicas, timeout_s=timeout_s, delegates=delegates
                )
                if backend == "emulated"
                else megatron_engine(
                    num_stages,
                    model,
                    seed=seed,
                    num_replicas=num_replicas,
                    timeout_s=timeout_s,
                    delegates=delegates,
                )
            )
        return self._engines[key]

    def close(self) -> None:
        engines, self._engines = list(self._engines.values()), {}
        for engine in engines:
            engine.close()


def fixed_plan(
    schedule: Schedule, profile: Profile, comm: CommMode | str = CommMode.DIRECT, policy: str = ""
) -> FixedPlan:
    """`schedule` (made by `policy`) over `comm` every iteration (the baselines' controller)."""
    return FixedPlan(Plan(schedule, profile, CommMode(comm), policy=policy))


def run_configuration(
    controller: Controller,
    *,
    backend: str = "sim",
    num_iterations: int = 5,
    num_warmup_iterations: int = 1,
    faults: FaultView = NO_FAULTS,
    keep_timeline: bool = True,
    injection: str = "hook",
    model: str | None = None,
    host: HostCosts = FREE,
    engines: RuntimeEngines | None = None,
    recovery: Recovery = CHECKPOINT_RESTART,
    on_iteration: OnIteration | None = None,
    delegated: bool = False,
    seed: int = 0,
) -> RunResult:
    """Run what `controller` plans. Warm-up iterations come first; a fault timeline counts
    iterations from the first measured one, and its delays add to the profile's. `model`
    names the megatron
    backend's GPT configuration (default: tiny); the others take none. `host`: a host's
    runtime costs for the simulator (the sim backend only). `engines`: runtime engines to
    share with other configurations (default: this configuration's own). `on_iteration`:
    called with each iteration's timeline as it ends (harness.loop). `delegated`: the
    controller may send over delegates (a runtime then starts them with its pool). `seed`:
    the megatron model's initial weights and synthetic tokens (the run's seed; the other
    backends compute no model)."""
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}; valid backends: {', '.join(BACKENDS)}")
    if model is not None and backend != "megatron":
        raise ConfigError(f"--model applies to --backend megatron only, not {backend!r}")
    if injection not in INJECTIONS:
        raise ConfigError(f"unknown injection {injection!r}; valid: {', '.join(INJECTIONS)}")
    if host != FREE:
        check_calibrated(backend)
    profile = controller.plan(0).profile
    run: Callable[[Engine], RunResult] = functools.partial(
        run_loop,
        controller=controller,
        num_iterations=num_iterations,
        num_warmup_iterations=num_warmup_iterations,
        faults=faults,
        keep_timeline=keep_timeline,
        recovery=recovery,
        on_iteration=on_iteration,
    )
    if backend == "sim":
        if injection == "network":  # what the testbed can run, timed as it runs it
            check_injectable(faults, injection)
        with SimEngine(host=host, delays_in_network=injection == "network") as sim:
            return run(sim)
    check_injectable(faults, injection)
    timeout_s = recovery.transport_timeout_s
    longest_ms = longest_hold_ms(
        profile,
        faults,
        model=(model or "tiny") if backend == "megatron" else None,
        injection=injection,
    )
    check_hold(longest_ms, timeout_s)
    check_processes(profile, delegated=delegated, tied=backend == "megatron")
    run = _worker_errors_named(run, num_warmup_iterations, longest_ms)
    if injection == "network":
        from harness.network import network_engine  # pyroute2, torch: only when needed

        with network_engine(
            profile,
            transport_timeout_s=timeout_s,
            delegated=delegated,
            longest_hold_ms=longest_ms,
            model=None if backend == "emulated" else model or "tiny",
            seed=seed,
        ) as engine:
            return run(engine)

    def engine_of(pools: RuntimeEngines) -> Engine:
        return pools.get(
            backend,
            profile.num_stages,
            model,
            num_replicas=profile.num_replicas,
            timeout_s=timeout_s,
            delegated=delegated,
            seed=seed,
        )

    if engines is not None:
        return run(engine_of(engines))
    with RuntimeEngines() as own:
        return run(engine_of(own))


def _worker_errors_named(
    run: Callable[[Engine], RunResult], num_warmup_iterations: int, longest_ms: float
) -> Callable[[Engine], RunResult]:
    """`run`, a worker's or its pool's error counting iterations as the results and the
    fault timeline do (from the first measured one, "warm-up iteration N" before it; the
    engine counts the warm-ups too), and where a wait timed out in a run that holds
    messages, saying so: one wait can span several held messages (`check_hold` bounds one),
    which the timeout alone reads as a dead link. The same type, the worker's report kept,
    the original the cause."""

    def named(engine: Engine) -> RunResult:
        from pipeline.runtime.remote_error import WorkerError, WorkerTimeout  # torch: loaded

        try:
            return run(engine)
        except WorkerError as err:
            message = measured_numbering(str(err), num_warmup_iterations)
            if isinstance(err, WorkerTimeout) and longest_ms > 0:
                message += (
                    f"; this run holds a message up to {longest_ms:g} ms, and one wait can "
                    "span several held ones (a chain of slow links, a delegate's send that "
                    "does not block, the testbed's handshake): raise the timeout (--timeout, a "
                    "spec's transport_timeout_s) above the longest wait"
                )
            if message == str(err):
                raise
            named_err = type(err)(message, rank=err.rank, remote=err.remote)
            named_err.noticed_s = err.noticed_s
            raise named_err from err

    return named


def longest_hold_ms(
    profile: Profile,
    faults: FaultView = NO_FAULTS,
    *,
    model: str | None = None,
    injection: str = "hook",
) -> float:
    """The longest a runtime's worker holds a message of `profile` before it sends it, ms:
    the profile's delays, a fault timeline's added, a cap's for the largest message that
    crosses the capped hosts (`largest_messages`). `model`: a megatron run's GPT preset,
    whose messages are its real tensors (None: the emulated backend's, the profile's
    bytes); `injection`: how the faults reach the messages."""
    longest_ms = max((*profile.delay_ms, *(d for _, d in profile.dp_delay_ms), 0.0))
    if isinstance(faults, FaultModel):  # a timeline's delays add to the profile's
        message_bytes, route_bytes = largest_messages(profile, model=model, injection=injection)
        longest_ms += faults.longest_hold_ms(profile.topology, message_bytes, route_bytes)
    return longest_ms


def largest_messages(
    profile: Profile, *, model: str | None = None, injection: str = "hook"
) -> tuple[int, dict[tuple[Position, Position], int]]:
    """The bytes of a run's PP messages and, per route between two positions that carries
    larger ones, the largest: each DP ring link its stage's largest chunk
    (pipeline.allreduce); under `injection` "network", a megatron replica's route from its
    first to its last stage the tied weight's gradient (the hook leaves that send alone,
    pipeline.topology.tied_link; the testbed's wire holds it as any other).
    `model`: a megatron run's GPT preset, whose messages, gradients and their elements are
    its own (`with_model_bytes`), whatever the profile says; None: the emulated backend's,
    the profile's bytes."""
    element_bytes, tied_bytes = 1, 0
    if model is not None:
        from pipeline.runtime.megatron.model import (  # torch: only when needed
            ELEMENT_BYTES,
            get_preset,
            with_model_bytes,
        )

        preset = get_preset(model)
        profile = with_model_bytes(profile, preset)
        element_bytes = ELEMENT_BYTES
        if injection == "network":
            tied_bytes = preset.tied_weight_bytes(profile.num_stages)
    topology, num_replicas = profile.topology, profile.num_replicas
    routes: dict[tuple[Position, Position], int] = {}
    for stage in range(profile.num_stages if num_replicas > 1 else 0):
        chunk = largest_chunk_bytes(
            profile.allreduce_bytes[stage], profile.dp_bucket_bytes, num_replicas, element_bytes
        )
        for link in topology.dp_ring(stage):
            routes[topology.ends(link)] = chunk
    if tied_bytes:
        last = profile.num_stages - 1
        for replica in range(num_replicas):
            routes[Position(0, replica), Position(last, replica)] = tied_bytes
    return profile.message_bytes, routes


def check_injectable(faults: FaultView, injection: str) -> None:
    """A ConfigError, naming the file, row and line, for a timeline's fault that `injection`
    cannot put on the messages: the testbed's network (`network`) takes a NIC down, no other
    effect on a NIC (harness.network), and said so only once the row's iteration ran."""
    if injection != "network" or not isinstance(faults, FaultModel):
        return
    for event in faults.events:
        effect = event.effect
        if event.target.kind is TargetKind.NIC and not effect.down and effect != Effect():
            raise faults.row_error(  # (an effect of none: a repair)
                event,
                "--inject network takes a NIC down, not another effect on a NIC "
                f"({event.target}); replay it with --inject hook",
            )


def run_warnings(
    system: str | None,
    profile: Profile,
    faults: FaultView,
    *,
    num_warmup_iterations: int,
    backend: str,
    host: HostCosts = FREE,
    injection: str = "hook",
) -> list[str]:
    """The warning lines a run of `system` (None: a fixed plan's) on `profile` under `faults`
    gives before it starts: `blind_detector_warning`, `sub_onset_delay_warning`,
    `noisy_ring_warning`, `static_dp_delay_warning`, `idle_fault_rows_warning`,
    `replaced_rows_warning`, `unimposed_link_terms_warning` (a runtime `backend` with
    `injection`), under `injection` "network" on a runtime `wire_rate_warning`, and with
    `host` costs their `calibration_shape_warning`, those that apply."""
    warnings = [
        unimposed_link_terms_warning(profile, backend, injection),
        idle_fault_rows_warning(profile, faults, tied=backend == "megatron"),
        replaced_rows_warning(profile, faults),
        calibration_shape_warning(host, profile),
    ]
    if injection == "network" and backend != "sim" and os.geteuid() == 0:  # (root: the testbed)
        warnings.append(wire_rate_warning(profile, faults, per_link_path()))
    if system is not None:
        warnings[:0] = [
            blind_detector_warning(
                system, profile, faults, num_warmup_iterations=num_warmup_iterations
            ),
            sub_onset_delay_warning(system, profile, faults),
            noisy_ring_warning(system, profile, backend),
            static_dp_delay_warning(system, profile),
        ]
    return [warning for warning in warnings if warning is not None]


WIRE_GBIT_S = 2.0
"""About what the testbed's userspace wire carries per host pair (`wire_rate_warning`): 2.0 and
3.8 Gbit/s measured here idle, 0.8-0.9 on a loaded host (BENCHMARKS.md, bench_injectors)."""


def _takes_the_wire(effect: Effect) -> bool:
    """Whether a fault row's `effect` puts its host pairs' traffic through the userspace wire
    at a rate the wire may not keep up with (`wire_rate_warning`): a delay, a stall, a
    redrawn delay, or a cap above `WIRE_GBIT_S` (not a row that ends the others)."""
    if effect.kind == "bandwidth":
        return effect.bandwidth_gbps is not None and effect.bandwidth_gbps > WIRE_GBIT_S
    return effect.kind in ("delay", "stall") and effect != Effect()


def wire_rate_warning(profile: Profile, faults: FaultView, path: PerLinkPath) -> str | None:
    """A warning line where the testbed's delayed host pairs take its userspace wire (`path`:
    no kernel netem) and the run's largest message (`largest_messages`: the profile's bytes)
    takes 1 ms or more at `WIRE_GBIT_S`, where the profile's links are faster: the wire, not
    the profile's rate or the delay, sets those messages' time. Delayed pairs: a profile's
    delays, or a fault timeline's delay, stall or redrawn-delay rows, or its caps faster than
    the wire (a capped pair takes the wire too: harness.network; a slower cap sets the time
    itself, as the simulator has it)."""
    delayed = (
        any(profile.delay_ms)
        or any(delay_ms for _, delay_ms in profile.dp_delay_ms)
        or (
            isinstance(faults, FaultModel)
            and any(_takes_the_wire(event.effect) for event in faults.events)
        )
    )
    rate_gbit_s = profile.link_bandwidth_gbps or math.inf
    if path.netem or not delayed or rate_gbit_s <= WIRE_GBIT_S:
        return None
    message_bytes, routes = largest_messages(profile)
    largest = max((message_bytes, *routes.values()))
    wire_ms = largest * 8 / (WIRE_GBIT_S * 1e6)
    if wire_ms < 1.0:
        return None
    rate_ms = largest * 8 / (rate_gbit_s * 1e6)
    at_rate = (
        ""
        if math.isinf(rate_gbit_s)
        else f" (at the profile's {rate_gbit_s:g} Gbit/s: {rate_ms:.3g} ms)"
    )
    return (
        f"warning: the testbed's delayed host pairs go through its userspace wire "
        f"({path.reason}), which carries about {WIRE_GBIT_S:g} Gbit/s (under 1 on a loaded "
        f"host): a {largest / (1 << 20):.3g} MiB message across one takes about "
        f"{wire_ms:.3g} ms there besides the delay{at_rate}, so those iterations run slower "
        "than the simulator's of the same profile (a host with kernel netem carries them at "
        "its links' rate)"
    )


def unimposed_link_terms_warning(profile: Profile, backend: str, injection: str) -> str | None:
    """A warning line naming the profile's link-model keys that the engine for `backend` and
    `injection` does not impose (`link_terms`: the fault hook none, the testbed no latency
    and no delegate rate): its messages take what the host's transport takes instead, where
    the simulator times them by those keys, and the two part by that much (1F1B at S=2, N=4
    over 20 ms with 64 KiB messages at 0.1 Gbit/s: 276.2 ms simulated, 258.4 ms through the
    hook, which imposed the delay but not the bandwidth: 250 ms and this host's costs)."""
    terms = link_terms(backend, injection)
    given = [
        (key, value, imposed)
        for key, value, imposed in (
            ("link_latency_ms", profile.link_latency_ms or None, terms.latency),
            ("link_bandwidth_gbps", profile.link_bandwidth_gbps, terms.bandwidth),
            ("dp_bandwidth_gbps", profile.dp_bandwidth_gbps, terms.bandwidth),
            ("delegate_gbps", profile.delegate_gbps, terms.delegate_rate),
        )
        if value is not None and not imposed
    ]
    if not given:
        return None
    keys = ", ".join(f"{key} {value:g}" for key, value, _ in given)
    return (
        f"warning: --backend {backend} --inject {injection} does not impose the profile's "
        f"{keys}: its messages take what this host's transport takes, which the simulator "
        "does not (compare it with a profile without them)"
    )


def check_calibrated(backend: str) -> None:
    """A calibration (host costs) is the simulator's: refused for a runtime `backend`."""
    if backend != "sim":
        raise ConfigError(
            f"a calibration is for the simulator (backend sim); the {backend} runtime is "
            "what it is calibrated on"
        )


def calibration_shape_warning(host: HostCosts, profile: Profile) -> str | None:
    """`HostCosts.shape_warning` for a run of `profile` (its median forward)."""
    return host.shape_warning(profile.num_stages, statistics.median(profile.t_f_ms))


def idle_fault_rows_warning(
    profile: Profile, faults: FaultView, *, tied: bool = False
) -> str | None:
    """A warning line naming a timeline's rows that touch no message on `profile`: a fault
    on DP ring links of stages whose gradient has no bytes (no ring runs there), and a
    bandwidth cap where no message has a size (a cap holds bytes only). Their runs would
    look as if the row did not matter (though a controller that reads the fault model,
    `adaptra-oracle`, still sees the row). Not named: a cap on PP links whose messages have
    no size where some ring has bytes (a rank swap may move a ring onto their hosts). Also
    named: a `hosts` pair that no link joins in a run of one replica (no rank swap moves a
    link there): only neighbouring stages talk, and, `tied` (megatron), the first and last
    (its tied embedding)."""
    if not isinstance(faults, FaultModel):
        return None
    ring_bytes = profile.allreduce_bytes or (0,) * profile.num_stages
    topology = profile.topology
    pp_links = [Link.pp(stage, 0) for stage in range(topology.num_stages - 1)]
    joined = {tuple(sorted(topology.hosts_of(link))) for link in pp_links}
    if tied:
        ends = (Position(0, 0), Position(topology.num_stages - 1, 0))
        joined.add(tuple(sorted(map(topology.host, ends))))
    idle: list[str] = []
    sizes = False
    for event in faults.events:
        target = event.target
        links = target.links if target.kind is TargetKind.LINKS else ()
        if links and all(
            link.kind is LinkKind.DP and not ring_bytes[link.group or 0] for link in links
        ):
            idle.append(f"row {event.row} (its stages' rings have no gradient bytes: none runs)")
            sizes = True
        elif event.effect.kind == "bandwidth" and not (profile.message_bytes or any(ring_bytes)):
            idle.append(f"row {event.row} (a cap holds bytes, and no message has any)")
            sizes = True
        elif (
            target.kind is TargetKind.HOSTS
            and profile.num_replicas == 1
            and target.hosts not in joined
        ):
            a, b = target.hosts
            idle.append(f"row {event.row} (no link joins hosts {a} and {b} at DP 1)")
    if not idle:
        return None
    verb = "touches" if len(idle) == 1 else "touch"
    advice = ": give it message_bytes and allreduce_bytes (both 0 unless given)" if sizes else ""
    return f"warning: fault {'; '.join(idle)} {verb} no message with this profile{advice}"


def replaced_rows_warning(profile: Profile, faults: FaultView) -> str | None:
    """A warning line naming a timeline's rows that a later row of their kind replaces where
    a reader may not expect it (`FaultModel.replaced_rows`): one kind of effect holds on a
    link or NIC at a time, so the earlier never applies, or does not come back."""
    if not isinstance(faults, FaultModel):
        return None
    lines = []
    for earlier, later, where in faults.replaced_rows(profile.topology):
        on = f" on {where}" if where else ""
        if later.start_iteration == earlier.start_iteration and later.at_ms == earlier.at_ms:
            lines.append(
                f"row {later.row} replaces row {earlier.row} as both start: row {earlier.row} "
                f"never applies{on}"
            )
        else:
            lines.append(
                f"row {later.row} replaces row {earlier.row}{on} from iteration "
                f"{later.start_iteration}, and row {earlier.row} does not come back when row "
                f"{later.row} ends at iteration {later.end_iteration} (repeat row {earlier.row} "
                "from there)"
            )
    if not lines:
        return None
    return (
        f"warning: fault {'; '.join(lines)} (one effect of a kind holds on a link or NIC at a time)"
    )


def max_processes() -> int:
    """The most processes a runtime run starts on this host (workers and delegates): 16 a
    core, at least 512 (a 512-stage profile started 519 processes, 6.8 GB, here, and would
    have waited up to 2 hours for them; a delegate rule's 4,096 a link direction and side
    would be thousands more)."""
    return max(512, 16 * (os.cpu_count() or 1))


def check_processes(
    profile: Profile,
    *,
    delegated: bool,
    tied: bool = False,
    remedy: str = "fewer stages or replicas, or fewer delegates (a profile's num_delegates)",
) -> None:
    """A ConfigError where a runtime run of `profile` would start more than `max_processes`
    processes: a worker per stage and replica, and, `delegated`, the profile's delegate
    count at both ends of every link direction a worker sends on (both ways of each PP link,
    one per replica of each stage's DP ring, and `tied`, megatron's tied embedding's route
    between a replica's first and last stages, both ways). `remedy`: what the error
    suggests."""
    num_stages, num_replicas = profile.num_stages, profile.num_replicas
    num_directions = 2 * (num_stages - 1) * num_replicas
    num_directions += num_stages * num_replicas if num_replicas > 1 else 0
    num_directions += 2 * num_replicas if tied and num_stages > 1 else 0
    num_workers = num_stages * num_replicas
    num_delegates = 2 * num_directions * profile.delegate_count() if delegated else 0
    limit = max_processes()
    if num_workers + num_delegates > limit:
        raise ConfigError(
            f"this run would start {num_workers} worker(s) and {num_delegates} delegate "
            f"process(es), more than the {limit} one host takes here: {remedy}"
        )


def check_hold(longest_ms: float, timeout_s: float) -> None:
    """A ConfigError unless a message held `longest_ms` arrives within the workers'
    `timeout_s` for one message (else its receiver times out and the iteration fails)."""
    if longest_ms >= 1000 * timeout_s:
        raise ConfigError(
            f"a delay of {longest_ms:g} ms is not shorter than the workers' {timeout_s:g} s "
            "timeout for one message: raise the timeout (--timeout, a spec's "
            "transport_timeout_s) or lower the delay"
        )


def link_terms(backend: str, injection: str) -> LinkTerms:
    """The link-model terms that `run_configuration`'s engine for `backend` and `injection`
    imposes on messages (its `Capabilities.link_terms`): what a detector-driven controller
    for it is built with (harness.policies.system_controller)."""
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}; valid backends: {', '.join(BACKENDS)}")
    if injection not in INJECTIONS:
        raise ConfigError(f"unknown injection {injection!r}; valid: {', '.join(INJECTIONS)}")
    if backend == "sim":
        return SimEngine.capabilities.link_terms
    if injection == "network":
        from harness.network import TESTBED_LINK_TERMS  # torch: only when needed

        return TESTBED_LINK_TERMS
    return NO_LINK_TERMS  # the runtime's fault hook: pipeline.engines.runtime
