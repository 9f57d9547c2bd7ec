"""Chrome/Perfetto trace export of a timeline (Trace Event Format, JSON)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.timeline import Timeline

__all__ = ["to_chrome_trace", "write_chrome_trace"]

_STAGES_PID, _LINKS_PID = 0, 1


def _us(ms: float) -> float:
    return round(ms * 1000.0, 3)


def to_chrome_trace(timeline: Timeline) -> dict[str, Any]:
    """One track per stage and replica (ops) and one per link direction (messages in
    flight); replica 0 keeps the plain names ("stage 2", "2-3 forward")."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": _STAGES_PID, "name": "process_name", "args": {"name": "stages"}},
        {"ph": "M", "pid": _LINKS_PID, "name": "process_name", "args": {"name": "links"}},
    ]
    num_stages = timeline.num_stages
    for replica, stage_idx in sorted({(r.replica, r.stage) for r in timeline.ops}):
        name = f"stage {stage_idx}" if replica == 0 else f"replica {replica} stage {stage_idx}"
        events.append(
            {
                "ph": "M",
                "pid": _STAGES_PID,
                "tid": replica * num_stages + stage_idx,
                "name": "thread_name",
                "args": {"name": name},
            }
        )
    for r in timeline.ops:
        events.append(
            {
                "ph": "X",
                "pid": _STAGES_PID,
                "tid": r.replica * num_stages + r.stage,
                "name": f"{r.kind.value}{r.microbatch}",
                "cat": r.kind.value,
                "ts": _us(r.start_ms),
                "dur": _us(r.end_ms - r.start_ms),
                "args": {"iteration": r.iteration, "microbatch": r.microbatch},
            }
        )
    tracks: dict[str, int] = {}
    for msg in timeline.messages:
        prefix = f"pp{msg.replica}:" if msg.replica else ""
        track = f"{prefix}{msg.link} {msg.direction}"
        if track not in tracks:
            tracks[track] = len(tracks)
            events.append(
                {
                    "ph": "M",
                    "pid": _LINKS_PID,
                    "tid": tracks[track],
                    "name": "thread_name",
                    "args": {"name": track},
                }
            )
        events.append(
            {
                "ph": "X",
                "pid": _LINKS_PID,
                "tid": tracks[track],
                "name": f"m{msg.microbatch}",
                "cat": msg.direction,
                "ts": _us(msg.send_start_ms),
                "dur": _us(msg.arrival_ms - msg.send_start_ms),
                "args": {
                    "iteration": msg.iteration,
                    "bytes": msg.num_bytes,
                    "send_end_ms": msg.send_end_ms,
                },
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(timeline: Timeline, path: str | Path) -> None:
    Path(path).write_text(json.dumps(to_chrome_trace(timeline)))
