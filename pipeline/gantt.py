"""Gantt chart of a timeline as a PNG: one row per stage of each replica, F/B/W coloured as in
the paper, the messages of the links with an injected delay drawn from their send to their
arrival, and each stage's DP all-reduce (its ring's span, hatched where a ring message was
delayed; where no ring messages are sent, the iteration's step)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from statistics import fmean
from typing import TYPE_CHECKING, NamedTuple

from pipeline.files import pyplot, save_figure
from pipeline.ops import OpKind
from pipeline.timeline import OpRecord, Timeline
from pipeline.topology import Link

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = [
    "RingSpan",
    "SlowMessage",
    "drawn_end_ms",
    "plot_gantt",
    "ring_spans",
    "slow_messages",
    "step_spans",
]

_COLOURS = {OpKind.F: "#4c72b0", OpKind.B: "#55a868", OpKind.W: "#dd8452", OpKind.BW: "#8172b3"}
_SLOW_COLOUR = "#c44e52"
_RING_COLOUR = "#b0b0b0"
_DPI = 120
"""The layout is made at the dpi the file is saved at: text extents depend on it."""
_MESSAGE_ZORDER = 2.5
"""Over the boxes (1), under their microbatch labels (3)."""


class SlowMessage(NamedTuple):
    """A message with an injected delay, as the chart draws it: from its sending stage's row
    at its send's start to its receiving stage's row at its arrival (of `replica`)."""

    send_start_ms: float
    sender: int
    arrival_ms: float
    receiver: int
    fault_ms: float
    replica: int = 0


class RingSpan(NamedTuple):
    """A stage's DP all-reduce as the chart draws it on `replica`'s row: from the first send
    of its ring's messages to or from that replica to the last one's arrival; `fault_ms`, the
    mean delay injected into a message of its most delayed link direction (messages.csv
    keeps the sums)."""

    stage: int
    start_ms: float
    end_ms: float
    fault_ms: float
    replica: int = 0

    def widened(self, start_ms: float, end_ms: float, fault_ms: float) -> RingSpan:
        """This span and another of its stage's ring links, as one."""
        return self._replace(
            start_ms=min(self.start_ms, start_ms),
            end_ms=max(self.end_ms, end_ms),
            fault_ms=max(self.fault_ms, fault_ms),
        )


def drawn_end_ms(timeline: Timeline, rings: Sequence[RingSpan] | None = None) -> float:
    """Where a chart of `timeline` ends by itself: its last op's or all-reduce's end
    (`rings`: as `plot_gantt` takes them)."""
    spans, _ = _after_the_pipeline(timeline, rings)
    return _end_ms(timeline, spans)


def _end_ms(timeline: Timeline, spans: Sequence[RingSpan]) -> float:
    """The last op's or drawn all-reduce's end."""
    return max([r.end_ms for r in timeline.ops] + [span.end_ms for span in spans], default=1.0)


def _replicas_of(timeline: Timeline) -> list[int]:
    """The replicas whose ops the timeline holds, in order (replica 0 where it has none)."""
    return sorted({op.replica for op in timeline.ops}) or [0]


def ring_spans(timeline: Timeline, replica: int = 0) -> list[RingSpan]:
    """Per stage whose ring `replica` takes part in, its `RingSpan` from the timeline's ring
    messages, by iteration (a timeline of several: each iteration's ring apart) and stage."""
    spans: dict[tuple[int, int], RingSpan] = {}
    delays: dict[tuple[int, int, str, str, int], list[float]] = {}
    for m in timeline.dp_messages:
        link = Link.parse(m.link)
        if replica not in (link.first, link.second) or link.group is None:
            continue
        where = (m.iteration, link.group)
        delays.setdefault((*where, m.link, m.direction, m.replica), []).append(m.fault_ms)
        first = RingSpan(link.group, m.send_start_ms, m.arrival_ms, 0.0, replica)
        span = spans.get(where, first)
        spans[where] = span.widened(m.send_start_ms, m.arrival_ms, 0.0)
    for (iteration, stage, *_), faults in delays.items():
        span = spans[iteration, stage]
        spans[iteration, stage] = span._replace(fault_ms=max(span.fault_ms, fmean(faults)))
    return [spans[key] for key in sorted(spans)]


_STEP_LABEL = "step after the pipeline (all-reduce, optimizer, the runtime's own time)"
"""A step's legend: a runtime's holds its own time after the last op too (a fraction of a ms
where a run has neither an all-reduce nor an optimizer)."""


