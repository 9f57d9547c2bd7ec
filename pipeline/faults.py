"""What the faults in force do to a message: the read-only view every engine and oracle gets.

injectors/ owns the fault model (its timelines, their file forms) and hands engines a
`FaultView` of it; the simulator asks it for each message's effect, the runtimes' fault hooks
realise that effect on the wire, and an oracle controller reads what is in force per link.
Nothing here changes a fault: a view is a pure function of what it is asked.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable
from typing import Protocol

from pipeline.link_rates import LinkRates
from pipeline.topology import Direction, Link, Topology

__all__ = [
    "NO_FAULTS",
    "AfterWarmup",
    "FaultView",
    "IterationFaults",
    "MessageFault",
    "NoFaults",
    "Route",
    "first_route_up",
    "route_over",
]


@dataclasses.dataclass(frozen=True, slots=True)
class MessageFault:
    """What the fault model assigns one message."""

    delay_ms: float = 0.0
    """Extra time before the message goes (a slow link), on top of the profile's own delay
    and its link's own bytes/bandwidth (a cap adds what it takes beyond those)."""
    cap_ms: float = 0.0
    """Of `delay_ms`, what the route's cap adds: the wire's share, which stays with the link
    the message crosses (the rest is injected: a delay, its jitter, a stall)."""
    failed: bool = False
    """The message cannot go over the NIC asked about: its link or a NIC on that route has
    failed."""


NONE = MessageFault()


@dataclasses.dataclass(frozen=True, slots=True)
class Route:
    """Where a delegated message goes (`route_over`) and what the faults do to it there."""

    nic: int
    """The data-plane NIC it takes, by index (`Topology.nics`)."""
    fault: MessageFault


class IterationFaults(Protocol):
    """What is in force during one iteration. Picklable: the runtimes ship it to every
    worker with the iteration's config."""

    def message_fault(
        self,
        link: Link,
        direction: Direction,
        kind: str,
        microbatch: int,
        num_bytes: int = 0,
        offset_ms: float = 0.0,
        nic: int = 0,
    ) -> MessageFault:
        """The effect on one message of a concrete link in `direction`, of `num_bytes`, sent
        `offset_ms` into the iteration (on the engine's clock) over data-plane NIC `nic` (by
        index: every message goes over the first until a failover moves its link
        direction). A failed route changes no state (asking another NIC next is free). On a PP link
        (`Link.pp(stage, replica)`), "forward" is an activation (`kind` "F"), "backward" a
        gradient ("B"), of `microbatch`; on a DP ring link (`Link.dp(stage, a, b)`) the
        all-reduce's messages have `kind` "AR", "forward" from the lower replica to the
        higher, and `microbatch` is the message's index on that link direction in the
        iteration (pipeline.allreduce). Asked about each message in each sender's send
        order, once per NIC tried (`route_over`): a view may keep per-sender state, changed
        only where the route is up (the NIC the message takes)."""
        ...

    def route_failed(self, link: Link, nic: int, offset_ms: float = 0.0) -> bool:
        """Whether the route of the concrete `link` over data-plane NIC `nic` has failed
        `offset_ms` into the iteration (as `message_fault` says `failed` for any message on
        it; asked without a message, it changes no state): what a new pair of delegates
        finds as it connects (`first_route_up`)."""
        ...

    def affects(self, link: Link) -> bool:
        """Some message on the concrete `link` (either direction) may get an effect: False
        lets an engine time a DP replica whose links are all unaffected as a copy of another
        such replica."""
        ...

    def cache_key(self) -> Hashable | None:
        """Equal keys give every message the same effect, so an engine may reuse an
        iteration it ran under an equal key; None: never reuse (seeded per-message draws,
        values redrawn over time, or state)."""
        ...


