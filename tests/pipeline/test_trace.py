import dataclasses

from pipeline.profile import Profile
from pipeline.schedule import Schedule
from pipeline.simulator import CommMode, simulate
from pipeline.timeline import FailoverRecord
from pipeline.trace import to_chrome_trace


def test_a_message_is_a_slice_to_its_arrival_and_an_instant_when_needed() -> None:
    # Ideal, 5 ms on the link: F1's activation arrives at 25 ms, stage 1 asks for it at 45.
    profile = Profile.uniform(2, 2, 10, 10, 10, delay_ms=(5.0,))
    schedule = Schedule.from_text([["F0", "F1", "BW0", "BW1"], ["F0", "BW0", "F1", "BW1"]])
    trace = to_chrome_trace(simulate(schedule, profile, CommMode.IDEAL))
    tracks = {
        e["args"]["name"]: e["tid"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["pid"] == 1 and e["name"] == "thread_name"
    }
    forward = [
        e
        for e in trace["traceEvents"]
        if e["ph"] in ("X", "i") and e["pid"] == 1 and e["tid"] == tracks["0-1 forward"]
    ]
    (in_flight,) = [e for e in forward if e["ph"] == "X" and e["name"] == "m1"]
    (needed,) = [e for e in forward if e["ph"] == "i" and e["name"] == "m1 needed"]
    assert (in_flight["ts"], in_flight["dur"]) == (20_000.0, 5_000.0)  # microseconds
    assert needed["ts"] == 45_000.0 and needed["s"] == "t"
    assert in_flight["args"]["arrival_ms"] == 25.0 and in_flight["args"]["needed_ms"] == 45.0
    # Every message has one of each.
    assert sum(e["ph"] == "i" for e in trace["traceEvents"]) == 2 * 2


def test_a_failover_is_an_instant_on_its_link_direction_s_track() -> None:
    profile = Profile.uniform(2, 2, 10, 10, 10)
    schedule = Schedule.from_text([["F0", "F1", "BW0", "BW1"], ["F0", "BW0", "F1", "BW1"]])
    healthy = simulate(schedule, profile, CommMode.DELEGATED)
    failovers = (
        FailoverRecord(0, "0-1", "forward", 0, "link state", "rnic0", "rnic1", 12.5, 13.0, 1, 7),
        FailoverRecord(0, "0-1", "backward", 1, "notice", "rnic0", "rnic1", 30.0, 31.5, -1, 8),
    )
    trace = to_chrome_trace(dataclasses.replace(healthy, failovers=failovers))
    tracks = {
        e["tid"]: e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["pid"] == 1 and e["name"] == "thread_name"
    }
    moves = [e for e in trace["traceEvents"] if e.get("cat") == "failover"]
    assert [(tracks[e["tid"]], e["name"], e["ts"], e["ph"], e["s"]) for e in moves] == [
        ("0-1 forward", "failover rnic0 -> rnic1", 12_500.0, "i", "t"),
        ("pp1:0-1 backward", "failover rnic0 -> rnic1", 30_000.0, "i", "t"),
    ]
    assert moves[0]["args"] == {
        "iteration": 0, "cause": "link state", "nic_from": "rnic0", "nic_to": "rnic1",
        "noticed_ms": 12.5, "resumed_ms": 13.0, "resume_seq": 1, "carrier_pid": 7,
    }  # fmt: skip
