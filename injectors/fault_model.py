"""The fault model: events on the physical things faults hit (host pairs, NICs), what is in
force at each iteration, and what that does to each message (a pipeline.faults.FaultView).

- A target is logical links ("2-3" in every replica, "pp1:2-3", "dp0:0-1"), a host pair, or
  one host's NIC. Links are resolved to the host pairs they run on under the default
  placement: a fault stays on its hosts when a rank swap moves a logical link elsewhere.
- Effects: a fixed delay (+ uniform jitter), a normal delay redrawn every U[lo, hi] ms, a
  bandwidth cap, a one-off stall, or down (a failure). An event is in force from
  `start_iteration` (at `at_ms` into it) until `end_iteration` (exclusive) or until a later
  event of the same kind on the same host pair or NIC replaces it (a delay of 0 ends one),
  from that event's own `at_ms`.
  Effects of different kinds on one target add up.
- Per message: its hosts and route pick the effects. A route is over one NIC index at both
  ends (every message uses the first, `rnic0`, until a failover moves its link direction:
  pipeline.faults.route_over); a host pair's effects are on the first NIC's plane only (as
  on the testbed), a NIC's on the routes through it. A cap replaces the link's own rate
  where slower (pipeline.link_rates: the lower of the two holds, as on the testbed). Jitter,
  caps and stalls are pure functions of (seed, link, direction, iteration, kind, microbatch), so
  every engine assigns a message the same `fault_ms`; redrawn distributions follow each
  engine's clock (the offset into the iteration) and agree in distribution only.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
import random
from collections.abc import Hashable, Iterable, Iterator, Mapping
from enum import StrEnum
from typing import NamedTuple

from pipeline.errors import ConfigError
from pipeline.faults import MessageFault
from pipeline.link_rates import NO_RATES, LinkRates
from pipeline.topology import Direction, Link, Position, Topology

__all__ = ["Effect", "FaultEvent", "FaultModel", "Held", "InForce", "Target", "TargetKind"]


class TargetKind(StrEnum):
    LINKS = "links"
    HOSTS = "hosts"
    NIC = "nic"


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    kind: TargetKind
    links: tuple[Link, ...] = ()
    hosts: tuple[int, int] = (0, 0)
    """A host pair (HOSTS), lower first; NIC: (host, 0), host -1 meaning the paper's choice:
    the host of stage floor(S/2), replica 0."""
    nic: str = ""

    def __str__(self) -> str:
        if self.kind is TargetKind.LINKS:
            return ",".join(str(link) for link in self.links)
        if self.kind is TargetKind.HOSTS:
            return f"hosts {self.hosts[0]}-{self.hosts[1]}"
        host = "mid" if self.hosts[0] < 0 else str(self.hosts[0])
        return f"host{host}:{self.nic}"

    @functools.lru_cache(maxsize=1024)  # noqa: B019 (targets and topologies are few, frozen)
    def units(self, topology: Topology) -> tuple[tuple[str, int, int | str], ...]:
        """What it hits: ("pair", a, b) host pairs (a < b) or ("nic", host, name); logical
        links and the paper's NIC are placed as by the default placement (a fault stays on
        its hosts when ranks move)."""
        default = _default_placement(topology)
        if self.kind is TargetKind.NIC:
            host = self.hosts[0]
            if host < 0:
                host = default.host(Position(topology.num_stages // 2, 0))
            if not 0 <= host < topology.num_hosts or self.nic not in topology.nics:
                raise ConfigError(
                    f"NIC {self} does not exist: hosts 0..{topology.num_hosts - 1} with "
                    f"{', '.join(topology.nics)}"
                )
            return (("nic", host, self.nic),)
        if self.kind is TargetKind.HOSTS:
            a, b = self.hosts
            if not (0 <= a < b < topology.num_hosts):
                raise ConfigError(
                    f"host pair {a}-{b} does not exist: hosts 0..{topology.num_hosts - 1}"
                )
            return (("pair", a, b),)
        pairs = []
        for link in self.links:
            for concrete in default.expand(link):
                a, b = sorted(default.hosts_of(concrete))
                pairs.append(("pair", a, b))
        return tuple(dict.fromkeys(pairs))


@dataclasses.dataclass(frozen=True, slots=True)
class Effect:
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    """Uniform in [-jitter, +jitter] around `delay_ms`, clipped at 0."""
    normal_ms: tuple[float, float] | None = None
    """(mean, std) of a delay redrawn every U[`redraw_every_ms`] ms, clipped at 0."""
    redraw_every_ms: tuple[float, float] = (0.0, 0.0)
    bandwidth_gbps: float | None = None
    """A cap, Gbit/s: it replaces the link's own rate (the profile's) where slower, so a
    message takes bytes/cap - bytes/rate longer, and the lowest cap on a message's route
    holds (pipeline.link_rates)."""
    stall_ms: float = 0.0
    """The first message on each direction of the target at or after the start waits this
    long: the direction is held (a one-off, in the start iteration)."""
    down: bool = False

    @property
    def kind(self) -> str:
        """Events of one kind on one target replace each other."""
        if self.down:
            return "down"
        if self.bandwidth_gbps is not None:
            return "bandwidth"
        if self.stall_ms:
            return "stall"
        return "delay"


@dataclasses.dataclass(frozen=True, slots=True)
class FaultEvent:
    start_iteration: int
    target: Target
    effect: Effect
    at_ms: float = 0.0
    end_iteration: int | None = None
    row: int = 0
    """Its row in the file it came from (for errors)."""
    line: int = 0
    """The line of that file its row is on (for errors; 0: none, as for a timeline built in
    code)."""


_Unit = tuple[str, int, int | str]
_HEALTHY = MessageFault()
_FAILED = MessageFault(failed=True)


def _unit_name(unit: _Unit) -> str:
    """A unit as a fault row names it: "hosts 1-2" (a host pair), "host1:rnic0" (a NIC)."""
    kind, first, second = unit
    return f"hosts {first}-{second}" if kind == "pair" else f"host{first}:{second}"


@dataclasses.dataclass(frozen=True, slots=True)
class Held:
    """An effect in force on a unit during (part of) one iteration: from `from_ms` into it
    until `until_ms` (inf: its end)."""

    effect: Effect
    from_ms: float = 0.0
    until_ms: float = math.inf

    def holds_at(self, offset_ms: float) -> bool:
        return self.from_ms <= offset_ms < self.until_ms


class _Span(NamedTuple):
    """An event in force during (part of) an iteration (`FaultModel._in_force`)."""

    event: FaultEvent
    from_ms: float
    until_ms: float = math.inf


@dataclasses.dataclass(slots=True)
class InForce:
    """The effects in force during one iteration under one topology (a
    pipeline.faults.IterationFaults). Picklable; each worker gets its own copy and keeps
    the state its own sends need (which stall it has paid)."""

    iteration: int
    topology: Topology
    effects: dict[_Unit, tuple[Held, ...]]
    """Per unit, its effects and when in this iteration each holds."""
    seed: int
    rates: LinkRates = NO_RATES
    """The links' own rates, which a cap replaces where slower (pipeline.link_rates)."""
    _stalled: set[tuple[_Unit, str, Position, float]] = dataclasses.field(default_factory=set)
    """The senders (and their units and directions) that paid a stall, with the offset it
    started at (a later stall row in the iteration is a stall of its own): one per worker."""
    _routes: dict[tuple[Link, int], list[tuple[_Unit, tuple[Held, ...]]]] = dataclasses.field(
        default_factory=dict
    )
    """Per link and NIC, the units on its route (both ways the same) with effects (looked up
    once)."""
    _redraws: dict[tuple[_Unit, Effect], _Redraws] = dataclasses.field(default_factory=dict)
    """Per unit and redrawn normal delay, its values this iteration, drawn as far as asked."""

    def cache_key(self) -> Hashable | None:
        """The topology and the effects, unless one draws per message, follows the clock or
        keeps state (jitter, a redrawn normal delay, a stall)."""
        drawn = any(
            held.effect.jitter_ms or held.effect.normal_ms is not None or held.effect.stall_ms
            for effects in self.effects.values()
            for held in effects
        )
        effects = tuple(sorted(self.effects.items()))
        return None if drawn else (self.topology, effects, self.rates)

    def affects(self, link: Link) -> bool:
        return any(self._route(link, nic) for nic in range(len(self.topology.nics)))

    def route_failed(self, link: Link, nic: int, offset_ms: float = 0.0) -> bool:
        route = self._route(link, nic)
        return any(h.effect.down and h.holds_at(offset_ms) for _, effects in route for h in effects)

    def _route(self, link: Link, nic: int) -> list[tuple[_Unit, tuple[Held, ...]]]:
        route = self._routes.get((link, nic))
        if route is None:
            units = _route_of(self.topology, link, nic)
            route = [(unit, self.effects[unit]) for unit in units if unit in self.effects]
            self._routes[link, nic] = route
        return route

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
        if not self.effects:
            return _HEALTHY
        if self.route_failed(link, nic, offset_ms):
            return _FAILED  # (before any stall is paid: a failed route changes no state)
        route = self._route(link, nic)
        delay_ms, cap_gbit_s = 0.0, math.inf
        for unit, effects in route:
            for held in effects:
                if not held.holds_at(offset_ms):
                    continue
                effect = held.effect
                delay_ms += self._delay_ms(held, unit, link, direction, kind, microbatch)
                if effect.bandwidth_gbps is not None:  # the route's lowest cap holds
                    cap_gbit_s = min(cap_gbit_s, effect.bandwidth_gbps)
                if effect.normal_ms is not None:
                    delay_ms += self._redrawn(effect, unit).at(offset_ms)
        if cap_gbit_s == math.inf:
            return MessageFault(delay_ms)
        cap_ms = self.rates.cap_ms(link, num_bytes, cap_gbit_s)
        return MessageFault(delay_ms + cap_ms, cap_ms=cap_ms)

    def _redrawn(self, effect: Effect, unit: _Unit) -> _Redraws:
        redraws = self._redraws.get((unit, effect))
        if redraws is None:
            redraws = _Redraws.start(effect, self.seed, unit, self.iteration)
            self._redraws[unit, effect] = redraws
        return redraws

    def _delay_ms(
        self, held: Held, unit: _Unit, link: Link, direction: Direction, kind: str, m: int
    ) -> float:
        effect = held.effect
        if effect.stall_ms:  # each stall row once per sender, from its start
            sender = (unit, direction, link.sender(direction), held.from_ms)
            if sender not in self._stalled:
                self._stalled.add(sender)
                return effect.stall_ms
        if not effect.jitter_ms:
            return effect.delay_ms
        draw = random.Random(f"{self.seed}:{link}:{direction}:{self.iteration}:{kind}:{m}")
        return max(0.0, effect.delay_ms + effect.jitter_ms * draw.uniform(-1.0, 1.0))


