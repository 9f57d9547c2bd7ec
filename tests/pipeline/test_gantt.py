"""The Gantt chart draws what a reader compares: a time axis charts can share, the legend off
the ops, and the messages of the links with an injected delay."""

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from matplotlib.collections import LineCollection
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure

from baselines import one_f_one_b
from pipeline.gantt import (
    RingSpan,
    SlowMessage,
    drawn_end_ms,
    plot_gantt,
    ring_spans,
    slow_messages,
    step_spans,
)
from pipeline.ops import OpKind
from pipeline.profile import Profile
from pipeline.simulator import CommMode, simulate
from pipeline.timeline import IterationRecord, MessageRecord, OpRecord, Timeline


def _slow_middle_link() -> Timeline:
    """1F1B, 4 stages, 4 microbatches of 10/10/5 ms, link 1-2 40 ms slow."""
    profile = Profile.uniform(4, 4, 10, 10, 5).with_delays([0, 40, 0])
    return simulate(one_f_one_b(profile), profile)


def test_slow_messages_run_down_the_link_forward_and_up_it_backward() -> None:
    slow = slow_messages(_slow_middle_link())
    assert len(slow) == 8  # 4 activations and 4 gradients on 1-2; links 0-1 and 2-3 are fast
    assert slow[0] == SlowMessage(20.0, 1, 60.0, 2, 40.0)  # F0 on stage 1 ends at 20 ms
    assert slow[3] == SlowMessage(110.0, 2, 150.0, 1, 40.0)  # B0's gradient
    assert {(m.sender, m.receiver) for m in slow} == {(1, 2), (2, 1)}
    assert all(m.arrival_ms - m.send_start_ms == 40.0 for m in slow)


def test_slow_messages_are_replica_0_s_delayed_ones() -> None:
    def message(replica: int, fault_ms: float) -> MessageRecord:
        return MessageRecord(0, "0-1", "backward", 0, 8, 5.0, 5.0, 35.0, 30.0, replica, fault_ms)

    timeline = Timeline(2, (), (message(0, 0.0), message(1, 30.0), message(0, 30.0)), ())
    assert slow_messages(timeline) == [SlowMessage(5.0, 1, 35.0, 0, 30.0)]
    assert slow_messages(timeline, replica=1) == [SlowMessage(5.0, 1, 35.0, 0, 30.0, 1)]


def _drawn(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, timeline: Timeline | None = None, **kwargs: Any
) -> Figure:
    """The figure `plot_gantt` saves of `timeline` (default `_slow_middle_link`), kept as it
    is saved."""
    saved: list[Figure] = []
    real = Figure.savefig

    def keep(fig: Figure, *args: Any, **options: Any) -> None:
        saved.append(fig)
        real(fig, *args, **options)

    monkeypatch.setattr(Figure, "savefig", keep)
    plot_gantt(timeline or _slow_middle_link(), tmp_path / "gantt.png", **kwargs)
    assert (tmp_path / "gantt.png").read_bytes()[:4] == b"\x89PNG"
    (fig,) = saved
    return fig


def test_the_chart_ends_where_it_is_told_and_its_legend_is_off_the_axes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert drawn_end_ms(_slow_middle_link()) == 335.0
    fig = _drawn(monkeypatch, tmp_path, title="1f1b", end_ms=1000.0)
    (ax,) = fig.axes
    assert ax.get_xlim() == (0.0, 1000.0)
    legend = ax.get_legend()
    assert legend is not None
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == ["F", "BW", "message on a slow link (+40 ms)"]
    box = legend.get_window_extent()
    assert ax.get_window_extent().x1 <= box.x0 and box.x1 <= fig.bbox.x1  # right of the ops
    (lines,) = [c for c in ax.collections if isinstance(c, LineCollection)]
    segments = [[tuple(point) for point in s] for s in lines.get_segments()]
    assert len(segments) == 8 and segments[0] == [(20.0, 1.0), (60.0, 2.0)]


def test_the_chart_ends_at_its_last_op_by_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (ax,) = _drawn(monkeypatch, tmp_path).axes
    assert ax.get_xlim() == (0.0, 335.0) and ax.get_title() == ""


def _slow_ring() -> Timeline:
    """1F1B, 2 stages x 2 replicas, 1 MB gradients at 10 Gbit/s, stage 1's ring link 30 ms
    slow."""
    profile = Profile.from_dict(
        {
            "stages": 2, "microbatches": 4, "t_f": 10, "t_b": 10, "t_w": 5, "dp": 2,
            "allreduce_bytes": 1_000_000, "link_bandwidth_gbps": 10,
            "dp_delay_ms": {"dp1:0-1": 30},
        }
    )  # fmt: skip
    return simulate(one_f_one_b(profile), profile)


