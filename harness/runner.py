"""One configuration (a controller's plans x backend x faults) run for K measured iterations,
and the engines it runs on: opened here, shared by an experiment's configurations."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING

from baselines.fixed_plan import FixedPlan
from harness.loop import CHECKPOINT_RESTART, OnIteration, Recovery, RunResult, run_loop
from injectors.fault_model import InForce
from pipeline.engines import Capabilities, Controller, Engine, Outcome, Plan
from pipeline.engines.base import Closing
from pipeline.engines.sim import SimEngine
from pipeline.errors import ConfigError
from pipeline.faults import NO_FAULTS, FaultView, IterationFaults
from pipeline.host_costs import FREE, HostCosts
from pipeline.profile import Profile
from pipeline.schedule import Schedule
from pipeline.simulator import CommMode
from pipeline.topology import Link, Topology

if TYPE_CHECKING:
    from injectors.testbed import Testbed

__all__ = [
    "BACKENDS",
    "INJECTIONS",
    "RunResult",
    "RuntimeEngines",
    "fixed_plan",
    "run_configuration",
]

BACKENDS = ("sim", "emulated", "megatron")
INJECTIONS = ("hook", "network")
"""How the emulated runtime injects a profile's link delays: a sleep before each send in the
fault hook (the paper's artifact), or in the network of a namespace testbed (a delay wire per
slow link, and htb caps for a link bandwidth; root only)."""


class RuntimeEngines(Closing):
    """The runtime engines of an experiment, one per (backend, stages, replicas, model), each
    started at its first iteration and kept until the experiment ends: configurations share
    pools."""

    def __init__(self) -> None:
        self._engines: dict[tuple[str, int, int, str], Engine] = {}

    def get(
        self, backend: str, num_stages: int, model: str | None, *, num_replicas: int = 1
    ) -> Engine:
        key = (backend, num_stages, num_replicas, model or "")
        if key not in self._engines:
            from pipeline.engines.runtime import emulated_engine, megatron_engine  # torch

            self._engines[key] = (
                emulated_engine(num_stages, num_replicas=num_replicas)
                if backend == "emulated"
                else megatron_engine(num_stages, model or "tiny", num_replicas=num_replicas)
            )
        return self._engines[key]

    def close(self) -> None:
        engines, self._engines = list(self._engines.values()), {}
        for engine in engines:
            engine.close()


@dataclasses.dataclass(slots=True)
class _NetworkDelays(Closing):
    """An emulated engine whose link delays are in a namespace testbed's network: at every
    iteration boundary the testbed's wires take the delays in force on their host pairs
    (the profile's links under the default placement, plus the fault timeline's); the
    workers get plans without them and no fault view (no sleeps)."""

    inner: Engine
    bed: Testbed
    profile: Profile
    applied: dict[tuple[int, int], float] = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def capabilities(self) -> Capabilities:
        return self.inner.capabilities

    def run(
        self,
        plan: Plan,
        iteration: int,
        faults: IterationFaults,
        *,
        digest: bool = False,
        checkpoint: bool = False,
    ) -> Outcome:
        if plan.profile.delay_ms != self.profile.delay_ms:
            raise ConfigError(
                "--inject network takes the profile's delays for the whole run; put changing "
                "delays in a fault timeline"
            )
        wanted = _profile_pair_delays_ms(self.profile)
        if isinstance(faults, InForce):
            for pair, delay_ms in faults.pair_delays_ms().items():
                wanted[pair] = wanted.get(pair, 0.0) + delay_ms
        elif faults is not NO_FAULTS:
            raise ConfigError("--inject network takes a fault timeline file's delays only")
        for pair in sorted(set(wanted) | set(self.applied)):
            if wanted.get(pair, 0.0) != self.applied.get(pair, 0.0):
                self.bed.set_delay(*pair, plane=0, delay_ms=wanted.get(pair, 0.0))
        self.applied = wanted
        quiet = dataclasses.replace(plan, profile=plan.profile.with_delays(()))
        return self.inner.run(quiet, iteration, NO_FAULTS, digest=digest, checkpoint=checkpoint)

    def restart(self) -> None:
        self.inner.restart()

    def close(self) -> None:
        self.inner.close()


def _profile_pair_delays_ms(profile: Profile) -> dict[tuple[int, int], float]:
    topology = Topology(profile.num_stages)
    delays: dict[tuple[int, int], float] = {}
    for link, delay_ms in enumerate(profile.delay_ms):
        if delay_ms:
            a, b = sorted(topology.hosts_of(Link.pp(link, 0)))
            delays[a, b] = delay_ms
    return delays


@contextlib.contextmanager
def _network_engine(profile: Profile) -> Iterator[Engine]:
    """A testbed of one host per stage, htb caps for the profile's link bandwidth, and
    delay wires set at each iteration boundary."""
    from injectors.testbed import Testbed
    from pipeline.engines.runtime import emulated_engine  # torch: only when needed

    if profile.num_replicas > 1:
        raise ConfigError("--inject network runs one replica (its testbed has PP links only)")
    with Testbed(profile.num_stages) as bed:
        for link in range(profile.num_stages - 1):
            if profile.link_bandwidth_gbps is not None:
                for src, dst in ((link, link + 1), (link + 1, link)):
                    rate_mbit = profile.link_bandwidth_gbps * 1e3
                    bed.cap_bandwidth(src, dst, plane=0, rate_mbit=rate_mbit)
        inner = emulated_engine(profile.num_stages, launch=bed.launcher())
        with _NetworkDelays(inner, bed, profile) as engine:
            yield engine


def fixed_plan(
    schedule: Schedule, profile: Profile, comm: CommMode | str = CommMode.DIRECT
) -> FixedPlan:
    """`schedule` over `comm` every iteration (the baselines' controller)."""
    return FixedPlan(Plan(schedule, profile, CommMode(comm)))


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
) -> RunResult:
    """Run what `controller` plans. Warm-up iterations come first; a fault timeline counts
    iterations from the first measured one, and its delays add to the profile's. `model`
    names the megatron
    backend's GPT configuration (default: tiny); the others take none. `host`: a host's
    runtime costs for the simulator (the sim backend only). `engines`: runtime engines to
    share with other configurations (default: this configuration's own). `on_iteration`:
    called with each iteration's timeline as it ends (harness.loop)."""
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}; valid backends: {', '.join(BACKENDS)}")
    if model is not None and backend != "megatron":
        raise ConfigError(f"--model applies to --backend megatron only, not {backend!r}")
    if injection not in INJECTIONS:
        raise ConfigError(f"unknown injection {injection!r}; valid: {', '.join(INJECTIONS)}")
    if host != FREE and backend != "sim":
        raise ConfigError(
            f"a calibration is for the simulator (backend sim); the {backend} runtime is "
            "what it is calibrated on"
        )
    if injection == "network" and backend != "emulated":
        raise ConfigError("--inject network needs the emulated backend")
    profile = controller.plan(0).profile
    topology = profile.topology
    if injection == "network" and any(
        faults.has_failure(i, topology) for i in range(num_iterations)
    ):
        raise ConfigError(
            "the fault timeline fails a link or NIC: the testbed cannot take a NIC down "
            "during a run yet; replay it with --inject hook"
        )
    run = functools.partial(
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
        with SimEngine(host=host) as sim:
            return run(sim)
    if injection == "network":
        with _network_engine(profile) as engine:
            return run(engine)
    shape = (backend, profile.num_stages, model)
    if engines is not None:
        return run(engines.get(*shape, num_replicas=profile.num_replicas))
    with RuntimeEngines() as own:
        return run(own.get(*shape, num_replicas=profile.num_replicas))
