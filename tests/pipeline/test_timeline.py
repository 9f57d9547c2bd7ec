import dataclasses
import json
from typing import Any

import pytest

from baselines import one_f_one_b
from pipeline.errors import ConfigError
from pipeline.profile import Profile
from pipeline.simulator import CommMode, simulate
from pipeline.timeline import (
    SCHEMA_VERSION,
    FailoverRecord,
    IterationRecord,
    MessageRecord,
    SwapRecord,
    Timeline,
)
from pipeline.topology import tied_link


def _timeline() -> Timeline:
    profile = Profile.uniform(
        2,
        4,
        1,
        2,
        1,
        delay_ms=(3.0,),
        num_replicas=2,
        allreduce_bytes=1_000_000,
        dp_bandwidth_gbps=8.0,
    )
    return simulate(one_f_one_b(profile), profile, CommMode.DIRECT)


def test_messages_carry_arrival_and_need_through_json() -> None:
    timeline = _timeline()
    assert SCHEMA_VERSION == 7
    assert MessageRecord._fields[7:] == (
        "arrival_ms",
        "needed_ms",
        "replica",
        "fault_ms",
        "wire_start_ms",
        "copy_in_ms",
        "carrier_pid",
    )
    assert all(m.wire_start_ms == m.send_start_ms for m in timeline.messages)  # direct
    assert {m.replica for m in timeline.messages} == {0, 1}
    assert {m.fault_ms for m in timeline.messages} == {3.0}  # the profile's delay
    data = json.loads(json.dumps(timeline.to_dict()))
    assert data["schema_version"] == SCHEMA_VERSION
    assert Timeline.from_dict(data) == timeline


def test_the_dp_rings_messages_are_records_of_their_own_through_json_and_moves() -> None:
    """S=2, D=2, 1 MB per stage in one bucket: each stage's DP link carries 2 chunks of
    500 kB per direction (reduce-scatter, all-gather), sent by replica 0 forward and by
    replica 1 backward, in index order, each arriving after it went and before its
    receiver forwards it."""
    timeline = _timeline()
    dp = timeline.dp_messages
    assert sorted((m.link, m.direction, m.replica, m.microbatch) for m in dp) == sorted(
        (f"dp{stage}:0-1", direction, replica, index)
        for stage in range(2)
        for direction, replica in (("forward", 0), ("backward", 1))
        for index in range(2)
    )
    assert {m.num_bytes for m in dp} == {500_000}
    assert all(m.send_start_ms < m.send_end_ms <= m.arrival_ms for m in dp)
    assert all(m.wire_start_ms == m.send_start_ms and m.fault_ms == 0.0 for m in dp)
    data = json.loads(json.dumps(timeline.to_dict()))
    assert len(data["dp_messages"]) == 8
    assert Timeline.from_dict(data) == timeline
    alone = timeline.one_iteration(0)
    assert alone.dp_messages == tuple(
        m._replace(
            send_start_ms=m.send_start_ms - timeline.iterations[0].start_ms,
            send_end_ms=m.send_end_ms - timeline.iterations[0].start_ms,
            arrival_ms=m.arrival_ms - timeline.iterations[0].start_ms,
            needed_ms=m.needed_ms - timeline.iterations[0].start_ms,
            wire_start_ms=m.wire_start_ms - timeline.iterations[0].start_ms,
        )
        for m in dp
    )
    assert alone.moved(5, 100.0).dp_messages == tuple(
        m._replace(
            iteration=5,
            send_start_ms=m.send_start_ms + 100.0,
            send_end_ms=m.send_end_ms + 100.0,
            arrival_ms=m.arrival_ms + 100.0,
            needed_ms=m.needed_ms + 100.0,
            wire_start_ms=m.wire_start_ms + 100.0,
        )
        for m in alone.dp_messages
    )
    assert Timeline.concat([timeline, timeline]).dp_messages == dp + dp