def step_spans(timeline: Timeline) -> list[RingSpan]:
    """Each iteration's step after the pipeline (`IterationRecord.step_time_ms`: the
    all-reduce and the optimizer, the cost model's where no ring messages are sent) on every
    stage of every replica; its delay unknown (0)."""
    return [
        RingSpan(stage, r.end_ms - r.step_time_ms, r.end_ms, 0.0, replica)
        for r in timeline.iterations
        if r.step_time_ms > 0
        for replica in _replicas_of(timeline)
        for stage in range(timeline.num_stages)
    ]


def _after_the_pipeline(
    timeline: Timeline, rings: Sequence[RingSpan] | None
) -> tuple[Sequence[RingSpan], bool]:
    """What a chart draws after the ops: the rings (`rings`, else every replica's of the
    timeline), each from its stage's last op before it on (another replica's chunks may
    reach this one while it still computes: they wait for it), True; or where there are
    none, the iterations' steps, False."""
    if rings is None:
        rings = [span for r in _replicas_of(timeline) for span in ring_spans(timeline, r)]
    if not rings:
        return step_spans(timeline), False
    ends_ms: dict[tuple[int, int], list[float]] = {}
    for op in timeline.ops:
        ends_ms.setdefault((op.replica, op.stage), []).append(op.end_ms)

    def last_op_ms(span: RingSpan) -> float:
        ends = ends_ms.get((span.replica, span.stage), ())
        return max((e for e in ends if e <= span.end_ms), default=0.0)

    return [span._replace(start_ms=max(span.start_ms, last_op_ms(span))) for span in rings], True


def slow_messages(timeline: Timeline, replica: int = 0) -> list[SlowMessage]:
    """`replica`'s PP messages with `fault_ms` > 0: "forward" ones go from a link's upstream
    stage to its downstream one, "backward" ones the other way."""
    out = []
    for m in timeline.messages:
        if m.replica != replica or m.fault_ms <= 0:
            continue
        link = Link.parse(m.link)
        if not link.is_pp:
            continue
        sender, receiver = link.sender(m.direction), link.receiver(m.direction)
        out.append(
            SlowMessage(
                m.send_start_ms, sender.stage, m.arrival_ms, receiver.stage, m.fault_ms, replica
            )
        )
    return out


def plot_gantt(
    timeline: Timeline,
    path: str | Path,
    title: str = "",
    end_ms: float | None = None,
    rings: Sequence[RingSpan] | None = None,
) -> None:
    """Write the chart of every replica (a row per stage of each; replica 1's slow link made
    replica 0's wait for it look like a long all-reduce, replica 1 not drawn), its time axis
    from 0 to `end_ms` (default `drawn_end_ms`: charts to compare share one); the microbatch
    index is printed in every box wide enough to hold it. The legend sits right of the axes,
    off the ops. After each stage's ops, its all-reduce: `rings` (default `ring_spans` of
    every replica: a timeline saved without its ring messages has them elsewhere), or where
    there are none the iteration's step."""
    plt = pyplot()
    spans, of_rings = _after_the_pipeline(timeline, rings)
    end_ms = _end_ms(timeline, spans) if end_ms is None else end_ms
    replicas = _replicas_of(timeline)
    rows = _Rows(timeline.num_stages, replicas)
    fig, ax = plt.subplots(figsize=(12, 0.5 * rows.count + 1.2), dpi=_DPI, layout="constrained")
    ops = list(timeline.ops)
    _draw_rings(ax, spans, rows)
    _draw_ops(ax, ops, rows)
    slow = [m for replica in replicas for m in slow_messages(timeline, replica)]
    _draw_slow_messages(ax, slow, rows)
    ax.set_yticks(range(rows.count), rows.labels())
    ax.set_ylim(rows.count - 0.5, -0.5)  # stage 0 on top
    ax.set_xlim(0, end_ms)
    ax.set_xlabel("time (ms)")
    kinds = sorted({r.kind for r in timeline.ops}, key=list(OpKind).index)
    _legend(ax, kinds, slow, spans, of_rings)
    if title:
        ax.set_title(title)
    # The layout once, before the labels: they sit inside the axes, so they would not move
    # it, and laid out with the figure they were drawn three times over (half the time).
    fig.draw_without_rendering()
    fig.set_layout_engine(None)  # "none" would keep a placeholder that savefig lays out for
    _label_ops(ax, ops, rows, min_label_ms=end_ms / 150)
    save_figure(fig, path, dpi=_DPI)
    plt.close(fig)


class _Rows:
    """A row per stage of each replica drawn, replica by replica (only "stage i" with one)."""

    def __init__(self, num_stages: int, replicas: Sequence[int]) -> None:
        self.num_stages, self.replicas = num_stages, list(replicas)
        self.count = num_stages * len(self.replicas)

    def of(self, replica: int, stage: int) -> int:
        return self.replicas.index(replica) * self.num_stages + stage

    def labels(self) -> list[str]:
        if len(self.replicas) == 1:
            return [f"stage {s}" for s in range(self.num_stages)]
        return [f"r{r} stage {s}" for r in self.replicas for s in range(self.num_stages)]


