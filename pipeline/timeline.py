"""The timeline: every op, every message and every iteration boundary of a run.

The same records come out of the simulator and the runtimes, so one metrics function, one
trace exporter and one Gantt chart serve them all.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, Generic, NamedTuple, TypeVar, get_type_hints

from pipeline.errors import ConfigError
from pipeline.ops import OpKind
from pipeline.topology import Direction, Link, is_tied_link

__all__ = [
    "SCHEMA_VERSION",
    "FailoverRecord",
    "IterationRecord",
    "MessageRecord",
    "OpRecord",
    "PerSource",
    "SwapRecord",
    "Timeline",
]

SCHEMA_VERSION = 7
"""7: `swaps` (rank swaps: who moved where, the state it moved, when). 6: `dp_messages` (the
DP all-reduce's ring messages). 5: `failovers` (the delegates' moves to another NIC). 4:
messages gained `wire_start_ms`, `copy_in_ms` and `carrier_pid` (the delegated path's
steps). 3: messages gained `fault_ms`, iterations `pids`. 2: messages gained `needed_ms`,
and the runtime's `arrival_ms` is the true arrival (in 1 it was when the consumer's wait
returned)."""


class OpRecord(NamedTuple):
    iteration: int
    stage: int
    kind: OpKind
    microbatch: int
    start_ms: float
    end_ms: float
    replica: int = 0
    """The DP replica whose copy of the stage ran it (0 without DP)."""


class MessageRecord(NamedTuple):
    """One message on a link, from its send to the op that takes it in.

    A timeline's `messages` are its PP links' (activations, gradients); its `dp_messages`
    the DP all-reduce's ring messages (pipeline.allreduce): `link` a DP link, `microbatch`
    the message's index among its link direction's, `replica` the sender's, `needed_ms`
    when the receiver had sent its own chunk of the step and waited for this one.

    - `send_start_ms`: the sending stage starts the send (a fault hook's delay is inside it);
      `send_end_ms`: the sending stage is free again.
    - `arrival_ms`: the whole message is at the receiving stage. The runtime's receiver thread
      stamps it as the receive completes (late by the stamp's resolution: receiver.py,
      BENCHMARKS.md); it can come a little before `send_end_ms`, as a sender is free again
      only after its data has gone.
    - `needed_ms`: the op that takes it in asked for it: its stage had finished everything
      before that op in its order (sends included). The op starts at max(arrival, needed)
      (delegated: at max(arrival + the receiver's copy in, needed), plus the simulator's
      device copy, `copy_gbps`), so the stage waited on the message
      max(0, arrival - needed) and the message waited on its consumer max(0, needed -
      arrival). Both times are read on the receiver's clock: their difference holds across
      hosts too.
    - `fault_ms`: the delay injected into it (the profile's `delay_ms` of its link plus what
      the fault model assigned it: pipeline.faults), the same in every engine; an emulated
      send lasts at least that long.
    """

    iteration: int
    link: str
    direction: Direction  # forward (activation) or backward (gradient)
    microbatch: int
    num_bytes: int
    send_start_ms: float
    send_end_ms: float
    arrival_ms: float
    needed_ms: float
    replica: int = 0
    fault_ms: float = 0.0
    wire_start_ms: float = 0.0
    """When the message went on the wire: the send's start (direct), when a delegate picked
    it up (delegated: between it and `arrival_ms` the message is on the wire, the link's
    delay included; before it, it waited for a free delegate)."""
    copy_in_ms: float = 0.0
    """Delegated: the copy into the consuming op's buffer, which the receiver makes as the
    message arrives (an op that asks for it later does not wait for it; the simulator's is
    the calibration's arrival-to-op cost, plus the profile's device copy, `copy_gbps`, which
    comes before the op); 0 direct."""
    carrier_pid: int = 0
    """The process that carried it: the sender (direct), a delegate (delegated); 0 from the
    simulator."""


class FailoverRecord(NamedTuple):
    """A sender delegate's move to another NIC (delegated runs, adaptra.transport): it noticed
    the NIC it used fail at `noticed_ms` (by `cause`: "link state", "notice", "timeout",
    "fault hook" or "sibling": pipeline.runtime.transport.Failover), and at `resumed_ms` its
    connection over `nic_to` had taken over, the messages from `resume_seq` on (of the link
    direction's seqs; -1: none) sent again. `iteration`: that of the last message it was
    given; a move between iterations is reported with the next one's records."""

    iteration: int
    link: str
    direction: Direction
    replica: int
    cause: str
    nic_from: str
    nic_to: str
    noticed_ms: float
    resumed_ms: float
    resume_seq: int
    carrier_pid: int


class SwapRecord(NamedTuple):
    """A worker's move in a rank swap (pipeline.topology): at the start of iteration
    `iteration` the process `pid` left position (`stage_from`, `replica_from`) for
    (`stage_to`, `replica_to`), from `start_ms` to `end_ms` building that stage,
    exchanging `num_bytes` of model state each way with the other movers (0: nothing to
    move: no model state, or the iteration starts from the initial state or a checkpoint)
    and, in the runtimes, setting the iteration up under the new position (receives, the
    DP ring's buffers, the backend's own). The iteration's ops start after it: its time is
    in the iteration's."""

    iteration: int
    pid: int
    stage_from: int
    replica_from: int
    stage_to: int
    replica_to: int
    num_bytes: int
    start_ms: float
    end_ms: float


class IterationRecord(NamedTuple):
    """t = `start_ms` is when stage 0 may start its first op; `end_ms` ends the step too."""

    iteration: int
    start_ms: float
    end_ms: float
    step_time_ms: float = 0.0
    pids: tuple[int, ...] = ()
    """The process that played each position (by position index, pipeline.topology) in
    the runtimes: a rank swap shows here; empty from the simulator."""


@dataclasses.dataclass(frozen=True, slots=True)
class Timeline:
    num_stages: int
    ops: tuple[OpRecord, ...]
    messages: tuple[MessageRecord, ...]
    iterations: tuple[IterationRecord, ...]
    failovers: tuple[FailoverRecord, ...] = ()
    dp_messages: tuple[MessageRecord, ...] = ()
    swaps: tuple[SwapRecord, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "num_stages": self.num_stages,
            "ops": [[*r[:2], r.kind.value, *r[3:]] for r in self.ops],
            "messages": [list(r) for r in self.messages],
            "iterations": [[*r[:4], list(r.pids)] for r in self.iterations],
            "failovers": [list(r) for r in self.failovers],
            "dp_messages": [list(r) for r in self.dp_messages],
            "swaps": [list(r) for r in self.swaps],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Timeline:
        """The timeline `to_dict` wrote; anything else (a damaged or edited file: a missing
        key, a row short of a field or with a field of the wrong type, an unknown op kind, a
        time not a finite number) is a ConfigError naming the field."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"a timeline must be a JSON object, got {type(data).__name__}")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ConfigError(
                f"timeline schema version {version!r} is not supported (expected {SCHEMA_VERSION})"
            )
        missing = [key for key in _REQUIRED_KEYS if key not in data]
        if missing:
            raise ConfigError(f"timeline is missing key(s) {', '.join(missing)}: damaged?")
        num_stages = data["num_stages"]
        if type(num_stages) is not int or num_stages < 1:
            raise ConfigError(f"timeline num_stages is {num_stages!r}, not a count >= 1: damaged?")
        rows = {name: data.get(name, []) for name in _RECORD_OF}
        for name, value in rows.items():
            _check_rows(name, value)
        for name in ("messages", "dp_messages", "failovers"):
            _check_links(name, rows[name], num_stages)
        return cls(
            num_stages=num_stages,
            ops=tuple(OpRecord(r[0], r[1], OpKind(r[2]), *r[3:]) for r in rows["ops"]),
            messages=tuple(map(MessageRecord._make, _directed(rows["messages"]))),
            iterations=tuple(
                IterationRecord._make([*r[:4], tuple(r[4])]) for r in rows["iterations"]
            ),
            failovers=tuple(map(FailoverRecord._make, _directed(rows["failovers"]))),
            dp_messages=tuple(map(MessageRecord._make, _directed(rows["dp_messages"]))),
            swaps=tuple(SwapRecord(*r) for r in rows["swaps"]),
        )

    @property
    def repeats(self) -> Timeline | None:
        """The one-iteration timeline this one is a moved copy of (`moved`), or None: its
        records are that one's, shifted in time, so what is computed from their times alone
        (per-link medians of arrival - wire start, say) is that one's too."""
        return None

    def moved(self, iteration: int, start_ms: float) -> Timeline:
        """This one-iteration timeline as iteration `iteration` starting at `start_ms` (its
        records are made when first read)."""
        return _Moved(self, iteration, start_ms)

    def one_iteration(self, iteration: int) -> Timeline:
        """Iteration `iteration` alone, its times counted from its own start."""
        bounds = next((r for r in self.iterations if r.iteration == iteration), None)
        if bounds is None:
            raise ValueError(f"timeline has no iteration {iteration}")
        t0 = bounds.start_ms

        def shifted(messages: tuple[MessageRecord, ...]) -> tuple[MessageRecord, ...]:
            return tuple(
                r._replace(
                    send_start_ms=r.send_start_ms - t0,
                    send_end_ms=r.send_end_ms - t0,
                    arrival_ms=r.arrival_ms - t0,
                    needed_ms=r.needed_ms - t0,
                    wire_start_ms=r.wire_start_ms - t0,
                )
                for r in messages
                if r.iteration == iteration
            )

        return Timeline(
            num_stages=self.num_stages,
            ops=tuple(
                r._replace(start_ms=r.start_ms - t0, end_ms=r.end_ms - t0)
                for r in self.ops
                if r.iteration == iteration
            ),
            messages=shifted(self.messages),
            iterations=(bounds._replace(start_ms=0.0, end_ms=bounds.end_ms - t0),),
            failovers=tuple(
                r._replace(noticed_ms=r.noticed_ms - t0, resumed_ms=r.resumed_ms - t0)
                for r in self.failovers
                if r.iteration == iteration
            ),
            dp_messages=shifted(self.dp_messages),
            swaps=tuple(
                r._replace(start_ms=r.start_ms - t0, end_ms=r.end_ms - t0)
                for r in self.swaps
                if r.iteration == iteration
            ),
        )

    @classmethod
    def concat(cls, parts: list[Timeline]) -> Timeline:
        """Join per-iteration timelines of one run into one."""
        if not parts:
            raise ValueError("cannot concatenate zero timelines")
        return cls(
            num_stages=parts[0].num_stages,
            ops=tuple(r for part in parts for r in part.ops),
            messages=tuple(r for part in parts for r in part.messages),
            iterations=tuple(r for part in parts for r in part.iterations),
            failovers=tuple(r for part in parts for r in part.failovers),
            dp_messages=tuple(r for part in parts for r in part.dp_messages),
            swaps=tuple(r for part in parts for r in part.swaps),
        )

    def split(self) -> list[Timeline]:
        """Each iteration alone, in the order of `iterations`, times as they are (`concat`
        undone), in one pass over the records."""
        index = {r.iteration: k for k, r in enumerate(self.iterations)}
        if len(index) != len(self.iterations):
            raise ValueError("timeline has an iteration twice: it cannot be split")
        fields = ("ops", "messages", "failovers", "dp_messages", "swaps")
        parts: list[dict[str, list[Any]]] = [{f: [] for f in fields} for _ in index]
        for name in fields:
            for record in getattr(self, name):
                if record.iteration not in index:
                    raise ValueError(f"a record of iteration {record.iteration}, which it lacks")
                parts[index[record.iteration]][name].append(record)
        return [
            Timeline(
                self.num_stages,
                iterations=(bounds,),
                **{name: tuple(records) for name, records in part.items()},
            )
            for bounds, part in zip(self.iterations, parts, strict=True)
        ]


_REQUIRED_KEYS = ("num_stages", "ops", "messages", "iterations")
"""The keys every timeline has (the others came in later schema versions; missing: none)."""

_RECORD_OF: dict[str, type[tuple[Any, ...]]] = {
    "ops": OpRecord,
    "messages": MessageRecord,
    "iterations": IterationRecord,
    "failovers": FailoverRecord,
    "dp_messages": MessageRecord,
    "swaps": SwapRecord,
}

_OP_KINDS = frozenset(kind.value for kind in OpKind)

_FIELD_CHECKS: dict[object, tuple[Callable[[Any], bool], str]] = {
    int: (lambda v: type(v) is int, "a whole number"),
    float: (lambda v: type(v) in (float, int) and math.isfinite(v), "a finite number"),
    str: (lambda v: type(v) is str, "a string"),
    Direction: (lambda v: isinstance(v, str), "a string"),  # which: `_check_links`
    OpKind: (lambda v: type(v) is str and v in _OP_KINDS, "an op kind F, B, W or BW"),
    tuple[int, ...]: (
        lambda v: type(v) is list and all(type(p) is int for p in v),
        "a list of pids",
    ),
}
"""By a record field's type: whether a JSON value is one of its (as `to_dict` writes it), and
what one is."""

_ROW_CHECKS = {
    name: tuple((field, *_FIELD_CHECKS[t]) for field, t in get_type_hints(record).items())
    for name, record in _RECORD_OF.items()
}
"""Each row's fields, in order, with `_FIELD_CHECKS`' check and wording for its type."""


def _check_rows(name: str, rows: Any) -> None:
    """`rows` is a list of rows of `name`'s record, each holding all its fields, in order and
    each of its type (`_FIELD_CHECKS`), as `to_dict` writes them."""
    checks = _ROW_CHECKS[name]
    if not isinstance(rows, list):
        raise ConfigError(f"timeline {name} must be a list of rows, got {type(rows).__name__}")
    for index, row in enumerate(rows):
        if not isinstance(row, list | tuple) or len(row) != len(checks):
            raise ConfigError(
                f"timeline {name}[{index}] must be a list of the {len(checks)} fields "
                f"{', '.join(field for field, _, _ in checks)}; got {row!r}"
            )
        if not all(check(value) for (_, check, _), value in zip(checks, row, strict=True)):
            field, what, value = next(
                (f, w, v) for (f, check, w), v in zip(checks, row, strict=True) if not check(v)
            )
            raise ConfigError(
                f"timeline {name}[{index}]: {field} is {value!r}, not {what}: damaged?"
            )


_DIRECTIONS = {direction.value: direction for direction in Direction}
"""A direction by its text (a dict: a long timeline's every message row reads one)."""


def _directed(rows: list[list[Any]]) -> list[list[Any]]:
    """`rows` (checked: `_check_links`), each third field, its direction's text, as the
    `Direction`."""
    return [[*row[:2], _DIRECTIONS[row[2]], *row[3:]] for row in rows]


def _check_links(name: str, rows: list[list[Any]], num_stages: int) -> None:
    """Each row's `link` (its second field) is a link's name, or for a failover also the
    tied route's of `num_stages` stages (a delegate on it fails over like any other:
    pipeline.topology's `tied_link`); its `direction` (its third) forward or backward (each
    name checked once: a run has few)."""
    for link in {row[1] for row in rows}:
        if name == "failovers" and is_tied_link(link, num_stages):
            continue
        try:
            Link.parse(link)
        except ConfigError as err:
            index = next(i for i, row in enumerate(rows) if row[1] == link)
            raise ConfigError(f"timeline {name}[{index}]: link {err}: damaged?") from err
    for direction in {row[2] for row in rows} - _DIRECTIONS.keys():
        index = next(i for i, row in enumerate(rows) if row[2] == direction)
        raise ConfigError(
            f"timeline {name}[{index}]: direction is {direction!r}, not forward or backward: "
            "damaged?"
        )


class _Moved(Timeline):
    """A one-iteration timeline moved to another iteration and start. Its op and message
    records are made when first read (ops, PP messages and DP messages each on their own): a
    long run repeats many iterations whose records nobody reads (their metrics and message
    rows are those of the iteration repeated)."""

    __slots__ = ("_dp", "_iteration", "_records", "_shift", "_source")
    _iteration: int
    _records: tuple[tuple[OpRecord, ...], tuple[MessageRecord, ...]] | None
    _dp: tuple[MessageRecord, ...] | None
    _shift: float
    _source: Timeline

    def __init__(self, source: Timeline, iteration: int, start_ms: float) -> None:
        (record,) = source.iterations
        shift = start_ms - record.start_ms
        moved = record._replace(
            iteration=iteration, start_ms=start_ms, end_ms=record.end_ms + shift
        )
        object.__setattr__(self, "num_stages", source.num_stages)
        object.__setattr__(self, "iterations", (moved,))
        object.__setattr__(
            self,
            "failovers",
            tuple(
                r._replace(
                    iteration=iteration,
                    noticed_ms=r.noticed_ms + shift,
                    resumed_ms=r.resumed_ms + shift,
                )
                for r in source.failovers
            ),
        )
        object.__setattr__(
            self,
            "swaps",
            tuple(
                r._replace(
                    iteration=iteration, start_ms=r.start_ms + shift, end_ms=r.end_ms + shift
                )
                for r in source.swaps
            ),
        )
        object.__setattr__(self, "_source", source)
        object.__setattr__(self, "_iteration", iteration)
        object.__setattr__(self, "_shift", shift)
        object.__setattr__(self, "_records", None)
        object.__setattr__(self, "_dp", None)

    @property
    def repeats(self) -> Timeline:
        return self._source

    def _moved_messages(self, messages: tuple[MessageRecord, ...]) -> tuple[MessageRecord, ...]:
        iteration, shift, new = self._iteration, self._shift, tuple.__new__
        return tuple(
            new(
                MessageRecord,
                (
                    *(iteration, li, d, m, n, a + shift, b + shift, c + shift, e + shift),
                    *(r, f, w + shift, i, p),
                ),
            )
            for _, li, d, m, n, a, b, c, e, r, f, w, i, p in messages
        )

    def _made(self) -> tuple[tuple[OpRecord, ...], tuple[MessageRecord, ...]]:
        if self._records is None:
            source, iteration, shift = self._source, self._iteration, self._shift
            new = tuple.__new__
            ops = tuple(
                new(OpRecord, (iteration, s, k, m, a + shift, b + shift, r))
                for _, s, k, m, a, b, r in source.ops
            )
            object.__setattr__(self, "_records", (ops, self._moved_messages(source.messages)))
        assert self._records is not None
        return self._records

    @property  # type: ignore[override]
    def ops(self) -> tuple[OpRecord, ...]:
        return self._made()[0]

    @property  # type: ignore[override]
    def messages(self) -> tuple[MessageRecord, ...]:
        return self._made()[1]

    @property  # type: ignore[override]
    def dp_messages(self) -> tuple[MessageRecord, ...]:
        if self._dp is None:
            object.__setattr__(self, "_dp", self._moved_messages(self._source.dp_messages))
        assert self._dp is not None
        return self._dp

    def _fields(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(Timeline))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Moved):
            other = Timeline(*other._fields())
        return Timeline(*self._fields()) == other

    def __hash__(self) -> int:
        return hash(Timeline(*self._fields()))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Timeline, self._fields())


_T = TypeVar("_T")


class PerSource(Generic[_T]):
    """`of(timeline)` for one-iteration timelines, computed once per timeline that moved
    copies repeat (`Timeline.repeats`: a simulator's repeated iterations), for what depends
    on the records' times alone, not on when they were; the last few kept."""

    def __init__(self, of: Callable[[Timeline], _T], keep: int = 8) -> None:
        self._of, self._keep = of, keep
        self._cache: dict[int, tuple[Timeline, _T]] = {}

    def __call__(self, timeline: Timeline) -> _T:
        source = timeline.repeats or timeline
        cached = self._cache.get(id(source))
        if cached is not None and cached[0] is source:
            return cached[1]
        value = self._of(source)
        if timeline.repeats is not None:  # it may come again
            if len(self._cache) >= self._keep:
                self._cache.pop(next(iter(self._cache)))
            self._cache[id(source)] = (source, value)
        return value