def test_failovers_go_through_json_and_with_their_iteration() -> None:
    moved = FailoverRecord(0, "1-2", "forward", 1, "link state", "rnic0", "rnic1", 4.0, 9.5, 3, 7)
    timeline = dataclasses.replace(_timeline(), failovers=(moved,))
    data = json.loads(json.dumps(timeline.to_dict()))
    assert data["failovers"] == [
        [0, "1-2", "forward", 1, "link state", "rnic0", "rnic1", 4.0, 9.5, 3, 7]
    ]
    assert Timeline.from_dict(data) == timeline
    start = timeline.iterations[0].start_ms
    alone = timeline.one_iteration(0).failovers
    assert alone == (moved._replace(noticed_ms=4.0 - start, resumed_ms=9.5 - start),)
    later = timeline.one_iteration(0).moved(5, 100.0).failovers
    assert later == (
        moved._replace(iteration=5, noticed_ms=104.0 - start, resumed_ms=109.5 - start),
    )
    assert Timeline.concat([timeline, timeline]).failovers == (moved, moved)


def test_a_failover_on_the_tied_route_goes_through_json() -> None:
    """A delegated megatron run's tied-embedding route fails over like any other and the
    pool records it under the route's name ("tied:0-3" at S=4): its timeline reads back.
    The name is a failover's only, and only the one of the timeline's stages."""
    tied = FailoverRecord(
        2, tied_link(4), "backward", 1, "notice", "rnic0", "rnic1", 4.0, 9.5, -1, 7
    )
    assert tied.link == "tied:0-3"
    timeline = Timeline(
        4, (), (), (IterationRecord(2, 0.0, 10.0, 1.0, (11, 12, 13, 14, 15, 16, 17, 18)),),
        failovers=(tied,),
    )  # fmt: skip
    data = json.loads(json.dumps(timeline.to_dict()))
    assert data["failovers"][0][1] == "tied:0-3"
    assert Timeline.from_dict(data) == timeline
    assert Timeline.from_dict(timeline.to_dict()) == timeline  # in-process: pids a list too
    for other in ("tied:0-2", "tied1:0-3", "tied:1-3"):  # another S's, or not the runtime's
        data["failovers"][0][1] = other
        with pytest.raises(ConfigError, match=rf"failovers\[0\]: link '{other}' is not a link"):
            Timeline.from_dict(data)
    data = json.loads(json.dumps(timeline.to_dict()))
    data["messages"] = [[2, "tied:0-3", "forward", 0, 8, 0.0, 1.0, 2.0, 2.0, 0, 0.0, 0.0, 0.0, 7]]
    with pytest.raises(ConfigError, match=r"messages\[0\]: link 'tied:0-3' is not a link"):
        Timeline.from_dict(data)


def test_swaps_go_through_json_and_with_their_iteration() -> None:
    swap = SwapRecord(0, 4242, 1, 0, 0, 1, 65536, 2.0, 7.5)
    timeline = dataclasses.replace(_timeline(), swaps=(swap,))
    data = json.loads(json.dumps(timeline.to_dict()))
    assert data["swaps"] == [[0, 4242, 1, 0, 0, 1, 65536, 2.0, 7.5]]
    assert Timeline.from_dict(data) == timeline
    start = timeline.iterations[0].start_ms
    alone = timeline.one_iteration(0)
    assert alone.swaps == (swap._replace(start_ms=2.0 - start, end_ms=7.5 - start),)
    assert alone.moved(3, 50.0).swaps == (
        swap._replace(iteration=3, start_ms=52.0 - start, end_ms=57.5 - start),
    )
    assert Timeline.concat([timeline, timeline]).swaps == (swap, swap)


def test_an_older_timeline_is_refused() -> None:
    data = _timeline().to_dict()
    # Version 3 rows had no wire_start_ms, copy_in_ms and carrier_pid.
    old = {**data, "schema_version": 3, "messages": [r[:-3] for r in data["messages"]]}
    with pytest.raises(ConfigError, match=r"schema version 3 is not supported \(expected 7\)"):
        Timeline.from_dict(old)


def test_a_row_short_of_a_field_is_refused() -> None:
    data = _timeline().to_dict()
    short = {**data, "messages": [data["messages"][0][:10], *data["messages"][1:]]}
    with pytest.raises(ConfigError, match=r"messages\[0\] must be a list of the 14 fields"):
        Timeline.from_dict(short)
    with pytest.raises(ConfigError, match=r"ops\[1\] must be a list of the 7 fields"):
        Timeline.from_dict({**data, "ops": [data["ops"][0], "F0"]})


def _damaged(data: dict[str, Any], key: str, index: int, field: int, value: Any) -> dict[str, Any]:
    rows = [list(r) for r in data[key]]
    rows[index][field] = value
    return {**data, key: rows}


