import dataclasses

from baselines import one_f_one_b
from pipeline.profile import Profile
from pipeline.schedule import Schedule
from pipeline.simulator import CommMode, simulate
from pipeline.timeline import FailoverRecord, Timeline
from pipeline.topology import Link, tied_link
from pipeline.trace import RestartMark, to_chrome_trace


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


def _failover_tracks(trace: dict) -> tuple[dict[int, str], list[dict]]:
    """The trace's message tracks by id, and its failover events."""
    tracks = {
        e["tid"]: e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["pid"] == 1 and e["name"] == "thread_name"
    }
    return tracks, [e for e in trace["traceEvents"] if e.get("cat") == "failover"]


def test_a_failover_is_an_instant_on_its_link_direction_s_track() -> None:
    profile = Profile.uniform(2, 2, 10, 10, 10)
    schedule = Schedule.from_text([["F0", "F1", "BW0", "BW1"], ["F0", "BW0", "F1", "BW1"]])
    healthy = simulate(schedule, profile, CommMode.DELEGATED)
    failovers = (
        FailoverRecord(0, "0-1", "forward", 0, "link state", "rnic0", "rnic1", 12.5, 13.0, 1, 7),
        FailoverRecord(0, "0-1", "backward", 1, "notice", "rnic0", "rnic1", 30.0, 31.5, -1, 8),
    )
    trace = to_chrome_trace(dataclasses.replace(healthy, failovers=failovers))
    tracks, moves = _failover_tracks(trace)
    assert [(tracks[e["tid"]], e["name"], e["ts"], e["ph"], e["s"]) for e in moves] == [
        ("0-1 forward", "failover rnic0 -> rnic1", 12_500.0, "i", "t"),
        ("pp1:0-1 backward", "failover rnic0 -> rnic1", 30_000.0, "i", "t"),
    ]
    assert moves[0]["args"] == {
        "iteration": 0, "cause": "link state", "nic_from": "rnic0", "nic_to": "rnic1",
        "noticed_ms": 12.5, "resumed_ms": 13.0, "resume_seq": 1, "carrier_pid": 7,
    }  # fmt: skip


def test_a_failover_on_the_tied_route_is_on_a_track_of_its_own() -> None:
    # The runtime names the tied route "tied:0-2" at S=3 (`tied_link`), every replica.
    profile = Profile.uniform(3, 3, 10, 10, 10, num_replicas=2, allreduce_bytes=4096)
    healthy = simulate(one_f_one_b(profile), profile, CommMode.DELEGATED)
    failovers = tuple(
        FailoverRecord(0, tied_link(3), "forward", r, "notice", "rnic0", "rnic1", 5, 6, -1, 7)
        for r in (0, 1)
    )
    trace = to_chrome_trace(dataclasses.replace(healthy, failovers=failovers))
    tracks, moves = _failover_tracks(trace)
    assert [tracks[e["tid"]] for e in moves] == ["tied:0-2 forward", "tied1:0-2 forward"]


