"""Where things run: positions (stage, replica), the worker playing each, hosts, NICs, links.

- A position is a (stage, replica) of the PP x DP grid; its index is `replica * S + stage`
  (`Topology.index`), the one place that formula lives.
- A worker is one process (one torch.distributed rank). A placement says which worker plays
  which position; by default worker i plays position i. A placement may change between
  iterations (a rank swap: `Topology.swapped`).
- A host runs `workers_per_host` consecutive workers (default 1: host index = worker index)
  and has the data-plane NICs `nics` (all traffic on the first until something moves it).
- A `Link` is a logical link, parsed and printed here only: "2-3" is PP link 2-3 in every
  replica, "pp1:2-3" the one of replica 1, "dp0:0-1" the DP ring link of stage 0 between
  replicas 0 and 1 (its ring closes with "dp0:0-(D-1)" for D > 2). Under a placement a
  concrete link runs between two hosts (`Topology.hosts_of`).
- The tied route, "tied:0-3" at S = 4 (`tied_link`), is no `Link`: the runtime's name for
  the route between the first and the last stage of a replica that carries a tied weight's
  gradient. Timelines name it (a delegate on it fails over like any other), no fault does.
"""

from __future__ import annotations

import dataclasses
import re
from enum import StrEnum
from typing import Any

from pipeline.checks import whole_number
from pipeline.errors import ConfigError

__all__ = [
    "DEFAULT_NICS",
    "Direction",
    "Link",
    "LinkKind",
    "Position",
    "Topology",
    "is_dp_link",
    "is_tied_link",
    "link_name",
    "tied_link",
]

DEFAULT_NICS = ("rnic0", "rnic1")

_LINK = re.compile(r"(?:(pp|dp)([0-9]+):)?([0-9]+)-([0-9]+)")
"""A link's name, matched whole, in ASCII digits (a regex's digit class takes others too)."""

_TIED = re.compile(r"tied:0-[1-9][0-9]*")
"""The tied route's name as `tied_link` writes it for every replica, matched whole."""


class LinkKind(StrEnum):
    PP = "pp"
    """Between neighbouring stages of one replica: activations down, gradients up."""
    DP = "dp"
    """Between two replicas of one stage on its gradient all-reduce ring."""


class Direction(StrEnum):
    """Which way a link's messages go (its text is a timeline's and a CSV's `direction`)."""

    FORWARD = "forward"
    """PP: activations, from the upstream stage; DP: from the link's lower replica."""
    BACKWARD = "backward"
    """PP: gradients, from the downstream stage; DP: from the higher replica (the message
    that closes the ring)."""

    @classmethod
    def between(cls, sender: int, receiver: int) -> Direction:
        """The direction from stage (or replica) `sender` to its neighbour `receiver`."""
        return cls.FORWARD if receiver > sender else cls.BACKWARD


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class Link:
    kind: LinkKind
    group: int | None
    """PP: the replica (None: the short form, every replica); DP: the stage."""
    first: int
    """PP: the upstream stage; DP: the lower replica."""
    second: int

    def __post_init__(self) -> None:
        if self.first < 0 or self.second <= self.first:
            raise ConfigError(f"link {self.first}-{self.second}: write the lower end first")
        if self.kind is LinkKind.PP and self.second != self.first + 1:
            raise ConfigError(f"PP link {self.first}-{self.second} must join neighbouring stages")
        if self.kind is LinkKind.DP and self.group is None:
            raise ConfigError("a DP link names its stage: dp<stage>:a-b")

    @classmethod
    def pp(cls, stage: int, replica: int | None = None) -> Link:
        """PP link `stage`-(`stage`+1), of one replica or (None) of every replica."""
        return cls(LinkKind.PP, replica, stage, stage + 1)

    @classmethod
    def dp(cls, stage: int, replica_a: int, replica_b: int | None = None) -> Link:
        """The DP ring link of `stage` between `replica_a` and `replica_b` (default a+1)."""
        b = replica_a + 1 if replica_b is None else replica_b
        return cls(LinkKind.DP, stage, min(replica_a, b), max(replica_a, b))

    @classmethod
    def parse(cls, text: str) -> Link:
        match = _LINK.fullmatch(str(text).strip())
        if match is None:
            raise ConfigError(
                f"{text!r} is not a link: 'i-(i+1)' (PP, every replica), 'pp<replica>:i-(i+1)' "
                "or 'dp<stage>:a-b'"
            )
        prefix, group, first, second = match.groups()
        kind = LinkKind(prefix) if prefix else LinkKind.PP
        try:  # (thousands of digits were past Python's limit on reading a number)
            lower, upper = whole_number(first), whole_number(second)
            replica_or_stage = None if group is None else whole_number(group)
        except ConfigError as err:
            raise ConfigError(f"link {str(text)[:40]!r}...: {err}") from None
        return cls(kind, replica_or_stage, lower, upper)

    @classmethod
    def from_spec(cls, value: Any, num_stages: int) -> Link:
        """A spec's link: a name, a PP link index (its upstream stage, >= 0), or the sugar
        `first` / `last` (PP; a pipeline of one stage has neither)."""
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 0:
                raise ConfigError(
                    f"link {value}: a PP link's index is its upstream stage (0 is link 0-1), "
                    "never negative"
                )
            return cls.pp(value)
        if value in ("first", "last"):
            if num_stages < 2:
                raise ConfigError(f"link {value}: a pipeline of {num_stages} stage has no PP link")
            return cls.pp(0 if value == "first" else num_stages - 2)
        return cls.parse(value)

    def __str__(self) -> str:
        if self.kind is LinkKind.PP and self.group is None:
            return f"{self.first}-{self.second}"
        return f"{self.kind.value}{self.group}:{self.first}-{self.second}"

    @property
    def is_pp(self) -> bool:
        return self.kind is LinkKind.PP

    def in_replica(self, replica: int) -> Link:
        """The concrete link: a PP link named for every replica ("0-1") as `replica`'s; a DP
        link (and a PP link of one replica) as it is."""
        return Link.pp(self.first, replica) if self.is_pp and self.group is None else self

    def sender(self, direction: Direction) -> Position:
        """The position sending its messages in `direction`: forward from the upstream stage
        (PP) or the lower replica (DP), backward from the other end."""
        if direction == Direction.FORWARD:
            end = self.first
        elif direction == Direction.BACKWARD:
            end = self.second
        else:  # not read as the other end
            raise ConfigError(f"a direction is forward or backward, not {direction!r}")
        if self.kind is LinkKind.PP:
            return Position(end, self.group or 0)
        assert self.group is not None
        return Position(self.group, end)

    def receiver(self, direction: Direction) -> Position:
        """The position receiving its messages in `direction`: the other end's."""
        other_way = {Direction.FORWARD: Direction.BACKWARD, Direction.BACKWARD: Direction.FORWARD}
        return self.sender(other_way.get(direction, direction))  # (sender refuses a bad one)

    @property
    def dp_stage(self) -> int:
        """The stage whose replicas a DP link joins."""
        if self.kind is not LinkKind.DP or self.group is None:
            raise ConfigError(f"{self} is not a DP link")
        return self.group