_DAMAGES: list[tuple[str, Any, str]] = [
    ("a list", lambda d: [d], "a timeline must be a JSON object, got list"),
    ("no ops", lambda d: {k: v for k, v in d.items() if k != "ops"}, r"missing key\(s\) ops"),
    ("ops a number", lambda d: {**d, "ops": 5}, "ops must be a list of rows, got int"),
    ("0 stages", lambda d: {**d, "num_stages": 0}, "num_stages is 0, not a count >= 1"),
    (
        "an unknown op kind",
        lambda d: _damaged(d, "ops", 2, 2, "X"),
        r"ops\[2\]: kind is 'X', not an op kind F, B, W or BW: damaged\?",
    ),
    (
        "pids a number",
        lambda d: _damaged(d, "iterations", 0, 4, 7),
        r"iterations\[0\]: pids is 7, not a list of pids",
    ),
    (
        "a time a string",
        lambda d: _damaged(d, "messages", 1, 7, "5"),
        r"messages\[1\]: arrival_ms is '5', not a finite number",
    ),
    (
        "a nan time",
        lambda d: _damaged(d, "dp_messages", 3, 5, float("nan")),
        r"dp_messages\[3\]: send_start_ms is nan, not a finite number",
    ),
    (
        "a fractional stage",
        lambda d: _damaged(d, "ops", 0, 1, 1.5),
        r"ops\[0\]: stage is 1.5, not a whole number",
    ),
    (
        "a boolean replica",
        lambda d: _damaged(d, "ops", 0, 6, True),
        r"ops\[0\]: replica is True, not a whole number",
    ),
    (
        "an unknown link",
        lambda d: _damaged(d, "messages", 4, 1, "zz"),
        r"messages\[4\]: link 'zz' is not a link",
    ),
    (
        "an unknown direction",
        lambda d: _damaged(d, "dp_messages", 2, 2, "up"),
        r"dp_messages\[2\]: direction is 'up', not forward or backward",
    ),
]


@pytest.mark.parametrize(
    ("damage", "message"), [d[1:] for d in _DAMAGES], ids=[d[0] for d in _DAMAGES]
)
def test_a_damaged_timeline_is_refused_naming_the_field(damage: Any, message: str) -> None:
    data = json.loads(json.dumps(_timeline().to_dict()))
    assert Timeline.from_dict(data) == _timeline()  # undamaged, it is read
    with pytest.raises(ConfigError, match=message):
        Timeline.from_dict(damage(data))


def test_one_iteration_counts_from_its_own_start() -> None:
    profile = Profile.uniform(2, 2, 1, 1, 1)
    first = simulate(one_f_one_b(profile), profile, CommMode.DIRECT)
    later = simulate(one_f_one_b(profile), profile, CommMode.DIRECT, iteration=1, start_ms=100.0)
    alone = Timeline.concat([first, later]).one_iteration(1)
    assert alone.iterations == (first.iterations[0]._replace(iteration=1),)
    assert alone.ops == tuple(r._replace(iteration=1) for r in first.ops)
    assert alone.messages == tuple(r._replace(iteration=1) for r in first.messages)
    with pytest.raises(ValueError, match="timeline has no iteration 2"):
        alone.one_iteration(2)


def test_split_undoes_concat_records_of_every_kind_included() -> None:
    first = _timeline()
    moved = FailoverRecord(1, "0-1", "forward", 1, "link state", "rnic0", "rnic1", 4.0, 9.5, 3, 7)
    swap = SwapRecord(1, 4242, 1, 0, 0, 1, 65536, 2.0, 7.5)
    moved_copy = first.one_iteration(0).moved(1, 500.0)
    later = Timeline(  # made, not a moved copy: its records then compare as tuples
        moved_copy.num_stages, moved_copy.ops, moved_copy.messages, moved_copy.iterations,
        (moved,), moved_copy.dp_messages, (swap,),
    )  # fmt: skip
    parts = Timeline.concat([first, later]).split()
    assert parts == [first, later]
    assert parts[1].dp_messages and parts[1].failovers == (moved,)
    with pytest.raises(ValueError, match="timeline has an iteration twice"):
        Timeline.concat([first, first]).split()
    stray = dataclasses.replace(first, swaps=(swap,))  # of iteration 1, which it lacks
    with pytest.raises(ValueError, match="a record of iteration 1, which it lacks"):
        stray.split()