def test_the_dp_ring_s_messages_and_the_step_are_on_their_own_tracks() -> None:
    # S=2, D=2, 4 buckets, 10 ms on stage 1's DP link (direct): each direction of dp1:0-1
    # sends 2 (D-1) x 4 = 8 chunks, one after another, 10 ms each; the step takes the
    # iteration from its last op's end (15 ms) to 93 ms.
    profile = Profile(
        num_stages=2, num_microbatches=4, t_f_ms=1, t_b_ms=1, t_w_ms=1, num_replicas=2,
        allreduce_bytes=(4000, 4000), dp_bucket_bytes=1000, dp_delay_ms={Link.dp(1, 0): 10.0},
    )  # fmt: skip
    timeline = simulate(one_f_one_b(profile), profile, CommMode.DIRECT)
    assert len(timeline.dp_messages) == 32
    assert (timeline.iterations[0].end_ms, timeline.iterations[0].step_time_ms) == (93.0, 78.0)
    trace = to_chrome_trace(timeline)
    names = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    assert sorted(n for n in names.values() if n.startswith(("dp", "step"))) == [
        "dp0:0-1 backward", "dp0:0-1 forward", "dp1:0-1 backward", "dp1:0-1 forward", "step",
    ]  # fmt: skip
    processes = {
        e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"
    }
    assert processes == {0: "stages", 1: "links", 2: "steps"}
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    chunks = [e for e in slices if names[e["pid"], e["tid"]].startswith("dp")]
    assert len(chunks) == 32 and {e["name"] for e in chunks} == {f"c{k}" for k in range(8)}
    slow = [
        (e["name"], e["ts"], e["dur"]) for e in chunks if names[1, e["tid"]] == "dp1:0-1 forward"
    ]
    assert slow == [(f"c{k}", 13_000.0 + 10_000.0 * k, 10_000.0) for k in range(8)]
    needed = [e for e in trace["traceEvents"] if e["ph"] == "i" and e["name"] == "c7 needed"]
    assert len(needed) == 4 and all(e["cat"] in ("forward", "backward") for e in needed)
    (step,) = [e for e in slices if names[e["pid"], e["tid"]] == "step"]
    assert (step["pid"], step["ts"], step["dur"]) == (2, 15_000.0, 78_000.0)  # "steps"
    assert step["args"] == {"iteration": 0, "step_time_ms": 78.0}
    assert max(e["ts"] + e["dur"] for e in slices) == 93_000.0  # the last ends with the step


def test_a_run_without_a_step_has_no_steps_process() -> None:
    profile = Profile.uniform(2, 2, 1, 1, 1)
    timeline = simulate(one_f_one_b(profile), profile, CommMode.DIRECT)
    assert timeline.iterations[0].step_time_ms == 0 and not timeline.dp_messages
    names = [e["args"]["name"] for e in to_chrome_trace(timeline)["traceEvents"] if e["ph"] == "M"]
    assert names == ["stages", "links", "stage 0", "stage 1", "0-1 forward", "0-1 backward"]


def test_a_restart_is_an_instant_across_the_tracks_where_the_next_run_starts() -> None:
    """Three iterations of a timeline, a restart before the third (the first two ended
    before it) and one after the last: each an instant of global scope at the start of
    the iteration after it (the last's at its end), its cause in its args."""
    profile = Profile.uniform(2, 2, 1, 1, 1)
    schedule = one_f_one_b(profile)
    parts = [
        simulate(schedule, profile, iteration=k, start_ms=start_ms)
        for k, start_ms in ((0, 0.0), (1, 100.0), (1, 200.0))
    ]
    timeline = Timeline.concat(parts)
    marks = [RestartMark(2, "LinkFailure: iteration 0: down"), RestartMark(3, "asked")]
    events = to_chrome_trace(timeline, marks, num_warmup_iterations=1)["traceEvents"]
    restarts = [e for e in events if e.get("cat") == "restart"]
    assert [(e["ph"], e["s"], e["name"], e["ts"]) for e in restarts] == [
        ("i", "g", "restart", 200_000.0),
        ("i", "g", "restart", timeline.iterations[2].end_ms * 1000.0),
    ]
    # The cause counts from the first measured iteration (as `run` says it), the ops from
    # the warm-up: it said "iteration 0" and "runs again from iteration: 1" of one iteration.
    assert [e["args"] for e in restarts] == [
        {
            "cause": "LinkFailure: iteration 0: down",
            "runs again from measured iteration": 0,
            "runs again from iteration (as ops' args: warm-ups first)": 1,
        },
        {
            "cause": "asked",
            "runs again from measured iteration": None,
            "runs again from iteration (as ops' args: warm-ups first)": None,
        },
    ]
    again = [e for e in events if e.get("cat") == "F" and e["ts"] >= 200_000.0]
    assert {e["args"]["iteration"] for e in again} == {1}
    assert not [e for e in to_chrome_trace(timeline)["traceEvents"] if e.get("cat") == "restart"]
