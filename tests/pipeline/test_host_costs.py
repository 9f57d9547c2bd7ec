"""The calibration file: a host's runtime costs, read strictly."""

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.errors import ConfigError
from pipeline.host_costs import FREE, CostCurve, HostCosts, RingLag

COSTS = {
    "schema_version": 3,
    "send_ms_by_bytes": [[0, 0.2], [1 << 20, 0.6], [1 << 23, 5.0]],
    "receive_lag_ms_by_bytes": [[0, 0.3], [1 << 20, 0.4]],
    "op_overhead_ms": 0.05,
    "host": "h",
    "measured_at": "2026-12-01T00:00:00+00:00",
}

MEASURED = {"op_ms": 2.0, "num_stages": 2, "git_revision": "abc123"}
BY_BYTES = [[1, [[125_000, 0.3], [40_000_000, 8.5]]], [2, [[125_000, 0.4], [40_000_000, 24.8]]]]


def test_round_trip_and_costs(tmp_path: Path) -> None:
    path = tmp_path / "host.json"
    path.write_text(json.dumps(COSTS))
    costs = HostCosts.from_file(path)
    optional = {"copy_out_ms_by_bytes": [], "copy_in_ms_by_bytes": [], "delegate_pickup_ms": 0.0,
                "failover_ms": 0.0, "ring_lag_ms_by_rings": [],
                "delegated_ring_lag_ms_by_rings": []}  # fmt: skip
    assert costs.to_dict() == {**COSTS, **optional}  # measured without delegates: free
    assert HostCosts.from_dict(costs.to_dict()) == costs
    assert costs.send_ms(0) == 0.2 and costs.send_ms(1 << 19) == pytest.approx(0.4)
    # between measured sizes: linear; past the last: the last segment's slope
    assert costs.send_ms(1 << 22) == pytest.approx(0.6 + 4.4 * 3 / 7)
    assert costs.send_ms(1 << 24) == pytest.approx(5.0 + 4.4 * 8 / 7)
    assert costs.receive_lag_for_ms(1 << 21) == pytest.approx(0.5)
    assert FREE.send_ms(1 << 30) == FREE.receive_lag_for_ms(1 << 30) == 0.0


@given(
    st.lists(
        st.tuples(st.integers(0, 1 << 24), st.floats(0, 100)), min_size=1, max_size=6,
        unique_by=lambda point: point[0],
    ),
    st.integers(0, 1 << 26),
)  # fmt: skip
def test_a_cost_curve_passes_through_its_points_and_never_goes_below_zero(
    points: list[tuple[int, float]], num_bytes: int
) -> None:
    curve = CostCurve(tuple(sorted(points)))
    for size, ms in points:
        assert curve.ms(size) == pytest.approx(ms)
    low, high = min(ms for _, ms in points), max(ms for _, ms in points)
    if num_bytes <= max(size for size, _ in points):  # inside: between its costs
        assert low - 1e-9 <= curve.ms(num_bytes) <= high + 1e-9
    else:  # past the last point it never falls
        assert curve.ms(num_bytes) >= curve.ms(max(size for size, _ in points)) - 1e-9
    assert CostCurve(tuple((size, ms) for size, ms in curve.to_json())) == curve


