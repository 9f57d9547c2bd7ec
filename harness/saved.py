"""What a run directory keeps of each configuration's timelines (docs/design.md, "Results"):
every measured iteration's messages per link direction in messages.csv, streamed as each
iteration ends, and the drawn iterations' whole timelines in timelines/, from which the
report draws its Gantt charts.

Only the drawn iterations' timelines stay in memory, so a configuration's memory is flat in
its number of iterations. Measured iterations are numbered as iterations.csv numbers them
(the first measured iteration is 0).
"""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import itertools
from collections.abc import Collection, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from harness.names import slug
from harness.resolved import ConfigurationKey
from harness.results import MESSAGES_COLUMNS, write_json_atomic
from pipeline.errors import ConfigError
from pipeline.files import atomic_writer, leftover_temporaries, parse_json_file
from pipeline.gantt import RingSpan
from pipeline.timeline import Timeline
from pipeline.topology import Link, is_dp_link

__all__ = [
    "MESSAGES_FILE",
    "TIMELINES_DIR",
    "ConfigurationKey",
    "ConfigurationRecorder",
    "SavedTimeline",
    "drawn_iterations",
    "drop_stale",
    "messages_writer",
    "read_ring_spans",
    "read_saved_timeline",
    "read_timeline",
    "timeline_name",
    "write_timeline",
]

MESSAGES_FILE = "messages.csv"
_MESSAGE_COLUMN = {name: k for k, name in enumerate(MESSAGES_COLUMNS)}
"""messages.csv's columns by name: their index in a row."""
TIMELINES_DIR = "timelines"


def timeline_name(key: ConfigurationKey) -> str:
    """The file under timelines/ of a configuration: its key slugged as harness.slurm names
    a configuration's folder, the repeat as r<repeat> (fig4_1f1b_0-1-40ms_r0.json)."""
    model, system, scenario, repeat = key
    return slug((model, system, scenario, f"r{repeat}"), "configuration name") + ".json"


def drawn_iterations(num_iterations: int, changes: Iterable[int] = ()) -> frozenset[int]:
    """The measured iterations whose whole timelines are kept: the last one, and around each
    change of the faults in force (an event's start or end, counted from the first measured
    iteration: `FaultModel.change_iterations`) the iteration before it and the one it is
    in."""
    drawn = {num_iterations - 1}
    for change in changes:
        drawn |= {change - 1, change}
    return frozenset(i for i in drawn if 0 <= i < num_iterations)


class ConfigurationRecorder:
    """harness.loop's `on_iteration` for one configuration: writes each measured iteration's
    messages to `out` (messages.csv rows) as it ends, and keeps the timelines of the `drawn`
    measured iterations only."""

    def __init__(
        self, out: TextIO, key: ConfigurationKey, drawn: Collection[int], num_warmup: int
    ) -> None:
        self._out = out
        self._prefix = _csv_line(key) + ","
        self._drawn = frozenset(drawn)
        self._kept: dict[int, Timeline] = {}
        """The drawn iterations' timelines by index: a lost one run again after a restart
        replaces its first run."""
        self._num_warmup = num_warmup
        self._rows_of: dict[int, list[str]] = {}
        """The rows (without their iteration) of recent computed iterations, for the ones
        that repeat them (`same_as`)."""

    @property
    def num_kept(self) -> int:
        """How many iterations' timelines are held now (at most len(drawn))."""
        return len(self._kept)

    def __call__(
        self, iteration: int, timeline: Timeline, measured: bool, same_as: int | None = None
    ) -> None:
        if not measured:
            return
        index = iteration - self._num_warmup  # after a restart, a lost one comes again
        rows = self._rows_of.get(same_as) if same_as is not None else None
        if rows is None:
            rows = _link_rows(timeline)
            if len(self._rows_of) >= 64:
                self._rows_of.pop(next(iter(self._rows_of)))
            self._rows_of[iteration] = rows
        start = f"{self._prefix}{index},"
        self._out.writelines(start + row for row in rows)
        if index in self._drawn:
            self._kept[index] = _renumbered(timeline, index)

    def timeline(self) -> Timeline:
        """The drawn iterations, numbered as iterations.csv numbers them, times as measured."""
        return Timeline.concat([self._kept[index] for index in sorted(self._kept)])


@contextlib.contextmanager
def messages_writer(run_dir: Path) -> Iterator[TextIO]:
    """messages.csv, to append one configuration's rows to: the new file (the old rows, then
    what the block writes) replaces the old one only if the block ends without an error."""
    path = run_dir / MESSAGES_FILE
    with atomic_writer(path, append=True) as out:
        if not out.tell():
            out.write(_csv_line(MESSAGES_COLUMNS) + "\n")
        yield out