def _draw_ops(ax: Axes, ops: list[OpRecord], rows: _Rows) -> None:
    boxes: dict[tuple[int, OpKind], list[tuple[float, float]]] = {}
    for r in ops:
        row = rows.of(r.replica, r.stage)
        boxes.setdefault((row, r.kind), []).append((r.start_ms, r.end_ms - r.start_ms))
    for (row, kind), spans in boxes.items():  # one collection per row and kind: fast
        ax.broken_barh(
            spans, (row - 0.4, 0.8), facecolors=_COLOURS[kind], edgecolor="white", linewidth=0.5
        )


def _draw_rings(ax: Axes, rings: Sequence[RingSpan], rows: _Rows) -> None:
    """Each stage's all-reduce as a grey box under its row's ops, hatched where delayed."""
    for span in rings:
        if span.replica not in rows.replicas:
            continue
        ax.broken_barh(
            [(span.start_ms, span.end_ms - span.start_ms)],
            (rows.of(span.replica, span.stage) - 0.25, 0.5),
            facecolors=_RING_COLOUR,
            edgecolor=_SLOW_COLOUR if span.fault_ms > 0 else "white",
            hatch="///" if span.fault_ms > 0 else None,
            linewidth=0.5,
        )


def _label_ops(ax: Axes, ops: list[OpRecord], rows: _Rows, min_label_ms: float) -> None:
    """The microbatch index in every box at least `min_label_ms` wide."""
    for r in ops:
        width = r.end_ms - r.start_ms
        if width >= min_label_ms:
            ax.text(
                r.start_ms + width / 2,
                rows.of(r.replica, r.stage),
                str(r.microbatch),
                ha="center",
                va="center",
                fontsize=6,
                color="white",
            )


def _draw_slow_messages(ax: Axes, slow: list[SlowMessage], rows: _Rows) -> None:
    """One line collection for every message and one scatter for their arrivals: fast."""
    if not slow:
        return
    from matplotlib.collections import LineCollection

    segments = [
        [
            (m.send_start_ms, rows.of(m.replica, m.sender)),
            (m.arrival_ms, rows.of(m.replica, m.receiver)),
        ]
        for m in slow
    ]
    ax.add_collection(
        LineCollection(segments, colors=_SLOW_COLOUR, linewidths=1.0, zorder=_MESSAGE_ZORDER)
    )
    ax.scatter(
        [m.arrival_ms for m in slow],
        [rows.of(m.replica, m.receiver) for m in slow],
        s=8,
        color=_SLOW_COLOUR,
        zorder=_MESSAGE_ZORDER,
    )


def _legend(
    ax: Axes,
    kinds: list[OpKind],
    slow: list[SlowMessage],
    rings: Sequence[RingSpan],
    of_rings: bool,
) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Patch | Line2D] = [Patch(color=_COLOURS[k], label=k.value) for k in kinds]
    if rings:
        label = "DP all-reduce" if of_rings else _STEP_LABEL
        handles.append(Patch(color=_RING_COLOUR, label=label))
    delayed = [span.fault_ms for span in rings if span.fault_ms > 0]
    if delayed:
        handles.append(
            Patch(
                facecolor=_RING_COLOUR,
                edgecolor=_SLOW_COLOUR,
                hatch="///",
                label=f"all-reduce over a slow DP link ({_delay_text(delayed)} a message, mean)",
            )
        )
    if slow:
        label = f"message on a slow link ({_delay_text(m.fault_ms for m in slow)})"
        handles.append(Line2D([], [], color=_SLOW_COLOUR, marker="o", markersize=3, label=label))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7)


def _delay_text(delays_ms: Iterable[float]) -> str:
    """ "+40 ms", or "+10-40 ms" when the messages were delayed by different amounts: to 3
    significant digits (a jitter's draws, 15.361930 ms, are not read to the microsecond),
    whole ms at least, or as many more as tell a range's ends apart."""
    values = sorted(set(delays_ms))
    low, high = values[0], values[-1]
    if low == high:
        return f"+{_ms_text(low, 3)} ms"
    for digits in range(3, 18):  # 17 digits tell any two doubles apart
        ends = _ms_text(low, digits), _ms_text(high, digits)
        if ends[0] != ends[1]:
            break
    return f"+{ends[0]}-{ends[1]} ms"


def _ms_text(ms: float, digits: int) -> str:
    """`ms` to `digits` significant digits, its whole ms at least, never in an exponent's
    form: 15.4, 25, 1235, 600000, 0.0423."""
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(ms)))) if ms else 0
    text = f"{ms:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text
