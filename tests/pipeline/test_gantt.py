"""The Gantt chart draws what a reader compares: a time axis charts can share, the legend off
the ops, and the messages of the links with an injected delay."""

from pathlib import Path
from typing import Any

import pytest
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure

from baselines import one_f_one_b
from pipeline.gantt import SlowMessage, drawn_end_ms, plot_gantt, slow_messages
from pipeline.profile import Profile
from pipeline.simulator import simulate
from pipeline.timeline import MessageRecord, Timeline


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
    assert slow_messages(timeline, replica=1) == [SlowMessage(5.0, 1, 35.0, 0, 30.0)]


def _drawn(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **kwargs: Any) -> Figure:
    """The figure `plot_gantt` saves, kept as it is saved."""
    saved: list[Figure] = []
    real = Figure.savefig

    def keep(fig: Figure, *args: Any, **options: Any) -> None:
        saved.append(fig)
        real(fig, *args, **options)

    monkeypatch.setattr(Figure, "savefig", keep)
    plot_gantt(_slow_middle_link(), tmp_path / "gantt.png", **kwargs)
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