def test_each_stage_s_all_reduce_is_drawn_hatched_where_its_ring_was_delayed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A slow DP ring link shows in the chart: its stage's all-reduce, from its ring's first
    send to its last arrival, runs past the ops, and the chart's own end is its end (the
    chart ended at the last op: a DP fault drew nothing)."""
    timeline = _slow_ring()
    (ring0, ring1) = ring_spans(timeline)
    last_op_ms = max(r.end_ms for r in timeline.ops)
    assert (ring0.stage, ring0.fault_ms, ring1.stage, ring1.fault_ms) == (0, 0.0, 1, 30.0)
    assert ring1.end_ms - ring1.start_ms > 2 * 30.0  # two ring steps, each 30 ms late
    assert drawn_end_ms(timeline) == ring1.end_ms > last_op_ms
    legend = _drawn(monkeypatch, tmp_path, timeline).axes[0].get_legend()
    assert legend is not None
    assert [t.get_text() for t in legend.get_texts()] == [
        "F", "BW", "DP all-reduce", "all-reduce over a slow DP link (+30 ms a message, mean)"
    ]  # fmt: skip


def test_a_step_without_ring_messages_is_drawn_after_the_pipeline_on_every_stage(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The cost model's all-reduce has no ring messages, only the iteration's step (all-reduce
    and optimizer): drawn from the pipeline's end to the iteration's end on every stage (at
    7B, a 30 ms DP link makes that step 3 s against a 0.4 s pipeline: the chart showed the
    pipeline alone)."""
    profile = Profile.uniform(2, 2, 10, 10, 5)
    pipeline = simulate(one_f_one_b(profile), profile)
    end_ms = drawn_end_ms(pipeline)
    timeline = dataclasses.replace(
        pipeline, iterations=(IterationRecord(0, 0.0, end_ms + 300.0, 300.0),)
    )
    assert ring_spans(timeline) == []
    assert step_spans(timeline) == [RingSpan(s, end_ms, end_ms + 300.0, 0.0) for s in (0, 1)]
    assert drawn_end_ms(timeline) == end_ms + 300.0
    legend = _drawn(monkeypatch, tmp_path, timeline).axes[0].get_legend()
    assert legend is not None
    assert [t.get_text() for t in legend.get_texts()][-1] == (
        "step after the pipeline (all-reduce, optimizer, the runtime's own time)"
    )


def test_ring_spans_are_replica_0_s_rings_each_iteration_apart() -> None:
    def chunk(iteration: int, link: str, sent_ms: float, replica: int) -> MessageRecord:
        return MessageRecord(iteration, link, "forward", 0, 8, sent_ms, sent_ms, sent_ms + 30.0,
                             sent_ms, replica, 0.0)  # fmt: skip

    dp = (
        chunk(0, "dp0:0-1", 5.0, 0), chunk(0, "dp0:0-1", 10.0, 1), chunk(1, "dp0:0-1", 105.0, 1),
        chunk(0, "dp1:1-2", 7.0, 1),  # replicas 1 and 2 only
    )  # fmt: skip
    timeline = Timeline(2, (), (), (), dp_messages=dp)
    assert ring_spans(timeline) == [RingSpan(0, 5.0, 40.0, 0.0), RingSpan(0, 105.0, 135.0, 0.0)]
    assert ring_spans(timeline, replica=2) == [RingSpan(1, 7.0, 37.0, 0.0, 2)]


def test_a_ring_span_s_delay_is_the_mean_of_its_most_delayed_link_direction() -> None:
    """What messages.csv keeps (a sum per link direction), so a chart of a saved run and one
    of a timeline say the same: a delay from mid-ring (30 ms on one of two messages) is 15
    ms a message there; another direction's 10 ms on each is less."""

    def chunk(way: str, sent_ms: float, replica: int, fault_ms: float) -> MessageRecord:
        return MessageRecord(0, "dp0:0-1", way, 0, 8, sent_ms, sent_ms, sent_ms + 1.0, sent_ms,
                             replica, fault_ms)  # fmt: skip

    timeline = Timeline(1, (), (), (), dp_messages=(
        chunk("forward", 0.0, 0, 0.0), chunk("forward", 5.0, 0, 30.0),
        chunk("backward", 0.0, 1, 10.0), chunk("backward", 5.0, 1, 10.0),
    ))  # fmt: skip
    assert ring_spans(timeline) == [RingSpan(0, 0.0, 6.0, 15.0)]