_REDRAW_BLOCK_INTERVALS = 1024
"""A redrawn delay's values are drawn in blocks of this many longest intervals, each from its
own seed: a message late in a long iteration draws its own block, not every value before it."""
_REDRAW_BLOCKS_KEPT = 4


@dataclasses.dataclass(slots=True)
class _Redraws:
    """A redrawn normal delay on one unit in one iteration: values held for seeded U[lo, hi]
    ms intervals. The iteration is cut into blocks of `_REDRAW_BLOCK_INTERVALS` longest
    intervals; each block's values run from its start, from its own seed, as far into it as
    asked (an interval that crosses a block's end ends there). A message asks its block only
    (kept for a later message: the last few blocks), so memory and time stay bounded however
    far into an iteration it is sent."""

    effect: Effect
    seed: str
    block_ms: float
    blocks: dict[int, _RedrawBlock] = dataclasses.field(default_factory=dict)

    @classmethod
    def start(cls, effect: Effect, seed: int, unit: _Unit, iteration: int) -> _Redraws:
        block_ms = _REDRAW_BLOCK_INTERVALS * effect.redraw_every_ms[1]
        return cls(effect, f"{seed}:{unit}:{iteration}:redraw", block_ms)

    def at(self, offset_ms: float) -> float:
        """The delay in force `offset_ms` into the iteration (clipped at 0)."""
        index = int(max(0.0, offset_ms) // self.block_ms)
        block = self.blocks.pop(index, None)
        if block is None:
            # block 0 keeps the iteration's seed: within its span the values are those of
            # one unbroken draw
            seed = self.seed if index == 0 else f"{self.seed}:{index}"
            block = _RedrawBlock.start(self.effect, random.Random(seed), index * self.block_ms)
            if len(self.blocks) >= _REDRAW_BLOCKS_KEPT:
                del self.blocks[next(iter(self.blocks))]  # the least recently asked
        self.blocks[index] = block
        return block.at(self.effect, offset_ms)


@dataclasses.dataclass(slots=True)
class _RedrawBlock:
    rng: random.Random
    ends_ms: list[float]
    """Where each value's interval ends (ms into the iteration), increasing."""
    values_ms: list[float]

    @classmethod
    def start(cls, effect: Effect, rng: random.Random, start_ms: float) -> _RedrawBlock:
        assert effect.normal_ms is not None
        first_end_ms = start_ms + rng.uniform(*effect.redraw_every_ms)
        return cls(rng, [first_end_ms], [rng.gauss(*effect.normal_ms)])

    def at(self, effect: Effect, offset_ms: float) -> float:
        assert effect.normal_ms is not None
        lo, hi = effect.redraw_every_ms
        while self.ends_ms[-1] <= offset_ms:
            self.ends_ms.append(self.ends_ms[-1] + max(self.rng.uniform(lo, hi), 1e-3))
            self.values_ms.append(self.rng.gauss(*effect.normal_ms))
        return max(0.0, self.values_ms[bisect.bisect_right(self.ends_ms, offset_ms)])


def _default_placement(topology: Topology) -> Topology:
    """`topology`'s stages, replicas and NICs under the default placement (one host per
    position): where a fault's target lies, whatever rank swaps did since."""
    return Topology(topology.num_stages, topology.num_replicas, nics=topology.nics)


def _units_between(topology: Topology, ends: tuple[Position, Position]) -> set[_Unit]:
    """What a message between two positions may meet, over any NIC (`_route_of`'s units for
    every NIC index)."""
    a, b = sorted(topology.host(end) for end in ends)
    return {("pair", a, b), *(("nic", host, name) for host in (a, b) for name in topology.nics)}


def _largest_message(
    unit: _Unit,
    message_bytes: int,
    topology: Topology,
    route_bytes: Mapping[tuple[Position, Position], int] | None,
) -> int:
    """The largest message that crosses `unit` (`FaultModel.longest_hold_ms`)."""
    if not route_bytes:
        return message_bytes
    default = _default_placement(topology)
    crossing = (n for ends, n in route_bytes.items() if unit in _units_between(default, ends))
    return max((message_bytes, *crossing))


def _routes(topology: Topology, units: Iterable[_Unit]) -> Iterator[tuple[_Unit, ...]]:
    """Every route (`_route_of`: a host pair's first-NIC route or its two hosts' NICs of
    another index) that meets one of `units` at least, between any two hosts: a rank swap
    may put a message on any host pair."""
    hosts: set[int] = set()
    for kind, host, other in units:
        hosts.update((host, other) if kind == "pair" and isinstance(other, int) else (host,))
    spare = next((h for h in range(topology.num_hosts) if h not in hosts), None)
    ends = sorted(hosts) + ([] if spare is None else [spare])  # any other host meets nothing
    for i, a in enumerate(ends):
        for b in ends[i + 1 :]:
            lo, hi = min(a, b), max(a, b)
            for index, name in enumerate(topology.nics):
                nics: tuple[_Unit, ...] = (("nic", lo, name), ("nic", hi, name))
                yield (("pair", lo, hi), *nics) if index == 0 else nics


def _route_of(topology: Topology, link: Link, nic: int = 0) -> tuple[_Unit, ...]:
    """What a message on `link` over data-plane NIC `nic` (by index) meets: its hosts' NICs
    of that index and, over the first NIC, its host pair (a host pair's faults are on the
    first NIC's plane, as on the testbed: a failover to another NIC leaves them)."""
    a, b = sorted(topology.hosts_of(link))
    name = topology.nics[nic]
    nics: tuple[_Unit, ...] = (("nic", a, name), ("nic", b, name))
    return (("pair", a, b), *nics) if nic == 0 else nics


def _planned_delay_ms(in_force: dict[_Unit, list[_Span]], topology: Topology, link: Link) -> float:
    """The fixed (or mean) delay on `link` at the end of the iteration: on its route (caps,
    stalls and failures left out)."""
    total = 0.0
    for unit in _route_of(topology, link):
        for span in in_force.get(unit, []):
            effect = span.event.effect
            if span.until_ms == math.inf and effect.kind == "delay":
                total += effect.normal_ms[0] if effect.normal_ms else effect.delay_ms
    return total


def _holds_in(event: FaultEvent, iteration: int) -> bool:
    """Whether `iteration` is before the event's end (a stall: its first iteration only)."""
    ended = event.end_iteration is not None and iteration >= event.end_iteration
    return not ended and not (event.effect.stall_ms and iteration != event.start_iteration)


def _by(event: FaultEvent, iteration: int, at_ms: float) -> bool:
    """Whether `event` had started by `at_ms` into `iteration`."""
    return event.start_iteration < iteration or (
        event.start_iteration == iteration and event.at_ms <= at_ms
    )


@dataclasses.dataclass(frozen=True, slots=True)
class FaultModel:
    """A run's fault events (a pipeline.faults.FaultView); iterations count from the first
    measured one. Its delays add to the profile's `delay_ms`."""

    events: tuple[FaultEvent, ...]
    seed: int = 0
    source: str = dataclasses.field(default="", compare=False)
    """The file it was read from, if any (named in `validate`'s errors)."""
    _change_iterations: tuple[int, ...] = dataclasses.field(init=False, repr=False, compare=False)
    """Where what is in force may change (`_epoch`), in order."""
    _in_force_by_epoch: dict[tuple[int, Topology], dict[_Unit, list[_Span]]] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """`_in_force`'s answers, by (`_epoch`, topology): a pure function of those and the
    frozen `events`; read only (a run asks for the same few of them many times)."""

    def __post_init__(self) -> None:
        # An event that starts `at_ms` into an iteration holds from 0 in the next one.
        changes = {*self.change_iterations(), *(e.start_iteration + 1 for e in self.events)}
        object.__setattr__(self, "_change_iterations", tuple(sorted(changes)))

    def validate(self, topology: Topology, num_iterations: int) -> None:
        """Targets must exist and every event must start within the run."""
        for event in self.events:
            try:
                event.target.units(topology)
            except ConfigError as err:
                raise self.row_error(event, str(err)) from None
            if event.start_iteration >= num_iterations:
                raise self.row_error(
                    event,
                    f"starts at iteration {event.start_iteration} but the run has "
                    f"{num_iterations} iteration{'s' * (num_iterations != 1)} "
                    f"(0..{num_iterations - 1})",
                )

    def row_error(self, event: FaultEvent, why: str) -> ConfigError:
        """The error for `event`'s row, found after the file was read: it names the file, the
        row and its line, as an error found reading the file does."""
        where = f"fault timeline {self.source}: " if self.source else ""
        line = f" (line {event.line})" if event.line else ""
        return ConfigError(f"{where}fault row {event.row}: {why}{line}")

    def change_iterations(self) -> tuple[int, ...]:
        """The iterations in which what is in force changes, in order: each event's start and,
        where it ends by itself, its end (its `end_iteration`; a stall's, the next one)."""
        changes = {event.start_iteration for event in self.events}
        for event in self.events:
            if event.effect.stall_ms:
                changes.add(event.start_iteration + 1)
            elif event.end_iteration is not None:
                changes.add(event.end_iteration)
        return tuple(sorted(changes))

    def _epoch(self, iteration: int) -> int:
        """The index of the run of iterations `iteration` is in over which `_in_force` is the
        same: it changes only where an event starts (its `at_ms` there, 0 after), in the
        iteration after that (a stall's last), and where an event ends."""
        return bisect.bisect_right(self._change_iterations, iteration)

    def _in_force(self, iteration: int, topology: Topology) -> dict[_Unit, list[_Span]]:
        """`_spans_in_force`, computed once per `_epoch` and topology; not to be mutated."""
        key = (self._epoch(iteration), topology)
        spans = self._in_force_by_epoch.get(key)
        if spans is None:
            spans = self._in_force_by_epoch[key] = self._spans_in_force(iteration, topology)
        return spans

    def _spans_in_force(self, iteration: int, topology: Topology) -> dict[_Unit, list[_Span]]:
        """Per unit, the events in force during `iteration` and when in it: each holds from
        its start (0 where that was in an earlier iteration) until a later event of its kind
        replaces it, or one with no effect (a delay of 0) ends every event on its target, at
        that event's start (its `at_ms` where it starts in `iteration`); none holds past its
        `end_iteration`, and a stall holds in the iteration it starts in only."""
        current: dict[_Unit, dict[str, _Span]] = {}
        spans: dict[_Unit, list[_Span]] = {}
        for event in sorted(self.events, key=lambda e: (e.start_iteration, e.at_ms)):
            if event.start_iteration > iteration:
                break
            at_ms = event.at_ms if event.start_iteration == iteration else 0.0
            clears = event.effect == Effect()
            for unit in event.target.units(topology):
                kinds = current.setdefault(unit, {})
                for kind in list(kinds) if clears else [event.effect.kind]:
                    ended = kinds.pop(kind, None)
                    if ended is not None and at_ms > ended.from_ms:  # held for a while
                        spans.setdefault(unit, []).append(ended._replace(until_ms=at_ms))
                if not clears:
                    kinds[event.effect.kind] = _Span(event, at_ms)
        for unit, kinds in current.items():
            spans.setdefault(unit, []).extend(kinds.values())
        by_unit = {}
        for unit, unit_spans in spans.items():
            kept = [span for span in unit_spans if _holds_in(span.event, iteration)]
            if kept:
                by_unit[unit] = kept
        return by_unit

    def at(self, iteration: int, topology: Topology, *, rates: LinkRates) -> InForce:
        effects = {
            unit: tuple(Held(s.event.effect, s.from_ms, s.until_ms) for s in spans)
            for unit, spans in self._in_force(iteration, topology).items()
        }
        return InForce(iteration, topology, effects, self.seed, rates)

    def pp_delays_ms(self, iteration: int, topology: Topology) -> tuple[float, ...]:
        """The fixed (or mean) delay in force on each PP link, the most of any replica's:
        what an oracle plans for (`_planned_delay_ms`)."""
        return tuple(
            max(
                self.link_delay_ms(iteration, topology, Link.pp(stage, replica))
                for replica in range(topology.num_replicas)
            )
            for stage in range(topology.num_stages - 1)
        )

    def link_delay_ms(self, iteration: int, topology: Topology, link: Link) -> float:
        """The fixed (or mean) delay in force on one concrete link (a replica's PP link, or a
        DP ring link) at `iteration` (`_planned_delay_ms`)."""
        return _planned_delay_ms(self._in_force(iteration, topology), topology, link)

    def dp_delays_ms(self, iteration: int, topology: Topology) -> tuple[tuple[str, float], ...]:
        """The DP ring links with a delay in force, and that delay (`_planned_delay_ms`)."""
        in_force = self._in_force(iteration, topology)
        delays = (
            (link, _planned_delay_ms(in_force, topology, link))
            for stage in range(topology.num_stages)
            for link in topology.dp_ring(stage)
        )
        return tuple((str(link), ms) for link, ms in delays if ms)

    def replaced_rows(self, topology: Topology) -> list[tuple[FaultEvent, FaultEvent, str]]:
        """(earlier, later, where) events where the later replaces the earlier on units they
        share (`_spans_in_force`: one event of a kind per unit) in a way a reader may not
        mean: both start together (the earlier never applies there), or the later starts
        while the earlier holds and ends before the earlier's own end (the earlier does not
        come back there). A later one without an end, a change of level, is not named.
        `where`: "" where they share every unit of the earlier, else the shared units
        ("hosts 1-2", "host1:rnic0")."""
        ordered = sorted(self.events, key=lambda e: (e.start_iteration, e.at_ms))
        replaced = []
        for index, earlier in enumerate(ordered):
            units = set(earlier.target.units(topology))
            for later in ordered[index + 1 :]:
                if later.effect == Effect() or later.effect.kind != earlier.effect.kind:
                    continue
                together = (later.start_iteration, later.at_ms) == (
                    earlier.start_iteration,
                    earlier.at_ms,
                )
                # An earlier row without an end holds for ever (a stall: in its iteration
                # only), so a later one that ends is inside it too.
                earlier_end = math.inf if earlier.end_iteration is None else earlier.end_iteration
                if earlier.effect.stall_ms:
                    earlier_end = min(earlier_end, earlier.start_iteration + 1)
                inside = (
                    later.end_iteration is not None
                    and later.start_iteration < earlier_end
                    and later.end_iteration < earlier_end
                )
                shared = units & set(later.target.units(topology))
                if (together or inside) and shared:
                    where = "" if shared == units else ", ".join(map(_unit_name, sorted(shared)))
                    replaced.append((earlier, later, where))
        return replaced

    def longest_hold_ms(
        self,
        topology: Topology,
        message_bytes: int = 0,
        route_bytes: Mapping[tuple[Position, Position], int] | None = None,
    ) -> float:
        """The longest the events in force together (in one iteration) may hold one message.
        On each unit (a host pair, a NIC) per kind the longest (a fixed delay with its
        jitter, a redrawn normal delay's mean plus four standard deviations, a stall), as
        events of one kind on a unit replace each other, and the kinds added up; on a route
        (a host pair and its hosts' NICs of one index, `_route_of`) its units' holds added
        up, as they add on a message, and its longest cap once (the route's lowest cap holds:
        the bytes at the cap's rate, at most that where the link has a rate of its own,
        pipeline.link_rates); the longest route's, over every host pair. A cap holds the
        largest message that crosses its unit: `message_bytes` (a PP message, which a rank
        swap may put on any host pair), or a larger one of `route_bytes`, the largest message
        on a route between two positions of `topology` (a DP ring link's largest chunk, the
        tied weight's gradient), where that route crosses the unit under the default
        placement (a rank swap that moves a ring moves its chunks off it: not bounded)."""
        largest: dict[_Unit, int] = {}

        def hold_ms(unit: _Unit, effect: Effect) -> float:
            held_ms = effect.delay_ms + effect.jitter_ms + effect.stall_ms
            if effect.normal_ms is not None:
                held_ms += effect.normal_ms[0] + 4 * effect.normal_ms[1]
            if effect.bandwidth_gbps is not None:
                if unit not in largest:
                    largest[unit] = _largest_message(unit, message_bytes, topology, route_bytes)
                held_ms += largest[unit] * 8 / (effect.bandwidth_gbps * 1e6)
            return held_ms

        def route_ms(held: dict[_Unit, dict[str, float]], route: tuple[_Unit, ...]) -> float:
            kinds = [held.get(unit, {}) for unit in route]
            cap_ms = max((k.get("bandwidth", 0.0) for k in kinds), default=0.0)
            return cap_ms + sum(ms for k in kinds for kind, ms in k.items() if kind != "bandwidth")

        longest_ms = 0.0
        for iteration in self._change_iterations:  # each run of iterations with one in force
            held: dict[_Unit, dict[str, float]] = {}
            for unit, spans in self._in_force(iteration, topology).items():
                for span in spans:
                    effect = span.event.effect
                    if not effect.down:
                        kinds = held.setdefault(unit, {})
                        kinds[effect.kind] = max(kinds.get(effect.kind, 0.0), hold_ms(unit, effect))
            routes = _routes(topology, held)
            longest_ms = max((longest_ms, *(route_ms(held, route) for route in routes)))
        return longest_ms

    def longest_delay_ms(self) -> float:
        """The longest delay one event keeps on its messages while in force (a fixed delay
        with its jitter, a redrawn normal delay's mean plus four standard deviations; not a
        stall, which holds one message once)."""
        held = [0.0]
        for event in self.events:
            effect = event.effect
            if not effect.down:
                held.append(effect.delay_ms + effect.jitter_ms)
            if effect.normal_ms is not None:
                held.append(effect.normal_ms[0] + 4 * effect.normal_ms[1])
        return max(held)

    def has_failure(self, iteration: int, topology: Topology) -> bool:
        """A link or NIC is down for some part of `iteration`."""
        return any(
            span.event.effect.down
            for spans in self._in_force(iteration, topology).values()
            for span in spans
        )

    def repaired(
        self, iteration: int, *, stragglers: bool = False, at_ms: float = math.inf
    ) -> FaultModel:
        """The hardware a checkpoint-restart at `iteration` comes back on: after a failure
        `at_ms` into `iteration`, without the failures that had started by then (the failed
        hardware replaced; a later one in `iteration` still happens when it runs again);
        `stragglers` (a restart a controller asked for before `iteration` runs): without
        every event that started before it (slow hardware too), while those that start in
        `iteration` still happen when it runs."""
        if stragglers:
            kept = tuple(e for e in self.events if e.start_iteration >= iteration)
        else:
            kept = tuple(e for e in self.events if not (e.effect.down and _by(e, iteration, at_ms)))
        return dataclasses.replace(self, events=kept)
