"""The calibration file: a host's runtime costs, read strictly."""

import json
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.host_costs import FREE, HostCosts

COSTS = {
    "schema_version": 1,
    "send_fixed_ms": 0.2,
    "send_ms_per_mib": 0.4,
    "receive_lag_ms": 0.3,
    "receive_lag_ms_per_mib": 0.1,
    "op_overhead_ms": 0.05,
    "host": "h",
    "measured_at": "2026-12-01T00:00:00+00:00",
}


def test_round_trip_and_costs(tmp_path: Path) -> None:
    path = tmp_path / "host.json"
    path.write_text(json.dumps(COSTS))
    costs = HostCosts.from_file(path)
    optional = ("copy_out_fixed_ms", "copy_out_ms_per_mib", "delegate_pickup_ms",
                "copy_in_fixed_ms", "copy_in_ms_per_mib", "failover_ms", "ring_lag_ms",
                "delegated_ring_lag_ms")  # fmt: skip
    assert costs.to_dict() == {**COSTS, **dict.fromkeys(optional, 0.0)}  # measured without
    assert HostCosts.from_dict(costs.to_dict()) == costs
    assert costs.send_ms(2 << 20) == pytest.approx(0.2 + 0.8)
    assert costs.receive_lag_for_ms(1 << 19) == pytest.approx(0.3 + 0.05)
    assert FREE.send_ms(1 << 30) == FREE.receive_lag_for_ms(1 << 30) == 0.0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schema_version": 2}, "schema_version 2 is not supported"),
        ({"send_fixed_ms": -1}, "send_fixed_ms must be finite and >= 0"),
        ({"op_overhead_ms": float("nan")}, "op_overhead_ms must be finite"),
        ({"receive_lag_ms": "fast"}, "receive_lag_ms must be a number"),
        ({"receive_lag_ms": True}, "receive_lag_ms must be a number"),
        ({"colour": "red"}, r"unknown key\(s\) \['colour'\]"),
        ({"send_ms_per_mib": None}, "send_ms_per_mib must be a number"),
        ({"ring_lag_ms": -0.5}, "ring_lag_ms must be finite and >= 0"),
    ],
)
def test_bad_calibrations_are_refused(tmp_path: Path, change: dict, message: str) -> None:
    path = tmp_path / "host.json"
    path.write_text(json.dumps({**COSTS, **change}))
    with pytest.raises(ConfigError, match=message):
        HostCosts.from_file(path)


def test_a_missing_cost_or_file_is_named(tmp_path: Path) -> None:
    data = dict(COSTS)
    del data["receive_lag_ms"]
    (tmp_path / "host.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"missing \['receive_lag_ms'\]"):
        HostCosts.from_file(tmp_path / "host.json")
    with pytest.raises(ConfigError, match="cannot read calibration"):
        HostCosts.from_file(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="is not valid JSON"):
        HostCosts.from_file(tmp_path / "bad.json")


def test_the_delegated_paths_costs_in_the_simulator() -> None:
    """A delegated message holds its sender for the copy out, waits the pick-up, and its op
    starts after the copy in (a 2-stage pipeline, one microbatch)."""
    from baselines import one_f_one_b
    from pipeline.profile import Profile
    from pipeline.simulator import CommMode, simulate

    host = HostCosts(
        copy_out_fixed_ms=0.5, copy_out_ms_per_mib=1.0, delegate_pickup_ms=0.25,
        copy_in_fixed_ms=0.1, copy_in_ms_per_mib=2.0,
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