def test_a_stage_s_all_reduce_is_drawn_from_its_last_op_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Replica 1 ended its ops first and sent replica 0 its ring's first chunk at 20 ms while
    replica 0 still computed until 50 ms: the chart drew replica 0's all-reduce over its ops
    from 20 ms on. The chunk waits for it: the bar starts at 50 ms (the span itself keeps
    when the first chunk was sent)."""
    ops = (
        OpRecord(0, 0, OpKind.F, 0, 0.0, 25.0, 0),
        OpRecord(0, 0, OpKind.BW, 0, 25.0, 50.0, 0),
    )
    early = MessageRecord(0, "dp0:0-1", "backward", 0, 8, 20.0, 20.0, 21.0, 50.0, 1, 0.0)
    late = MessageRecord(0, "dp0:0-1", "forward", 0, 8, 51.0, 51.0, 80.0, 60.0, 0, 0.0)
    timeline = Timeline(1, ops, (), (), dp_messages=(early, late))
    assert ring_spans(timeline) == [RingSpan(0, 20.0, 80.0, 0.0)]
    ring = _drawn(monkeypatch, tmp_path, timeline).axes[0].collections[0]
    xs = [x for path in ring.get_paths() for x, _ in path.vertices]
    assert (min(xs), max(xs)) == (50.0, 80.0)


def test_every_replica_has_its_rows_and_its_slow_messages(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """40 ms on replica 1's link 0-1: the chart drew replica 0 alone, whose all-reduce then
    waits for replica 1's ring chunks, a long grey bar blamed on the all-reduce while the
    slow PP link was not drawn. Each replica now has a row per stage, its slow messages on
    them, and its ring from its own last op on."""
    from injectors.fault_files import parse_yaml
    from pipeline.link_rates import NO_RATES
    from pipeline.topology import Topology

    profile = Profile.uniform(2, 4, 10, 10, 5, num_replicas=2, allreduce_bytes=(1_000_000,) * 2)
    faults = parse_yaml('[{start_iteration: 0, links: ["pp1:0-1"], delay_ms: 40}]')
    timeline = simulate(
        one_f_one_b(profile),
        profile,
        CommMode.DIRECT,
        faults=faults.at(0, Topology(2, 2), rates=NO_RATES),
    )
    (ax,) = _drawn(monkeypatch, tmp_path, timeline).axes
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "r0 stage 0", "r0 stage 1", "r1 stage 0", "r1 stage 1"
    ]  # fmt: skip
    (lines,) = [c for c in ax.collections if isinstance(c, LineCollection)]
    rows = {(round(a[1]), round(b[1])) for a, b in lines.get_segments()}
    assert rows == {(2, 3), (3, 2)}  # replica 1's link, both ways
    replica_0_ends = max(op.end_ms for op in timeline.ops if op.replica == 0)
    replica_1_ends = max(op.end_ms for op in timeline.ops if op.replica == 1)
    assert replica_1_ends > replica_0_ends + 100  # its 40 ms messages held it back
    grey = to_rgba("#b0b0b0")
    rings = {}  # each ring box's row and start
    for collection in ax.collections:
        if (
            not isinstance(collection, LineCollection)
            and tuple(collection.get_facecolor()[0]) == grey
        ):
            (path,) = collection.get_paths()
            rings[round(float(path.vertices[:, 1].mean()))] = float(path.vertices[:, 0].min())
    last_op_ms = {
        2 * r + s: max(op.end_ms for op in timeline.ops if (op.replica, op.stage) == (r, s))
        for r in (0, 1)
        for s in (0, 1)
    }
    assert rings.keys() == last_op_ms.keys()  # a ring on each replica's own rows
    assert all(rings[row] >= last_op_ms[row] for row in rings)  # after its own last op
    assert rings[2] == last_op_ms[2] > last_op_ms[0]  # replica 1 waited: not replica 0's end


def test_the_legend_gives_a_jittered_delay_s_range_to_three_significant_digits(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A link under 20 +- 5 ms of jitter: its messages' delays drawn from the seed are
    15.361930... to 24.952348... ms, which the legend printed to six digits ("+15.3619-24.9523
    ms"); a range it rounds alike keeps the digits that tell its ends apart, and a long delay
    its whole ms."""

    def message(microbatch: int, fault_ms: float) -> MessageRecord:
        return MessageRecord(0, "0-1", "forward", microbatch, 8, 10.0, 10.0, 10.0 + fault_ms,
                             10.0, 0, fault_ms)  # fmt: skip

    def labels(*delays_ms: float) -> list[str]:
        ops = (OpRecord(0, 0, OpKind.F, 0, 0.0, 10.0, 0),)
        messages = tuple(message(k, ms) for k, ms in enumerate(delays_ms))
        fig = _drawn(monkeypatch, tmp_path, Timeline(2, ops, messages, ()), end_ms=50.0)
        legend = fig.axes[0].get_legend()
        assert legend is not None
        return [t.get_text() for t in legend.get_texts()]

    assert labels(15.361930457, 20.4, 24.952348101)[-1] == "message on a slow link (+15.4-25 ms)"
    assert labels(20.01, 20.04)[-1] == "message on a slow link (+20.01-20.04 ms)"
    assert labels(40.0)[-1] == "message on a slow link (+40 ms)"
    assert labels(1234.56, 600000.0)[-1] == "message on a slow link (+1235-600000 ms)"