def link_name(stage: int) -> str:
    """PP link `stage`-(`stage`+1) as text, every replica ("2-3")."""
    return str(Link.pp(stage))


def tied_link(num_stages: int, replica: int | None = None) -> str:
    """The name of the route between the first and the last stage of a replica, over which
    they sum their tied weight's gradients (megatron's embedding group): "tied:0-3" at S=4
    (as the runtime and its records name it, their replica field saying whose), "tied1:0-3"
    replica 1's (a trace's track). Its "forward" direction goes from the first stage to the
    last. Not a `Link` of the topology: no fault targets it by name, but it crosses the NICs
    of both stages' hosts."""
    if num_stages < 2:
        raise ConfigError(f"a pipeline of {num_stages} stage has no tied route")
    return f"tied{'' if replica is None else replica}:0-{num_stages - 1}"


def is_dp_link(text: str) -> bool:
    """Whether `text`, a link's name as `Link` prints it, names a DP ring link ("dp1:0-1"):
    without parsing it, for loops over many messages' rows."""
    return text.startswith(LinkKind.DP.value)


def is_tied_link(text: str, num_stages: int | None = None) -> bool:
    """Whether `text` is the tied route's name as the runtime writes it (`tied_link`, every
    replica: "tied:0-3"), of a pipeline of `num_stages` (None: of any)."""
    if num_stages is None:
        return _TIED.fullmatch(text) is not None
    return num_stages >= 2 and text == tied_link(num_stages)


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class Position:
    stage: int
    replica: int = 0

    def __str__(self) -> str:
        return f"stage {self.stage}" + (f" replica {self.replica}" if self.replica else "")