class SavedTimeline(NamedTuple):
    """A configuration's saved timeline, and which of its drawn iterations ran again after a
    checkpoint restart (`RunResult.rerun_iterations`): the run kept is the one after it, the
    run with the fault that failed, or was lost, is not saved. A file of an older version
    says none."""

    timeline: Timeline
    rerun_iterations: frozenset[int]


_RERUN_KEY = "rerun_iterations"
"""What the file adds to `Timeline.to_dict`'s keys."""


def write_timeline(
    run_dir: Path, key: ConfigurationKey, timeline: Timeline, rerun_iterations: Iterable[int] = ()
) -> Path:
    """The drawn iterations' `timeline`, and those of them among `rerun_iterations`."""
    path = run_dir / TIMELINES_DIR / timeline_name(key)
    drawn = {r.iteration for r in timeline.iterations}
    rerun = sorted(drawn.intersection(rerun_iterations))
    write_json_atomic(path, {**timeline.to_dict(), _RERUN_KEY: rerun}, compact=True)
    return path


def read_saved_timeline(run_dir: Path, key: ConfigurationKey) -> SavedTimeline | None:
    """The saved timeline of a configuration, or None if the run directory has none."""
    path = run_dir / TIMELINES_DIR / timeline_name(key)
    if not path.exists():
        return None
    return parse_json_file(path, "timeline", _saved_timeline)


def read_timeline(run_dir: Path, key: ConfigurationKey) -> Timeline | None:
    """The saved timeline of a configuration, or None if the run directory has none."""
    saved = read_saved_timeline(run_dir, key)
    return None if saved is None else saved.timeline


def read_ring_spans(
    run_dir: Path, iterations: Mapping[ConfigurationKey, int]
) -> dict[ConfigurationKey, list[RingSpan]]:
    """Per configuration, each replica's DP all-reduce per stage (`pipeline.gantt.RingSpan`)
    in its measured iteration `iterations[key]`, from messages.csv's DP rows (a saved timeline
    has no ring messages: these rows are their record), read once for all; of its run after
    a restart where it ran twice (the later rows). Empty for a configuration without ring
    messages."""
    path = run_dir / MESSAGES_FILE
    if not iterations or not path.exists():
        return {key: [] for key in iterations}
    prefixes = {_csv_line((*key, iteration)) + ",": key for key, iteration in iterations.items()}
    index = _MESSAGE_COLUMN
    rows: dict[ConfigurationKey, dict[tuple[str, str, str], list[str]]] = {}
    with path.open(newline="") as handle, _damage_named(path):
        starts = tuple(prefixes)
        for row in csv.reader(line for line in handle if line.startswith(starts)):  # cheap
            if len(row) != len(MESSAGES_COLUMNS):
                raise ConfigError(f"{path}: a row has {len(row)} fields, not {len(index)}")
            if is_dp_link(row[index["link"]]):
                key = prefixes[_csv_line(row[:5]) + ","]
                link_way = (row[index["link"]], row[index["direction"]], row[index["replica"]])
                rows.setdefault(key, {})[link_way] = row  # a rerun's: the later rows
    return {key: _ring_spans(path, list(rows.get(key, {}).values())) for key in iterations}


def _ring_spans(path: Path, rows: list[list[str]]) -> list[RingSpan]:
    """`read_ring_spans` of one configuration's DP rows."""
    index = _MESSAGE_COLUMN
    spans: dict[tuple[int, int], RingSpan] = {}
    try:
        for row in rows:
            link = Link.parse(row[index["link"]])
            if link.group is None:
                continue
            start = float(row[index["first_send_start_ms"]])
            end = float(row[index["last_arrival_ms"]])
            fault = float(row[index["fault_ms"]]) / max(1, int(row[index["num_messages"]]))
            for replica in (link.first, link.second):  # each end's ring takes part in it
                span = spans.get((replica, link.group))
                spans[replica, link.group] = (
                    span.widened(start, end, fault)
                    if span
                    else RingSpan(link.group, start, end, fault, replica)
                )
    except (ValueError, ConfigError) as err:
        raise ConfigError(f"{path}: a DP row is not as written: {err}") from err
    return [spans[key] for key in sorted(spans)]


