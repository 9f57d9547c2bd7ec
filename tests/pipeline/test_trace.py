from pipeline.profile import Profile
from pipeline.schedule import Schedule
from pipeline.simulator import CommMode, simulate
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
