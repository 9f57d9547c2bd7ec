"""Chrome/Perfetto trace export of a timeline (Trace Event Format, JSON).

Ops are slices on their stage's track. Each message is a slice on its link direction's track
from its send's start to its arrival, and an instant event when its consumer asked for it
(`MessageRecord.needed_ms`): an instant after the slice's end marks a message that waited for
its consumer, one before it a consumer that waited for the message. The DP all-reduce's ring
messages (`Timeline.dp_messages`) are so too, on their DP links' tracks ("dp1:0-1 forward":
stage 1's ring), named by their index along the link direction ("c3": its fourth chunk).
Each iteration's step (`IterationRecord.step_time_ms`: from its last op's end to its end, the
all-reduce and the optimizer) is a slice on the "steps" process's track. A delegate's
failover to another NIC is an instant event "failover rnic0 -> rnic1" on its link direction's
track when it noticed the failure (`FailoverRecord`: its cause and when it resumed in its
args); a failover on the tied route (pipeline.topology's `tied_link`) has a track of its own,
"tied:0-3 forward" ("tied1:0-3 forward": replica 1's). A message's args have the delay
injected into it (`fault_ms`). A worker's move in a rank swap (`SwapRecord`) is a slice
"swap from stage 1 replica 1" on the track of the position it took, before its ops there.
A checkpoint-restart (`RestartMark`) is an instant "restart" across every track where the
iteration after it starts (the iterations it runs again have their numbers again; the failed
attempt's ops never came back), its cause in its args. Args number iterations as the
timeline does, a run's warm-ups first; a restart's cause and where it runs again from count
from the first measured one, as `run`'s output, the results and the fault timeline do, so
its args also say where that is in the trace's numbering.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from pipeline.files import write_atomic
from pipeline.timeline import FailoverRecord, MessageRecord, Timeline
from pipeline.topology import Direction, Link, Position, Topology, is_tied_link, tied_link

__all__ = ["RestartMark", "to_chrome_trace", "write_chrome_trace"]

_STAGES_PID, _LINKS_PID, _STEPS_PID = 0, 1, 2


class RestartMark(NamedTuple):
    """A checkpoint-restart in a run: before the timeline's iteration record `before` (an
    index into `Timeline.iterations`, the first run after it), and what it followed."""

    before: int
    cause: str


def _us(ms: float) -> float:
    return round(ms * 1000.0, 3)


def to_chrome_trace(
    timeline: Timeline, restarts: Sequence[RestartMark] = (), num_warmup_iterations: int = 0
) -> dict[str, Any]:
    """Processes "stages" (a track per stage and replica: ops), "links" (a track per link
    direction: messages, PP links' then DP links') and "steps" (where an iteration has one);
    replica 0 keeps the plain names ("stage 2", "2-3 forward"); `restarts`: the run's, whose
    first `num_warmup_iterations` iterations were warm-ups."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": _STAGES_PID, "name": "process_name", "args": {"name": "stages"}},
        {"ph": "M", "pid": _LINKS_PID, "name": "process_name", "args": {"name": "links"}},
    ]
    num_replicas = 1 + max((r.replica for r in timeline.ops), default=0)
    grid = Topology(timeline.num_stages, num_replicas)
    for replica, stage_idx in sorted({(r.replica, r.stage) for r in timeline.ops}):
        name = f"stage {stage_idx}" if replica == 0 else f"replica {replica} stage {stage_idx}"
        events.append(
            {
                "ph": "M",
                "pid": _STAGES_PID,
                "tid": grid.index(Position(stage_idx, replica)),
                "name": "thread_name",
                "args": {"name": name},
            }
        )
    for r in timeline.ops:
        events.append(
            {
                "ph": "X",
                "pid": _STAGES_PID,
                "tid": grid.index(Position(r.stage, r.replica)),
                "name": f"{r.kind.value}{r.microbatch}",
                "cat": r.kind.value,
                "ts": _us(r.start_ms),
                "dur": _us(r.end_ms - r.start_ms),
                "args": {"iteration": r.iteration, "microbatch": r.microbatch},
            }
        )
    for swap in timeline.swaps:  # on the track of the position taken, before its ops
        events.append(
            {
                "ph": "X",
                "pid": _STAGES_PID,
                "tid": grid.index(Position(swap.stage_to, swap.replica_to)),
                "name": f"swap from stage {swap.stage_from} replica {swap.replica_from}",
                "cat": "swap",
                "ts": _us(swap.start_ms),
                "dur": _us(swap.end_ms - swap.start_ms),
                "args": {"iteration": swap.iteration, "pid": swap.pid, "bytes": swap.num_bytes},
            }
        )
    events += _step_events(timeline)
    records = timeline.iterations
    for mark in restarts:  # where the next run starts (a restart in the last: its end)
        after = records[mark.before] if mark.before < len(records) else None
        events.append(
            {
                "ph": "i",
                "s": "g",
                "pid": _STAGES_PID,
                "tid": 0,
                "name": "restart",
                "cat": "restart",
                "ts": _us(records[-1].end_ms if after is None else after.start_ms),
                "args": {
                    "cause": mark.cause,
                    "runs again from measured iteration": (
                        None if after is None else after.iteration - num_warmup_iterations
                    ),
                    "runs again from iteration (as ops' args: warm-ups first)": (
                        None if after is None else after.iteration
                    ),
                },
            }
        )
    tracks: dict[str, int] = {}

    def track(link_name: str, replica: int, direction: Direction) -> int:
        """The link direction's track (a PP link of replica r named "ppr:i-(i+1)", the tied
        route of replica r "tiedr:0-(S-1)")."""
        if is_tied_link(link_name, timeline.num_stages):
            name = f"{tied_link(timeline.num_stages, replica or None)} {direction}"
        else:
            link = Link.parse(link_name)
            if link.is_pp and replica:
                link = Link.pp(link.first, replica)
            name = f"{link} {direction}"
        if name not in tracks:
            tracks[name] = len(tracks)
            events.append(
                {
                    "ph": "M",
                    "pid": _LINKS_PID,
                    "tid": tracks[name],
                    "name": "thread_name",
                    "args": {"name": name},
                }
            )
        return tracks[name]

    for msg in timeline.messages:
        events += _message_events(msg, track(msg.link, msg.replica, msg.direction))
    for msg in timeline.dp_messages:
        events += _message_events(msg, track(msg.link, msg.replica, msg.direction), "c")
    for failover in timeline.failovers:
        tid = track(failover.link, failover.replica, failover.direction)
        events.append(_failover_event(failover, tid))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(
    timeline: Timeline,
    path: str | Path,
    restarts: Sequence[RestartMark] = (),
    num_warmup_iterations: int = 0,
) -> None:
    write_atomic(path, json.dumps(to_chrome_trace(timeline, restarts, num_warmup_iterations)))