def _saved_timeline(data: Any) -> SavedTimeline:
    """A saved timeline as `write_timeline` wrote it: at least one iteration, and each op on
    one of its stages, ending no earlier than it starts (`Timeline.from_dict` checks each
    field's type, not this; the report's chart left an op of another stage out, a negative
    one too, and drew one ending before its start backwards)."""
    timeline = Timeline.from_dict(data)
    if not timeline.iterations:  # `write_timeline` saves at least one drawn iteration
        raise ConfigError("holds no iteration: damaged?")
    odd = next(
        (
            (k, op)
            for k, op in enumerate(timeline.ops)
            if not 0 <= op.stage < timeline.num_stages or op.end_ms < op.start_ms
        ),
        None,
    )
    if odd is not None:
        k, op = odd
        raise ConfigError(
            f"ops[{k}] is of stage {op.stage} (of {timeline.num_stages}) from {op.start_ms:g} "
            f"to {op.end_ms:g} ms: damaged?"
        )
    rerun = data.get(_RERUN_KEY, [])
    if not isinstance(rerun, list) or not all(
        isinstance(k, int) and not isinstance(k, bool) for k in rerun
    ):
        raise ConfigError(f"{_RERUN_KEY} is not a list of iterations: damaged?")
    return SavedTimeline(timeline, frozenset(rerun))


def drop_stale(
    run_dir: Path, done: Collection[ConfigurationKey], stale: Iterable[ConfigurationKey]
) -> None:
    """Before a resume (its run holding `run_dir`: no writer at work there): keep only the
    messages of configurations in runs.csv (`done`: it is written last), and remove the
    saved timelines of the `stale` ones (to be run again) and every temporary file a run
    killed mid-write (SIGKILL) left in `run_dir` and its timelines (pipeline.files'
    writers' `.NAME.XXXXXXXX.tmp`: messages.csv's, as big as it, runs.csv's, iterations.csv's,
    a timeline's, spec.json's, a report's), and nothing else."""
    for key in stale:
        (run_dir / TIMELINES_DIR / timeline_name(key)).unlink(missing_ok=True)
    for folder in (run_dir, run_dir / TIMELINES_DIR):
        for left in leftover_temporaries(folder):
            left.unlink(missing_ok=True)
    path = run_dir / MESSAGES_FILE
    if not path.exists():
        return
    with path.open(newline="") as old, _damage_named(path), atomic_writer(path) as new:
        reader, writer = csv.reader(old), csv.writer(new, lineterminator="\n")
        writer.writerow(next(reader, MESSAGES_COLUMNS))
        writer.writerows(row for row in reader if tuple(row[:4]) in done)


@contextlib.contextmanager
def _damage_named(path: Path) -> Iterator[None]:
    """messages.csv read within: bytes that are no UTF-8 or a field past csv's limit (what
    the harness never writes) are a ConfigError naming it, not an internal error."""
    try:
        yield
    except (UnicodeDecodeError, csv.Error) as err:
        raise ConfigError(f"{path} cannot be read ({err}): damaged?") from err


def _renumbered(timeline: Timeline, index: int) -> Timeline:
    return Timeline(
        num_stages=timeline.num_stages,
        ops=tuple(r._replace(iteration=index) for r in timeline.ops),
        messages=tuple(r._replace(iteration=index) for r in timeline.messages),
        iterations=tuple(r._replace(iteration=index) for r in timeline.iterations),
        failovers=tuple(r._replace(iteration=index) for r in timeline.failovers),
        swaps=tuple(r._replace(iteration=index) for r in timeline.swaps),
    )  # no dp_messages: messages.csv has them per link direction (see docs/design.md)


def _link_rows(timeline: Timeline) -> list[str]:
    """messages.csv's rows of one iteration, after its key and iteration columns: one per
    link direction and replica, PP links first, then DP links."""
    t0 = timeline.iterations[0].start_ms
    groups: dict[tuple[str, str, int], list[float]] = {}
    every = itertools.chain(timeline.messages, timeline.dp_messages)
    for _, link, way, _, size, start, end, arrival, needed, replica, fault, *_ in every:
        group = groups.get((link, way, replica))
        if group is None:
            groups[link, way, replica] = [1, size, start, end, arrival, end - start, fault,
                                          max(0.0, arrival - needed)]  # fmt: skip
            continue
        group[0] += 1
        group[1] += size
        group[2] = min(group[2], start)
        group[3] = max(group[3], end)
        group[4] = max(group[4], arrival)
        group[5] += end - start
        group[6] += fault
        group[7] += max(0.0, arrival - needed)
    row = "%s,%s,%d,%d,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f\n"
    return [
        row % (_field(link), _field(way), replica, n, size, a - t0, b - t0, c - t0, d, f, w)
        for (link, way, replica), (n, size, a, b, c, d, f, w) in sorted(groups.items())
    ]


@functools.lru_cache(maxsize=256)
def _field(text: str) -> str:
    return _csv_line((text,))


def _csv_line(values: Iterable[object]) -> str:
    """One CSV row, quoted as the csv module quotes it, without its line end."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="").writerow(values)
    return buffer.getvalue()
