"""The engine interface: one iteration of a plan, under the faults in force, on any engine.

A controller (pipeline.engines.control) says what each iteration runs (a `Plan`); an engine
(`sim`, `emulated`, `megatron`) runs it and returns what it measured (an `Outcome`). Each
engine declares what it can do once, in its `Capabilities`; `check_plan` is the one place
a plan is held against them.
"""

from __future__ import annotations

import dataclasses
from enum import StrEnum
from types import TracebackType
from typing import Protocol, Self

from pipeline.checks import check_count
from pipeline.errors import ConfigError
from pipeline.faults import IterationFaults
from pipeline.link_terms import LinkTerms
from pipeline.profile import Profile
from pipeline.schedule import ReplicaSchedules, Schedule, validate_schedule
from pipeline.simulator import CommMode, LinkComm
from pipeline.timeline import Timeline
from pipeline.topology import Direction, Link, Topology

__all__ = [
    "Action",
    "Capabilities",
    "Closing",
    "Engine",
    "Outcome",
    "Plan",
    "check_plan",
]

_NUM_VALIDATED = 64
"""The schedules an engine holds as validated (then it starts over): a controller replans."""


class Action(StrEnum):
    RUN = "run"
    """Run the iteration."""
    RESTART = "restart"
    """Restart the job from its last checkpoint before running it."""


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """One iteration as a controller asks for it."""

    schedule: Schedule
    profile: Profile
    """The op times and the static link delays the schedule is run under (a fault view's
    delays come on top, per message)."""
    comm: CommMode = CommMode.DIRECT
    link_comms: tuple[LinkComm, ...] = ()
    """Link directions whose messages go another way than `comm` (modes mixed per link
    direction)."""
    topology: Topology | None = None
    """Which worker plays which position (None: the default placement)."""
    action: Action = Action.RUN
    replica_schedules: ReplicaSchedules | None = None
    """Each DP replica's own schedule, on its share of the global batch (a rebalance: unequal
    microbatch counts, `profile.num_replicas` x `profile.num_microbatches` in all; None:
    every replica runs `schedule`)."""
    policy: str = dataclasses.field(default="", compare=False)
    """The policy that made `schedule` (reported per iteration; empty: the run's)."""
    believed_ms: tuple[tuple[str, float], ...] = dataclasses.field(default=(), compare=False)
    """The links (PP, DP ring) the controller believed slow when it made this plan, with
    their extra delay in ms (a detector's estimates, an oracle's knowledge): reported, never
    run."""
    num_delegates: int | None = None
    """How many of the delegates started per link direction and side (the profile's
    `delegate_count()`, which the engine starts) this iteration's delegated messages go
    through: the first so many, message k through delegate k mod this (None: all)."""

    def __post_init__(self) -> None:
        if self.num_delegates is not None:
            check_count("a plan's num_delegates", self.num_delegates, 1)
            started = self.profile.delegate_count()
            if self.num_delegates > started:
                raise ConfigError(
                    f"a plan's num_delegates ({self.num_delegates}) must be at most the "
                    f"delegates started ({started}: the profile's delegate count)"
                )
        split = self.replica_schedules
        if split is None:
            return
        profile = self.profile
        total = profile.num_replicas * profile.num_microbatches
        if len(split.schedules) != profile.num_replicas or split.num_microbatches != total:
            raise ConfigError(
                f"replica schedules {split} do not split the global batch of {total} "
                f"microbatches over {profile.num_replicas} replica(s)"
            )

    def schedule_of(self, replica: int) -> Schedule:
        """The schedule replica `replica` runs."""
        split = self.replica_schedules
        return self.schedule if split is None else split.schedules[replica]

    def uses_delegates(self) -> bool:
        """Whether any of its messages go over delegates."""
        modes = (self.comm, *(c.comm for c in self.link_comms))
        return CommMode.DELEGATED in modes

    def num_delegates_used(self) -> int:
        """The delegates per link direction and side its delegated messages go through."""
        return self.profile.delegate_count() if self.num_delegates is None else self.num_delegates

    def iteration_profile(self) -> Profile:
        """`profile` as the iteration runs under it: its `num_delegates` the plan's (the
        delegates its messages go through) where the plan gives one."""
        if self.num_delegates is None:
            return self.profile
        return dataclasses.replace(self.profile, num_delegates=self.num_delegates)

    def validate(self, validated: dict[int, Schedule]) -> None:
        """Validate each replica's schedule for its microbatch count, but those already in
        `validated` (an engine's, by id: a schedule object is validated once; it holds them,
        so that no other schedule takes a freed one's id), and add them."""
        split = self.replica_schedules
        for replica in range(self.profile.num_replicas):
            schedule = self.schedule_of(replica)
            if validated.get(id(schedule)) is not schedule:
                count = self.profile.num_microbatches if split is None else split.counts[replica]
                validate_schedule(schedule, self.profile.num_stages, count)
                if len(validated) >= _NUM_VALIDATED:
                    validated.clear()
                validated[id(schedule)] = schedule

    def comm_by_link(self) -> dict[str, str]:
        """Each PP link's comm mode: "delegated" where either direction's messages go over
        delegates, else its directions' mode (where they differ, the one its last
        `link_comms` entry gives). A direction's mode is `comm` but where a `link_comms`
        entry gives another (the last one for it, as the simulator runs it)."""
        directions: dict[str, dict[Direction, CommMode]] = {}
        last: dict[str, CommMode] = {}
        for override in self.link_comms:
            link = str(Link.pp(override.link.first))
            directions.setdefault(link, {})[override.direction] = override.comm
            last[link] = override.comm
        modes: dict[str, str] = {}
        for i in range(self.schedule.num_stages - 1):
            link = str(Link.pp(i))
            ways = dict.fromkeys(Direction, self.comm) | directions.get(link, {})
            if CommMode.DELEGATED in ways.values():
                modes[link] = CommMode.DELEGATED.value
            elif ways[Direction.FORWARD] is ways[Direction.BACKWARD]:
                modes[link] = ways[Direction.FORWARD].value
            else:
                modes[link] = last[link].value
        return modes


