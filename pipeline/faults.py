"""What the faults in force do to a message: the read-only view every engine and oracle gets.

injectors/ owns the fault model (its timelines, their file forms) and hands engines a
`FaultView` of it; the simulator asks it for each message's effect, the runtimes' fault hooks
realise that effect on the wire, and an oracle controller reads what is in force per link.
Nothing here changes a fault: a view is a pure function of what it is asked.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from pipeline.topology import Link

__all__ = ["NO_FAULTS", "AfterWarmup", "FaultView", "IterationFaults", "MessageFault", "NoFaults"]


@dataclasses.dataclass(frozen=True, slots=True)
class MessageFault:
    """What the fault model assigns one message."""

    delay_ms: float = 0.0
    """Extra time before the message goes (a slow link), on top of the profile's own delay."""
    failed: bool = False
    """The message cannot go: its link or a NIC on its route has failed."""


NONE = MessageFault()


class IterationFaults(Protocol):
    """What is in force during one iteration. Picklable: the runtimes ship it to every
    worker with the iteration's config."""

    def message_fault(self, link: Link, direction: str, kind: str, microbatch: int) -> MessageFault:
        """The effect on one message of a concrete PP link (`Link.pp(stage, replica)`) in
        `direction` ("forward": an activation, `kind` "F"; "backward": a gradient, "B")."""
        ...


class FaultView(Protocol):
    """A whole run's faults, iteration by iteration (iterations count from the first
    measured one)."""

    def at(self, iteration: int) -> IterationFaults: ...

    def pp_delays_ms(self, iteration: int, num_stages: int) -> tuple[float, ...]:
        """The delay in force on each PP link (every replica) at `iteration`: what an oracle
        controller plans for."""
        ...

    def has_failure(self, iteration: int) -> bool:
        """A failure is in force at `iteration`."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class NoFaults:
    """A healthy cluster: every iteration, every message."""

    def message_fault(self, link: Link, direction: str, kind: str, microbatch: int) -> MessageFault:
        return NONE

    def at(self, iteration: int) -> NoFaults:
        return self

    def pp_delays_ms(self, iteration: int, num_stages: int) -> tuple[float, ...]:
        return (0.0,) * (num_stages - 1)

    def has_failure(self, iteration: int) -> bool:
        return False


NO_FAULTS = NoFaults()


@dataclasses.dataclass(frozen=True, slots=True)
class AfterWarmup:
    """`faults` with its iteration 0 moved to iteration `num_warmup` of a run: the warm-up
    iterations run healthy (a fault timeline counts from the first measured iteration)."""

    faults: FaultView
    num_warmup: int

    def at(self, iteration: int) -> IterationFaults:
        if iteration < self.num_warmup:
            return NO_FAULTS
        return self.faults.at(iteration - self.num_warmup)

    def pp_delays_ms(self, iteration: int, num_stages: int) -> tuple[float, ...]:
        if iteration < self.num_warmup:
            return NO_FAULTS.pp_delays_ms(iteration, num_stages)
        return self.faults.pp_delays_ms(iteration - self.num_warmup, num_stages)

    def has_failure(self, iteration: int) -> bool:
        return iteration >= self.num_warmup and self.faults.has_failure(iteration - self.num_warmup)
