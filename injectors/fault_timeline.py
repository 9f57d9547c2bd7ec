"""Fault timelines: which links are slow or failed at which iteration.

Two forms, one meaning (DESIGN.md): the paper's trace, rows `start_iteration;links;delay_s`
(links "i_j" joined by commas, a delay of 0 ends the event on those links, `inf` is a NIC
failure), and YAML, a list of `{start_iteration, links: ["0-1", ...], delay_ms}` with
`delay_ms: inf` for a failure. Iterations count from 0. Every error names its row.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from pipeline.errors import ConfigError
from pipeline.faults import MessageFault
from pipeline.topology import Link, link_name

__all__ = ["FaultEvent", "FaultTimeline", "parse_trace", "parse_yaml"]


@dataclasses.dataclass(frozen=True, slots=True)
class FaultEvent:
    start_iteration: int
    links: tuple[int, ...]
    """PP link indices (link i joins stage i and i+1); empty with a failure: a NIC failure."""
    delay_ms: float
    """0 ends the event on these links; math.inf is a failure."""


@dataclasses.dataclass(frozen=True, slots=True)
class _InForce:
    """The delays in force during one iteration, by PP link index (every replica)."""

    delay_ms_by_link: dict[int, float]

    def message_fault(self, link: Link, direction: str, kind: str, microbatch: int) -> MessageFault:
        return MessageFault(self.delay_ms_by_link.get(link.first, 0.0))


@dataclasses.dataclass(frozen=True, slots=True)
class FaultTimeline:
    """A pipeline.faults.FaultView: its delays add to the profile's."""

    events: tuple[FaultEvent, ...]

    def validate(self, num_stages: int, num_iterations: int) -> None:
        """Links must exist and every event must start within the run."""
        for row, event in enumerate(self.events, 1):
            for link in event.links:
                if not 0 <= link < num_stages - 1:
                    raise ConfigError(
                        f"fault row {row}: link {link_name(link)} does not exist "
                        f"with {num_stages} stages"
                    )
            if event.start_iteration >= num_iterations:
                raise ConfigError(
                    f"fault row {row}: starts at iteration {event.start_iteration}"
                    f" but the run has {num_iterations} iterations (0.."
                    f"{num_iterations - 1})"
                )

    def at(self, iteration: int) -> _InForce:
        """The latest event on each link wins."""
        delays: dict[int, float] = {}
        for event in sorted(self.events, key=lambda e: e.start_iteration):
            if event.start_iteration > iteration:
                break
            for link in event.links:
                delays[link] = event.delay_ms
        return _InForce({link: d for link, d in delays.items() if d})

    def pp_delays_ms(self, iteration: int, num_stages: int) -> tuple[float, ...]:
        in_force = self.at(iteration).delay_ms_by_link
        return tuple(in_force.get(i, 0.0) for i in range(num_stages - 1))

    def has_failure(self, iteration: int) -> bool:
        """A failure (any `inf` event) has started by `iteration`."""
        return any(e.delay_ms == math.inf and e.start_iteration <= iteration for e in self.events)


def _iteration(row: int, value: Any) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ConfigError(f"fault row {row}: start iteration {value!r} is not an integer") from None
    if number < 0:
        raise ConfigError(f"fault row {row}: start iteration must be >= 0, got {number}")
    return number


def _delay_ms(row: int, value: Any, scale: float) -> float:
    text = str(value).strip().lower()
    try:
        number = math.inf if text == "inf" else float(text) * scale
    except ValueError:
        raise ConfigError(f"fault row {row}: delay {value!r} is not a number or inf") from None
    if math.isnan(number) or number < 0:
        raise ConfigError(f"fault row {row}: delay must be >= 0 (or inf), got {value!r}")
    return number


def _links(row: int, names: Sequence[str], separator: str) -> tuple[int, ...]:
    """PP links written "i<separator>(i+1)" ("_" in the paper's trace, "-" in YAML)."""
    links = []
    for name in names:
        text = name.strip()
        try:
            if text.count(separator) != 1:
                raise ConfigError(f"separator {separator!r}")
            link = Link.parse(text.replace(separator, "-"))
            if not link.is_pp or link.group is not None:
                raise ConfigError("not a PP link of every replica")
        except ConfigError:
            raise ConfigError(
                f"fault row {row}: {name!r} is not a PP link between neighbouring "
                "stages (e.g. '2_3' in a trace, '2-3' in YAML)"
            ) from None
        links.append(link.first)
    return tuple(links)


def parse_trace(text: str) -> FaultTimeline:
    """The paper's trace: rows separated by newlines or spaces, fields by ';'."""
    events = []
    for row, line in enumerate(text.split(), 1):
        fields = line.split(";")
        if len(fields) != 3:
            raise ConfigError(
                f"fault row {row}: {line!r} needs 3 fields 'start_iteration;links;delay_s'"
            )
        names = [n for n in fields[1].split(",") if n.strip()]
        delay = _delay_ms(row, fields[2], 1000.0)
        if not names and delay != math.inf:
            raise ConfigError(f"fault row {row}: a delay needs at least one link")
        events.append(FaultEvent(_iteration(row, fields[0]), _links(row, names, "_"), delay))
    return FaultTimeline(tuple(events))


def parse_yaml(text: str) -> FaultTimeline:
    """A YAML list of {start_iteration, links, delay_ms}."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"fault timeline is not valid YAML: {err}") from err
    if not isinstance(data, list):
        raise ConfigError(
            "a YAML fault timeline is a list of {start_iteration, links, delay_ms} rows"
        )
    events = []
    for row, item in enumerate(data, 1):
        if not isinstance(item, dict) or set(item) - {"start_iteration", "links", "delay_ms"}:
            raise ConfigError(f"fault row {row}: expected keys start_iteration, links, delay_ms")
        names = item.get("links") or []
        if not isinstance(names, list):
            raise ConfigError(f"fault row {row}: links must be a list like ['0-1']")
        delay = _delay_ms(row, item.get("delay_ms"), 1.0)
        if not names and delay != math.inf:
            raise ConfigError(f"fault row {row}: a delay needs at least one link")
        events.append(
            FaultEvent(
                _iteration(row, item.get("start_iteration")),
                _links(row, [str(n) for n in names], "-"),
                delay,
            )
        )
    return FaultTimeline(tuple(events))