def _step_events(timeline: Timeline) -> list[dict[str, Any]]:
    """The "steps" process's track: a slice per iteration with a step, from its last op's end
    to its end (none without one: no process either)."""
    steps = [r for r in timeline.iterations if r.step_time_ms > 0]
    if not steps:
        return []
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": _STEPS_PID, "name": "process_name", "args": {"name": "steps"}},
        {"ph": "M", "pid": _STEPS_PID, "tid": 0, "name": "thread_name", "args": {"name": "step"}},
    ]
    for r in steps:
        events.append(
            {
                "ph": "X",
                "pid": _STEPS_PID,
                "tid": 0,
                "name": "step",
                "cat": "step",
                "ts": _us(r.end_ms - r.step_time_ms),
                "dur": _us(r.step_time_ms),
                "args": {"iteration": r.iteration, "step_time_ms": r.step_time_ms},
            }
        )
    return events


def _message_events(msg: MessageRecord, tid: int, prefix: str = "m") -> list[dict[str, Any]]:
    """A message on its link's track: a slice "m3" from its send's start to its arrival, and
    an instant "m3 needed" when the op that takes it in asked for it (`prefix` "c" for a DP
    ring's chunks, numbered along their link direction)."""
    args = {
        "iteration": msg.iteration,
        "bytes": msg.num_bytes,
        "send_end_ms": msg.send_end_ms,
        "arrival_ms": msg.arrival_ms,
        "needed_ms": msg.needed_ms,
        "fault_ms": msg.fault_ms,
    }
    in_flight = {
        "ph": "X",
        "pid": _LINKS_PID,
        "tid": tid,
        "name": f"{prefix}{msg.microbatch}",
        "cat": msg.direction,
        "ts": _us(msg.send_start_ms),
        # Never negative, even where two hosts' clocks disagree (torchrun).
        "dur": _us(max(msg.arrival_ms - msg.send_start_ms, 0.0)),
        "args": args,
    }
    needed = {
        "ph": "i",
        "s": "t",
        "pid": _LINKS_PID,
        "tid": tid,
        "name": f"{prefix}{msg.microbatch} needed",
        "cat": msg.direction,
        "ts": _us(msg.needed_ms),
        "args": args,
    }
    return [in_flight, needed]


def _failover_event(failover: FailoverRecord, tid: int) -> dict[str, Any]:
    """A delegate's move to another NIC: an instant on its link direction's track when it
    noticed the failure."""
    f = failover
    return {
        "ph": "i",
        "s": "t",
        "pid": _LINKS_PID,
        "tid": tid,
        "name": f"failover {f.nic_from} -> {f.nic_to}",
        "cat": "failover",
        "ts": _us(f.noticed_ms),
        "args": {
            "iteration": f.iteration,
            "cause": f.cause,
            "nic_from": f.nic_from,
            "nic_to": f.nic_to,
            "noticed_ms": f.noticed_ms,
            "resumed_ms": f.resumed_ms,
            "resume_seq": f.resume_seq,
            "carrier_pid": f.carrier_pid,
        },
    }
