"""Experiment specs: models x systems x fault scenarios, and what each configuration runs.

A model is either one of the cost model's GPT-2 configurations (pipeline.cost_model) or, with
`profile`, a label for a hand-written profile. `default_experiment()` is what
`adaptra-bench run` does with no arguments. The spec file's form is the README's.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Hashable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from harness.loop import CHECKPOINT_RESTART, MAX_ITERATIONS, Recovery
from harness.names import check_label, check_run_name
from harness.policies import SYSTEMS, Planner, plan, system_controller
from harness.resolved import ResolvedSpec
from harness.runner import (
    BACKENDS,
    INJECTIONS,
    check_hold,
    check_injectable,
    check_processes,
    link_terms,
    longest_hold_ms,
)
from harness.saved import ConfigurationKey, timeline_name
from injectors.fault_files import fault_file_form, parse_faults
from injectors.fault_model import FaultModel
from pipeline.checks import MAX_SEED, check_count, check_ms, check_wait_s
from pipeline.cost_model import GPTModel, ModelCost, model_cost, resolve_hardware, resolve_model
from pipeline.engines import Controller, Plan
from pipeline.errors import AdaptraBenchError, ConfigError
from pipeline.faults import NO_FAULTS
from pipeline.files import load_yaml, read_text
from pipeline.host_costs import FREE, HostCosts
from pipeline.link_terms import ALL_LINK_TERMS, LinkTerms
from pipeline.profile import Profile
from pipeline.schedule import Schedule
from pipeline.simulator import CommMode, check_takes_host_costs
from pipeline.topology import Link, Topology

__all__ = [
    "Configuration",
    "ExperimentSpec",
    "Scenario",
    "Target",
    "controller_for",
    "default_experiment",
    "finish_advice",
    "load_spec",
    "memoised_planner",
    "resolved_from_record",
    "resume_advice",
    "resume_command",
    "spec_from_record",
    "without_folders",
]


def _failover_alone(costs: HostCosts) -> bool:
    """Whether `costs` hold no cost but `failover_ms` (a calibration written to price a NIC
    failure, as bench_failover.py's): the delegated path's move to another NIC, which the
    direct path never makes (it restarts), so no healthy message of any comm pays it and a
    cost-model model may take it."""
    return dataclasses.replace(costs, failover_ms=0.0) == dataclasses.replace(
        FREE,
        host=costs.host,
        measured_at=costs.measured_at,
        op_ms=costs.op_ms,
        num_stages=costs.num_stages,
        git_revision=costs.git_revision,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Scenario:
    """One fault scenario: a delay on a set of links (PP and DP), or a fault timeline."""

    links: tuple[Link, ...] = ()
    """PP links of every replica ("0-1") and DP ring links ("dp<stage>:r-(r+1)"); each of
    their messages pays the delay (a DP link's: every message of the all-reduce's ring on
    it, pipeline.allreduce)."""
    delay_ms: float = 0.0
    faults: FaultModel | None = None
    faults_name: str = ""

    @property
    def name(self) -> str:
        if self.faults is not None:
            return f"trace:{self.faults_name}"
        if not self.delay_ms or not self.links:
            return "fault-free"
        return f"{self.link_names}@{self.delay_ms:g}ms"

    @property
    def link_names(self) -> str:
        return ",".join(str(link) for link in self.links)

    def apply(self, profile: Profile) -> Profile:
        """`profile` with this scenario's static delays on its PP and DP links."""
        slow = {link.first for link in self.links if link.is_pp}
        return profile.with_delays(
            [self.delay_ms if i in slow else 0.0 for i in range(profile.num_stages - 1)],
            {link: self.delay_ms for link in self.links if not link.is_pp},
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    """A model as the engines see it: its label, its profile and, if it has one, its cost."""

    label: str
    profile: Profile
    cost: ModelCost | None

    @property
    def direct_comm(self) -> CommMode:
        """How its systems on the direct path send: a cost-model model's as the paper's
        artifact injects delays on its GPU path (`nccl-sleep`), a profile's `direct`."""
        return CommMode.DIRECT if self.cost is None else CommMode.NCCL_SLEEP

    @property
    def samples_per_iteration(self) -> int:
        """The global batch: every DP replica's microbatches (a hand-written profile's
        microbatch is one sample; a cost-model one has the model's microbatch size)."""
        if self.cost is None:
            return self.profile.num_microbatches * self.profile.num_replicas
        model = self.cost.model
        return model.microbatches * model.microbatch_size * model.dp


class Configuration(NamedTuple):
    """One run of a spec: a model under a system in a scenario, and which repeat."""

    target: Target
    system: str
    scenario: Scenario
    repeat: int

    @property
    def key(self) -> ConfigurationKey:
        """Its name in the run directory's files (runs.csv's model, system, scenario, repeat)."""
        return (self.target.label, self.system, self.scenario.name, str(self.repeat))


def _link(value: Any, target: Target) -> Link:
    """A spec's link (pipeline.topology.Link.from_spec) that exists in `target`: a PP link of
    every replica, or a DP ring link r-(r+1)."""
    num_stages, num_replicas = target.profile.num_stages, target.profile.num_replicas
    link = Link.from_spec(value, num_stages)
    if link.is_pp and link.group is not None:
        raise ConfigError(f"link {link}: a scenario slows a PP link in every replica ('2-3')")
    if not link.is_pp and link.second != link.first + 1:
        raise ConfigError(f"link {link}: a scenario slows DP ring links dp<stage>:r-(r+1)")
    return Topology(num_stages, num_replicas).check(link)


_DEFAULT_LINK_SETS: tuple[tuple[Any, ...], ...] = (("0-1",),)

MAX_REPEATS = 1000
"""The most runs of each configuration a spec takes (`num_repeats`)."""
MAX_CONFIGURATIONS = 100_000
"""The most configurations a spec has, repeats included (models x systems x scenarios x
`num_repeats`): a run builds them all, and their runs.csv rows, before its first."""


def _check_unique(name: str, values: Sequence[Hashable]) -> None:
    """A spec lists each system, delay, model and link set once: a repeat would run the same
    configuration twice under one name (use num_repeats for that)."""
    first: dict[Hashable, int] = {}
    for i, value in enumerate(values):
        if value in first:
            raise ConfigError(f"{name}[{i}] repeats {name}[{first[value]}]; list each once")
        first[value] = i


def _refuse_with_faults(given: Sequence[str]) -> None:
    """A ConfigError if a spec with `faults` gave any of the static scenarios' keys."""
    if given:
        raise ConfigError(
            f"faults with {' and '.join(given)}: a fault timeline replaces the link sets x "
            "delays scenarios (give one or the other)"
        )


def _check_model_labels(targets: Sequence[Target]) -> None:
    """Each model once, under a label of its own (its configurations' name in the results):
    a changed copy is labelled "<base>-custom" unless its mapping gives a `name`, and a copy
    that changes nothing but its label is the model again (it would run the same twice)."""
    first: dict[str, int] = {}
    by_model: dict[GPTModel, int] = {}
    for i, target in enumerate(targets):
        if target.cost is not None:
            model = target.cost.model  # what it runs, whatever its name says
            same = dataclasses.replace(model, name="", num_microbatches=model.microbatches)
            j = by_model.setdefault(same, i)
            if j != i and targets[j].label != target.label:
                raise ConfigError(
                    f"models[{i}] ({target.label}) is models[{j}] ({targets[j].label}) under "
                    "another name; list each model once"
                )
        j = first.setdefault(target.label, i)
        if j == i:
            continue
        other = targets[j]
        if target.cost is None or other.cost is None or target.cost.model == other.cost.model:
            raise ConfigError(f"models[{i}] repeats models[{j}]; list each once")
        raise ConfigError(
            f"models[{j}] and models[{i}] differ but are both labelled {target.label}; "
            "give each its own `name:`"
        )


def _check_scenario_names(scenarios: Sequence[Scenario]) -> None:
    """A scenario's name (its links and its delay to 6 significant digits) names one
    scenario: two delays that print alike would be one configuration in the results, their
    rows mixed and one's timeline overwritten by the other's."""
    first: dict[str, Scenario] = {}
    for scenario in scenarios:
        other = first.setdefault(scenario.name, scenario)
        if other is not scenario:
            raise ConfigError(
                f"delays_ms {other.delay_ms!r} and {scenario.delay_ms!r} would both name the "
                f"scenario {scenario.name} (a name keeps 6 significant digits); list delays "
                "that differ within them"
            )


class _MemoisedPlanner:
    """Plans each (policy, profile) once: an experiment's configurations share them. A class,
    not a closure: a spec that holds one pickles (a user's process pool)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, Profile], Schedule] = {}

    def __call__(self, policy: str, profile: Profile) -> Schedule:
        if (policy, profile) not in self._cache:
            self._cache[policy, profile] = plan(policy, profile).schedule
        return self._cache[policy, profile]


def memoised_planner() -> Planner:
    """A planner that plans each (policy, profile) once (`_MemoisedPlanner`)."""
    return _MemoisedPlanner()


_SETUP = (
    "injection",
    "num_warmup_iterations",
    "checkpoint_every",
    "restart_ms",
    "transport_timeout_s",
)
"""A spec's fields, besides its models' inputs, that a configuration's numbers depend on and
runs.csv does not say (`ExperimentSpec.setups`)."""
_RUNTIME_SETUP = frozenset({"injection", "transport_timeout_s"})
"""Those of `_SETUP` only a runtime backend takes."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ExperimentSpec:
    """Every model x system x scenario is one configuration, run `num_repeats` times."""

    name: str
    models: tuple[Any, ...]
    """Cost-model names or mappings (pipeline.cost_model.resolve_model); with `profile`, one
    label for it."""
    systems: tuple[str, ...]
    """The systems (harness.policies.SYSTEMS), e.g. 1f1b, zb, adaptra-cpu, adaptra."""
    profile: Profile | None = None
    hardware: Any = "h800-ib400"
    """The cost model's hardware: a name (pipeline.cost_model.HARDWARE) or a mapping, e.g.
    {base: h800-ib400, network_gbps: 200}."""
    link_sets: tuple[tuple[Any, ...], ...] = _DEFAULT_LINK_SETS
    """Each set of links gets each delay in turn: PP links ("i-j", an index, "first", "last")
    and DP ring links ("dp<stage>:r-(r+1)", a delay per all-reduce message on the link)."""
    delays_ms: tuple[float, ...] = (0.0,)
    faults: str | None = None
    """A fault timeline file (paper trace or YAML): one scenario replacing links x delays."""
    num_iterations: int = 5
    num_warmup_iterations: int = 1
    num_repeats: int = 1
    seed: int = 0
    backend: str = "sim"
    injection: str = "hook"
    """How a runtime injects delays (harness.runner.INJECTIONS); the simulator times them as
    that injection does (`network`: a delay propagates and a cap queues the bytes, holding no
    sender)."""
    checkpoint_every: int = CHECKPOINT_RESTART.checkpoint_every
    """Iterations between the checkpoints a failure restarts from (harness.loop.Recovery)."""
    restart_ms: float = CHECKPOINT_RESTART.restart_ms
    """The cluster's cost of one restart, ms (not modelled unless given)."""
    transport_timeout_s: float = CHECKPOINT_RESTART.transport_timeout_s
    """With backend emulated or megatron (either injection): a worker's wait for one message
    before it gives up, s; every scenario's longest hold must be shorter (checked when read)."""
    calibration: str | None = None
    """A host's runtime costs for the sim backend (pipeline.host_costs; `adaptra-bench
    calibrate`), relative to the spec file."""
    faults_text: str | None = None
    """The fault timeline file's text, read once when the spec is made (not a spec file's
    key): a run directory's spec.json keeps it, so a resumed run compares what the file held
    and a report rebuilds from it, never reading the file again."""
    calibration_costs: dict[str, Any] | None = None
    """The calibration's costs (HostCosts.to_dict), read once and kept as `faults_text` is."""
    planner: Planner = dataclasses.field(
        default_factory=memoised_planner, init=False, repr=False, compare=False
    )
    """Memoised: the check's plans (each system's first plan of each configuration) are the
    run's (`harness.experiment.run_experiment` plans with it), not made twice. Not a key."""
    resolve_models: dataclasses.InitVar[bool] = True
    """False for the spec a run directory's spec.json holds (`spec_from_record`): its models
    are not resolved, nor checked, when it is made (a later version's cost model may lack
    or change them); spec.json's `resolved` keeps what they resolved to when it ran."""

    def __post_init__(self, resolve_models: bool) -> None:
        self._check_types()
        check_run_name(self.name, "spec name")  # the run directory's default name
        if self.faults is not None:
            check_label(Path(self.faults).stem, "fault timeline file name")
            fault_file_form(self.faults)  # a suffix it cannot read is refused before reading
            ignored = [
                name
                for name, value, default in (
                    ("link_sets", self.link_sets, _DEFAULT_LINK_SETS),
                    ("delays_ms", self.delays_ms, (0.0,)),
                )
                if value != default
            ]
            _refuse_with_faults(ignored)
            if self.faults_text is None:
                object.__setattr__(self, "faults_text", read_text(self.faults, "fault timeline"))
        elif self.faults_text is not None:
            raise ConfigError("faults_text without faults: a timeline's text needs its file name")
        unknown = [s for s in self.systems if s not in SYSTEMS]
        if not self.systems or unknown:
            what = f"unknown system {unknown[0]}" if unknown else "no system given"
            raise ConfigError(f"{what}; valid: {', '.join(SYSTEMS)}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"unknown backend {self.backend!r}; valid: {', '.join(BACKENDS)}")
        if self.injection not in INJECTIONS:
            raise ConfigError(
                f"unknown injection {self.injection!r}; valid: {', '.join(INJECTIONS)}"
            )
        if not self.models:
            raise ConfigError("the spec names no model")
        self.recovery()  # valid
        if self.calibration is not None:
            if self.backend != "sim":
                raise ConfigError("a calibration is for the sim backend")
            if self.calibration_costs is None:
                costs = HostCosts.from_file(self.calibration).to_dict()
                object.__setattr__(self, "calibration_costs", costs)
            self.host_costs()  # valid
        elif self.calibration_costs is not None:
            raise ConfigError("calibration_costs without calibration: costs need their file name")
        if self.profile is not None and (
            len(self.models) != 1 or not isinstance(self.models[0], str)
        ):
            raise ConfigError("with a profile, `models` is one label for it")
        if not self.delays_ms:
            raise ConfigError("delays_ms is empty (0 is the fault-free run)")
        delays_ms = tuple(check_ms(f"delays_ms[{i}]", d) for i, d in enumerate(self.delays_ms))
        object.__setattr__(self, "delays_ms", delays_ms)  # floats, as runs.csv writes them
        _check_unique("systems", self.systems)
        _check_unique("delays_ms", self.delays_ms)
        if self.profile is not None and not any(
            (*self.profile.t_f_ms, *self.profile.t_b_ms, *self.profile.t_w_ms)
        ):
            raise ConfigError(
                "every op time of the profile is 0: an iteration would take no time, and its "
                "throughput and slowdowns would have nothing to divide by"
            )
        if self.profile is not None and (
            any(self.profile.delay_ms) or any(d for _, d in self.profile.dp_delay_ms)
        ):
            raise ConfigError(
                "a spec's profile takes no delay_ms or dp_delay_ms: its scenarios set the links' "
                "delays (delays_ms on link_sets; a timeline in faults)"
            )
        if self.backend == "megatron" and self.profile is None:
            raise ConfigError(
                "backend megatron runs a megatron GPT named by `model` (e.g. tiny) over a "
                "`profile` that gives its stages, microbatches and delays"
            )
        if not resolve_models:
            return
        check_injectable(self.fault_timeline() or NO_FAULTS, self.injection)  # before any work
        targets = self.targets()
        _check_model_labels(targets)
        saved_as: dict[str, str] = {}  # each configuration's timeline file (harness.saved)
        num_configurations = 0
        for target in targets:
            check_label(target.label, "model name")
            if target.cost is not None and self.backend != "sim":
                raise ConfigError(
                    f"model {target.label} comes from the cost model, the paper's cluster's "
                    "times, which only the sim backend runs; use backend: sim, or give a "
                    "profile of the model instead"
                )
            if self.calibration is not None and not _failover_alone(self.host_costs()):
                try:  # simulate --comm nccl-sleep --calibration's check
                    check_takes_host_costs(target.direct_comm)
                except ConfigError as err:
                    raise ConfigError(
                        f"calibration: model {target.label} comes from the cost model (the "
                        f"paper's cluster), whose 1F1B and ZB send {target.direct_comm}: {err}, "
                        "and only the delegated systems would pay them (give a profile of the "
                        "model instead)"
                    ) from err
            scenarios = self.scenarios(target)
            _check_scenario_names(scenarios)
            num_configurations += len(scenarios) * len(self.systems) * self.num_repeats
            if num_configurations > MAX_CONFIGURATIONS:
                raise ConfigError(
                    f"the spec has more than {MAX_CONFIGURATIONS:,} configurations (models x "
                    "systems x scenarios x num_repeats); split it into several"
                )
            if self.backend != "sim":  # before any work: a runtime's workers would time out
                for scenario in scenarios:
                    self._check_hold(target, scenario)
            for scenario in scenarios:
                for system in self.systems:  # the last repeat's name is the longest
                    config = f"{target.label}/{system}/{scenario.name}"
                    last = str(self.num_repeats - 1)
                    name = timeline_name((target.label, system, scenario.name, last))
                    other = saved_as.setdefault(name, config)
                    if other != config:
                        raise ConfigError(
                            f"configurations {other} and {config} would save their timelines "
                            f"to the same file {name}; rename a model"
                        )
            self._check_first_plans(target, scenarios)  # the costliest check: last

    def _check_first_plans(self, target: Target, scenarios: Sequence[Scenario]) -> None:
        """Each system plans its first iteration of `target` in each scenario, as its run
        will (`_first_plans`): a system that cannot plan for the profile (ZB-H2 needs 2S - 1
        microbatches of activation memory, more than a `mem_limit` 1F1B meets) is refused
        here, naming its configuration, not when its turn comes after the others have run.
        Later plans (a re-plan under the delays a detector sees) are not made here. The
        spec's `planner` keeps them for the run: a plan is made once per policy and profile
        (about 0.1 s for the Fig. 16 preset's 80 configurations)."""
        for _ in self._first_plans(target, scenarios):
            pass

    def _first_plans(
        self, target: Target, scenarios: Sequence[Scenario]
    ) -> Iterator[tuple[str, Scenario, Plan]]:
        """Each system's plan for its first iteration of `target` in each scenario, as its
        run makes it (`controller_for`, then its plan for iteration 0; the spec's `planner`
        makes each once); a ConfigError naming the configuration where one cannot plan."""
        for scenario in scenarios:
            for system in self.systems:
                try:
                    first = controller_for(
                        system,
                        target,
                        scenario,
                        self.planner,
                        self.num_warmup_iterations,
                        self.recovery(),
                        link_terms=self.link_terms(),
                    ).plan(0)
                except AdaptraBenchError as err:  # a ScheduleError too (a memory limit)
                    raise ConfigError(_configuration_error(target, system, scenario, err)) from err
                yield system, scenario, first

    def check_processes_here(self) -> None:
        """A ConfigError naming the first configuration whose run on this host would start
        more processes than it takes (harness.runner.check_processes, as `run_configuration`
        counts them from its first plan: a delay's delegates); none for the simulator. Not
        part of the spec's own check: a cluster job (`launch --spec`) spreads its ranks over
        nodes, while `run` starts them all here, so it checks before it writes anything."""
        if self.backend == "sim":
            return
        for target in self.targets():
            for system, scenario, first in self._first_plans(target, self.scenarios(target)):
                try:
                    check_processes(
                        first.profile,
                        delegated=SYSTEMS[system][1] == "delegated",
                        tied=self.backend == "megatron",
                    )
                except ConfigError as err:
                    raise ConfigError(_configuration_error(target, system, scenario, err)) from err

    def _check_hold(self, target: Target, scenario: Scenario) -> None:
        """A runtime's workers receive each of `scenario`'s messages within their
        transport timeout (harness.runner.check_hold, as `run_configuration` checks it)."""
        held = longest_hold_ms(
            scenario.apply(target.profile),
            scenario.faults or NO_FAULTS,
            model=target.label if self.backend == "megatron" else None,
            injection=self.injection,
        )
        try:
            check_hold(held, self.transport_timeout_s)
        except ConfigError as err:
            raise ConfigError(f"model {target.label}, scenario {scenario.name}: {err}") from err

    def _check_types(self) -> None:
        """What YAML gives is any type: each field must be of its own (a float count, a
        string delay or a bool seed is a mistake in the file)."""
        for name in ("name", "backend", "injection"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"{name} must be a string, got {getattr(self, name)!r}")
        for name in ("faults", "calibration"):
            if not isinstance(getattr(self, name), (str, type(None))):
                raise ConfigError(f"{name} must be a file name, got {getattr(self, name)!r}")
        if not isinstance(self.faults_text, (str, type(None))):
            raise ConfigError(f"faults_text must be a string, got {self.faults_text!r}")
        if not isinstance(self.calibration_costs, (dict, type(None))):
            raise ConfigError(
                f"calibration_costs must be a mapping, got {self.calibration_costs!r}"
            )
        for name, minimum, maximum in (
            ("num_iterations", 1, MAX_ITERATIONS),
            ("num_warmup_iterations", 0, MAX_ITERATIONS),
            ("num_repeats", 1, MAX_REPEATS),
            ("seed", 0, MAX_SEED),
            ("checkpoint_every", 1, None),
        ):
            check_count(name, getattr(self, name), minimum, maximum)
        check_ms("restart_ms", self.restart_ms)
        check_wait_s("transport_timeout_s", self.transport_timeout_s)  # run --timeout's range
        if not all(isinstance(s, str) for s in self.systems):
            raise ConfigError(f"systems must be a list of names, got {list(self.systems)!r}")
        if not all(isinstance(m, (str, dict)) for m in self.models):
            raise ConfigError(f"models must be names or mappings, got {list(self.models)!r}")

    def recovery(self) -> Recovery:
        return Recovery(
            checkpoint_every=self.checkpoint_every,
            restart_ms=self.restart_ms,
            transport_timeout_s=self.transport_timeout_s,
        )

    def link_terms(self) -> LinkTerms:
        """The link-model terms its engine (backend and injection) imposes on messages."""
        return link_terms(self.backend, self.injection)

    def host_costs(self) -> HostCosts:
        """The calibration's costs as read when the spec was made (FREE without one)."""
        if self.calibration_costs is None:
            return FREE
        try:
            return HostCosts.from_dict(self.calibration_costs)
        except ConfigError as err:
            raise ConfigError(f"calibration {self.calibration}: {err}") from err

    def targets(self) -> list[Target]:
        if self.profile is not None:
            profile = self.profile
            if self.backend == "megatron":  # its DP ring sums the model's real gradients
                from pipeline.runtime.megatron.model import get_preset, with_model_bytes

                profile = with_model_bytes(profile, get_preset(str(self.models[0])))
            return [Target(str(self.models[0]), profile, None)]
        targets = []
        for entry in self.models:
            cost = model_cost(resolve_model(entry), resolve_hardware(self.hardware))
            targets.append(Target(cost.model.name, cost.profile, cost))
        return targets

    def fault_timeline(self) -> FaultModel | None:
        """Its fault timeline, if it has one, as read from `faults_text` (not checked against a
        model's topology: `scenarios` does that)."""
        if self.faults is None:
            return None
        return parse_faults(str(self.faults_text), self.faults, self.seed)

    def scenarios(self, target: Target) -> list[Scenario]:
        """The fault-free scenario once (if a delay is 0), then every link set x delay."""
        timeline = self.fault_timeline()
        if timeline is not None:
            timeline.validate(
                target.profile.topology,
                self.num_iterations,
            )
            return [Scenario(faults=timeline, faults_name=Path(str(self.faults)).stem)]
        if not self.link_sets:
            raise ConfigError("link_sets is empty")
        scenarios = [Scenario()] if 0 in self.delays_ms else []
        slow = [d for d in self.delays_ms if d]
        # Fault-free only, with the default links: none needs to exist (one stage has none).
        needed = slow or self.link_sets != _DEFAULT_LINK_SETS
        link_sets = []
        for i, link_set in enumerate(self.link_sets if needed else ()):
            if not link_set:
                raise ConfigError(f"link_sets[{i}] is empty: a link set names the links to slow")
            links = tuple(_link(link, target) for link in link_set)
            for j, link in enumerate(links):
                k = links.index(link)
                if k != j:  # "0-1,0-1@5ms" slows the link once, under another name
                    raise ConfigError(
                        f"link_sets[{i}][{j}] ({link_set[j]!r}) repeats link {link} "
                        f"(link_sets[{i}][{k}], {link_set[k]!r}); list each link once"
                    )
            link_sets.append(links)
        resolved = [frozenset(links) for links in link_sets]
        for i, chosen in enumerate(resolved):
            if (j := resolved.index(chosen)) != i:  # `first` and `last` of 2 stages are one
                raise ConfigError(
                    f"link_sets[{i}] repeats link_sets[{j}] in model {target.label} (both "
                    f"{', '.join(sorted(map(str, chosen)))}); list each once"
                )
        for links in link_sets:
            scenarios += [Scenario(links, d) for d in slow]
        return scenarios

    def configurations(self) -> list[Configuration]:
        """Every configuration, in the order a run runs them."""
        return [
            Configuration(target, system, scenario, repeat)
            for target in self.targets()
            for system in self.systems
            for scenario in self.scenarios(target)
            for repeat in range(self.num_repeats)
        ]

    def setups(self) -> dict[str, dict[str, Any]]:
        """Per model label, the inputs its configurations' numbers depend on besides what
        runs.csv says of them (harness.compare.IDENTITY): the fields of the profile it runs
        as this version resolves it (`profile <field>`: a cost-model model's on its hardware,
        a megatron run's with its model's bytes; a model or hardware spelled out otherwise
        but the same is the same), and the run's `_SETUP` (`_RUNTIME_SETUP` where a runtime
        backend runs it: the simulator takes neither, but for an injection other than the
        hook's, which it times as that injection does: `run --backend sim --inject network`).
        Models this version cannot resolve (a preset renamed since): each named one's name
        and the hardware as written."""
        run = {
            name: getattr(self, name)
            for name in _SETUP
            if self.backend != "sim"
            or name not in _RUNTIME_SETUP
            or (name == "injection" and self.injection != "hook")  # the network's timing
        }
        try:
            targets = self.targets()
        except ConfigError:
            named = (entry for entry in self.models if isinstance(entry, str))
            return {name: {"model": name, "hardware": self.hardware, **run} for name in named}
        return {
            target.label: {
                **{f"profile {k}": v for k, v in target.profile.to_dict().items()},
                **run,
            }
            for target in targets
        }

    def resolve(self, configurations: Sequence[Configuration] | None = None) -> ResolvedSpec:
        """What it resolves to with this version's cost model (its `configurations`, if given,
        are these): what spec.json keeps for the report."""
        configs = self.configurations() if configurations is None else configurations
        return ResolvedSpec(
            {c.target.label: c.target.samples_per_iteration for c in configs},
            tuple(c.key for c in configs),
        )

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        del data["planner"]
        data["profile"] = None if self.profile is None else self.profile.to_dict()
        return data

    @classmethod
    def from_dict(
        cls, data: Any, base_dir: Path | None = None, *, recorded: bool = False
    ) -> ExperimentSpec:
        """The `to_dict` form, which is also the YAML spec file's (`model` and `links` are
        accepted for one model and one link set); `faults`, `calibration` and a `profile`
        given as a file's path are relative to `base_dir`. Only a `recorded` spec (spec.json's)
        may give what the spec read from its files (`faults_text`, `calibration_costs`): a
        spec file names the files; its models are not resolved (`resolve_models`)."""
        if not isinstance(data, dict):
            raise ConfigError("an experiment spec is a mapping of its fields")
        values = dict(data)
        if not recorded and values.get("faults") is not None:  # whatever their values
            _refuse_with_faults([k for k in ("links", "link_sets", "delays_ms") if k in values])
        if isinstance(values.get("links"), list) and any(
            isinstance(link, list) for link in values["links"]
        ):
            raise ConfigError(
                "links is one set of links, all slowed in one scenario (links: ['0-1', "
                "'2-3']); for several scenarios give link_sets, a list of such sets"
            )
        if isinstance(values.get("links"), str):  # one link: `links: last`
            values["links"] = [values["links"]]
        for single, plural in (("model", "models"), ("links", "link_sets")):
            if single in values:
                if plural in values:
                    raise ConfigError(f"give {single!r} or {plural!r}, not both")
                values[plural] = [values.pop(single)]
        fields = {f.name for f in dataclasses.fields(cls) if f.init}
        fields -= set() if recorded else _READ
        unknown = sorted(map(str, set(values) - fields))  # YAML keys may be numbers
        if unknown:
            raise ConfigError(
                f"unknown spec key(s) {', '.join(unknown)}; valid keys: "
                f"{', '.join(sorted(fields | {'model', 'links'}))}"
            )
        missing = [k for k in ("name", "models", "systems") if k not in values]
        if missing:
            raise ConfigError(f"the spec is missing {', '.join(missing)}")
        profile = values.get("profile")
        if isinstance(profile, str) and base_dir is not None:  # a profile file, as `run` takes
            values["profile"] = Profile.from_file(base_dir / profile)  # (its errors name it)
        elif profile is not None:
            values["profile"] = Profile.from_dict(profile)
        for key in ("models", "systems", "delays_ms"):
            if key in values:
                values[key] = tuple(values[key] if isinstance(values[key], list) else [values[key]])
        if "link_sets" in values:
            if not isinstance(values["link_sets"], (list, tuple)):
                raise ConfigError(
                    f"link_sets must be a list of link lists, got {values['link_sets']!r}"
                )
            flat = [s for s in values["link_sets"] if not isinstance(s, (list, tuple))]
            if flat:
                raise ConfigError(
                    f"link_sets is a list of link sets, one scenario each, got {flat[0]!r} "
                    "in it: [['0-1'], ['2-3']] for two scenarios of one slow link each, or "
                    "links: ['0-1', '2-3'] for one scenario slowing both"
                )
            values["link_sets"] = tuple(tuple(s) for s in values["link_sets"])
        for key in ("faults", "calibration"):  # another type: refused as not a file name
            if isinstance(values.get(key), str) and base_dir is not None:
                values[key] = str((base_dir / values[key]).resolve())
        spec = cls(**values, resolve_models=not recorded)
        if not recorded:  # spec.json writes every key, its defaults too
            _refuse_what_changes_nothing(spec, values)
        return spec


def _configuration_error(
    target: Target, system: str, scenario: Scenario, err: BaseException
) -> str:
    """An error of one configuration, naming it."""
    return f"model {target.label}, system {system}, scenario {scenario.name}: {err}"


def _refuse_what_changes_nothing(spec: ExperimentSpec, given: dict[str, Any]) -> None:
    """A ConfigError for a key the spec file gives that its run would ignore, as `run`
    refuses such an option (`--seed` without --faults or --backend megatron): a `seed` with
    neither a fault timeline nor backend megatron, a `hardware` with a `profile`."""
    if "seed" in given and spec.faults is None and spec.backend != "megatron":
        raise ConfigError(
            "seed seeds a fault timeline's draws (faults) and backend megatron's model: this "
            "spec has neither, so it would change nothing"
        )
    if "hardware" in given and spec.profile is not None:
        raise ConfigError(
            "hardware is the cost model's: a spec with a profile, which gives the op times "
            "and message sizes, takes none (it would change nothing)"
        )


_READ = frozenset({"faults_text", "calibration_costs"})
"""What a spec read from the files it names: spec.json keeps it, a spec file never gives it."""


def spec_from_record(record: dict[str, Any]) -> ExperimentSpec:
    """The spec a run directory's spec.json holds (harness.results.read_spec_record), with
    the fault timeline's text and the calibration's costs it kept: the files it names are not
    read again. A record of spec version 1 kept their paths only: the files are read then."""
    spec = record["spec"]
    if record["spec_version"] >= 2:
        for name, kept in (("faults", "faults_text"), ("calibration", "calibration_costs")):
            if spec.get(name) is not None and spec.get(kept) is None:
                raise ConfigError(f"the spec.json spec names {name} but keeps no {kept}: damaged?")
    return ExperimentSpec.from_dict(spec, recorded=True)


def resolved_from_record(record: dict[str, Any], path: Path) -> ResolvedSpec:
    """What the run of spec.json `path`'s record (harness.results.read_spec_record) resolved
    its spec to, as it kept it; a record of an older version, which kept none, is resolved
    now, with this version's cost model (the error says so where that fails: a preset renamed
    since)."""
    try:
        if "resolved" in record:
            return ResolvedSpec.from_dict(record["resolved"])
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from err
    try:
        return spec_from_record(record).resolve()
    except (ConfigError, TypeError) as err:
        raise ConfigError(
            f"{path}, of an older version, keeps no resolved models; resolving them with this "
            f"version failed: {err}"
        ) from err


def without_folders(spec: dict[str, Any]) -> dict[str, Any]:
    """`spec` (`ExperimentSpec.to_dict`'s form) with its fault timeline's and calibration's
    file names in place of their paths (their contents are kept beside them: `faults_text`,
    `calibration_costs`): the same experiment wherever its files are."""
    names = {key: Path(spec[key]).name for key in ("faults", "calibration") if spec.get(key)}
    return {**spec, **names}


def resume_command(spec: ExperimentSpec, run_dir: Path) -> str:
    """The command line that finishes the run in `run_dir`: `--spec SPEC` (the spec file it
    was started with, which spec.json does not name) unless it is the default experiment."""
    spec_option = "" if spec.to_dict() == default_experiment().to_dict() else " --spec SPEC"
    run_dir = run_dir.resolve()  # `report .` names the run "" in a directory "."
    out, run_id = shlex.quote(str(run_dir.parent)), shlex.quote(run_dir.name)
    return f"adaptra-bench run{spec_option} --out {out} --run-id {run_id}"


def resume_advice(spec: ExperimentSpec, run_dir: Path) -> str:
    """`resume_command` in backquotes, and what SPEC is where it has one: "`adaptra-bench
    run --spec SPEC --out D --run-id ID` (SPEC: the spec file it was started with)"."""
    command = resume_command(spec, run_dir)
    spec_file = " --spec SPEC " in command
    return f"`{command}`" + (" (SPEC: the spec file it was started with)" if spec_file else "")


def finish_advice(record: dict[str, Any], spec: ExperimentSpec, run_dir: Path) -> str:
    """How to finish the unfinished run in `run_dir` (spec.json's `record`): "resume it with
    `resume_advice`", or, for a directory `collect` began (`ran_by`: a `collect` killed
    before it wrote runs.csv, which no run may resume), "remove it and collect again with
    `adaptra-bench collect JOB --out D --run-id ID`"."""
    source = record.get("collected_from")
    if "ran_by" not in record:
        return f"resume it with {resume_advice(spec, run_dir)}"
    run_dir = run_dir.resolve()
    job = shlex.quote(source) if isinstance(source, str) else "JOB"
    out, run_id = shlex.quote(str(run_dir.parent)), shlex.quote(run_dir.name)
    return (
        "its collect was cut short (a run cannot resume it): remove it and collect again with "
        f"`adaptra-bench collect {job} --out {out} --run-id {run_id}`"
    )


def load_spec(path: Path) -> ExperimentSpec:
    """An experiment spec from a YAML (or JSON) file; every error names the file."""
    data = load_yaml(read_text(path, "spec"), f"spec {path}")
    try:
        return ExperimentSpec.from_dict(data, base_dir=path.parent)
    except (ConfigError, TypeError) as err:
        raise ConfigError(f"spec {path}: {err}") from err


def default_experiment() -> ExperimentSpec:
    """1F1B, ZB, Adaptra-CPU and Adaptra on the paper's Fig. 4 pipeline, a slow first link."""
    return ExperimentSpec(
        name="default",
        models=("fig4-uniform-10ms",),
        profile=Profile.uniform(4, 12, t_f_ms=10, t_b_ms=10, t_w_ms=10),
        systems=("1f1b", "zb", "adaptra-cpu", "adaptra"),
        delays_ms=(0.0, 10.0, 20.0, 40.0),
    )


def controller_for(
    system: str,
    target: Target,
    scenario: Scenario,
    planner: Planner | None = None,
    num_warmup_iterations: int = 1,
    recovery: Recovery = CHECKPOINT_RESTART,
    link_terms: LinkTerms = ALL_LINK_TERMS,
) -> Controller:
    """What runs `system` on `target` in `scenario` (harness.policies.system_controller)
    after `num_warmup_iterations`, on an engine that imposes `link_terms` (the simulator's
    by default; a spec's own: `ExperimentSpec.link_terms`)."""
    return system_controller(
        system,
        scenario.apply(target.profile),
        scenario.faults or NO_FAULTS,
        num_warmup_iterations=num_warmup_iterations,
        planner=planner or memoised_planner(),
        profile_for=None if target.cost is None else target.cost.profile_for,
        direct_comm=target.direct_comm,
        recovery=recovery,
        link_terms=link_terms,
    )