@dataclasses.dataclass(frozen=True, slots=True)
class Capabilities:
    comms: frozenset[CommMode]
    """The comm modes it realises."""
    link_terms: LinkTerms
    """The link-model terms it imposes on every message (pipeline.link_terms): what a
    detector reading its timelines subtracts from a message's measured time."""
    trains: bool = False
    """It computes a real model: losses and a parameter digest."""
    restarts: bool = False
    """It can be checkpoint-restarted after a link failure (`Engine.restart`)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    timeline: Timeline
    """The iteration's ops, messages and boundary (one iteration)."""
    loss: float | None = None
    """Training loss (engines that train)."""
    params_sha256: str = ""
    """The parameters' digest after the iteration, when it was asked for (engines that
    train; pipeline.runtime.digest)."""
    devices: str = ""
    """Where a runtime's workers computed and how they talked (pipeline.runtime.devices:
    `describe_pool`); empty for the simulator."""
    same_as: int | None = None
    """This iteration is iteration `same_as` of the run again, moved to now: the same plan
    and faults (the simulator; never with per-message draws). Whatever was derived from
    that one's timeline holds for this one."""


class Engine(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def capabilities(self) -> Capabilities: ...

    def run(
        self,
        plan: Plan,
        iteration: int,
        faults: IterationFaults,
        *,
        digest: bool = False,
        checkpoint: bool = False,
    ) -> Outcome:
        """Run iteration `iteration` of the current run (iteration 0 starts a new run: a
        training engine starts again from the initial parameters, and every link direction
        on the first NIC, on healthy hardware; right after `restart` it is the same run
        back at its start, whose clock goes on). `digest`: report the
        parameters' digest after it; `checkpoint`: a training engine saves its state after
        it. A message that cannot go (its link or a NIC on its route is down) raises
        `pipeline.errors.LinkFailure`."""
        ...

    def restart(self) -> None:
        """Come back after a failure, as a checkpoint-restart does: fresh processes, which
        (a training engine) resume from the last checkpoint of this run, or from the initial
        parameters at iteration 0."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Engine: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class Closing:
    """`with` closes it: engines (and what holds engines) are context managers."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def check_plan(engine: Engine, plan: Plan) -> None:
    """Refuse, with the engine's name, a plan it cannot run."""
    capabilities = engine.capabilities
    for comm in (plan.comm, *(c.comm for c in plan.link_comms)):
        if comm not in capabilities.comms:
            valid = ", ".join(sorted(c.value for c in capabilities.comms))
            raise ConfigError(
                f"comm {comm.value!r} is not available in the {engine.name} engine yet; "
                f"it runs {valid}"
            )
    if plan.action is Action.RESTART and not capabilities.restarts:
        raise ConfigError(f"the {engine.name} engine cannot restart")