class FaultView(Protocol):
    """A whole run's faults, iteration by iteration (iterations count from the first
    measured one)."""

    def at(self, iteration: int, topology: Topology, *, rates: LinkRates) -> IterationFaults:
        """What is in force at `iteration` with positions placed as in `topology`, on links
        of `rates` (the profile's, `Profile.link_rates`: a cap replaces a link's own rate
        where slower, pipeline.link_rates; NO_RATES: every link unlimited)."""
        ...

    def pp_delays_ms(self, iteration: int, topology: Topology) -> tuple[float, ...]:
        """The delay in force on each PP link at `iteration`, the most of any replica's: what
        an oracle controller plans for."""
        ...

    def dp_delays_ms(self, iteration: int, topology: Topology) -> tuple[tuple[str, float], ...]:
        """The DP ring links with a delay in force at `iteration`, and that delay."""
        ...

    def has_failure(self, iteration: int, topology: Topology) -> bool:
        """A failure is in force at `iteration`."""
        ...

    def repaired(
        self, iteration: int, *, stragglers: bool = False, at_ms: float = math.inf
    ) -> FaultView:
        """The faults a checkpoint-restart at `iteration` resumes under: after a failure
        `at_ms` into `iteration` (inf: its end), every failure that had started by then
        cleared, the failed hardware replaced (one that starts later in `iteration` still
        happens when it runs again); `stragglers` (a restart a controller asked for before
        `iteration` runs, to leave the slow hardware out): every event that started before
        `iteration` cleared, slow links and NICs too, while those that start in it still
        happen."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class NoFaults:
    """A healthy cluster: every iteration, every message. Unpickled (in a worker) it is
    `NO_FAULTS`: code asks `faults is NO_FAULTS`."""

    def __reduce__(self) -> tuple[Callable[[], NoFaults], tuple[()]]:
        return _no_faults, ()

    def message_fault(
        self,
        link: Link,
        direction: Direction,
        kind: str,
        microbatch: int,
        num_bytes: int = 0,
        offset_ms: float = 0.0,
        nic: int = 0,
    ) -> MessageFault:
        return NONE

    def route_failed(self, link: Link, nic: int, offset_ms: float = 0.0) -> bool:
        return False

    def affects(self, link: Link) -> bool:
        return False

    def cache_key(self) -> Hashable | None:
        return ()

    def at(self, iteration: int, topology: Topology, *, rates: LinkRates) -> NoFaults:
        return self

    def pp_delays_ms(self, iteration: int, topology: Topology) -> tuple[float, ...]:
        return (0.0,) * (topology.num_stages - 1)

    def dp_delays_ms(self, iteration: int, topology: Topology) -> tuple[tuple[str, float], ...]:
        return ()

    def has_failure(self, iteration: int, topology: Topology) -> bool:
        return False

    def repaired(
        self, iteration: int, *, stragglers: bool = False, at_ms: float = math.inf
    ) -> NoFaults:
        return self


NO_FAULTS = NoFaults()


def _no_faults() -> NoFaults:
    return NO_FAULTS


@dataclasses.dataclass(frozen=True, slots=True)
class AfterWarmup:
    """`faults` with its iteration 0 moved to iteration `num_warmup` of a run: the warm-up
    iterations run healthy (a fault timeline counts from the first measured iteration)."""

    faults: FaultView
    num_warmup: int

    def at(self, iteration: int, topology: Topology, *, rates: LinkRates) -> IterationFaults:
        if iteration < self.num_warmup:
            return NO_FAULTS
        return self.faults.at(iteration - self.num_warmup, topology, rates=rates)

    def pp_delays_ms(self, iteration: int, topology: Topology) -> tuple[float, ...]:
        if iteration < self.num_warmup:
            return NO_FAULTS.pp_delays_ms(iteration, topology)
        return self.faults.pp_delays_ms(iteration - self.num_warmup, topology)

    def dp_delays_ms(self, iteration: int, topology: Topology) -> tuple[tuple[str, float], ...]:
        if iteration < self.num_warmup:
            return ()
        return self.faults.dp_delays_ms(iteration - self.num_warmup, topology)

    def has_failure(self, iteration: int, topology: Topology) -> bool:
        return iteration >= self.num_warmup and self.faults.has_failure(
            iteration - self.num_warmup, topology
        )

    def repaired(
        self, iteration: int, *, stragglers: bool = False, at_ms: float = math.inf
    ) -> AfterWarmup:
        repaired = self.faults.repaired(
            iteration - self.num_warmup, stragglers=stragglers, at_ms=at_ms
        )
        return AfterWarmup(repaired, self.num_warmup)


def route_over(
    faults: IterationFaults,
    nic: int,
    num_nics: int,
    link: Link,
    direction: Direction,
    kind: str,
    microbatch: int,
    num_bytes: int = 0,
    offset_ms: float = 0.0,
) -> Route:
    """Where a message of a delegated link direction now on NIC `nic` goes (of `num_nics`):
    over `nic` while its route is up, else over the first other NIC whose route is up (the
    direction fails over to it, as a sender delegate does); failed over `nic` where no
    route is up."""
    fault = faults.message_fault(link, direction, kind, microbatch, num_bytes, offset_ms, nic)
    if not fault.failed:
        return Route(nic, fault)
    for other in range(num_nics):
        if other != nic:
            moved = faults.message_fault(
                link, direction, kind, microbatch, num_bytes, offset_ms, other
            )
            if not moved.failed:
                return Route(other, moved)
    return Route(nic, fault)


def first_route_up(
    faults: IterationFaults, link: Link, num_nics: int, offset_ms: float = 0.0
) -> int:
    """The NIC (by index, of `num_nics`) a new pair of delegates of the concrete `link` starts
    on when it connects `offset_ms` into the iteration: the first whose route is up (as
    adaptra.transport's do, knowing the NICs down at both hosts), so that it meets no
    failover; the first NIC where none is up (its first message fails)."""
    for nic in range(num_nics):
        if not faults.route_failed(link, nic, offset_ms):
            return nic
    return 0