def test_a_flat_tail_still_grows_past_the_last_size() -> None:
    """A calibration whose 8 MiB mean came out below its 4 MiB mean (noise) pools the two
    into a flat last segment: past 8 MiB the cost grows at the slope across the pool (from
    the last size that costs less), not the flat segment's 0, which charged 16 MiB and 40 MB
    what 8 MiB cost."""
    mib = 1 << 20
    synthetic = CostCurve(((0, 0.14), (1 << 16, 0.2), (1 << 18, 0.3), (mib, 0.55),
                           (4 * mib, 2.55), (8 * mib, 2.55)))  # fmt: skip
    assert synthetic.ms(8 * mib) == 2.55
    assert synthetic.ms(16 * mib) == pytest.approx(2.55 + 2.0 / 7 * 8)  # 4.836, was 2.55
    assert synthetic.ms(40_000_000) == pytest.approx(
        2.55 + 2.0 / (7 * mib) * (40_000_000 - 8 * mib)
    )
    # a loaded 2-core host's `calibrate --repeats 1 --stages 2 --op-ms 2` (rounded)
    costs = HostCosts.from_dict({
        **COSTS,
        "send_ms_by_bytes": [[0, 0.214], [1 << 16, 0.214], [1 << 18, 0.226], [mib, 1.0],
                             [4 * mib, 8.664], [8 * mib, 8.664]],
        "receive_lag_ms_by_bytes": [[0, 0.263], [1 << 16, 0.263], [1 << 18, 0.263],
                                    [mib, 1.504], [4 * mib, 2.536], [8 * mib, 2.536]],
    })  # fmt: skip
    assert costs.send_ms(16 * mib) == pytest.approx(8.664 + 7.664 / 7 * 8)  # 17.42, was 8.664
    assert costs.receive_lag_for_ms(16 * mib) == pytest.approx(2.536 + 1.032 / 7 * 8)  # was 2.536
    # a rising last segment keeps its slope; a curve with nothing below its last stays flat
    assert CostCurve(((0, 1.0), (mib, 2.0), (2 * mib, 4.0))).ms(3 * mib) == pytest.approx(6.0)
    assert CostCurve(((0, 1.0), (mib, 1.0))).ms(8 * mib) == 1.0
    assert CostCurve.line(0.3).ms(1 << 30) == 0.3


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schema_version": 1}, "schema_version 1 is not supported"),
        ({"schema_version": 2}, "schema_version 2 is not supported.*calibrate` again"),
        ({"send_ms_by_bytes": [[0, -1]]}, "send_ms_by_bytes must be finite and in 0..3600000"),
        # an hour at most, as a profile's times: 1e308 made an iteration of inf ms
        ({"op_overhead_ms": 1e308}, "op_overhead_ms must be finite and in 0..3600000 ms"),
        ({"failover_ms": 3_600_001}, "failover_ms must be finite and in 0..3600000 ms"),
        ({"send_ms_by_bytes": [[0, 1.0], [1, 1e300]]}, "send_ms_by_bytes must be finite and in"),
        ({"send_ms_by_bytes": [[5, 1.0], [0, 1.0]]}, "sizes must rise from >= 0"),
        ({"send_ms_by_bytes": [[0.5, 1.0]]}, "a size must be a whole number of bytes"),
        ({"send_ms_by_bytes": [[0, 1.0, 2]]}, "is not a \\[bytes, ms\\] pair"),
        ({"send_ms_by_bytes": 0.2}, "must be a list of \\[bytes, ms\\] pairs"),
        ({"op_overhead_ms": float("nan")}, "op_overhead_ms must be finite"),
        ({"receive_lag_ms_by_bytes": [[0, "fast"]]}, "receive_lag_ms_by_bytes must be a number"),
        ({"receive_lag_ms_by_bytes": [[0, True]]}, "receive_lag_ms_by_bytes must be a number"),
        ({"colour": "red"}, r"unknown key\(s\) \['colour'\]"),
        ({"op_overhead_ms": None}, "op_overhead_ms must be a number"),
        ({"ring_lag_ms_by_rings": [[1, -0.5]]}, "ring_lag_ms_by_rings must be finite and in 0"),
        ({"ring_lag_ms_by_rings": [[1.5, 0.5]]}, "a size must be a whole number of rings"),
        ({"ring_lag_ms": 0.5}, r"unknown key\(s\) \['ring_lag_ms'\]"),  # schema 2's
        # malformed files that used to be read (a dict made a string, 3.0 taken for 3)
        ({"host": {"name": "h"}}, r"host must be a string, got \{'name': 'h'\}"),
        ({"measured_at": 20261201}, "measured_at must be a string, got 20261201"),
        ({"schema_version": 3.0}, "schema_version must be a whole number, got 3.0"),
        ({"schema_version": True}, "schema_version must be a whole number, got True"),
        ({"schema_version": "3"}, "schema_version must be a whole number, got '3'"),
        (
            {"send_ms_by_bytes": [[0, 5.0], [1048576, 0.1]]},
            "send_ms_by_bytes falls from 5.0 ms at 0 bytes to 0.1 ms at 1048576",
        ),
        (
            {"receive_lag_ms_by_bytes": [[0, 0.3], [1 << 20, 0.4], [1 << 23, 0.35]]},
            "receive_lag_ms_by_bytes falls from 0.4 ms",
        ),
        ({"send_ms_by_bytes": [[8388608, 4.6]]}, "send_ms_by_bytes must start at 0 bytes.*8388608"),
        ({"ring_lag_ms_by_rings": [[0, 0.1], [1, 0.2]]}, "must start at 1 rings.*got 0"),
        ({"ring_lag_ms_by_rings": [[2, 0.5]]}, "ring_lag_ms_by_rings must start at 1 rings"),
        ({"delegated_ring_lag_ms_by_rings": [[1, 0.9], [4, 0.2]]}, "falls from 0.9 ms at 1 rings"),
        ({"copy_in_ms_by_bytes": [[4096, 0.1]]}, "copy_in_ms_by_bytes must start at 0 bytes"),
    ],
)
def test_bad_calibrations_are_refused(tmp_path: Path, change: dict, message: str) -> None:
    path = tmp_path / "host.json"
    path.write_text(json.dumps({**COSTS, **change}))
    with pytest.raises(ConfigError, match=message):
        HostCosts.from_file(path)