@dataclasses.dataclass(frozen=True, slots=True)
class Topology:
    num_stages: int
    num_replicas: int = 1
    placement: tuple[int, ...] = ()
    """The worker playing each position, by position index (empty: worker i plays i)."""
    workers_per_host: int = 1
    nics: tuple[str, ...] = DEFAULT_NICS

    def __post_init__(self) -> None:
        if self.num_stages < 1 or self.num_replicas < 1 or self.workers_per_host < 1:
            raise ConfigError("a topology needs >= 1 stage, replica and worker per host")
        if self.placement and sorted(self.placement) != list(range(self.num_positions)):
            raise ConfigError(
                f"a placement gives each of the {self.num_positions} positions its own worker, "
                f"got {list(self.placement)}"
            )
        if not self.nics:
            raise ConfigError("a host needs at least one NIC")

    @property
    def num_positions(self) -> int:
        return self.num_stages * self.num_replicas

    @property
    def num_workers(self) -> int:
        return self.num_positions

    @property
    def num_hosts(self) -> int:
        return -(-self.num_workers // self.workers_per_host)

    @property
    def workers(self) -> tuple[int, ...]:
        """The worker playing each position, by position index."""
        return self.placement or tuple(range(self.num_positions))

    def index(self, position: Position) -> int:
        """The position's index (and, under the default placement, its worker)."""
        self.check_position(position)
        return position.replica * self.num_stages + position.stage

    def position(self, index: int) -> Position:
        if not 0 <= index < self.num_positions:
            raise ConfigError(f"position index {index} is out of range 0..{self.num_positions - 1}")
        return Position(index % self.num_stages, index // self.num_stages)

    def worker(self, position: Position) -> int:
        index = self.index(position)
        return self.placement[index] if self.placement else index

    def position_of_worker(self, worker: int) -> Position:
        index = self.placement.index(worker) if self.placement else worker
        return self.position(index)

    def host_of_worker(self, worker: int) -> int:
        return worker // self.workers_per_host

    def host(self, position: Position) -> int:
        return self.host_of_worker(self.worker(position))

    def check_position(self, position: Position) -> None:
        stage, replica = position.stage, position.replica
        if not (0 <= stage < self.num_stages and 0 <= replica < self.num_replicas):
            raise ConfigError(f"{position} does not exist: {self._size('x')}")

    def _size(self, joined_by: str) -> str:
        """The grid's size in words: "4 stages and 1 replica"."""
        stages = f"{self.num_stages} stage{'s' if self.num_stages != 1 else ''}"
        replicas = f"{self.num_replicas} replica{'s' if self.num_replicas != 1 else ''}"
        return f"{stages} {joined_by} {replicas}"

    def check(self, link: Link) -> Link:
        """`link` itself, once it exists here; else a ConfigError saying what does."""
        if link.is_pp:
            ok = link.second < self.num_stages and (
                link.group is None or link.group < self.num_replicas
            )
        else:
            last = self.num_replicas - 1
            ok = link.dp_stage < self.num_stages and (
                link.second == link.first + 1 <= last or (link.first, link.second) == (0, last)
            )
        if not ok:
            raise ConfigError(
                f"link {link} does not exist with {self._size('and')} "
                f"(PP links i-(i+1) < {self.num_stages}, "
                "DP ring links dp<stage>:a-(a+1) and dp<stage>:0-(D-1))"
            )
        return link

    def expand(self, link: Link) -> tuple[Link, ...]:
        """The concrete links a name stands for: "2-3" is "pp<r>:2-3" of every replica."""
        self.check(link)
        if link.is_pp and link.group is None:
            return tuple(Link.pp(link.first, r) for r in range(self.num_replicas))
        return (link,)

    def ends(self, link: Link) -> tuple[Position, Position]:
        """The two positions a concrete link joins, lower end first."""
        self.check(link)
        if link.is_pp:
            replica = 0 if link.group is None else link.group
            return Position(link.first, replica), Position(link.second, replica)
        return Position(link.dp_stage, link.first), Position(link.dp_stage, link.second)

    def hosts_of(self, link: Link) -> tuple[int, int]:
        """The hosts a concrete link runs between under this placement, lower end first."""
        a, b = self.ends(link)
        return self.host(a), self.host(b)

    def dp_ring(self, stage: int) -> tuple[Link, ...]:
        """The ring of `stage`'s replicas: r -> r+1, closing with (D-1) -> 0 (one link for D=2)."""
        num = self.num_replicas
        if num == 1:
            return ()
        ring = [Link.dp(stage, r) for r in range(num - 1)]
        return tuple(ring + ([Link.dp(stage, 0, num - 1)] if num > 2 else []))

    def dp_pair_onto_pp(self, link: Link) -> Topology:
        """A placement where the two hosts of DP ring link `link` (under this placement) are
        PP neighbours instead (Falcon's topology change; the paper's first step for a slow DP
        link): the upper replica's worker of the stage swaps with the lower replica's worker
        of the next stage (the previous one for the last stage), so the pair carries that PP
        link of the lower replica, and the stage's ring no longer crosses it."""
        self.check(link)
        if link.is_pp or self.num_stages < 2:
            raise ConfigError(f"{link} is not a DP ring link between two stages' worth of hosts")
        stage = link.dp_stage
        neighbour = stage + 1 if stage + 1 < self.num_stages else stage - 1
        return self.swapped(Position(stage, link.second), Position(neighbour, link.first))

    def swapped(self, a: Position, b: Position) -> Topology:
        """The same hosts with the workers of positions `a` and `b` exchanged."""
        workers = list(self.workers)
        i, j = self.index(a), self.index(b)
        workers[i], workers[j] = workers[j], workers[i]
        return dataclasses.replace(self, placement=tuple(workers))
