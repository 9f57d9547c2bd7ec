import json
import struct
from pathlib import Path

import pytest

from baselines import one_f_one_b, zb_h2
from pipeline.errors import ConfigError
from pipeline.gantt import plot_gantt
from pipeline.metrics import compute_metrics
from pipeline.ops import OpKind
from pipeline.profile import Profile
from pipeline.schedule import Schedule
from pipeline.simulator import CommMode, simulate
from pipeline.timeline import SCHEMA_VERSION, IterationRecord, OpRecord, Timeline
from pipeline.trace import to_chrome_trace


def _fig4(fig4_fixture: dict, c0: float = 0.0) -> Timeline:
    profile = Profile.from_dict({**fig4_fixture["profile"], "delay_ms": [c0, 0, 0]})
    return simulate(Schedule.from_dict(fig4_fixture), profile, CommMode.IDEAL)


def test_fig4_metrics(fig4_fixture: dict) -> None:
    metrics = compute_metrics(_fig4(fig4_fixture))
    assert metrics.iteration_time_ms == 390.0
    assert metrics.max_stage_span_ms == 360.0  # every stage is busy 360 ms end to end
    assert metrics.bubble_ratio == pytest.approx(1 - 4 * 360 / (4 * 390))
    assert [s.busy_ms for s in metrics.stages] == [360.0] * 4
    assert [s.idle_ms for s in metrics.stages] == [30.0] * 4
    # Stage 0 holds 7 warm-up forwards, then gains half a microbatch per B-F pair until F11.
    assert [s.peak_memory for s in metrics.stages] == [9.5, 8.5, 7.5, 6.5]


def test_send_blocking_counts_as_idle() -> None:
    profile = Profile.uniform(2, 2, 10, 10, 10, delay_ms=(5.0,))
    metrics = compute_metrics(simulate(one_f_one_b(profile), profile, CommMode.DIRECT))
    assert [s.busy_ms for s in metrics.stages] == [60.0, 60.0]
    assert metrics.stages[0].idle_ms == metrics.iteration_time_ms - 60.0


def test_a_stage_busy_throughout_has_no_bubble_not_a_negative_one() -> None:
    """Op times summed (0.083 + 1.165 + 2.53 ms) passed the span they fill (3.778 ms) by a
    rounding error: a bubble ratio of -2.2e-16, which results.csv's read refuses."""
    ends = (0.0, 0.083, 1.248, 3.778)
    ops = tuple(
        OpRecord(0, 0, kind, 0, start, end)
        for kind, start, end in zip((OpKind.F, OpKind.B, OpKind.W), ends, ends[1:], strict=False)
    )
    timeline = Timeline(1, ops, (), (IterationRecord(0, 0.0, 3.778),))
    assert sum(op.end_ms - op.start_ms for op in ops) > 3.778  # the rounding error
    assert compute_metrics(timeline).bubble_ratio == 0.0


def test_timeline_json_round_trip_and_version_check(fig4_fixture: dict) -> None:
    timeline = _fig4(fig4_fixture, 20)
    data = json.loads(json.dumps(timeline.to_dict()))
    assert data["schema_version"] == SCHEMA_VERSION
    assert Timeline.from_dict(data) == timeline
    with pytest.raises(ConfigError, match="schema version 99"):
        Timeline.from_dict({**data, "schema_version": 99})


def test_timeline_records_every_op_and_message(fig4_fixture: dict) -> None:
    timeline = _fig4(fig4_fixture, 20)
    assert len(timeline.ops) == 4 * 36
    # 3 links x 12 microbatches x 2 directions; link 0-1 pays 20 ms.
    assert len(timeline.messages) == 72
    slow = [m for m in timeline.messages if m.link == "0-1"]
    assert all(m.arrival_ms - m.send_start_ms == 20.0 for m in slow)


def test_chrome_trace(fig4_fixture: dict) -> None:
    trace = to_chrome_trace(_fig4(fig4_fixture))
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    ops = [e for e in spans if e["pid"] == 0]
    assert len(ops) == 144 and len(spans) == 144 + 72
    first_b = next(e for e in ops if e["tid"] == 0 and e["name"] == "B0")
    assert (first_b["ts"], first_b["dur"]) == (70_000.0, 10_000.0)  # microseconds
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert {"stage 0", "stage 3", "0-1 forward", "2-3 backward"} <= names


def test_gantt_png_is_a_real_image(tmp_path: Path) -> None:
    profile = Profile.uniform(4, 8, 10, 10, 5)
    path = tmp_path / "gantt.png"
    plot_gantt(simulate(zb_h2(profile), profile), path, title="zb-h2")
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    assert width > 600 and height > 150