def test_a_file_without_a_schema_version_is_named_not_a_calibration(tmp_path: Path) -> None:
    """A profile given as --calibration was 'schema_version must be a whole number, got
    None': the key is missing, not null, and the file is likely another kind."""
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"stages": 2, "microbatches": 4, "t_f": 1, "t_b": 1, "t_w": 1}))
    with pytest.raises(
        ConfigError,
        match=r"has none \(its keys: microbatches, stages, t_b, "
        r"t_f, t_w\): not a calibration file\?",
    ) as caught:
        HostCosts.from_file(path)
    assert "got None" not in str(caught.value)
    with pytest.raises(ConfigError, match="whole number, got None"):
        HostCosts.from_dict({**COSTS, "schema_version": None})  # given as null: said so


def test_curves_that_calibrate_writes_are_read() -> None:
    """Flat stretches (pooled means), one point at the smallest size, and no points at all are
    a measured file's shapes; they are read as written."""
    flat = CostCurve.parse([[0, 0.2], [1 << 16, 0.2], [1 << 20, 0.6]], "send_ms_by_bytes")
    assert flat.points == ((0, 0.2), (1 << 16, 0.2), (1 << 20, 0.6))
    assert CostCurve.parse([[1, 0.25]], "ring_lag_ms_by_rings", "rings").ms(4) == 0.25
    assert CostCurve.parse([], "copy_in_ms_by_bytes") == CostCurve()


def test_a_missing_cost_or_file_is_named(tmp_path: Path) -> None:
    data = dict(COSTS)
    del data["receive_lag_ms_by_bytes"]
    (tmp_path / "host.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"missing \['receive_lag_ms_by_bytes'\]"):
        HostCosts.from_file(tmp_path / "host.json")
    with pytest.raises(ConfigError, match="cannot read calibration"):
        HostCosts.from_file(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="is not valid JSON"):
        HostCosts.from_file(tmp_path / "bad.json")


def test_the_delegated_paths_costs_in_the_simulator() -> None:
    """A delegated message holds its sender for the copy out, waits the pick-up, is there the
    wire and the delegate's transfer later (here the direct path's send and receive, 0), and
    its op, which waited, starts after the copy in (a 2-stage pipeline, one microbatch)."""
    from baselines import one_f_one_b
    from pipeline.profile import Profile
    from pipeline.simulator import CommMode, simulate

    host = HostCosts(
        copy_out_ms_by_bytes=CostCurve.line(0.5, 1.0), delegate_pickup_ms=0.25,
        copy_in_ms_by_bytes=CostCurve.line(0.1, 2.0),
    )  # fmt: skip
    profile = Profile.uniform(2, 2, 10, 10, 10, message_bytes=1 << 20).with_delays([5.0])
    timeline = simulate(one_f_one_b(profile), profile, CommMode.DELEGATED, host=host)
    first = next(m for m in timeline.messages if m.direction == "forward" and m.microbatch == 0)
    assert first.send_end_ms - first.send_start_ms == pytest.approx(1.5)
    assert first.wire_start_ms - first.send_end_ms == pytest.approx(0.25)
    assert first.arrival_ms - first.wire_start_ms == pytest.approx(5.0)
    assert first.copy_in_ms == pytest.approx(2.1)
    consumer = next(r for r in timeline.ops if (r.stage, r.kind.value, r.microbatch) == (1, "F", 0))
    assert consumer.start_ms == pytest.approx(first.arrival_ms + 2.1)
    # a measured transfer: the message is there 0.75 ms after the wire
    measured = dataclasses.replace(host, delegate_transfer_ms_by_bytes=CostCurve.line(0.75))
    timeline = simulate(one_f_one_b(profile), profile, CommMode.DELEGATED, host=measured)
    first = next(m for m in timeline.messages if m.direction == "forward" and m.microbatch == 0)
    assert first.arrival_ms - first.wire_start_ms == pytest.approx(5.0 + 0.75)


def test_a_delegated_message_is_copied_in_as_it_arrives() -> None:
    """The receiver copies a delegated message in as it arrives: an op that asks for it after
    the copy is done does not wait for it; one that waits starts the copy after its arrival.
    The profile's device copy (`copy_gbps`, the paper's model) stays before the op."""
    from baselines import one_f_one_b
    from pipeline.ops import OpKind
    from pipeline.profile import Profile
    from pipeline.simulator import CommMode, simulate

    host = HostCosts(copy_in_ms_by_bytes=CostCurve.line(3.0))
    profile = Profile.uniform(2, 4, 10, 10, 10, message_bytes=1 << 20)
    free = simulate(one_f_one_b(profile), profile, CommMode.DELEGATED)
    costly = simulate(one_f_one_b(profile), profile, CommMode.DELEGATED, host=host)
    starts = {(r.stage, r.kind, r.microbatch): r.start_ms for r in costly.ops}
    free_starts = {(r.stage, r.kind, r.microbatch): r.start_ms for r in free.ops}
    # Waited for: stage 1's F0 starts after its activation's copy (13, not 10), so BW0's
    # gradient is back at 43, and stage 0, idle since 20, starts BW0 after its copy: 46.
    assert free_starts[0, OpKind.BW, 0] == 40.0 and starts[0, OpKind.BW, 0] == 46.0
    # Not waited for: F1's activation arrived at 20 and was copied by 23, while stage 1 ran
    # BW0 until 43: F1 starts as BW0 ends, with no copy to wait for.
    for timeline in (free, costly):
        records = {(r.stage, r.kind, r.microbatch): r for r in timeline.ops}
        assert records[1, OpKind.F, 1].start_ms == records[1, OpKind.BW, 0].end_ms
    copy = Profile.uniform(2, 4, 10, 10, 10, message_bytes=1 << 20, copy_gbps=8.0)  # 1.05 ms
    on_device = simulate(one_f_one_b(copy), copy, CommMode.DELEGATED)
    device_starts = {(r.stage, r.kind, r.microbatch): r.start_ms for r in on_device.ops}
    assert device_starts[1, OpKind.F, 1] > free_starts[1, OpKind.F, 1]  # before the op


def test_a_version_5_file_is_written_so_that_it_is_read_back() -> None:
    """With a delegate's transfer the file is version 5, and its ring lags are written by
    chunk size though each is one number per ring count (a version 4 form in a version 5
    file was refused on reading); without one, version 4, its lags by rings alone."""
    lag = [[1, [[0, 0.25]]], [2, [[0, 0.5]]]]
    data = {**COSTS, "schema_version": 5, **MEASURED, "ring_lag_ms_by_rings": lag,
            "delegate_transfer_ms_by_bytes": [[0, 0.3]]}  # fmt: skip
    costs = HostCosts.from_dict(data)
    written = costs.to_dict()
    assert written["schema_version"] == 5 and written["ring_lag_ms_by_rings"] == lag
    assert HostCosts.from_dict(written) == costs
    older = dataclasses.replace(costs, delegate_transfer_ms_by_bytes=CostCurve())
    assert older.to_dict()["schema_version"] == 4
    assert older.to_dict()["ring_lag_ms_by_rings"] == [[1, 0.25], [2, 0.5]]
    assert HostCosts.from_dict(older.to_dict()) == older


def test_a_ring_count_without_a_curve_is_refused() -> None:
    with pytest.raises(ConfigError, match="a CostCurve by chunk bytes, with points"):
        RingLag(((1, CostCurve()),))


def test_a_delegates_transfer_is_measured_or_the_direct_paths(tmp_path: Path) -> None:
    """Version 5 has `delegate_transfer_ms_by_bytes`; without it (a version 4 file, or one
    measured without delegates) a delegate is charged the direct path's send and receive."""
    transfer = [[0, 0.1], [1 << 20, 0.5]]
    costs = HostCosts.from_dict({**COSTS, "schema_version": 5, **MEASURED,
                                 "delegate_transfer_ms_by_bytes": transfer})  # fmt: skip
    assert costs.delegate_transfer_ms(1 << 19) == pytest.approx(0.3)
    assert costs.to_dict()["schema_version"] == 5  # it needs version 5
    assert costs.to_dict()["delegate_transfer_ms_by_bytes"] == transfer
    old = HostCosts.from_dict(COSTS)  # send 0.2 + receive lag 0.3 at 0 B
    assert old.delegate_transfer_ms(0) == pytest.approx(0.5)
    assert "delegate_transfer_ms_by_bytes" not in old.to_dict()
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['delegate_transfer_ms_by_bytes'\]"):
        HostCosts.from_dict({**COSTS, "schema_version": 4, **MEASURED,
                             "delegate_transfer_ms_by_bytes": transfer})  # fmt: skip
    with pytest.raises(ConfigError, match="goes with the calibration's op_ms"):
        dataclasses.replace(old, delegate_transfer_ms_by_bytes=CostCurve.line(0.1)).to_dict()


def test_a_version_4_file_records_what_the_runs_must_match(tmp_path: Path) -> None:
    """op_ms, num_stages and git_revision are kept (version 4); a version 3 file, without
    them, is still read and written back as it was."""
    measured = {**COSTS, "schema_version": 4, "op_ms": 10.0, "num_stages": 4,
                "git_revision": "abc123"}  # fmt: skip
    path = tmp_path / "host.json"
    path.write_text(json.dumps(measured))
    costs = HostCosts.from_file(path)
    assert (costs.op_ms, costs.num_stages, costs.git_revision) == (10.0, 4, "abc123")
    assert HostCosts.from_dict(costs.to_dict()) == costs
    assert costs.to_dict()["schema_version"] == 4
    old = HostCosts.from_dict(COSTS)
    assert (old.op_ms, old.num_stages, old.git_revision) == (None, None, "")
    assert old.to_dict()["schema_version"] == 3 and "op_ms" not in old.to_dict()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schema_version": 4}, r"missing \['op_ms', 'num_stages', 'git_revision'\]"),
        ({"op_ms": 10.0}, r"unknown key\(s\) \['op_ms'\]"),  # version 3 has none
        ({"schema_version": 4, "op_ms": 0, "num_stages": 4, "git_revision": ""}, "op_ms must"),
        ({"schema_version": 4, "op_ms": 2, "num_stages": 2.5, "git_revision": ""}, "whole"),
        ({"schema_version": 4, "op_ms": 2, "num_stages": 4, "git_revision": 7}, "git_revision"),
        ({"schema_version": 6}, "schema_version 6 is not supported.*expected 3, 4, 5"),
        # a ring lag by chunk bytes is version 5's
        (
            {"schema_version": 4, **MEASURED, "ring_lag_ms_by_rings": [[1, [[0, 0.1]]]]},
            "ring_lag_ms_by_rings must be a number",
        ),
    ],
)
def test_bad_version_4_files_are_refused(change: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        HostCosts.from_dict({**COSTS, **change})


def test_a_version_5_file_has_the_rings_lag_by_chunk_size(tmp_path: Path) -> None:
    """Each ring count's lag is a curve by the chunk's bytes: linear between the measured
    sizes and between the ring counts, the last segment's slope beyond either; the file is
    written back as read. A version 4 file's lags (one number per ring count) are the same
    at every chunk size, and it is written back as version 4."""
    measured = {**COSTS, "schema_version": 5, **MEASURED, "ring_lag_ms_by_rings": BY_BYTES}
    path = tmp_path / "host.json"
    path.write_text(json.dumps(measured))
    costs = HostCosts.from_file(path)
    lag = costs.ring_lag(delegated=False)
    assert lag.ms(125_000, 1) == 0.3 and lag.ms(40_000_000, 2) == 24.8
    assert lag.ms(1_000, 1) == 0.3  # below the smallest chunk: its lag
    middle = (125_000 + 40_000_000) // 2
    assert lag.ms(middle, 1) == pytest.approx((0.3 + 8.5) / 2)
    assert lag.ms(40_000_000, 3) == pytest.approx(24.8 + (24.8 - 8.5))  # past 2 rings
    assert lag.ms(80_000_000, 1) == pytest.approx(8.5 + 8.2 * 40_000_000 / 39_875_000)
    assert costs.ring_lag(delegated=True).ms(1 << 20, 4) == 0.0  # not measured: free
    assert costs.to_dict() == {**measured, "copy_out_ms_by_bytes": [], "copy_in_ms_by_bytes": [],
                               "delegate_pickup_ms": 0.0, "failover_ms": 0.0,
                               "delegated_ring_lag_ms_by_rings": [],
                               "delegate_transfer_ms_by_bytes": []}  # fmt: skip
    old = HostCosts.from_dict({**COSTS, "schema_version": 4, **MEASURED,
                               "ring_lag_ms_by_rings": [[1, 0.3], [4, 1.1]]})  # fmt: skip
    assert old.ring_lag(delegated=False).ms(40_000_000, 4) == 1.1
    assert old.to_dict()["schema_version"] == 4
    assert old.to_dict()["ring_lag_ms_by_rings"] == [[1, 0.3], [4, 1.1]]


@pytest.mark.parametrize(
    ("lag", "message"),
    [
        ([[2, [[0, 0.1]]]], "must start at 1 rings"),
        ([[1, [[0, 0.1]]], [1, [[0, 0.2]]]], "ring counts must rise"),
        ([[1, 0.3]], r"at 1 rings must be a list of \[bytes, ms\] pairs, got 0.3"),
        ([[1, [[0, 0.1]], 3]], "is not a"),
        ([[1.0, [[0, 0.1]]]], "a ring count must be a whole number"),
        ([[1, []]], "at 1 rings: no \\[bytes, ms\\] points"),
        ([[1, [[4_000_000, 0.9], [40_000_000, 0.5]]]], "at 1 rings falls from 0.9 ms"),
        ([[1, [[-5, 0.1]]]], "sizes must rise from >= 0"),
        # more rings at once never cost less (at a size either count measured)
        ([[1, [[0, 0.6]]], [2, [[0, 0.3]]]], "falls from 1 to 2 rings at 0 bytes"),
        ([[1, [[0, 0.1], [100, 5.0]]], [2, [[0, 0.2], [50, 0.3]]]], "1 to 2 rings at 50 bytes"),
        ({"1": [[0, 0.1]]}, "must be a list of"),
    ],
)
def test_bad_version_5_ring_lags_are_refused(lag: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        HostCosts.from_dict(
            {**COSTS, "schema_version": 5, **MEASURED, "delegated_ring_lag_ms_by_rings": lag}
        )


def test_a_calibration_from_another_host_is_named() -> None:
    """A warning, not a refusal (a user may model another host); none where the file names
    no host."""
    costs = HostCosts.from_dict(COSTS)  # host "h"
    assert costs.other_host_warning("h") is None
    assert costs.other_host_warning("box") == (
        "warning: the calibration was measured on host 'h', not on this one ('box'): its "
        "costs predict runs there"
    )
    assert FREE.other_host_warning("box") is None


def test_a_calibration_of_another_shape_is_named() -> None:
    """Its per-op overhead depends on how long an op sleeps and its transfers' costs on how
    many workers share the cores: a run of other stages, or of ops over 2x longer or shorter,
    is warned of (not refused: the costs are still this host's); a file that recorded no
    shape (version 3) says nothing."""
    costs = HostCosts.from_dict({**COSTS, "schema_version": 4, **MEASURED})  # 2 stages, 2 ms
    assert costs.shape_warning(2, 2.0) is None
    assert costs.shape_warning(2, 4.0) is None and costs.shape_warning(2, 1.0) is None
    assert costs.shape_warning(1, 2.0) is None  # calibrate runs 2 stages at least
    assert costs.shape_warning(2, 4.1) == (
        "warning: the calibration ran 2 stages with 2 ms ops, this run 2 with 4.1 ms "
        "forwards: its costs predict runs of its own shape (calibrate --stages 2 --op-ms 4.1)"
    )
    assert costs.shape_warning(4, 2.0) is not None and costs.shape_warning(2, 0.9) is not None
    assert HostCosts.from_dict(COSTS).shape_warning(8, 50.0) is None
    # what calibrate can do: 16 stages at most, ops longer than 0 ms
    most = HostCosts(op_ms=2.0, num_stages=16)
    assert most.shape_warning(20, 2.0) is None and most.shape_warning(16, 0.0) is None
    warned = HostCosts(op_ms=2.0, num_stages=4).shape_warning(20, 0.0)
    assert warned is not None and warned.endswith("(calibrate --stages 16 --op-ms 2)")
    longest = HostCosts(op_ms=2.0, num_stages=4).shape_warning(4, 70_000.0)
    assert longest is not None and longest.endswith("--op-ms 60000)")  # calibrate's longest
    assert HostCosts(op_ms=30_000.0, num_stages=4).shape_warning(4, 200_000.0) is not None
